"""The Device record: a cost profile that turns MACs, bytes and page traffic into seconds and joules."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

#: fields that are plain numbers and must be positive and finite
_POSITIVE = ("ram_bytes", "flops_per_s", "flops_per_j", "mem_bytes_per_s", "mem_j_per_byte",
             "page_in_bytes_per_s", "page_out_bytes_per_s", "page_latency_s", "storage_w")


@dataclass(frozen=True)
class Device:
    """A device's costs. 1 MAC = 2 FLOP; ``nbytes`` of a node = bytes it reads plus bytes it writes."""

    name: str                     # "m0" | "m4f" | "m7" | "a72" | "tx2" | "host" (or "host-calibrated")
    title: str                    # e.g. "Raspberry Pi 4B (Cortex-A72)"
    ram_bytes: int                # RAM of the device (the default budget)
    flops_per_s: float            # sustained compute throughput, FLOP/s
    flops_per_j: float            # compute energy efficiency, FLOP/J
    mem_bytes_per_s: float        # RAM bandwidth seen by memory-bound ops (elementwise, copies)
    mem_j_per_byte: float         # energy per byte moved to/from RAM by an op
    page_in_bytes_per_s: float    # secondary storage (flash / SD / eMMC) read bandwidth
    page_out_bytes_per_s: float   # write bandwidth
    page_latency_s: float         # fixed latency per page operation (one tensor read or written)
    storage_w: float              # power drawn by the storage while paging (W)
    weights_in_flash: bool        # frozen weights are read in place from flash (MCUs), not held in RAM

    def __post_init__(self):
        for f in _POSITIVE:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"device {self.name!r}: {f} must be a positive finite number, got {v!r}")
        if not isinstance(self.ram_bytes, int):
            raise ValueError(f"device {self.name!r}: ram_bytes must be an int, got {self.ram_bytes!r}")

    # -- compute: a roofline for time, additive energy ------------------------------------------
    def node_time_s(self, macs: int, nbytes: int) -> float:
        """Roofline: the op is bound by compute or by memory traffic, whichever is slower."""
        return max(2 * macs / self.flops_per_s, nbytes / self.mem_bytes_per_s)

    def node_energy_j(self, macs: int, nbytes: int) -> float:
        return 2 * macs / self.flops_per_j + nbytes * self.mem_j_per_byte

    # -- paging: one tensor read from / written to secondary storage -----------------------------
    def page_in_s(self, nbytes: int) -> float:
        return self.page_latency_s + nbytes / self.page_in_bytes_per_s

    def page_out_s(self, nbytes: int) -> float:
        return self.page_latency_s + nbytes / self.page_out_bytes_per_s

    def page_in_j(self, nbytes: int) -> float:
        return self.page_in_s(nbytes) * self.storage_w

    def page_out_j(self, nbytes: int) -> float:
        return self.page_out_s(nbytes) * self.storage_w

    # -- presentation ----------------------------------------------------------------------------
    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """Every field, one a line, with units."""
        rows = [
            ("name", self.name),
            ("title", self.title),
            ("RAM", _bytes(self.ram_bytes)),
            ("compute", f"{self.flops_per_s:.4g} FLOP/s"),
            ("compute energy", f"{self.flops_per_j:.4g} FLOP/J  ({self.flops_per_s / self.flops_per_j:.4g} W active)"),
            ("memory bandwidth", _rate(self.mem_bytes_per_s)),
            ("memory energy", f"{self.mem_j_per_byte:.4g} J/byte"),
            ("page in", _rate(self.page_in_bytes_per_s)),
            ("page out", _rate(self.page_out_bytes_per_s)),
            ("page latency", f"{self.page_latency_s * 1e3:.4g} ms per tensor"),
            ("storage power", f"{self.storage_w:.4g} W"),
            ("weights in flash", "yes" if self.weights_in_flash else "no"),
        ]
        assert len(rows) == len(fields(self))
        return "\n".join(f"{k:18s} {v}" for k, v in rows)


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.4g} {unit} ({n:,} B)"
    return f"{n} B"


def _rate(bps: float) -> str:
    return f"{bps / 1e9:.4g} GB/s" if bps >= 1e9 else f"{bps / 1e6:.4g} MB/s"
