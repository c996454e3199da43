"""calibrate_host: a Device measured on this machine.

Measured: float32 matmul throughput with numpy (with the threads numpy's BLAS uses by default; not
pinned to one), memory bandwidth of a large copy, and storage read / write bandwidth and per-operation
latency on a temporary file (``tempfile`` directory unless ``directory`` is given; removed after).
Storage is fitted to the profile's model ``t = latency + nbytes / bandwidth`` from a small and a large
operation (through their median times, or, when those differ by less than the times' spread, with the
large one's whole time as transfer); a write is ``pwrite`` + ``fsync``, a read is ``pread`` after the
file's pages were dropped from the OS cache (``posix_fadvise(DONTNEED)``; where that is missing, reads
come from the cache).
Not measurable from software: power. The energy figures use the generic host profile's active power
(``HOST_W``) and SSD power (``HOST_SSD_W``); the title says so.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

from .device import Device
from .profiles import DEVICES, HOST_SSD_W, HOST_W

MATMUL_N = 384                 # float32 square matmul: 113 MFLOP, ~ms on a laptop core, big enough for BLAS
COPY_BYTES = 32 * 1024**2      # well beyond the last-level cache, so the copy streams from RAM
SMALL_IO = 4096                # one file-system block: the per-operation latency
LARGE_IO = 4 * 1024**2         # bandwidth-dominated transfer
#: share of the time budget given to each measurement (matmul, copy, write, read)
SHARES = (0.3, 0.2, 0.3, 0.2)
MIN_REPS = 3                   # repetitions after one warm-up, whatever the budget


def _durations(fn, budget_s: float) -> list[float]:
    """Times of repeated calls (after one warm-up) until ``budget_s`` is spent, at least MIN_REPS."""
    fn()
    out: list[float] = []
    end = time.perf_counter() + budget_s
    while len(out) < MIN_REPS or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _median(ts: list[float]) -> float:
    return max(statistics.median(ts), 1e-9)


def _matmul_flops(budget_s: float) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    b = rng.standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
    c = np.empty_like(a)
    return 2 * MATMUL_N**3 / _median(_durations(lambda: np.matmul(a, b, out=c), budget_s))


def _copy_bytes_per_s(budget_s: float) -> float:
    src = np.ones(COPY_BYTES, dtype=np.uint8)
    dst = np.empty_like(src)
    return 2 * COPY_BYTES / _median(_durations(lambda: np.copyto(dst, src), budget_s))  # read + write


def _drop_cache(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _spread(ts: list[float]) -> float:
    """Half the interquartile range of the times: how far a median of them may be off."""
    if len(ts) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(ts, n=4, method="inclusive")
    return (q3 - q1) / 2


def _fit(n_small: int, small: list[float], n_large: int, large: list[float]) -> tuple[float, float]:
    """(latency, bandwidth) of t = latency + n / bandwidth from the times of a small and a large operation.

    The line goes through the two medians when their difference stands out of the times' spread.
    When it does not (a loaded machine, a disk whose large write costs no more than its sync), the
    slope would be noise and its bandwidth unbounded; then the whole large operation's time counts as
    transfer (a lower bound on the bandwidth) and the small one's as latency.
    """
    t_small, t_large = _median(small), _median(large)
    dt = t_large - t_small
    if dt > 2 * (_spread(small) + _spread(large)):
        bw = (n_large - n_small) / dt
        return max(t_small - n_small / bw, 1e-7), bw
    return max(t_small, 1e-7), n_large / t_large


def _storage(budget_s: float, directory) -> tuple[float, float, float]:
    """(read B/s, write B/s, latency s) measured on a temporary file."""
    small, large = os.urandom(SMALL_IO), os.urandom(LARGE_IO)
    fd, path = tempfile.mkstemp(prefix="edgetrain-calibrate-", dir=directory)
    try:
        def write(data):
            os.pwrite(fd, data, 0)
            os.fsync(fd)

        def read(n):
            _drop_cache(fd)
            os.pread(fd, n, 0)

        w_budget, r_budget = (budget_s * s / sum(SHARES[2:]) for s in SHARES[2:])
        writes_small = _durations(lambda: write(small), w_budget / 2)
        writes_large = _durations(lambda: write(large), w_budget / 2)
        reads_small = _durations(lambda: read(SMALL_IO), r_budget / 2)
        reads_large = _durations(lambda: read(LARGE_IO), r_budget / 2)
    finally:
        os.close(fd)
        os.remove(path)
    lat_w, bw_w = _fit(SMALL_IO, writes_small, LARGE_IO, writes_large)
    lat_r, bw_r = _fit(SMALL_IO, reads_small, LARGE_IO, reads_large)
    return bw_r, bw_w, (lat_w + lat_r) / 2


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return DEVICES["host"].ram_bytes


def calibrate_host(seconds: float = 2.0, *, directory=None) -> Device:
    """Measure this machine in about ``seconds`` (plus warm-ups); a Device named "host-calibrated"."""
    if not (isinstance(seconds, (int, float)) and seconds > 0):
        raise ValueError(f"calibrate_host: seconds must be positive, got {seconds!r}")
    total = sum(SHARES)
    flops = _matmul_flops(seconds * SHARES[0] / total)
    mem = _copy_bytes_per_s(seconds * SHARES[1] / total)
    bw_in, bw_out, latency = _storage(seconds * sum(SHARES[2:]) / total, directory)
    return Device(name="host-calibrated",
                  title="this machine, measured (power not measurable: the host defaults' "
                        f"{HOST_W:g} W compute, {HOST_SSD_W:g} W storage)",
                  ram_bytes=_ram_bytes(), flops_per_s=flops, flops_per_j=flops / HOST_W,
                  mem_bytes_per_s=mem, mem_j_per_byte=HOST_W / mem, page_in_bytes_per_s=bw_in,
                  page_out_bytes_per_s=bw_out, page_latency_s=latency, storage_w=HOST_SSD_W,
                  weights_in_flash=False)
