"""Running a firmware on the QEMU board of its target (its record's emulator: the MPS2 boards of
the Cortex-M, the virt board of RISC-V), confined (no semihosting, seccomp,
a fresh empty working directory), optionally counting the instructions of each training step
by class and per function with a small TCG plugin and estimating cycles from them (cycles.py;
the plugin decodes Thumb-2 or RV32: the decoder of the target's runtime folder, `decoder_dir`).
The firmware's output lines, exit status, losses and stack high-water mark come back as a
QemuRun."""
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
from typing import Optional, Union

from . import cycles
from .cache import cache_path
from ...devices.targets import Target
from .cortexm_target import RUNTIME_DIR, RUNTIME_ROOT, CortexMError, elf_toolchain, resolve

QEMU_TIMEOUT_S = 600.0
ICOUNT_MARKER = "et_icount_mark"
#: the ISA's instruction decoder the plugin includes (one per runtime folder that has its own ISA)
DECODER = "icount_decode.h"
# QEMU's seccomp filter: no obsolete system calls, no setuid/setgid, no fork/exec, no
# scheduler or resource-limit changes (the guest has no way to the host without semihosting;
# this bounds what a bug in QEMU's device models could do).
QEMU_SANDBOX = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"


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


def decoder_dir(target: Union[str, Target] = "cortex-m4") -> Path:
    """The runtime folder whose icount_decode.h decodes the target's instructions: its own
    runtime folder's where it has one (runtime/riscv/: RV32), else runtime/cortexm/'s (Thumb-2)."""
    t = resolve(target)
    own = RUNTIME_ROOT / (t.runtime or "cortexm")
    return own if (own / DECODER).exists() else RUNTIME_DIR


def plugin_path(target: Union[str, Target] = "cortex-m4") -> Path:
    """The instruction-count plugin for the target's ISA (runtime/cortexm/icount_plugin.c with
    the decoder of `decoder_dir`), built with the host cc into the cache, keyed by both sources'
    hash. It also exports its decoder, et_decode, for tests (ctypes)."""
    src, dec = RUNTIME_DIR / "icount_plugin.c", decoder_dir(target)
    digest = hashlib.sha256(src.read_bytes() + (dec / DECODER).read_bytes()).hexdigest()[:16]
    cache = cache_path("qemu")
    so = cache / f"qemu-icount-{digest}.so"
    if so.exists():
        return so
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise CortexMError("instruction counting needs a host C compiler (cc) to build the QEMU plugin")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = so.with_suffix(f".{os.getpid()}.tmp")
    r = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-I", str(dec), "-o", str(tmp), str(src)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise CortexMError(f"building the QEMU instruction-count plugin failed:\n{r.stderr}")
    os.replace(tmp, so)
    return so


def _symbol_address(elf: Path, symbol: str) -> int:
    r = subprocess.run([elf_toolchain(elf).tool("nm"), str(elf)], capture_output=True, text=True, check=True)
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


def qemu_command(target: Union[str, Target], elf) -> list[str]:
    """The QEMU command line that runs `elf` confined: console on UART0 (stdout), semihosting
    off, the board's exit (the target's emulator args: on the MPS2 boards the watchdog's reset
    ends the emulation (board.c's exit; a reset the firmware asks for through SYSRESETREQ still
    restarts it); on virt, without OpenSBI, the test device), seccomp on where QEMU has it."""
    t = resolve(target)
    emu = t.emulator
    qemu = shutil.which(emu.binary)
    if qemu is None:
        raise CortexMError(f"cannot run the firmware: {emu.binary} not found (Debian: apt-get install {emu.packages})")
    cmd = [qemu, "-M", emu.machine, *(("-cpu", emu.cpu) if emu.cpu else ()), "-nographic", "-monitor", "none",
           "-serial", "stdio", "-semihosting-config", "enable=off", *emu.args]
    if _qemu_has_sandbox(qemu):
        cmd += ["-sandbox", QEMU_SANDBOX]
    return cmd + ["-kernel", str(Path(elf).resolve())]


def run_qemu(out_dir, target: Union[str, Target] = "cortex-m4", *, icount: bool = False,
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
    t = resolve(target)
    cmd = qemu_command(t, elf)
    with tempfile.TemporaryDirectory(prefix="et-qemu-") as tmp:
        marks_file = Path(tmp) / "marks.txt"
        workdir = Path(tmp) / "cwd"
        workdir.mkdir()
        if icount:
            marker = _symbol_address(elf, ICOUNT_MARKER)
            names = cycles.write_symbols(Path(tmp) / "symbols.txt", cycles.function_symbols(elf))
            cmd[1:1] = ["-plugin", f"{plugin_path(t)},marker=0x{marker:x},out={marks_file},"
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
        if t.cycle_table in cycles.TIMINGS:
            estimates = tuple(cycles.timing(t.cycle_table).cycles(s.total) for s in counts)
    return QemuRun(exit_code, lines, tuple(losses), hw, reserve, per_step, total, counts, estimates)
