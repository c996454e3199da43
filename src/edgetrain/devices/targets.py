"""The target registry: each place a compiled program can be emitted for, in one record.

A target names what the C backend builds and how: for a firmware target its ISA and compiler
flags (``Toolchain``: the cross compiler's prefix and ``-mcpu``/``-march``/``-mabi`` flags),
its FPU (none or single precision) and SIMD extension, the kernel variants the runtime headers
have for it, the emulator that runs it here (``Emulator``: QEMU binary, machine, CPU), the
memory it links into (``MemoryMap``: flash and SRAM origins and sizes), the runtime folder of
its startup files and linker template (backends/c/runtime/<runtime>/) and the cycle table
(backends/c/cycles.py) its instruction counts are costed with; and for every target the cost
profile (``profiles``) that the scheduler and the reports use. A target name is resolved to
its record once (``resolve_target``) and the record is passed down: backends/c (``emit_c``,
``cortexm``, the QEMU runner, the size report, the stack bound), the capability table and the
CLI read it and never parse the name. Adding a chip is one entry here, its runtime folder
(startup, board, linker script, Makefile: only the files that differ from runtime/cortexm/)
and, where it has SIMD, its kernels.

    get_target("cortex-m7").device      # the "m7" cost profile (STM32F746)
    TARGETS                             # name -> Target: "host", "cortex-m4", "cortex-m7", "cortex-m55",
                                        # "rv32imafc", "rv32imc", "rv32imafcv"
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional, Union

from .device import Device
from .profiles import DEVICES

#: the firmware's regions (cortexm's link.ld): the paper's STM32F746 has 1 MB flash and 320 KB
#: SRAM, of which the paper budgets 256 KB; both QEMU MPS2 boards have 4 MiB behind each region
MCU_FLASH_BYTES = 1024 * 1024
MCU_SRAM_BYTES = 256 * 1024


@dataclass(frozen=True)
class Toolchain:
    """A cross compiler: its tools' common prefix ("arm-none-eabi-": gcc, nm, objdump, readelf,
    size), the flags that select the ISA, ABI and FPU, and the Debian packages that install it."""
    prefix: str
    arch_flags: tuple[str, ...]
    packages: str

    def tool(self, name: str) -> str:
        return self.prefix + name


@dataclass(frozen=True)
class Emulator:
    """The QEMU system emulator that runs the firmware here: binary, ``-M`` machine, ``-cpu``
    (None: the machine's own) and the arguments that make it a bare board with a console and an
    exit (the Cortex-M's watchdog ends the emulation; the RISC-V virt board runs without its
    OpenSBI firmware, the firmware's test-device write ends it)."""
    binary: str
    machine: str
    cpu: Optional[str] = None
    args: tuple[str, ...] = ()
    packages: str = ""


@dataclass(frozen=True)
class MemoryMap:
    """The firmware's link.ld regions: origins and the sizes they are cut to, and how much memory
    the emulated board has behind each origin (the most a budget can give a region)."""
    flash_origin: int
    flash_bytes: int
    ram_origin: int
    sram_bytes: int
    board_bytes: int = 4 << 20


@dataclass(frozen=True)
class Target:
    """One emit target. ``backend``: its row of the capability table (backends/capabilities.py).
    Firmware targets have a toolchain, an emulator and a memory map (and the rest below); the
    host target has none of these (the host's C compiler, the machine's own memory)."""

    name: str
    backend: str  # "c" (the host build) | "cortex-m" | "riscv" (firmware)
    profile: str  # the cost profile's name in devices.DEVICES
    isa: Optional[str] = None  # "armv7e-m", "rv32imafc", "rv32imc"
    cpu: Optional[str] = None  # the core (-mcpu on Arm), for the reports
    fpu: str = "none"  # "none" | "single": hard-float ABI with a single-precision FPU
    simd: str = "none"  # "arm-dsp" | "helium" | "rvv" | "none"
    kernels: tuple[str, ...] = ("portable",)  # the runtime headers' kernel variants it builds
    toolchain: Optional[Toolchain] = None
    emulator: Optional[Emulator] = None
    memory: Optional[MemoryMap] = None
    runtime: Optional[str] = None  # backends/c/runtime/<runtime>/: startup files, board, link.ld.in, Makefile
    startup_files: tuple[str, ...] = ()  # copied from it (or, where it has none, from runtime/cortexm/)
    make_vars: tuple[tuple[str, str], ...] = ()  # config.mk's variables for the Makefile
    defines: tuple[str, ...] = ()  # -D flags naming the core to the runtime headers (config.mk's OPT)
    cycle_table: Optional[str] = None  # backends/c/cycles.py TIMINGS key; None: no cycle estimate

    @property
    def firmware(self) -> bool:
        """Whether this target builds a bare-metal firmware (cortexm.py) rather than a host library."""
        return self.emulator is not None

    @property
    def device(self) -> Device:
        """The cost profile of this target (devices.profiles)."""
        return DEVICES[self.profile]

    @property
    def machine(self) -> Optional[str]:
        return self.emulator.machine if self.emulator else None

    @property
    def sram_bytes(self) -> Optional[int]:
        return self.memory.sram_bytes if self.memory else None

    @property
    def flash_bytes(self) -> Optional[int]:
        return self.memory.flash_bytes if self.memory else None


ARM_EABI = "gcc-arm-none-eabi libnewlib-arm-none-eabi"
RISCV_ELF = "gcc-riscv64-unknown-elf picolibc-riscv64-unknown-elf"
# Both QEMU MPS2 boards (mps2-an386, mps2-an500) have 4 MiB of RAM at each of these addresses
# (ZBT SSRAM1 at 0, ZBT SSRAM2/3 at 0x20000000); the regions are cut to the device budget.
MPS2_MEMORY = MemoryMap(0x0000_0000, MCU_FLASH_BYTES, 0x2000_0000, MCU_SRAM_BYTES)
# QEMU virt's DRAM starts at 0x80000000 (128 MiB by default; the device tree QEMU writes sits at
# its top), where its reset vector jumps with -bios none: "flash" is its first 4 MiB, SRAM the next.
VIRT_MEMORY = MemoryMap(0x8000_0000, MCU_FLASH_BYTES, 0x8040_0000, MCU_SRAM_BYTES)
# QEMU's MPS3 AN547 (Corstone-300: Cortex-M55): the vector table in its 512 KiB ITCM at 0 (where
# VTOR_S points at reset), code and constants in its 2 MiB SRAM at 0x01000000, data in its 512 KiB
# DTCM at 0x20000000 (runtime/cortexm55/link.ld.in)
AN547_MEMORY = MemoryMap(0x0100_0000, MCU_FLASH_BYTES, 0x2000_0000, MCU_SRAM_BYTES, board_bytes=512 << 10)
_MPS2_ARGS = ("-watchdog-action", "poweroff")
_CORTEX_M = dict(backend="cortex-m", isa="armv7e-m", fpu="single", simd="arm-dsp", kernels=("portable", "arm-dsp"),
                 memory=MPS2_MEMORY, runtime="cortexm",
                 startup_files=("startup.c", "main.c", "board.c", "board.h", "cortexm.h", "et_format.h", "et_stack.h",
                                "Makefile"))
_RISCV = dict(backend="riscv", memory=VIRT_MEMORY, runtime="riscv",
              startup_files=("crt0.S", "startup.c", "main.c", "board.c", "board.h", "cortexm.h", "et_format.h",
                             "et_stack.h", "Makefile"))


def _cortex_m(name: str, profile: str, fpu: str, machine: str, **kw) -> Target:
    flags = (f"-mcpu={name}", "-mthumb", "-mfloat-abi=hard", f"-mfpu={fpu}")
    return Target(name, profile=profile, cpu=name, toolchain=Toolchain("arm-none-eabi-", flags, ARM_EABI),
                  emulator=Emulator("qemu-system-arm", machine, None, _MPS2_ARGS, "qemu-system-arm"),
                  make_vars=(("CPU", name), ("FPU", fpu), ("MACHINE", machine)), cycle_table=name,
                  **{**_CORTEX_M, **kw})


def _rv32(isa: str, abi: str, qemu_cpu: str, fpu: str, march: Optional[str] = None, link_march: Optional[str] = None,
          **kw) -> Target:
    """A RISC-V target: `march` (default: the ISA's name) compiles the code, `link_march` (default:
    march) picks the C library's multilib at the link (gcc 12's multilib match is by exact name)."""
    march = march or isa
    flags = (f"-march={march}", f"-mabi={abi}", "-mcmodel=medany")
    link = (("LINK_MARCH", link_march),) if link_march else ()
    return Target(isa, profile="m4f" if fpu == "single" else "m0", isa=isa, cpu=isa, fpu=fpu,
                  toolchain=Toolchain("riscv64-unknown-elf-", flags, RISCV_ELF),
                  emulator=Emulator("qemu-system-riscv32", "virt", qemu_cpu, ("-bios", "none"), "qemu-system-misc"),
                  make_vars=(("MARCH", march), ("MABI", abi), ("MACHINE", "virt"), ("QEMU_CPU", qemu_cpu), *link),
                  cycle_table=isa, **{**_RISCV, **kw})


TARGETS = MappingProxyType({
    "host": Target("host", "c", "host"),
    # the Cortex-M4F's cost profile is POET's nRF52840; QEMU's board is the MPS2 AN386
    "cortex-m4": _cortex_m("cortex-m4", "m4f", "fpv4-sp-d16", "mps2-an386"),
    # fpv5-sp-d16: the single-precision FPU of the paper's STM32F746 (the "m7" profile; QEMU's
    # M7, the MPS2 AN500, has the double-precision one, a superset); -DET_FPV5: its VRINTM floors
    # in one instruction (gcc cannot tell it from the M4's FPv4 by its predefined macros)
    "cortex-m7": _cortex_m("cortex-m7", "m7", "fpv5-sp-d16", "mps2-an500", defines=("-DET_FPV5",)),
    # the Cortex-M55 (Armv8.1-M with Helium, MVE: -mfpu=auto takes the M55's FPU and MVE.fp; no
    # cost profile of its own, the M7's) on QEMU's MPS3 AN547 (Corstone-300): its UART0 and
    # watchdog at their secure aliases (the core starts Secure), its own memory map.
    # -fno-tree-vectorize: gcc -O2 turns plain float loops into Helium's vector float arithmetic,
    # which flushes subnormal operands and results to zero (QEMU 7.2: 1e-39f * 1.0f gives 0 in a
    # vector, 1e-39f in the scalar FPU) where the reference keeps them; Helium is used where a
    # kernel asks for it (et_int8_mve.h's integer intrinsics)
    "cortex-m55": _cortex_m("cortex-m55", "m7", "auto", "mps3-an547", isa="armv8.1-m.main", simd="helium",
                            kernels=("portable", "arm-dsp", "helium"), memory=AN547_MEMORY, runtime="cortexm55",
                            defines=("-DET_FPV5", "-DUART0_BASE=0x59303000u", "-DWDOG_BASE=0x5802E000u",
                                     "-fno-tree-vectorize")),
    # RISC-V microcontrollers on QEMU virt (its CPU cut to the ISA: an F instruction on the rv32imc
    # traps; cycle tables from CORE-V's CV32E40P / CV32E40X: backends/c/cycles.py). rv32imafc (GD32V
    # class): single-precision FPU, the ilp32f ABI;
    # rv32imc (ESP32-C3 class): no FPU, float arithmetic in libgcc's soft-float routines
    "rv32imafc": _rv32("rv32imafc", "ilp32f", "rv32,d=false", "single"),
    "rv32imc": _rv32("rv32imc", "ilp32", "rv32,a=false,f=false,d=false", "none"),
    # rv32imafcv: rv32imafc with the vector extension's embedded integer subset, Zve32x (SEW 8 to
    # 32, no 64-bit elements, no vector float), VLEN 128 (Zvl128b): the int8 kernels of
    # et_int8_rvv.h (inline assembly: gcc 12 has no RVV intrinsics and its -O3 emits no vector
    # code). gcc 12's full "v" implies D (ELEN 64); Zve32x keeps the single-precision FPU alone.
    # Compiled with the vector subset (__riscv_vector defined), linked with the rv32imafc
    # multilib's picolibc (no multilib names a vector ISA: linking with this -march would take
    # the rv64 default). QEMU 7.2 has no Zve32x switch and its V requires D: its Zve32f (Zve32x
    # and vector float32, unused here) at ELEN 32, VLEN 128, without D (a 64-bit SEW is vill).
    "rv32imafcv": _rv32("rv32imafcv", "ilp32f", "rv32,d=false,Zve32f=true,vext_spec=v1.0,vlen=128,elen=32", "single",
                        march="rv32imafc_zve32x_zvl128b", link_march="rv32imafc", simd="rvv",
                        kernels=("portable", "rvv")),
})
#: the names of the firmware targets
FIRMWARE_TARGETS = tuple(name for name, t in TARGETS.items() if t.firmware)


def get_target(name: str) -> Target:
    """A target by name (ValueError naming the known ones otherwise)."""
    try:
        return TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown target {name!r}; expected one of {sorted(TARGETS)}") from None


def resolve_target(target: Union[str, Target]) -> Target:
    """The record of `target`: a name is looked up once (get_target), a Target passes through
    (a chip not in TARGETS, e.g. a test's copy of one under another name, works the same)."""
    return target if isinstance(target, Target) else get_target(target)


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
