"""The C kernel of ops/check.py (runtime/et_check.h): check(x, ok; message) is a view of x, so
the kernel only reads `ok`; when it is 0 the message goes to et_check_fail (ET_ERROR_HOOK, kept
for et_check_error) and a float x computed in the arena is filled with NaN, so that a training
step's loss is non-finite and the checked step (step_guard.py) or the weight banks keep the
trained state. Any dtype of x (float32, int8, ...): an int8 x is left as it is."""
from __future__ import annotations

from ....ir import Node
from ....ops.check import CHECK
from ..layout import CBackendError
from .context import EmitContext
from .registry import register

#: the NaN of each float C type
_NAN = {"float32": "(0.0f / 0.0f)", "float64": "(0.0 / 0.0)"}


def c_string(text: str) -> str:
    """`text` (UTF-8) as a C string literal: printable ASCII as it is, every other byte octal."""
    out = []
    for b in text.encode("utf-8"):
        ch = chr(b)
        out.append("\\" + ch if ch in '"\\?' else ch if 32 <= b < 127 else f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def has_check(graphs) -> bool:
    """True when one of `graphs` holds a check (its program includes runtime_headers.CHECK_HEADER)."""
    return any(n.op == CHECK for g in graphs for n in g.nodes)


@register(CHECK)
def _check(node: Node, ctx: EmitContext) -> str:
    x, ok = node.inputs
    if ok.dtype not in ("bool", "int8", "int32", "int64"):
        raise CBackendError(f"C kernel for check: the condition {ok} must be bool or an integer")
    fill = ""
    if x.dtype in _NAN and ctx.state_of(x) is None and x.type.numel:
        fill = (f" {ctx.ctype(x)} *Y = {ctx.ptr(x)}; for (int i = 0; i < {x.type.numel}; ++i) Y[i] = "
                f"{_NAN[x.dtype]};")
    return f"{{ if (!*{ctx.ptr(ok)}) {{ et_check_fail({c_string(node.attrs['message'])});{fill} }} }}"
