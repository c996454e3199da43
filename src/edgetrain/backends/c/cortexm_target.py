"""The firmware targets (the target registry's records with a toolchain and an emulator), the
error every firmware step raises, and the tools a firmware needs (shared by cortexm.py,
qemu_run.py, firmware_size.py, stack_bound.py). Every firmware module takes the resolved
record (`resolve`), never the name; the tools that only read an ELF find its toolchain from
the ELF's machine (`elf_toolchain`)."""
from __future__ import annotations

import shutil
from pathlib import Path
from types import MappingProxyType
from typing import Optional, Union

from ...devices.targets import (FIRMWARE_TARGETS as FIRMWARE_TARGET_NAMES, MCU_FLASH_BYTES, MCU_SRAM_BYTES,
                                MPS2_MEMORY, TARGETS as ALL_TARGETS, Target, Toolchain, resolve_target)
from .layout import CBackendError

RUNTIME_ROOT = Path(__file__).parent / "runtime"
#: the Cortex-M runtime folder: its files are every firmware's unless a target's folder has its own
RUNTIME_DIR = RUNTIME_ROOT / "cortexm"
#: where a firmware project's Makefile puts its objects (build/model.o) and link map
#: (runtime/cortexm/Makefile's BUILD); firmware.elf stays in the project folder
BUILD_DIR = "build"

# The Cortex-M targets' memory map (devices.targets.MPS2_MEMORY), importable from here
FLASH_ORIGIN = MPS2_MEMORY.flash_origin
RAM_ORIGIN = MPS2_MEMORY.ram_origin
# the regions' default sizes (each target's in devices.targets: the paper's STM32F746 has 1 MB
# flash and 320 KB SRAM, of which the paper budgets 256 KB)
FLASH_BYTES = MCU_FLASH_BYTES
SRAM_BYTES = MCU_SRAM_BYTES

#: every firmware target of the target registry (toolchain, emulator, memory map, cost profile)
FIRMWARE_TARGETS = MappingProxyType({name: ALL_TARGETS[name] for name in FIRMWARE_TARGET_NAMES})
#: the Cortex-M ones (the Arm Thumb-2 firmware: the instruction-count plugin's and cycles.py's)
TARGETS = MappingProxyType({name: t for name, t in FIRMWARE_TARGETS.items() if t.backend == "cortex-m"})


class CortexMError(CBackendError):
    """A firmware project could not be written, built or run."""


def resolve(target: Union[str, Target]) -> Target:
    """The record of a firmware target: a name looked up once, a Target passed through
    (CortexMError for a target that builds no firmware)."""
    try:
        t = resolve_target(target)
    except ValueError:
        t = None
    if t is None or not t.firmware:
        raise CortexMError(f"unknown firmware target {target!r}; expected one of {sorted(FIRMWARE_TARGETS)}")
    return t


def get_target(target: Union[str, Target]) -> Target:
    """The registry's record of a firmware target (CortexMError for any other name)."""
    return resolve(target)


def runtime_file(t: Target, name: str) -> Path:
    """A runtime file of target `t`: its runtime folder's, else the Cortex-M folder's (a chip's
    folder holds only what differs: startup, board, linker template, Makefile)."""
    own = RUNTIME_ROOT / t.runtime / name
    return own if own.exists() else RUNTIME_DIR / name


def tools(target: Union[str, Target] = "cortex-m4") -> tuple[str, ...]:
    """The programs building and running a firmware of `target` needs."""
    t = resolve(target)
    return tuple(t.toolchain.tool(n) for n in ("gcc", "size", "readelf", "nm")) + (t.emulator.binary, "make")


TOOLS = tools("cortex-m4")


def missing_tools(target: Union[str, Target] = "cortex-m4") -> list[str]:
    """The tools building and running a firmware of `target` needs that are not on PATH (Debian,
    for the Cortex-M: gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm make; for RISC-V:
    gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf qemu-system-misc make). A RISC-V target
    also needs its C library (picolibc.specs)."""
    t = resolve(target)
    missing = [name for name in tools(t) if shutil.which(name) is None]
    if not missing and t.backend == "riscv" and not _has_specs(t.toolchain, "picolibc.specs"):
        missing.append("picolibc (picolibc-riscv64-unknown-elf)")
    return missing


def _has_specs(tc: Toolchain, specs: str) -> bool:
    import subprocess

    r = subprocess.run([tc.tool("gcc"), f"-print-file-name={specs}"], capture_output=True, text=True)
    return r.returncode == 0 and Path(r.stdout.strip()).is_absolute()


#: ELF e_machine -> the toolchain that reads that ELF
_ELF_MACHINES = {40: "cortex-m4", 243: "rv32imafc"}


def elf_toolchain(elf) -> Toolchain:
    """The toolchain whose binutils read `elf` (from the ELF header's e_machine: Arm, RISC-V)."""
    with open(elf, "rb") as f:
        head = f.read(20)
    machine: Optional[int] = int.from_bytes(head[18:20], "little") if head[:4] == b"\x7fELF" else None
    if machine not in _ELF_MACHINES:
        raise CortexMError(f"{elf}: not an Arm or RISC-V ELF (machine {machine})")
    return ALL_TARGETS[_ELF_MACHINES[machine]].toolchain
