"""The C runtime's headers (runtime/et_*.h): which ones a program includes, and their text.

Each header has an include guard and includes what it uses (its libc headers and the runtime
headers it calls), so it compiles alone and the order in which a program includes them does
not matter (tests/backends/test_runtime_headers.py compiles each one alone, for the host and
for the Cortex-M). So the list is derived, not written: KERNEL_HEADERS is every et_*.h of
RUNTIME_DIR, sorted, less
- PROGRAM_HEADERS, whose state is one program's (the weight banks, the page file, a failed
  check): emit.py adds each to a program that needs it, and kernel_lib.py keeps them out of the
  kernel object shared by every program;
- DRIVER_HEADERS, the standalone host driver's (project.py adds it beside main.c).
A new kernel header needs no list edited: it is in every program once it is in the folder
(and in the wheel: pyproject.toml's package data takes runtime/*.h)."""
from __future__ import annotations

from pathlib import Path

from .layout import CBackendError

#: the folder of the runtime headers (and of the targets' board files: cortexm/, riscv/, ...)
RUNTIME_DIR = Path(__file__).parent / "runtime"
#: the weight banks' double-buffered commit (weight_banks=2)
BANK_HEADER = "et_bank.h"
#: the storage API of page_in / page_out (a program that pages)
PAGE_HEADER = "et_page.h"
#: a program's failed run-time check (kernels/check.py)
CHECK_HEADER = "et_check.h"
#: headers with per-program state: included only by a program that needs them, never compiled
#: into the shared kernel object (kernel_lib.py)
PROGRAM_HEADERS = (BANK_HEADER, PAGE_HEADER, CHECK_HEADER)
#: the standalone host driver's weights and samples files (project.py; it includes model.h)
DRIVER_HEADERS = ("et_weights.h",)


def kernel_headers() -> tuple[str, ...]:
    """The runtime headers every program includes: each et_*.h of RUNTIME_DIR less
    PROGRAM_HEADERS and DRIVER_HEADERS, sorted. A named header missing from the folder is an
    error (an incomplete installation), never left out."""
    names = sorted(p.name for p in RUNTIME_DIR.glob("et_*.h"))
    named = PROGRAM_HEADERS + DRIVER_HEADERS + ("et_common.h",)
    missing = [h for h in named if h not in names]
    if missing:
        raise CBackendError(f"the C runtime headers {', '.join(missing)} are missing from {RUNTIME_DIR}: "
                            "the edgetrain installation is incomplete (reinstall it)")
    return tuple(n for n in names if n not in PROGRAM_HEADERS + DRIVER_HEADERS)


#: the headers of every program (kernel_headers(), once per process)
KERNEL_HEADERS = kernel_headers()


def header_text(name: str) -> str:
    """The text of runtime header `name`; CBackendError when it is not in RUNTIME_DIR."""
    path = RUNTIME_DIR / name
    try:
        return path.read_text()
    except FileNotFoundError:
        raise CBackendError(f"the C runtime header {name} is missing from {RUNTIME_DIR}: "
                            "the edgetrain installation is incomplete (reinstall it)") from None
