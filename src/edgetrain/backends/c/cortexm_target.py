"""The Cortex-M firmware targets and their memory map, the error every firmware step raises,
and the tools a firmware needs (shared by cortexm.py, qemu_run.py and firmware_size.py)."""
from __future__ import annotations

import shutil
from pathlib import Path
from types import MappingProxyType

from ...devices.targets import MCU_FLASH_BYTES, MCU_SRAM_BYTES, TARGETS as ALL_TARGETS, Target
from .layout import CBackendError

RUNTIME_DIR = Path(__file__).parent / "runtime" / "cortexm"
#: where a firmware project's Makefile puts its objects (build/model.o) and link map
#: (runtime/cortexm/Makefile's BUILD); firmware.elf stays in the project folder
BUILD_DIR = "build"

# Both QEMU boards (mps2-an386, mps2-an500) have 4 MiB of RAM at each of these addresses
# (ZBT SSRAM1 at 0, ZBT SSRAM2/3 at 0x20000000); the regions are cut to the device budget.
FLASH_ORIGIN = 0x0000_0000
RAM_ORIGIN = 0x2000_0000
# the regions' default sizes (each target's in devices.targets: the paper's STM32F746 has 1 MB
# flash and 320 KB SRAM, of which the paper budgets 256 KB)
FLASH_BYTES = MCU_FLASH_BYTES
SRAM_BYTES = MCU_SRAM_BYTES

#: the firmware targets of the target registry (devices.targets: CPU, FPU, QEMU machine, regions,
#: cost profile)
TARGETS = MappingProxyType({name: t for name, t in ALL_TARGETS.items() if t.firmware})


class CortexMError(CBackendError):
    """A firmware project could not be written, built or run."""


def get_target(target: str) -> Target:
    """The registry's record of a firmware target (CortexMError for any other name)."""
    try:
        return TARGETS[target]
    except KeyError:
        raise CortexMError(f"unknown Cortex-M target {target!r}; expected one of {sorted(TARGETS)}") from None


TOOLS = ("arm-none-eabi-gcc", "arm-none-eabi-size", "arm-none-eabi-readelf", "arm-none-eabi-nm",
         "qemu-system-arm", "make")


def missing_tools() -> list[str]:
    """The tools building and running a firmware needs that are not on PATH (Debian:
    gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm make)."""
    return [t for t in TOOLS if shutil.which(t) is None]
