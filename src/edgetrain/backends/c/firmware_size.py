"""The size report of a linked firmware: flash and SRAM from its section headers, the static
stack bound (stack_bound.py), and a QEMU run's measured stack and instruction counts."""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ...devices.targets import Target
from .cortexm_target import FLASH_BYTES, SRAM_BYTES, CortexMError, elf_toolchain, resolve
from .qemu_run import QemuRun
from .stack_bound import StackBoundError, stack_bound


@dataclass(frozen=True)
class FirmwareSize:
    """Memory of a firmware image, in bytes. flash = code + read-only data (weights frozen in
    flash, embedded samples) + the initial values of .data; sram = .data + .bss (arena, trained
    weights, optimizer state; .noinit's weight banks counted here) + the heap and stack
    reserves of link.ld."""
    flash: int
    sram: int
    text: int  # .isr_vector + .text (+ ARM unwind tables)
    rodata: int
    data: int
    bss: int
    heap_reserve: int
    stack_reserve: int
    flash_limit: int = FLASH_BYTES
    sram_limit: int = SRAM_BYTES
    stack_high_water: Optional[int] = None  # measured on a run (stack painting)
    stack_bound: Optional[int] = None  # the static worst case (stack_bound.py), exception frame included
    instructions_per_step: Optional[int] = None  # measured under QEMU (mean over the steps)
    cycles_per_step: Optional[int] = None  # estimated from the counts by class (cycles.py; mean over the steps)

    @property
    def sram_used(self) -> int:
        """SRAM with the stack counted at its measured high-water mark (when known)."""
        if self.stack_high_water is None:
            return self.sram
        return self.sram - self.stack_reserve + self.stack_high_water

    def describe(self) -> str:
        kb = lambda b: f"{b / 1024:.1f} KB"
        s = (f"flash {kb(self.flash)} of {kb(self.flash_limit)} (text {kb(self.text)}, rodata {kb(self.rodata)}, "
             f"data {kb(self.data)}); SRAM {kb(self.sram)} of {kb(self.sram_limit)} (data {kb(self.data)}, "
             f"bss {kb(self.bss)}, heap {kb(self.heap_reserve)}, stack {kb(self.stack_reserve)})")
        if self.stack_bound is not None:
            s += f"; stack bound {self.stack_bound} B"
        if self.stack_high_water is not None:
            s += f"; stack high water {self.stack_high_water} B"
        if self.instructions_per_step is not None:
            s += f"; {self.instructions_per_step} instructions/step"
        if self.cycles_per_step is not None:
            s += f" (about {self.cycles_per_step} cycles)"
        return s


def _sections(elf: Path) -> dict[str, tuple[int, int, str]]:
    """name -> (address, size, type) of the allocated sections (readelf -S), less the
    thread-local .tbss, which takes no room of its own (RISC-V's link.ld gives it .tbss_space)."""
    r = subprocess.run([elf_toolchain(elf).tool("readelf"), "-S", "-W", str(elf)], capture_output=True, text=True)
    if r.returncode != 0:
        raise CortexMError(f"readelf failed on {elf}: {r.stderr}")
    out = {}
    row = re.compile(r"^\s*\[\s*\d+\]\s+(\S+)\s+(\S+)\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\S+\s+(\S*)")
    for line in r.stdout.splitlines():
        m = row.match(line)
        if m and "A" in m.group(5) and "T" not in m.group(5):
            out[m.group(1)] = (int(m.group(3), 16), int(m.group(4), 16), m.group(2))
    return out


def firmware_size(elf, run: Optional[QemuRun] = None, target: Union[str, Target, None] = None) -> FirmwareSize:
    """Flash and SRAM of a linked firmware (from its section headers), with the stack
    high-water mark and instructions per step of `run` when given. `target`: its memory map
    tells SRAM from flash (None: the Cortex-M's, or RISC-V's for a RISC-V ELF)."""
    if target is None:
        target = "rv32imafc" if elf_toolchain(elf).prefix.startswith("riscv") else "cortex-m4"
    mem = resolve(target).memory
    secs = _sections(Path(elf))
    text = rodata = data = bss = heap = stack = 0
    flash = 0
    for name, (addr, size, typ) in secs.items():
        in_ram = mem.ram_origin <= addr < mem.ram_origin + SRAM_BYTES * 16
        if name == ".heap":
            heap = size
        elif name == ".stack":
            stack = size
        elif name == ".rodata":
            rodata = size
        elif in_ram and typ == "NOBITS":
            bss += size
        elif in_ram:
            data += size
        else:
            text += size
        if not in_ram or typ != "NOBITS":
            flash += size  # code and constants, or the initial image of .data
    sram = sum(size for addr, size, _ in secs.values() if mem.ram_origin <= addr)
    ips = cps = None
    if run is not None and run.instructions_per_step:
        ips = round(sum(run.instructions_per_step) / len(run.instructions_per_step))
    if run is not None and run.cycles_per_step:
        cps = round(sum(run.cycles_per_step) / len(run.cycles_per_step))
    try:
        bound = stack_bound(Path(elf)).bytes
    except StackBoundError:
        bound = None
    return FirmwareSize(flash=flash, sram=sram, text=text, rodata=rodata, data=data, bss=bss, heap_reserve=heap,
                        stack_reserve=stack, stack_high_water=run.stack_high_water if run else None, stack_bound=bound,
                        instructions_per_step=ips, cycles_per_step=cps,
                        flash_limit=mem.flash_bytes, sram_limit=mem.sram_bytes)
