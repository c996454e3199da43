"""One copy of each constant table of an emitted program.

A kernel emitter writes its layer's constants (requantization multipliers and shifts, scales,
index maps, parameter structs) as block-scoped `static const` declarations, one per line:

    {
        static const int32_t P_m[16] = {1073741824, ...};
        static const et_qconv_p P = {1, 8, ..., P_m, P_s, 0};
        et_qconv_rows(&P, ...);
    }

Emitted per call, the same table is repeated wherever its values recur: a layer's output
scales read by its weight and its bias gradient, the same parameter struct in the train,
forward and gradient graphs. `ConstPool.hoist` moves each such declaration to file scope
under a name of its own (`et_c<k>_<name>`), keyed by its type and initializer, so that equal
tables are emitted once; the block refers to the shared one. The values, their types and
`const` (flash on a microcontroller) stay as they were: the compiler sees the same
constants, so it specialises the kernels as before.

A declaration stays where it is when hoisting could change what a name means: its name is
declared twice in one block, or used before its declaration there (an outer name it shadows),
or its initializer names something of the block other than a table hoisted before it.
"""
from __future__ import annotations

import re

#: a block-scoped constant table, one per line: indent, type, name, array bounds, initializer
DECL = re.compile(r"^[ \t]*static const ([A-Za-z_]\w*) ([A-Za-z_]\w*)((?:\[\d*\])*) = (\{.*\});[ \t]*\n?", re.M)
#: an identifier (not the suffix of a number: 1.0f, 3u, 1e-05f)
IDENT = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
#: the prefix of the shared names (the runtime headers use no identifier starting with it)
PREFIX = "et_c"


def _uses(name: str) -> re.Pattern:
    """`name` as an identifier, not as a struct field (`.name`, `->name`)."""
    return re.compile(rf"(?<![\w.>])(?<!->){re.escape(name)}\b")


class ConstPool:
    """The file-scope constant tables of one model.c, in the order first met."""

    def __init__(self):
        self._by_key: dict[tuple, str] = {}
        self._decls: list[str] = []

    def __len__(self) -> int:
        return len(self._decls)

    def _name_for(self, ctype: str, name: str, dims: str, init: str) -> str:
        key = (ctype, dims, init)
        if key not in self._by_key:
            shared = f"{PREFIX}{len(self._decls)}_{name}"
            self._by_key[key] = shared
            self._decls.append(f"static const {ctype} {shared}{dims} = {init};")
        return self._by_key[key]

    def hoist(self, code: str) -> str:
        """`code` (one kernel's C block) with its constant tables moved into the pool and its
        uses of them renamed to the shared names."""
        decls = list(DECL.finditer(code))
        names = [m.group(2) for m in decls]
        renames: dict[str, str] = {}
        cut = []  # spans of the hoisted declarations
        for m in decls:
            ctype, name, dims, init = m.groups()
            if (names.count(name) > 1 or _uses(name).search(code, 0, m.start(2)) is not None
                    or self._names_a_local(init, code, m.span(), renames)):
                continue
            for old, new in renames.items():  # a struct naming tables hoisted before it
                init = _uses(old).sub(new, init)
            renames[name] = self._name_for(ctype, name, dims, init)
            cut.append(m.span())
        if not cut:
            return code
        out, pos = [], 0
        for a, b in cut:
            out.append(code[pos:a])
            pos = b
        out.append(code[pos:])
        code = "".join(out)
        for old, new in renames.items():
            code = _uses(old).sub(new, code)
        return code

    @staticmethod
    def _names_a_local(init: str, code: str, span: tuple, hoisted: dict) -> bool:
        """Whether the initializer names something of the block other than a hoisted table:
        an identifier that occurs in the block outside this declaration."""
        for ident in set(IDENT.findall(init)) - set(hoisted):
            pattern = _uses(ident)
            if pattern.search(code, 0, span[0]) or pattern.search(code, span[1]):
                return True
        return False

    def declarations(self) -> list[str]:
        """The shared tables, to be written before the functions that use them."""
        return list(self._decls)
