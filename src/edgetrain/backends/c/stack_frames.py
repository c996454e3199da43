"""What the static stack bound reads from a firmware's disassembly, for every ISA: a function's
frame (bytes, whether it is dynamic, its callees) and the functions of `objdump -d` output
(stack_bound.py reads Thumb-2 frames, stack_bound_riscv.py RISC-V ones)."""
from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable, Optional

FUNC = re.compile(r"^([0-9a-f]+) <([^>]+)>:$")
INSN = re.compile(r"^\s*[0-9a-f]+:\s+(\S+)\s*(.*)$")


@dataclass(frozen=True)
class Frame:
    bytes: int  # pushes and sp subtractions, summed
    dynamic: bool = False  # sp lowered by a register's value
    callees: tuple[str, ...] = ()


def function_blocks(text: str) -> tuple[list[tuple[int, str]], dict[str, list[tuple[str, str]]]]:
    """([(start address, function)] by address, {function: [(mnemonic, operands)]}) of
    `objdump -d --no-show-raw-insn` output."""
    funcs: list[tuple[int, str]] = []
    body: dict[str, list[tuple[str, str]]] = {}
    name = None
    for line in text.splitlines():
        m = FUNC.match(line)
        if m:
            name = m.group(2)
            funcs.append((int(m.group(1), 16), name))
            body[name] = []
            continue
        m = INSN.match(line)
        if m and name is not None:
            body[name].append((m.group(1), m.group(2)))
    return sorted(funcs), body


def owner_of(starts: list[tuple[int, str]]) -> Callable[[int], Optional[str]]:
    """The function whose code holds an address, from `function_blocks`' (start, name) pairs
    in address order (None below the first)."""
    addrs = [a for a, _ in starts]

    def owner(addr: int) -> Optional[str]:
        i = bisect_right(addrs, addr) - 1
        return starts[i][1] if i >= 0 else None

    return owner
