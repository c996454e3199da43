"""Cortex-M firmware projects for emitted training programs.

`write_project(out_dir, target, samples)` adds to a directory holding an emitted program
(model.c / model.h and their runtime headers) what makes it a bare-metal firmware for a
Cortex-M4 or Cortex-M7: startup code (vector table, .data/.bss set-up, FPU on, stack painting),
a linker script with a 1 MiB flash and a 256 KiB SRAM region (a program that does not fit
fails to link), output on the board's UART and exit through its watchdog (board.c), a main.c
that trains on the samples embedded in flash and prints `step <i> loss <value>` per step, and a
Makefile (`make`, `make run`, `make size`). `build` runs make, `run_qemu` runs the firmware on
QEMU's MPS2 board of the target (optionally counting instructions per step, by class and per
function, with a small TCG plugin, and estimating cycles from them: cycles.py),
`firmware_size` reports flash and SRAM from the ELF's sections.

The firmware runs confined: without semihosting (which would let it open host files and run
host commands: SYS_OPEN, SYS_SYSTEM), so all it can do is compute, print on the UART and end
with a status; a semihosting call is a fault there (exit ET_EXIT_FAULT). QEMU runs under its
seccomp sandbox (no exec, no privilege change) in a fresh empty directory, as defence in depth.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from string import Template
from types import MappingProxyType
from typing import Optional, Sequence

import numpy as np

from ...devices.targets import MCU_FLASH_BYTES, MCU_SRAM_BYTES, TARGETS as ALL_TARGETS, Target
from . import cycles, firmware_reserves as reserves
from .cache import cache_path
from .layout import CBackendError
from .stack_bound import StackBoundError, stack_bound
from .staging import write_files
from .toolchain import ToolTimeout, run_tool

RUNTIME_DIR = Path(__file__).parent / "runtime" / "cortexm"
# Copied verbatim into the project (main.c includes model.h and the generated samples.h).
RUNTIME_FILES = ("startup.c", "main.c", "board.c", "board.h", "cortexm.h", "et_format.h", "Makefile")

# Both QEMU boards (mps2-an386, mps2-an500) have 4 MiB of RAM at each of these addresses
# (ZBT SSRAM1 at 0, ZBT SSRAM2/3 at 0x20000000); the regions are cut to the device budget.
FLASH_ORIGIN = 0x0000_0000
RAM_ORIGIN = 0x2000_0000
# the regions' default sizes (each target's in devices.targets: the paper's STM32F746 has 1 MB
# flash and 320 KB SRAM, of which the paper budgets 256 KB)
FLASH_BYTES = MCU_FLASH_BYTES
SRAM_BYTES = MCU_SRAM_BYTES
# Stack and heap reserves of a project linked by `make` alone; `build` sizes them
# (firmware_reserves.py) unless the project was written with explicit ones.
DEFAULT_STACK_BYTES = reserves.DEFAULT_STACK_BYTES
DEFAULT_HEAP_BYTES = reserves.DEFAULT_HEAP_BYTES
DEFAULT_OPT = "-O2"
QEMU_TIMEOUT_S = 600.0
#: seconds `make firmware.elf` may take; past it its process group (make and the compilers) is killed
BUILD_TIMEOUT = 900
ICOUNT_MARKER = "et_icount_mark"
# QEMU's seccomp filter: no obsolete system calls, no setuid/setgid, no fork/exec, no
# scheduler or resource-limit changes (the guest has no way to the host without semihosting;
# this bounds what a bug in QEMU's device models could do).
QEMU_SANDBOX = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

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


# --- tools -----------------------------------------------------------------------------------
TOOLS = ("arm-none-eabi-gcc", "arm-none-eabi-size", "arm-none-eabi-readelf", "arm-none-eabi-nm",
         "qemu-system-arm", "make")


def missing_tools() -> list[str]:
    """The tools building and running a firmware needs that are not on PATH (Debian:
    gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm make)."""
    return [t for t in TOOLS if shutil.which(t) is None]


# --- samples ---------------------------------------------------------------------------------
def format_step_line(step: int, loss: float) -> str:
    """The line the firmware (and the host driver) prints after a step: `step` is the number
    of steps done (1 after the first); the loss is C's "%.9g" of the float32 value, which
    round-trips (Python's %-formatting of the same double gives the same text)."""
    return "step %d loss %.9g" % (step, float(np.float32(loss)))


# --- project ---------------------------------------------------------------------------------
def emit_firmware(prog, out_dir, target: str = "cortex-m4", samples: Sequence = (), weight_banks: int = 1,
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


def firmware_project_files(prog, target: str = "cortex-m4", samples: Sequence = (), weight_banks: int = 1,
                           graphs: tuple = ("train",), **project) -> dict:
    """{file name: text or bytes} of emit_firmware's project, nothing written."""
    from .emit import emit_sources
    from .project import program_samples

    get_target(target)
    if getattr(prog, "page_store", None) is not None:
        raise CortexMError("this program runs a paging schedule (page_in / page_out); the C backend reaches "
                           "secondary storage on the host build only (a file, backends/c/runtime/et_page.h)")
    from ..capabilities import check_program

    check_program(prog, "cortex-m")  # an op without a kernel: refused before anything is written
    if len(prog.inputs) != 1:
        raise CortexMError(f"the firmware drives models with one input; this one takes {len(prog.inputs)}")
    # The firmware runs the train graph only, so by default the arena is the train graph's plan
    # (at 128x128 the predict graph, planned without row streaming, alone needs about 240 KB).
    files = emit_sources(prog, embed_weights=True, graphs=tuple(graphs), weight_banks=weight_banks)
    files.update(firmware_files(target, program_samples(prog, samples), **project))
    return files



def write_project(out_dir, target: str = "cortex-m4", samples=None, *, stack_bytes: Optional[int] = None,
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


def firmware_files(target: str = "cortex-m4", samples=None, *, stack_bytes: Optional[int] = None,
                   heap_bytes: Optional[int] = None, opt: str = DEFAULT_OPT,
                   flash_bytes: Optional[int] = None, sram_bytes: Optional[int] = None) -> dict:
    """{file name: text or bytes} of the firmware files write_project writes (flash_bytes,
    sram_bytes: the linker's regions, by default the target's)."""
    from .project import samples_source

    t = get_target(target)
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
    files = {name: (RUNTIME_DIR / name).read_bytes() for name in RUNTIME_FILES}
    ld = Template((RUNTIME_DIR / "link.ld.in").read_text()).substitute(
        flash_origin=f"0x{FLASH_ORIGIN:08X}", flash_bytes=str(flash_bytes),
        ram_origin=f"0x{RAM_ORIGIN:08X}", ram_bytes=str(sram_bytes),
        stack_bytes=str(DEFAULT_STACK_BYTES if stack_bytes is None else stack_bytes),
        stack_note=reserves.AUTO_NOTE if stack_bytes is None else "",
        heap_bytes=str(DEFAULT_HEAP_BYTES if heap_bytes is None else heap_bytes),
        heap_note=reserves.AUTO_NOTE if heap_bytes is None else "")
    files["link.ld"] = ld
    opt_flags = " ".join((opt,) + fpu_defines(t))
    files["config.mk"] = (f"# generated by edgetrain.backends.c.cortexm for {t.name}\n"
                          f"CPU = {t.cpu}\nFPU = {t.fpu}\nMACHINE = {t.machine}\nOPT = {opt_flags}\n")
    files["samples.h"] = samples_source(list(inputs), list(labels))
    return files


def fpu_defines(t: Target) -> tuple[str, ...]:
    """Defines naming the target's FPU to the runtime headers: -DET_FPV5 for an FPv5 (the
    Cortex-M7's: VRINTM floors in one instruction; gcc cannot tell it from the M4's FPv4 by
    its predefined macros). Compiled alongside the optimisation level (config.mk's OPT)."""
    return ("-DET_FPV5",) if t.fpu.startswith("fpv5") else ()


def build(out_dir, jobs: int = 1, extra_cflags: Sequence[str] = ()) -> Path:
    """`make` in out_dir; returns firmware.elf. A program that does not fit the flash or SRAM
    region fails here (the linker's message, "region `RAM' overflowed by ...", is in the
    error). The reserves link.ld marks auto are then sized and the firmware relinked: the
    stack to the static worst case of the linked code (stack_bound.py; where the code has
    none, both keep their defaults) plus the guard word, the heap to 0 when nothing linked
    allocates; a stack reserve given explicitly below that worst case is refused."""
    missing = [t for t in ("arm-none-eabi-gcc", "make") if shutil.which(t) is None]
    if missing:
        raise CortexMError(f"cannot build the firmware: {', '.join(missing)} not found "
                           "(Debian: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi make)")
    out = Path(out_dir)
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


def _make(cmd, out):
    try:
        return run_tool(cmd, timeout=BUILD_TIMEOUT)
    except ToolTimeout as err:
        raise CortexMError(f"firmware build in {out}: {err}") from None


# --- running ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class QemuRun:
    exit_code: int  # the firmware's status: its last line, `edgetrain: exit <status>`
    lines: tuple[str, ...]  # the firmware's output lines
    losses: tuple[float, ...]  # from the `step <i> loss <v>` lines
    stack_high_water: Optional[int]  # bytes, measured by stack painting
    stack_reserve: Optional[int]
    instructions_per_step: Optional[tuple[int, ...]]  # guest instructions of each step (icount=True)
    instructions_total: Optional[int]  # from reset to the end of the last step (icount=True)
    # (counts are per translation block entered: a block left early by an exception still
    # counts whole; training code raises none)
    counts_per_step: Optional[tuple[cycles.StepCounts, ...]] = None  # by class and per function (icount=True)
    cycles_per_step: Optional[tuple[float, ...]] = None  # estimated with the target's table (cycles.TIMINGS)

    @property
    def step_lines(self) -> tuple[str, ...]:
        return tuple(l for l in self.lines if l.startswith("step "))


_STEP_RE = re.compile(r"^step (\d+) loss (\S+)$")
# board.c's last line: the firmware's exit status
_EXIT_RE = re.compile(r"^edgetrain: exit (-?\d+)$")
_STACK_RE = re.compile(r"^stack high water (\d+) of (\d+) bytes$")


def _plugin_path() -> Path:
    """The instruction-count plugin, built with the host cc into the cache (keyed by its
    source's hash). It also exports its decoder, et_decode, for tests (ctypes)."""
    src = RUNTIME_DIR / "icount_plugin.c"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    cache = cache_path("qemu")
    so = cache / f"qemu-icount-{digest}.so"
    if so.exists():
        return so
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise CortexMError("instruction counting needs a host C compiler (cc) to build the QEMU plugin")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = so.with_suffix(f".{os.getpid()}.tmp")
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        raise CortexMError(f"building the QEMU instruction-count plugin failed:\n{r.stderr}")
    os.replace(tmp, so)
    return so


def _symbol_address(elf: Path, symbol: str) -> int:
    r = subprocess.run(["arm-none-eabi-nm", str(elf)], capture_output=True, text=True, check=True)
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == symbol:
            return int(parts[0], 16) & ~1  # clear the Thumb bit
    raise CortexMError(f"{elf} has no symbol {symbol}")


@lru_cache(maxsize=None)
def _qemu_has_sandbox(qemu: str) -> bool:
    """Whether this QEMU was built with seccomp (Debian's is; macOS has none): `-sandbox` is
    parsed before `-version` exits, and refused by a QEMU without it."""
    r = subprocess.run([qemu, "-sandbox", "on", "-version"], capture_output=True, text=True)
    return r.returncode == 0


def qemu_command(target: str, elf) -> list[str]:
    """The QEMU command line that runs `elf` confined: console on UART0 (stdout), semihosting
    off, the watchdog's reset ending the emulation (board.c's exit; a reset the firmware asks
    for through SYSRESETREQ still restarts it), seccomp on where QEMU has it."""
    t = get_target(target)
    qemu = shutil.which("qemu-system-arm")
    if qemu is None:
        raise CortexMError("cannot run the firmware: qemu-system-arm not found (Debian: apt-get install qemu-system-arm)")
    cmd = [qemu, "-M", t.machine, "-nographic", "-monitor", "none", "-serial", "stdio",
           "-semihosting-config", "enable=off", "-watchdog-action", "poweroff"]
    if _qemu_has_sandbox(qemu):
        cmd += ["-sandbox", QEMU_SANDBOX]
    return cmd + ["-kernel", str(Path(elf).resolve())]


def run_qemu(out_dir, target: str = "cortex-m4", *, icount: bool = False,
             timeout: float = QEMU_TIMEOUT_S) -> QemuRun:
    """Runs out_dir/firmware.elf on the target's QEMU MPS2 board, confined (`qemu_command`):
    its UART output becomes the run's lines and its last line `edgetrain: exit <status>` the
    exit code; a firmware that ends without that line, or runs past `timeout` seconds, raises
    CortexMError. QEMU's working directory is a fresh empty one. With `icount`, a TCG plugin
    (built here with the host cc) counts the guest instructions of each training step, by
    class and per function (counts_per_step), and the cycles are estimated from them with the
    target's cost table (cycles_per_step; QEMU executes instructions, not cycles: cycles.py
    says what the estimate leaves out)."""
    elf = Path(out_dir) / "firmware.elf"
    cmd = qemu_command(target, elf)
    with tempfile.TemporaryDirectory(prefix="et-qemu-") as tmp:
        marks_file = Path(tmp) / "marks.txt"
        workdir = Path(tmp) / "cwd"
        workdir.mkdir()
        if icount:
            marker = _symbol_address(elf, ICOUNT_MARKER)
            names = cycles.write_symbols(Path(tmp) / "symbols.txt", cycles.function_symbols(elf))
            cmd[1:1] = ["-plugin", f"{_plugin_path()},marker=0x{marker:x},out={marks_file},"
                                   f"symbols={Path(tmp) / 'symbols.txt'}"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=workdir,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            raise CortexMError(f"QEMU did not finish in {timeout:.0f} s: {out[-2000:]}") from None
        marks = cycles.parse_marks(marks_file.read_text(), names) if icount and marks_file.exists() else None
    lines = [l.rstrip("\r") for l in r.stdout.splitlines()]
    exits = [i for i, l in enumerate(lines) if _EXIT_RE.match(l)]
    if not exits:
        tail = " | ".join(lines[-5:]) or "no output"
        raise CortexMError(f"the firmware ended without reporting an exit status (QEMU exit {r.returncode}); "
                           f"last lines: {tail}; QEMU: {r.stderr[-2000:].strip()}")
    exit_code = int(_EXIT_RE.match(lines[exits[-1]]).group(1))
    lines = tuple(l for i, l in enumerate(lines) if i not in exits)
    losses, hw, reserve = [], None, None
    for l in lines:
        m = _STEP_RE.match(l)
        if m:
            losses.append(float(m.group(2)))
            continue
        m = _STACK_RE.match(l)
        if m:
            hw, reserve = int(m.group(1)), int(m.group(2))
    per_step = total = counts = estimates = None
    if marks:
        # marks: the running counts before and after each step (main.c's et_icount_mark)
        counts = cycles.step_counts(marks)
        per_step = tuple(s.instructions for s in counts)
        total = marks[-1].instructions
        if target in cycles.TIMINGS:
            estimates = tuple(cycles.timing(target).cycles(s.total) for s in counts)
    return QemuRun(exit_code, lines, tuple(losses), hw, reserve, per_step, total, counts, estimates)


# --- size report -----------------------------------------------------------------------------
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
    """name -> (address, size, type) of the allocated sections (arm-none-eabi-readelf -S)."""
    r = subprocess.run(["arm-none-eabi-readelf", "-S", "-W", str(elf)], capture_output=True, text=True)
    if r.returncode != 0:
        raise CortexMError(f"readelf failed on {elf}: {r.stderr}")
    out = {}
    row = re.compile(r"^\s*\[\s*\d+\]\s+(\S+)\s+(\S+)\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+\S+\s+(\S*)")
    for line in r.stdout.splitlines():
        m = row.match(line)
        if m and "A" in m.group(5):
            out[m.group(1)] = (int(m.group(3), 16), int(m.group(4), 16), m.group(2))
    return out


def firmware_size(elf, run: Optional[QemuRun] = None) -> FirmwareSize:
    """Flash and SRAM of a linked firmware (from its section headers), with the stack
    high-water mark and instructions per step of `run` when given."""
    secs = _sections(Path(elf))
    text = rodata = data = bss = heap = stack = 0
    flash = 0
    for name, (addr, size, typ) in secs.items():
        in_ram = RAM_ORIGIN <= addr < RAM_ORIGIN + SRAM_BYTES * 16
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
    sram = sum(size for addr, size, _ in secs.values() if RAM_ORIGIN <= addr)
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
                        instructions_per_step=ips, cycles_per_step=cps)


@dataclass(frozen=True)
class FirmwareRun:
    """A firmware built and run under QEMU: the project, its run and its size report."""
    out_dir: Path
    run: QemuRun
    size: FirmwareSize


def run_firmware(prog, out_dir, target: str = "cortex-m4", samples: Sequence = (), *,
                 icount: bool = True) -> FirmwareRun:
    """Emit `prog` as a `target` firmware training on `samples`, link it (CortexMError if it
    does not fit 256 KB SRAM / 1 MB flash), run it under QEMU, and attach the size report
    (flash, SRAM, measured stack high-water mark, instructions and estimated cycles per step) to the program:
    `prog.memory.firmware` (Program.record_firmware)."""
    d = emit_firmware(prog, out_dir, target, samples)
    elf = build(d)
    run = run_qemu(d, target, icount=icount)
    if run.exit_code != 0:
        raise CortexMError(f"the firmware exited with {run.exit_code}: {' | '.join(run.lines[-5:])}")
    size = firmware_size(elf, run)
    prog.record_firmware(size)
    return FirmwareRun(Path(d), run, size)
