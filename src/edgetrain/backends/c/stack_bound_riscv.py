"""The frames and calls of a RISC-V firmware's functions, read from `objdump -d` (stack_bound.py
computes the bound from them, as for the Cortex-M).

A frame is the sum of the function's stack-pointer decrements: `addi sp,sp,-N` (objdump prints
`add sp,sp,-N`), or `add sp,sp,rX` / `sub sp,sp,rX` with rX a constant the function loaded
(`li`, `lui` and `addi` on it) for frames past the 12-bit immediate; `sub sp,sp,rX` / `add sp,sp,rX` by any other register is a dynamic frame
(gcc's variable-length arrays and alloca). Setting sp from another register or from memory
(`mv sp, rX`, `lw sp, ...`, `add sp, s0, -N`) is gcc setting it back to a value it had (the end
of a block-scoped buffer's life, the epilogue from the frame pointer): it lowers nothing. Any
other instruction writing sp is a dynamic frame. Its callees are the functions a `jal` (a call), a `j` or a branch
into another function (a tail call), or a `jalr` whose target objdump resolves (an unrelaxed
`call`: auipc + jalr) lands in; `jalr` / `jr` through a register (other than the return,
`ret` / `jr ra`) is a call through a pointer, except a switch's jump table: `lw rX, ...` then
`add rX, rX, rBase` then `jr rX` (gcc's tables of offsets from the table's address, which
libgcc's soft-float division uses; a pointer loaded from memory is not added to a base). The
firmware's own code is compiled with -fno-jump-tables (its Makefile). Code built with -msave-restore (picolibc's) saves its registers through libgcc's millicode:
`jal t0, __riscv_save_N` lowers sp by 16 * ceil((N + 1) / 4) bytes (ra and s0..s(N-1), in
16-byte steps: libgcc's save-restore.S) and returns through `jr t0`; those bytes are the caller's
frame (its body runs on them), and `__riscv_restore_N`, reached by a tail jump, raises sp. The
hart pushes nothing on a trap: the
trap handler's frame (et_trap_entry, crt0.S) is its own code's.
"""
from __future__ import annotations

import re
from typing import Optional

from .stack_frames import Frame, function_blocks, owner_of

#: the RISC-V firmware's trap entry (crt0.S: it jumps to startup.c's et_trap_handler)
TRAP_ENTRY = "et_trap_entry"
#: a trap stacks nothing (the handler saves what it uses in its own frame)
EXCEPTION_FRAME_BYTES = 0

_TARGET = re.compile(r"(?:^|[\s,])([0-9a-f]+) <[^>]+>")
_NO_DEST = re.compile(r"^(s[bhwd]|fs[wd]|c\.s[wd]|b\w*|j|jr|ret|csrw|csrs|csrc|csrwi|csrsi|csrci|fence.*|wfi|ecall|ebreak"
                      r"|mret|nop)$")


_SAVE = re.compile(r"<__riscv_save_(\d+)>")


def millicode_save_bytes(n: int) -> int:
    """The bytes `__riscv_save_<n>` lowers sp by (ra and s0..s(n-1), 16-byte aligned)."""
    return 16 * -(-(n + 1) // 4)


def _int(text: str) -> Optional[int]:
    try:
        return int(text, 0)
    except ValueError:
        return None


def _jump_table(op: str, ops: list[str], prev: list[tuple[str, list[str]]]) -> bool:
    """Whether `jr rX` ends a switch's jump table: `lw rX, ...; add rX, rX, rBase; jr rX`."""
    if op != "jr" or len(ops) != 1 or len(prev) < 2:
        return False
    (op1, ops1), (op2, ops2) = prev
    r = ops[0]
    return op1 == "lw" and ops1[:1] == [r] and op2 == "add" and len(ops2) == 3 and ops2[:2] == [r, r]


def parse_disassembly(text: str) -> dict[str, Frame]:
    """{function: Frame} of RISC-V `objdump -d --no-show-raw-insn` output (see the module doc)."""
    starts, body = function_blocks(text)
    owner = owner_of(starts)

    out = {}
    for name, insns in body.items():
        size, dynamic, callees = 0, False, []
        consts: dict[str, int] = {}
        prev: list[tuple[str, list[str]]] = []  # the two instructions before this one
        for mnemonic, args in insns:
            code, _, comment = args.partition("#")
            ops = [a.strip() for a in code.split(",")] if code.strip() else []
            op = mnemonic
            if op in ("add", "addi", "c.addi16sp", "c.addi") and ops[:2] == ["sp", "sp"] and len(ops) == 3:
                imm = _int(ops[2])
                if imm is not None:
                    size += max(0, -imm)
                elif ops[2] in consts:
                    size += max(0, -consts[ops[2]])
                else:
                    dynamic = True
            elif op == "sub" and ops[:2] == ["sp", "sp"] and len(ops) == 3:
                if ops[2] in consts:
                    size += max(0, consts[ops[2]])
                else:
                    dynamic = True
            elif op in ("add", "addi", "mv", "lw") and ops[:1] == ["sp"]:
                pass  # sp set back to a value it had (see the module doc)
            elif ops and ops[0] == "sp" and not _NO_DEST.match(op):
                dynamic = True  # sp computed some other way
            elif op == "jal" and ops[:1] == ["t0"] and _SAVE.search(code):
                size += millicode_save_bytes(int(_SAVE.search(code).group(1)))  # the caller's frame
            elif op in ("jal", "j", "tail", "call") or (op.startswith("b") and op not in ("bset", "bclr")):
                t = _TARGET.search(code)
                if t:
                    callee = owner(int(t.group(1), 16))
                    if callee is not None and callee != name:
                        callees.append(callee)
            elif op == "jr" and ops == ["t0"]:
                pass  # the millicode's return (t0: the alternate link register)
            elif op in ("jalr", "jr"):
                t = _TARGET.search(comment)
                if t:  # auipc + jalr: objdump resolves the target
                    callee = owner(int(t.group(1), 16))
                    if callee is not None and callee != name:
                        callees.append(callee)
                elif not (op == "jr" and ops == ["ra"]) and not _jump_table(op, ops, prev):
                    callees.append("<indirect>")
            # constants loaded into registers (for the large frames' sp arithmetic)
            if op == "li" and len(ops) == 2 and _int(ops[1]) is not None:
                consts[ops[0]] = _int(ops[1])
            elif op == "lui" and len(ops) == 2 and _int(ops[1]) is not None:
                v = (_int(ops[1]) << 12) & 0xFFFFFFFF
                consts[ops[0]] = v - (1 << 32) if v >= 1 << 31 else v
            elif op in ("add", "addi") and len(ops) == 3 and ops[0] == ops[1] and ops[0] in consts \
                    and _int(ops[2]) is not None:
                consts[ops[0]] += _int(ops[2])
            elif ops and not _NO_DEST.match(op):
                consts.pop(ops[0], None)
            prev = (prev + [(op, ops)])[-2:]
        out[name] = Frame(size, dynamic, tuple(dict.fromkeys(callees)))
    return out
