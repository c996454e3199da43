"""The worst-case stack of a firmware, found statically from its linked ELF (Cortex-M here;
RISC-V's frames and calls are read by stack_bound_riscv.py, the bound is the same).

Every function's frame is read from its code (`objdump -d`): its pushes (4 bytes a core or
single-precision register, 8 a double one) and its stack-pointer subtractions summed, which is
the frame on its one path through a prologue and a bound when there are several (gcc's own
`-fstack-usage` leaves out the 16 bytes of argument registers a function taking a structure
by value stores below its frame: the measured high water exceeded it); its callees are the
functions its `bl` and branches land in (a tail branch counted as a call). The firmware's own
code and the C library's and libgcc's functions it calls (memcpy, the soft-float helpers) are
read the same way. The bound is the deepest call chain from the reset handler plus the
deepest exception handler of the vector table on top of it, with the frame the core stacks on
exception entry (26 words with the FPU's registers).

There is no bound, and `StackBoundError` says why, when a frame's size is dynamic (a
subtraction from sp by a register: a variable-length array, alloca), a call goes through a
register, or a function calls itself through any chain. The kernels' fixed stack buffers are
frames like any other; cortexm.build sizes the stack reserve of link.ld to this bound, so a
program whose SRAM with its stack does not fit fails to link, and the tests check the QEMU
run's painted high-water mark against it.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .stack_frames import FUNC, Frame, function_blocks, owner_of  # noqa: F401 (Frame: part of this module's API)

#: the exception frame with the FPU's registers: r0-r3, r12, lr, pc, xPSR, s0-s15, FPSCR and an
#: alignment word (Armv7-M ARM, B1.5.7)
EXCEPTION_FRAME_BYTES = 26 * 4


class StackBoundError(Exception):
    """The firmware's stack has no static bound (see the module doc)."""


@dataclass(frozen=True)
class StackBound:
    """bytes: the worst case; chain: the deepest call chain from the reset handler (function
    names, outermost first) and its bytes; handler: the deepest exception handler's chain and
    its bytes with the exception frame."""
    bytes: int
    chain: tuple[str, ...]
    chain_bytes: int
    handler: tuple[str, ...]
    handler_bytes: int

    def describe(self) -> str:
        return (f"{self.bytes} B: {' > '.join(self.chain)} ({self.chain_bytes} B)"
                + (f" + exception {' > '.join(self.handler)} ({self.handler_bytes} B)" if self.handler else ""))


# --- the ELF's disassembly -------------------------------------------------------------------
_REGLIST = re.compile(r"\{([^}]*)\}")
_IMM = re.compile(r"#(\d+)")
_TARGET = re.compile(r"^([0-9a-f]+) <[^>]+>")
_PREDEC = re.compile(r"\[sp, #-(\d+)\]!")
_SP_DEST = re.compile(r"^sp,\s*(sp,\s*)?")


def _reg_count(regs: str) -> int:
    n = 0
    for part in regs.split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-")
            n += int(b.strip()[1:]) - int(a.strip()[1:]) + 1
        elif part:
            n += 1
    return n


def parse_disassembly(text: str) -> dict[str, Frame]:
    """{function: Frame} of Thumb-2 `objdump -d --no-show-raw-insn` output (see the module doc):
    the callees are the functions whose code holds the target address of a `bl` or a branch
    (found by address, not by objdump's label, which may name an absolute symbol); a call
    through a register is the callee "<indirect>"."""
    starts, body = function_blocks(text)
    owner = owner_of(starts)

    out = {}
    for name, insns in body.items():
        size, dynamic, callees = 0, False, []
        for mnemonic, args in insns:
            op = mnemonic.split(".")[0]
            regs = _REGLIST.search(args)
            if (op in ("push", "vpush") or (op in ("stmdb", "stmfd", "vstmdb") and args.startswith("sp!"))) and regs:
                per = 8 if regs.group(1).strip().startswith("d") else 4
                size += per * _reg_count(regs.group(1))
            elif op.startswith("str") and (w := _PREDEC.search(args)):
                size += int(w.group(1))  # str lr, [sp, #-4]!
            elif op in ("sub", "subw") and _SP_DEST.match(args):
                imm = _IMM.match(_SP_DEST.sub("", args, count=1).strip())
                if imm:
                    size += int(imm.group(1))
                else:
                    dynamic = True
            elif op in ("blx", "bx") and not _TARGET.search(args):
                if op == "blx" or args.split()[0] != "lr":  # a call, or a tail call, through a register
                    callees.append("<indirect>")
            elif op in ("mov", "ldr") and args.startswith("pc,") and "[sp" not in args:
                callees.append("<indirect>")  # a jump through a register or memory (ldr pc, [sp]...: a return)
            elif op.startswith("b") and (t := _TARGET.search(args)):
                callee = owner(int(t.group(1), 16))
                if callee is not None and callee != name:
                    callees.append(callee)
        out[name] = Frame(size, dynamic, tuple(dict.fromkeys(callees)))
    return out


def _objdump(elf: Path) -> str:
    from .cortexm_target import elf_toolchain

    return elf_toolchain(elf).tool("objdump")


def disassemble(elf: Path) -> str:
    r = subprocess.run([_objdump(elf), "-d", "--no-show-raw-insn", str(elf)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise StackBoundError(f"objdump failed on {elf}: {r.stderr.strip()}")
    return r.stdout


def function_addresses(text: str) -> dict[int, str]:
    """{address: function} of `objdump -d` output (the name objdump heads the code with)."""
    return {int(m.group(1), 16): m.group(2) for m in map(FUNC.match, text.splitlines()) if m}


def vector_handlers(elf: Path, functions: Mapping[int, str]) -> list[str]:
    """The functions the vector table names, except the reset handler (entry 1)."""
    r = subprocess.run([_objdump(elf), "-s", "-j", ".isr_vector", str(elf)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise StackBoundError(f"{elf} has no vector table: {r.stderr.strip()}")
    words = []
    for line in r.stdout.splitlines():
        m = re.match(r"^ [0-9a-f]+ ((?:[0-9a-f]{8} ?){1,4})", line)
        if m:
            words += [int.from_bytes(bytes.fromhex(w), "little") for w in m.group(1).split()]
    return list(dict.fromkeys(functions[w & ~1] for w in words[2:] if w and (w & ~1) in functions))


# --- the bound ---------------------------------------------------------------------------------
def deepest(root: str, frames: Mapping[str, Frame]) -> tuple[int, tuple[str, ...]]:
    """(bytes, chain) of the deepest call chain from `root` (StackBoundError where there is
    none: see the module doc)."""
    memo: dict[str, tuple[int, tuple[str, ...]]] = {}
    active: list[str] = []

    def walk(name: str) -> tuple[int, tuple[str, ...]]:
        if name in memo:
            return memo[name]
        if name in active:
            raise StackBoundError(f"recursion: {' > '.join(active[active.index(name):] + [name])}; "
                                  f"no static stack bound")
        f = frames.get(name)
        if f is None:
            raise StackBoundError(f"{name}: called, but the ELF has no code for it")
        if f.dynamic:
            raise StackBoundError(f"{name} has a dynamic frame (a variable-length array or alloca); "
                                  f"no static stack bound")
        active.append(name)
        best: tuple[int, tuple[str, ...]] = (0, ())
        for c in f.callees:
            if c == "<indirect>":
                raise StackBoundError(f"{name} calls through a pointer; no static stack bound")
            best = max(best, walk(c), key=lambda t: t[0])
        active.pop()
        memo[name] = (f.bytes + best[0], (name,) + best[1])
        return memo[name]

    return walk(root)


def stack_bound(elf, root: str = "Reset_Handler") -> StackBound:
    """The worst-case stack of a linked firmware (see the module doc)."""
    elf = Path(elf)
    text = disassemble(elf)
    if _objdump(elf).startswith("riscv"):  # the trap entry of crt0.S; a trap stacks nothing
        from . import stack_bound_riscv as rv

        frames, handlers, frame_bytes = rv.parse_disassembly(text), [rv.TRAP_ENTRY], rv.EXCEPTION_FRAME_BYTES
    else:  # the vector table's handlers, on the exception frame with the FPU's registers
        frames, frame_bytes = parse_disassembly(text), EXCEPTION_FRAME_BYTES
        handlers = vector_handlers(elf, function_addresses(text))
    chain_bytes, chain = deepest(root, frames)
    handler_bytes, handler = 0, ()
    for h in handlers:
        b, c = deepest(h, frames)
        if b + frame_bytes > handler_bytes:
            handler_bytes, handler = b + frame_bytes, c
    return StackBound(chain_bytes + handler_bytes, chain, chain_bytes, handler, handler_bytes)
