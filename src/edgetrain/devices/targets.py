"""The target registry: each place a compiled program can be emitted for, in one record.

A target names what the C backend builds (its toolchain: the cross compiler's ``-mcpu`` and
``-mfpu``, or the host's C compiler), where the firmware runs here (the QEMU machine), the
memory the firmware links into (SRAM and flash regions) and the cost profile (``profiles``)
that the scheduler and the reports use for it. ``backends/c`` (``emit_c``, ``cortexm``), the
capability table and the CLI read their target lists from here; adding a target is one entry.

    get_target("cortex-m7").device      # the "m7" cost profile (STM32F746)
    TARGETS                             # name -> Target: "host", "cortex-m4", "cortex-m7"
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional

from .device import Device
from .profiles import DEVICES

#: the firmware's regions (cortexm's link.ld): the paper's STM32F746 has 1 MB flash and 320 KB
#: SRAM, of which the paper budgets 256 KB; both QEMU MPS2 boards have 4 MiB behind each region
MCU_FLASH_BYTES = 1024 * 1024
MCU_SRAM_BYTES = 256 * 1024


@dataclass(frozen=True)
class Target:
    """One emit target. ``backend``: its row of the capability table (backends/capabilities.py).
    Firmware targets have a cross toolchain (``cpu``, ``fpu``: single precision, hard-float ABI),
    a QEMU ``machine`` and the ``sram_bytes`` / ``flash_bytes`` their linker script allows; the
    host target has none of these (the host's C compiler, the machine's own memory)."""

    name: str
    backend: str  # "c" (the host build) | "cortex-m" (firmware)
    profile: str  # the cost profile's name in devices.DEVICES
    cpu: Optional[str] = None  # arm-none-eabi-gcc -mcpu
    fpu: Optional[str] = None  # -mfpu
    machine: Optional[str] = None  # qemu-system-arm -M
    sram_bytes: Optional[int] = None
    flash_bytes: Optional[int] = None

    @property
    def firmware(self) -> bool:
        """Whether this target builds a bare-metal firmware (cortexm.py) rather than a host library."""
        return self.machine is not None

    @property
    def device(self) -> Device:
        """The cost profile of this target (devices.profiles)."""
        return DEVICES[self.profile]


TARGETS = MappingProxyType({
    "host": Target("host", "c", "host"),
    # the Cortex-M4F's cost profile is POET's nRF52840; QEMU's board is the MPS2 AN386
    "cortex-m4": Target("cortex-m4", "cortex-m", "m4f", cpu="cortex-m4", fpu="fpv4-sp-d16", machine="mps2-an386",
                        sram_bytes=MCU_SRAM_BYTES, flash_bytes=MCU_FLASH_BYTES),
    # fpv5-sp-d16: the single-precision FPU of the paper's STM32F746 (the "m7" profile; QEMU's
    # M7, the MPS2 AN500, has the double-precision one, a superset)
    "cortex-m7": Target("cortex-m7", "cortex-m", "m7", cpu="cortex-m7", fpu="fpv5-sp-d16", machine="mps2-an500",
                        sram_bytes=MCU_SRAM_BYTES, flash_bytes=MCU_FLASH_BYTES),
})
#: the names of the firmware targets
FIRMWARE_TARGETS = tuple(name for name, t in TARGETS.items() if t.firmware)


def get_target(name: str) -> Target:
    """A target by name (ValueError naming the known ones otherwise)."""
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown target {name!r}; expected one of {sorted(TARGETS)}") from None


def get_device(name_or_device) -> Device:
    """A profile by name ("a72", case-insensitive) or by emit target ("cortex-m7": its profile),
    or a Device passed through. It lives here, beside the targets, because it reads both
    registries (profiles sit below targets)."""
    if isinstance(name_or_device, Device):
        return name_or_device
    if isinstance(name_or_device, str):
        key = name_or_device.strip().lower()
        if key in DEVICES:
            return DEVICES[key]
        if key in TARGETS:
            return TARGETS[key].device
    raise ValueError(f"unknown device {name_or_device!r}: use one of {', '.join(DEVICES)} "
                     f"(or a Device; edgetrain.devices.calibrate_host() measures this machine)")
