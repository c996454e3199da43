"""Firmware projects for emitted training programs: Cortex-M and RISC-V microcontrollers.

`write_project(out_dir, target, samples)` adds to a directory holding an emitted program
(model.c / model.h and their runtime headers) what makes it a bare-metal firmware for a
firmware target of devices/targets.py (a name, resolved once, or its record: every step
below reads the record's toolchain, emulator, memory map and runtime folder). For a
Cortex-M4 or Cortex-M7 (runtime/cortexm/; RISC-V's runtime/riscv/ is the same contract on
QEMU's virt board: crt0.S, a trap handler, the NS16550A UART, exit through the test device):
startup code (vector table, .data/.bss set-up, FPU on, stack painting),
a linker script with a 1 MiB flash and a 256 KiB SRAM region (a program that does not fit
fails to link), output on the board's UART and exit through its watchdog (board.c), a main.c
that trains on the samples embedded in flash and prints `step <i> loss <value>` per step, a
Makefile (`make`, `make run`, `make size`; objects and the link map under build/, firmware.elf
beside the sources) and a README.md (what the files are, how to build and run them). `build`
runs make and sizes the stack and heap reserves (firmware_reserves.py), `run_qemu`
(qemu_run.py) runs the firmware on QEMU's MPS2 board of the target (optionally counting
instructions per step, by class and per function, with a small TCG plugin, and estimating
cycles from them: cycles.py), `firmware_size`
(firmware_size.py) reports flash and SRAM from the ELF's sections; `run_firmware` does all
three. The targets and the memory map are cortexm_target.py's.

The firmware runs confined: without semihosting (which would let it open host files and run
host commands: SYS_OPEN, SYS_SYSTEM), so all it can do is compute, print on the UART and end
with a status; a semihosting call is a fault there (exit ET_EXIT_FAULT). QEMU runs under its
seccomp sandbox (no exec, no privilege change) in a fresh empty directory, as defence in depth.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Optional, Sequence, Union

import numpy as np

from ...devices.targets import Target
from . import firmware_reserves as reserves
# the targets, the memory map, the run and the size report, importable from here too
from .cortexm_target import (BUILD_DIR, FIRMWARE_TARGETS, FLASH_BYTES, FLASH_ORIGIN, RAM_ORIGIN,  # noqa: F401
                             RUNTIME_DIR, SRAM_BYTES, TARGETS, TOOLS, CortexMError, get_target, missing_tools, resolve,
                             runtime_file)
from .firmware_size import FirmwareSize, firmware_size  # noqa: F401
from .qemu_run import QEMU_TIMEOUT_S, QemuRun, qemu_command, run_qemu  # noqa: F401
from .staging import write_files
from .toolchain import ToolTimeout, run_tool

# Copied verbatim into a Cortex-M project (main.c includes model.h and the generated samples.h);
# each target's list is its record's startup_files
RUNTIME_FILES = TARGETS["cortex-m4"].startup_files
# Stack and heap reserves of a project linked by `make` alone; `build` sizes them
# (firmware_reserves.py) unless the project was written with explicit ones.
DEFAULT_STACK_BYTES = reserves.DEFAULT_STACK_BYTES
DEFAULT_HEAP_BYTES = reserves.DEFAULT_HEAP_BYTES
DEFAULT_OPT = "-O2"
#: seconds `make firmware.elf` may take; past it its process group (make and the compilers) is killed
BUILD_TIMEOUT = 900


# --- samples ---------------------------------------------------------------------------------
def format_step_line(step: int, loss: float) -> str:
    """The line the firmware (and the host driver) prints after a step: `step` is the number
    of steps done (1 after the first); the loss is C's "%.9g" of the float32 value, which
    round-trips (Python's %-formatting of the same double gives the same text)."""
    return "step %d loss %.9g" % (step, float(np.float32(loss)))


# --- project ---------------------------------------------------------------------------------
def emit_firmware(prog, out_dir, target: Union[str, Target] = "cortex-m4", samples: Sequence = (), weight_banks: int = 1,
                  graphs: tuple = ("train",), **project) -> Path:
    """A firmware project for `prog` in out_dir: the emitted model.c / model.h / runtime
    headers with the initial weights compiled in (frozen ones `const`: flash), and the
    firmware files of `write_project` training on `samples` ((x, y) pairs as for
    `prog.step`). `make` builds firmware.elf, `make run` runs it on QEMU. weight_banks=2: the
    trained state twice, each step committed by one header write (emit.emit_sources), in
    .noinit RAM that a system reset leaves alone: after a reset the firmware resumes from the
    last committed step (main.c prints "resumed at step N"). All files are written at once
    (staging.write_files: a full disk or a crash leaves the old project whole). `graphs`: the
    graphs emitted (emit.emit_sources): main.c only trains, so by default the train graph alone
    (et_predict and et_gradients are then marked left out in model.h)."""
    return write_files(out_dir, firmware_project_files(prog, target, samples, weight_banks, graphs, **project))


def firmware_project_files(prog, target: Union[str, Target] = "cortex-m4", samples: Sequence = (), weight_banks: int = 1,
                           graphs: tuple = ("train",), **project) -> dict:
    """{file name: text or bytes} of emit_firmware's project, nothing written."""
    from .emit import emit_sources
    from .project import program_samples

    t = resolve(target)
    if getattr(prog, "page_store", None) is not None:
        raise CortexMError("this program runs a paging schedule (page_in / page_out); the C backend reaches "
                           "secondary storage on the host build only (a file, backends/c/runtime/et_page.h)")
    from ..capabilities import check_program

    check_program(prog, t.backend)  # an op without a kernel: refused before anything is written
    if len(prog.inputs) != 1:
        raise CortexMError(f"the firmware drives models with one input; this one takes {len(prog.inputs)}")
    # The firmware runs the train graph only, so by default the arena is the train graph's plan
    # (at 128x128 the predict graph, planned without row streaming, alone needs about 240 KB).
    files = emit_sources(prog, embed_weights=True, graphs=tuple(graphs), weight_banks=weight_banks)
    files.update(firmware_files(t, program_samples(prog, samples), **project))
    return files



def write_project(out_dir, target: Union[str, Target] = "cortex-m4", samples=None, *, stack_bytes: Optional[int] = None,
                  heap_bytes: Optional[int] = None, opt: str = DEFAULT_OPT,
                  flash_bytes: Optional[int] = None, sram_bytes: Optional[int] = None) -> Path:
    """Writes the firmware files into `out_dir` (which holds, or will hold, the emitted
    model.c/model.h). `samples`: a tuple (inputs, labels) of two arrays with one row per
    step, or a list of (x, y) array pairs, already in the program's dtypes (embedded as their
    bytes: `emit.samples_source`). Returns out_dir. The files are written at once
    (staging.write_files). stack_bytes, heap_bytes: the link.ld reserves; None (the default):
    sized by `build` (the static stack bound; no heap unless something linked allocates)."""
    return write_files(out_dir, firmware_files(target, samples, stack_bytes=stack_bytes, heap_bytes=heap_bytes,
                                               opt=opt, flash_bytes=flash_bytes, sram_bytes=sram_bytes))


def firmware_files(target: Union[str, Target] = "cortex-m4", samples=None, *, stack_bytes: Optional[int] = None,
                   heap_bytes: Optional[int] = None, opt: str = DEFAULT_OPT,
                   flash_bytes: Optional[int] = None, sram_bytes: Optional[int] = None) -> dict:
    """{file name: text or bytes} of the firmware files write_project writes (flash_bytes,
    sram_bytes: the linker's regions, by default the target's)."""
    from .project import samples_source

    t = resolve(target)
    mem = t.memory
    flash_bytes = t.flash_bytes if flash_bytes is None else flash_bytes
    sram_bytes = t.sram_bytes if sram_bytes is None else sram_bytes
    if samples is None:
        raise CortexMError("the firmware needs training samples to embed")
    if isinstance(samples, tuple) and len(samples) == 2 and not isinstance(samples[0], tuple):
        inputs, labels = samples  # one row (or list item) per step
    else:
        pairs = list(samples)
        inputs, labels = [np.asarray(x) for x, _ in pairs], [np.asarray(y) for _, y in pairs]
    if len(inputs) == 0:
        raise CortexMError("the firmware needs at least one training sample")
    if heap_bytes is not None and (heap_bytes < 0 or heap_bytes % 4096):
        raise CortexMError(f"heap_bytes={heap_bytes}: the heap must be whole 4 KiB pages (newlib's malloc "
                           f"extends it to page boundaries)")
    if stack_bytes is not None and (stack_bytes <= 0 or stack_bytes % 8):
        raise CortexMError(f"stack_bytes={stack_bytes}: the stack must be a positive multiple of 8 bytes")
    files = {name: runtime_file(t, name).read_bytes() for name in t.startup_files}
    ld = Template(runtime_file(t, "link.ld.in").read_text()).substitute(
        flash_origin=f"0x{mem.flash_origin:08X}", flash_bytes=str(flash_bytes),
        ram_origin=f"0x{mem.ram_origin:08X}", ram_bytes=str(sram_bytes),
        stack_bytes=str(DEFAULT_STACK_BYTES if stack_bytes is None else stack_bytes),
        stack_note=reserves.AUTO_NOTE if stack_bytes is None else "",
        heap_bytes=str(DEFAULT_HEAP_BYTES if heap_bytes is None else heap_bytes),
        heap_note=reserves.AUTO_NOTE if heap_bytes is None else "")
    files["link.ld"] = ld
    opt_flags = " ".join((opt,) + fpu_defines(t))
    files["config.mk"] = (f"# generated by edgetrain.backends.c.cortexm for {t.name}\n"
                          + "".join(f"{k} = {v}\n" for k, v in t.make_vars) + f"OPT = {opt_flags}\n")
    files["samples.h"] = samples_source(list(inputs), list(labels))
    files["README.md"] = Template(runtime_file(t, "README.md.in").read_text()).substitute(
        {k.lower(): v for k, v in t.make_vars}, target=t.name, samples=len(inputs),
        flash_bytes=f"{flash_bytes:,}", flash_origin=f"0x{mem.flash_origin:08X}",
        sram_bytes=f"{sram_bytes:,}", ram_origin=f"0x{mem.ram_origin:08X}")
    return files


def fpu_defines(t: Target) -> tuple[str, ...]:
    """Defines naming the target's core to the runtime headers (its record's `defines`):
    -DET_FPV5 for the Cortex-M7's FPv5 (VRINTM floors in one instruction; gcc cannot tell it
    from the M4's FPv4 by its predefined macros). Compiled alongside the optimisation level
    (config.mk's OPT)."""
    return tuple(t.defines)


def build(out_dir, jobs: int = 1, extra_cflags: Sequence[str] = (), target: Union[str, Target, None] = None) -> Path:
    """`make` in out_dir; returns firmware.elf. A program that does not fit the flash or SRAM
    region fails here (the linker's message, "region `RAM' overflowed by ...", is in the
    error). The reserves link.ld marks auto are then sized and the firmware relinked: the
    stack to the static worst case of the linked code (stack_bound.py; where the code has
    none, both keep their defaults) plus the guard word, the heap to 0 when nothing linked
    allocates; a stack reserve given explicitly below that worst case is refused. `target`: the
    project's target (None: the one its config.mk names), for the tools it needs."""
    out = Path(out_dir)
    t = resolve(target if target is not None else project_target(out))
    missing = [n for n in (t.toolchain.tool("gcc"), "make") if shutil.which(n) is None]
    if missing:
        raise CortexMError(f"cannot build the firmware: {', '.join(missing)} not found "
                           f"(Debian: apt-get install {t.toolchain.packages} make)")
    cmd = ["make", "-C", str(out), f"-j{jobs}", "firmware.elf"]
    if extra_cflags:
        cmd.append("EXTRA_CFLAGS=" + " ".join(extra_cflags))
    ld = out / "link.ld"
    first = ld.read_text()
    r = _make(cmd, out)
    if r.returncode != 0:
        if "overflowed" not in r.stderr or reserves.AUTO_NOTE not in first:
            raise CortexMError(f"firmware build failed in {out}:\n{r.stdout[-4000:]}{r.stderr[-8000:]}")
        # with the default reserves it does not fit: link it without them to size them
        ld.write_text(reserves.set_auto(first, stack=0, heap=0))
        if _make(cmd, out).returncode != 0:
            ld.write_text(first)
            raise CortexMError(f"firmware build failed in {out}:\n{r.stdout[-4000:]}{r.stderr[-8000:]}")
    elf = out / "firmware.elf"
    try:
        want, bound, why = reserves.sized(first, elf)
    except reserves.ReserveError as err:
        raise CortexMError(f"firmware in {out}: {err}") from None
    if want != ld.read_text():
        ld.write_text(want)
        r = _make(cmd, out)
        if r.returncode != 0:
            at = f"at its static bound, {bound.describe()}" if bound else f"at the default ({why})"
            raise CortexMError(f"firmware build failed in {out} with its stack reserve {at}:\n"
                               f"{r.stdout[-4000:]}{r.stderr[-8000:]}")
    return elf


def project_target(out_dir) -> str:
    """The target a firmware project was written for (its config.mk's first line)."""
    first = (Path(out_dir) / "config.mk").read_text().splitlines()[0]
    prefix = "# generated by edgetrain.backends.c.cortexm for "
    if not first.startswith(prefix):
        raise CortexMError(f"{out_dir}/config.mk does not name its target")
    return first[len(prefix):].strip()


def _make(cmd, out):
    try:
        return run_tool(cmd, timeout=BUILD_TIMEOUT)
    except ToolTimeout as err:
        raise CortexMError(f"firmware build in {out}: {err}") from None


@dataclass(frozen=True)
class FirmwareRun:
    """A firmware built and run under QEMU: the project, its run and its size report."""
    out_dir: Path
    run: QemuRun
    size: FirmwareSize


def run_firmware(prog, out_dir, target: Union[str, Target] = "cortex-m4", samples: Sequence = (), *,
                 icount: bool = True) -> FirmwareRun:
    """Emit `prog` as a `target` firmware training on `samples`, link it (CortexMError if it
    does not fit 256 KB SRAM / 1 MB flash), run it under QEMU, and attach the size report
    (flash, SRAM, measured stack high-water mark, instructions and estimated cycles per step) to the program:
    `prog.firmware` (Program.record_firmware)."""
    t = resolve(target)
    d = emit_firmware(prog, out_dir, t, samples)
    elf = build(d, target=t)
    run = run_qemu(d, t, icount=icount)
    if run.exit_code != 0:
        raise CortexMError(f"the firmware exited with {run.exit_code}: {' | '.join(run.lines[-5:])}")
    size = firmware_size(elf, run)
    prog.record_firmware(size)
    return FirmwareRun(Path(d), run, size)
