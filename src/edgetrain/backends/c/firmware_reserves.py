"""The stack and heap reserves of a firmware's link.ld, sized to the linked code.

firmware_files writes each reserve either as given or marked auto (AUTO_NOTE) at a default
that a plain `make` links with; cortexm.build then sets the auto ones from the linked ELF and
relinks: the stack to its static worst case (stack_bound.py) plus startup.c's guard word,
rounded to 8 bytes; the heap to 0 when nothing linked allocates (no _sbrk: the firmware's own
code formats numbers without the C library's printf), else DEFAULT_HEAP_BYTES. A stack given
explicitly below the worst case is refused. Code without a static bound (a test harness
calling newlib's printf, which recurses) keeps the defaults.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Optional

from .stack_bound import StackBound, StackBoundError, stack_bound

DEFAULT_STACK_BYTES = 8 * 1024
#: newlib's malloc extends its heap by whole 4 KiB pages
DEFAULT_HEAP_BYTES = 4 * 1024
#: link.ld's mark of a reserve cortexm.build sizes
AUTO_NOTE = " /* auto: sized by edgetrain's cortexm.build */"
#: the word at the bottom of the stack reserve that startup.c's guard check reads
STACK_GUARD_BYTES = 4
_LINE = {name: re.compile(rf"^{name} = (\d+);(.*)$", re.M) for name in ("__stack_size", "__heap_size")}


class ReserveError(Exception):
    """An explicit stack reserve below the static bound."""


def reserve(ld: str, name: str) -> tuple[int, bool]:
    """(bytes, auto) of link.ld's reserve `name` (__stack_size or __heap_size)."""
    m = _LINE[name].search(ld)
    if m is None:
        raise ReserveError(f"link.ld has no {name} line")
    return int(m.group(1)), AUTO_NOTE.strip() in m.group(2)


def set_auto(ld: str, stack: Optional[int], heap: Optional[int]) -> str:
    """link.ld with its auto reserves set to these values (None: left), still marked auto."""
    for name, value in (("__stack_size", stack), ("__heap_size", heap)):
        if value is not None and reserve(ld, name)[1]:
            ld = _LINE[name].sub(f"{name} = {value};{AUTO_NOTE}", ld)
    return ld


def allocates(elf: Path) -> bool:
    """Whether the firmware links the C library's allocator (its _sbrk, or picolibc's sbrk on
    RISC-V: startup.c's)."""
    from .cortexm_target import elf_toolchain

    r = subprocess.run([elf_toolchain(elf).tool("nm"), str(elf)], capture_output=True, text=True, check=True)
    return any(line.split()[-1] in ("_sbrk", "sbrk") for line in r.stdout.splitlines() if line.strip())


#: the stack pointer's alignment: 8 bytes on the Cortex-M (AAPCS), 16 on RISC-V (its psABI;
#: link.ld aligns the stack's top to it)
STACK_ALIGN = {"arm": 8, "riscv": 16}


def stack_reserve_for(bound: StackBound, align: int = STACK_ALIGN["arm"]) -> int:
    """The stack reserve that holds `bound` and the guard word below it, whole `align`s."""
    return -(-(bound.bytes + STACK_GUARD_BYTES) // align) * align


def stack_align(elf: Path) -> int:
    """The stack alignment of the ELF's ISA (STACK_ALIGN)."""
    from .cortexm_target import elf_toolchain

    return STACK_ALIGN["riscv" if elf_toolchain(elf).prefix.startswith("riscv") else "arm"]


def sized(ld: str, elf: Path) -> tuple[str, Optional[StackBound], str]:
    """(link.ld with its auto reserves sized to `elf`, the stack bound, "") or, for code with no
    static stack bound (newlib's printf recurses, a variable-length array), (link.ld with its
    auto reserves at their defaults, None, why): the stack guard still catches an overflow
    at run time."""
    try:
        bound = stack_bound(elf)
    except StackBoundError as err:
        return set_auto(ld, stack=DEFAULT_STACK_BYTES, heap=DEFAULT_HEAP_BYTES), None, str(err)
    stack, stack_auto = reserve(ld, "__stack_size")
    _, heap_auto = reserve(ld, "__heap_size")
    want = stack_reserve_for(bound, stack_align(elf))
    if not stack_auto and want > stack:
        raise ReserveError(f"its stack can reach {bound.describe()}, beyond the {stack}-byte reserve it was "
                           f"written with (less {STACK_GUARD_BYTES} for the guard word)")
    return set_auto(ld, stack=want if stack_auto else None,
                    heap=(DEFAULT_HEAP_BYTES if allocates(elf) else 0) if heap_auto else None), bound, ""
