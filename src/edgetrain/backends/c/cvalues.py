"""C initializers of numpy arrays, and the two parts of a weight trained on some channels."""
from __future__ import annotations

import numpy as np

from .kernels import EmitContext
from .layout import StateArray

#: values per line of an emitted initializer
PER_LINE = 8


def fmt_values(a: np.ndarray) -> str:
    """`{...}`: the values of `a` as a C initializer, PER_LINE a line."""
    flat = np.ascontiguousarray(a).reshape(-1)
    if a.dtype == np.float32:
        items = []
        for x in flat.tolist():
            items.append(EmitContext.c_float(x))
    elif a.dtype == np.float64:
        items = [EmitContext.c_double(x) for x in flat.tolist()]
    elif a.dtype == np.int64:
        items = [f"INT64_C({x})" for x in flat.tolist()]
    elif a.dtype == np.int32 and flat.size and int(flat.min()) == -2**31:
        items = [f"(-{2**31 - 1} - 1)" if x == -2**31 else str(x) for x in flat.tolist()]
    else:
        items = [str(int(x)) for x in flat.tolist()]
    lines = [", ".join(items[i:i + PER_LINE]) for i in range(0, len(items), PER_LINE)]
    return "{\n  " + ",\n  ".join(lines) + "\n}" if items else "{0}"


def split_parts(st: StateArray, full: np.ndarray):
    """(selected channels, the rest) of a split weight `full`."""
    idx = [slice(None)] * full.ndim
    idx[st.sel.dim] = np.asarray(st.sel.index)
    sel = full[tuple(idx)]
    idx[st.sel.dim] = np.asarray(st.rest, dtype=np.int64)
    rest = full[tuple(idx)]
    return sel, rest
