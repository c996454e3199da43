"""This core's single-thread float32 matmul roofline: the GFLOP/s of a large sgemm through the
BLAS the host C library links (backends/c/blas.py library_blas(): MKL where the package mkl is
installed, else scipy-openblas32), one thread; also with EDGETRAIN_BLAS=openblas. It names the
kernels that ran: OpenBLAS picks them for the CPU when it loads, unless OPENBLAS_CORETYPE names them
(a machine that sets OPENBLAS_CORETYPE=Haswell runs the AVX2 ones on an AVX-512 core).

    PYTHONPATH=src python bench/sgemm_peak.py [--n 2048] [--repeats 7]

bench/step_speed.py prints each training step's GFLOP/s next to this figure."""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from pathlib import Path
from typing import Optional

import numpy as np

#: CBLAS enum values (cblas.h)
ROW_MAJOR, NO_TRANS = 101, 111


def _library() -> Optional[tuple]:
    """(the library, its sgemm, its set-threads function) of the BLAS the host C library links;
    None without one."""
    from edgetrain.backends.c import blas

    b = blas.library_blas()
    if b is not None and blas.MKL_FLAG in b.cflags:  # MKL: its single dynamic library holds both
        libdir = next(f[2:] for f in b.ldflags if f.startswith("-L"))
        rt = sorted(Path(libdir).glob("libmkl_rt.so*"))
        if rt:
            lib = ctypes.CDLL(str(rt[0]))
            return lib, lib.cblas_sgemm, lib.MKL_Set_Num_Threads
    try:
        import scipy_openblas32 as sob
    except ImportError:
        return None
    lib = ctypes.CDLL(str(Path(sob.get_lib_dir()) / f"lib{sob.get_library()}.so"))
    prefix = "scipy_" if hasattr(lib, "scipy_cblas_sgemm") else ""
    return lib, getattr(lib, f"{prefix}cblas_sgemm"), getattr(lib, f"{prefix}openblas_set_num_threads")


def kernels() -> str:
    """Which BLAS kernels the bench ran: MKL's, or OpenBLAS's core name (openblas_get_corename)."""
    found = _library()
    if found is None:
        return "no BLAS"
    lib = found[0]
    for name in ("scipy_openblas_get_corename", "openblas_get_corename"):
        if hasattr(lib, name):
            f = getattr(lib, name)
            f.restype = ctypes.c_char_p
            return f"OpenBLAS {f().decode()} kernels"
    return "MKL"


def sgemm_peak_gflops(n: int = 2048, repeats: int = 7, threads: int = 1) -> Optional[float]:
    """Median GFLOP/s of C = A B (n x n float32) on `threads` threads; None without the BLAS."""
    found = _library()
    if found is None:
        return None
    _, sgemm, set_threads = found
    set_threads(ctypes.c_int(threads))
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    c = np.zeros((n, n), np.float32)
    ptr = (lambda m: m.ctypes.data_as(ctypes.c_void_p))
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def run():
        sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, n, n, n, one, ptr(a), n, ptr(b), n, zero, ptr(c), n)

    run()
    clock = time.thread_time if threads == 1 else time.perf_counter  # one thread: its CPU time (load left out)
    ts = []
    for _ in range(repeats):
        t = clock()
        run()
        ts.append(clock() - t)
    if not np.allclose(c[:4, :4], a[:4] @ b[:, :4], rtol=1e-3, atol=1e-2):
        raise RuntimeError("sgemm returned a wrong product")
    return 2.0 * n ** 3 / statistics.median(ts) / 1e9


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    g = sgemm_peak_gflops(args.n, args.repeats, args.threads)
    print("no BLAS (pip install scipy-openblas32)" if g is None else
          f"sgemm {args.n}x{args.n}x{args.n}, {args.threads} thread(s), {kernels()}: {g:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
