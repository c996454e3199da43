"""Explicit, frozen configuration objects."""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Optional, Union

#: byte multipliers; microcontroller datasheets count KB and MB in powers of two.
UNITS = {"": 1, "B": 1, "KB": 1024, "KIB": 1024, "K": 1024, "MB": 1024**2, "MIB": 1024**2, "M": 1024**2,
         "GB": 1024**3, "GIB": 1024**3, "G": 1024**3}


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, else the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def format_bytes(n: int) -> str:
    """`n` bytes in the units parse_bytes reads (KB = 1024 B, MB = 1024 KB): one unit family
    in every summary, and a printed figure can be typed back as a budget (812.5 KB, 37.84 MB)."""
    if n < UNITS["KB"]:
        return f"{n} B"
    if n < UNITS["MB"]:
        return f"{n / UNITS['KB']:,.1f} KB"
    return f"{n / UNITS['MB']:,.2f} MB"


def parse_bytes(v: Union[int, str, None], what: str = "size") -> Optional[int]:
    """'256KB' -> 262144; ints pass through; None stays None."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise ValueError(f"{what}: expected a byte count like 256KB, got {v!r}")
    if isinstance(v, (int, float)):
        if not math.isfinite(v) or int(v) <= 0:
            raise ValueError(f"{what} must be a positive number of bytes, got {v!r}")
        return int(v)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(v))
    if not m or m.group(2).upper() not in UNITS:
        raise ValueError(f"{what}: cannot read {v!r}; write e.g. 256KB, 1MB or a number of bytes")
    x = float(m.group(1)) * UNITS[m.group(2).upper()]
    if not math.isfinite(x):  # '9' * 400 reads as infinity: int() of it is an OverflowError
        raise ValueError(f"{what}: {v!r} is too large a number of bytes")
    n = int(x)
    if n <= 0:
        raise ValueError(f"{what} must be positive, got {v!r}")
    return n


@dataclass(frozen=True)
class SGD:
    """Stochastic gradient descent, as torch.optim.SGD (no dampening, no Nesterov).

    For int8 training: `qas` turns Quantization-Aware Scaling on (each int weight's
    gradient times w_scale^-2, each int bias's times (w_scale * x_scale)^-2, per output
    channel), so the same `lr` as float training works; `seed` keys the stochastic
    rounding of the integer updates. Both are ignored in float training."""

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    qas: bool = True
    seed: int = 0

    def __post_init__(self):
        for name in ("lr", "momentum", "weight_decay"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"SGD {name} must be a finite number >= 0, got {v!r}")
        if not isinstance(self.qas, bool):
            raise ValueError(f"SGD qas must be True or False, got {self.qas!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"SGD seed must be an int >= 0, got {self.seed!r}")


@dataclass(frozen=True)
class Budget:
    """Memory a device offers: `sram` for the training program, `flash` for read-only data."""

    sram: Optional[Union[int, str]] = None
    flash: Optional[Union[int, str]] = None

    def __post_init__(self):
        object.__setattr__(self, "sram", parse_bytes(self.sram, "sram"))
        object.__setattr__(self, "flash", parse_bytes(self.flash, "flash"))
