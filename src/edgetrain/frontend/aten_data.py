"""Core-aten -> IR converters of what a model computes from its data at run time: comparisons
(a padding mask `ids != pad`), argmax (the last real token of each row) and indexing with
such positions (`logits[torch.arange(B), last]`, as GPT2ForSequenceClassification pools).
They register into `converters.CONVERTERS` (the package's __init__ imports this module); aten.index.Tensor's
converter (aten.py) calls `index_at_run_time` when an index is not known at capture time."""
from __future__ import annotations

import math

import torch

from ..ir import Value
from ..ops import Emitter
from .converters import Known, aten, converts, unsupported

#: torch's promotion categories: a bool and an integer compare as the integer, an integer and
#: a float as the float; within a category the wider dtype wins
_CATEGORY = {"bool": 0, "int8": 1, "int16": 1, "int32": 1, "int64": 1, "float32": 2, "float64": 2}
_WIDTH = ("bool", "int8", "int32", "int64", "float32", "float64")
#: the dtype torch gives a Python float met by an integer tensor (its default dtype)
_DEFAULT_FLOAT = "float32"
_INDEX_DTYPES = ("int32", "int64")


def promoted(a: str, b: str) -> str:
    """The dtype torch compares tensors of dtypes a and b in."""
    if _CATEGORY[a] != _CATEGORY[b]:
        return a if _CATEGORY[a] > _CATEGORY[b] else b
    return max(a, b, key=_WIDTH.index)


def _scalar_dtype(t: str, s) -> str:
    """The dtype torch compares a tensor of dtype t with the Python scalar s in."""
    if isinstance(s, float) and _CATEGORY[t] < 2:
        return _DEFAULT_FLOAT
    if isinstance(s, int) and not isinstance(s, bool) and t == "bool":
        return "int64"
    return t


def _compare(cmp: str):
    def conv(e: Emitter, a, b):
        if not isinstance(a, Value):
            unsupported(f"unsupported op aten.{cmp} of a {type(a).__name__} and a tensor")
        if isinstance(b, Value):
            want = promoted(a.dtype, b.dtype)
        else:
            want = _scalar_dtype(a.dtype, b)
            b = e.const(b, want)
        a, b = (v if v.dtype == want else e.emit("cast", v, dtype=want) for v in (a, b))
        return e.emit("compare", a, b, cmp=cmp)

    return conv


for _cmp in ("eq", "ne", "lt", "le", "gt", "ge"):
    for _ov in ("Tensor", "Scalar"):
        converts(getattr(getattr(aten, _cmp), _ov))(_compare(_cmp))


@converts(aten.isnan.default)
def _isnan(e: Emitter, x):  # (a NaN is the one value unequal to itself)
    return e.emit("compare", x, x, cmp="ne") if x.dtype in ("float32", "float64") else _all_false(e, x)


@converts(aten.isinf.default)
def _isinf(e: Emitter, x):
    if x.dtype not in ("float32", "float64"):
        return _all_false(e, x)
    return e.emit("compare", e.emit("abs", x), e.const(float("inf"), x.dtype), cmp="eq")


def _all_false(e: Emitter, x) -> Value:
    return e.emit("expand", e.const(False, "bool"), shape=tuple(x.shape)) if x.shape else e.const(False, "bool")


def _bool_operand(e: Emitter, x, op: str) -> Value:
    """A boolean mask's operand: a bool tensor, or a Python bool as a constant."""
    if isinstance(x, bool):
        return e.const(x, "bool")
    if not isinstance(x, Value) or x.dtype != "bool":
        unsupported(f"unsupported op aten.{op} of {getattr(x, 'dtype', type(x).__name__)} operands "
                    "(only boolean masks)")
    return x


@converts(aten.bitwise_and.Tensor, aten.logical_and.default)
def _and(e: Emitter, a, b):
    """a & b of boolean masks (a causal mask and a padding mask): where(a, b, False)."""
    a, b = _bool_operand(e, a, "bitwise_and"), _bool_operand(e, b, "bitwise_and")
    return e.emit("where", a, b, e.const(False, "bool"))


@converts(aten.bitwise_or.Tensor, aten.logical_or.default)
def _or(e: Emitter, a, b):
    """a | b of boolean masks: where(a, True, b)."""
    a, b = _bool_operand(e, a, "bitwise_or"), _bool_operand(e, b, "bitwise_or")
    return e.emit("where", a, e.const(True, "bool"), b)


@converts(aten.logical_not.default, aten.bitwise_not.default)
def _not(e: Emitter, a):
    """~a of a boolean mask: a == False."""
    return e.emit("compare", _bool_operand(e, a, "logical_not"), e.const(False, "bool"), cmp="eq")


def _any_all(which: str):
    def conv(e: Emitter, x, dim=None, keepdim=False):
        """any / all of a boolean mask over `dim` (None: every dim): the count of True (float32, exact
        below 2**24 elements) compared with 0 / the dims' size."""
        x = _bool_operand(e, x, which)
        dims = None if dim is None else tuple(int(d) for d in (dim if isinstance(dim, (list, tuple)) else (dim,)))
        count = e.emit("sum", e.emit("cast", x, dtype="float32"), dims=dims, keepdim=bool(keepdim))
        if which == "any":
            return e.emit("compare", count, e.const(0.0, "float32"), cmp="gt")
        size = math.prod(x.shape) // max(math.prod(count.shape), 1) if x.shape else 1
        return e.emit("compare", count, e.const(float(size), "float32"), cmp="eq")
    return conv


for _which in ("any", "all"):
    for _ov in ("default", "dim", "dims"):
        if hasattr(getattr(aten, _which), _ov):
            converts(getattr(getattr(aten, _which), _ov))(_any_all(_which))


@converts(aten.argmax.default)
def _argmax(e: Emitter, x, dim=None, keepdim=False):
    return e.emit("argmax", x, dim=None if dim is None else int(dim), keepdim=bool(keepdim))


def _int64(e: Emitter, v: Value) -> Value:
    return v if v.dtype == "int64" else e.emit("cast", v, dtype="int64")


def _compared(e: Emitter, v: Value, cmp: str, k: int) -> Value:
    """(v cmp k) as int64 0 / 1."""
    return _int64(e, e.emit("compare", v, e.const(k, "int64"), cmp=cmp))


def _run_time_index(e: Emitter, i, size: int) -> tuple:
    """One index tensor as int64 positions, and where it is out of range (int64 1 / 0; None
    when known at capture time, where it is wrapped and checked here). A run-time one is
    wrapped by IR arithmetic: i + size * (i < 0), torch's negative indices."""
    if isinstance(i, Known):
        t = i.tensor
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            unsupported(f"unsupported op aten.index.Tensor with a {t.dtype} index")
        if bool(((t < -size) | (t >= size)).any()):
            raise ValueError(f"index out of range for a dim of size {size}")
        return i.value((t % size).long()), None
    if i.dtype not in _INDEX_DTYPES:
        unsupported(f"unsupported op aten.index.Tensor with a {i.dtype} index computed at run time "
                    f"(only {' or '.join(_INDEX_DTYPES)} positions; a boolean mask has a data-dependent shape)")
    i = _int64(e, i)
    bad = e.emit("add", _compared(e, i, "lt", -size), _compared(e, i, "ge", size))
    return e.emit("add", i, e.emit("mul", _compared(e, i, "lt", 0), e.const(size, "int64"))), bad


def _flat_rows(e: Emitter, pos: list, bads: list, sizes: tuple) -> Value:
    """The merged row i0 * size1 + i1 ... of the positions. A row with a position out of its
    dim's range becomes the row count, out of range of the merged rows too (else x[0, 4] of a
    dim of 3 would read x[1, 1]): the reference runtime stops there (embedding's IndexError, as
    torch raises) and the C kernel reads zeros (reported through ET_ERROR_HOOK)."""
    flat = pos[0]
    for p, size in zip(pos[1:], sizes[1:]):
        flat = e.emit("add", e.emit("mul", flat, e.const(size, "int64")), p)
    bads = [b for b in bads if b is not None]
    if len(pos) == 1 or not bads:  # one dim: embedding checks the position itself
        return flat
    count = bads[0]
    for b in bads[1:]:
        count = e.emit("add", count, b)
    rows = e.const(math.prod(sizes), "int64")
    return e.emit("add", flat, e.emit("mul", _compared(e, count, "gt", 0), e.emit("sub", rows, flat)))


def index_at_run_time(e: Emitter, x: Value, indices: list) -> Value:
    """x[..., i0, i1, ...] where some index tensor is computed from the inputs: the indexed
    dims (adjacent, as torch requires for its result to keep them in place) are moved to the
    front and merged into the rows of a matrix, which `embedding` reads at the flat rows
    i0 * size1 + i1 ... (int64 arithmetic); embedding's gradient adds the output gradient back
    to the rows read, so it reaches x. The result: x's leading dims + the indices' broadcast
    shape + x's trailing dims."""
    if x.dtype not in ("float32", "float64"):
        unsupported(f"unsupported op aten.index.Tensor of a {x.dtype} tensor with indices computed at run "
                    "time (only float tensors)")
    dims = [d for d, i in enumerate(indices) if i is not None]
    if dims != list(range(dims[0], dims[0] + len(dims))):
        unsupported("unsupported op aten.index.Tensor with index tensors on non-adjacent dims")
    first, n = dims[0], len(dims)
    sizes = x.shape[first:first + n]
    pos, bads = zip(*[_run_time_index(e, indices[d], size) for d, size in zip(dims, sizes)])
    flat = _flat_rows(e, list(pos), list(bads), sizes)
    lead, rest = x.shape[:first], x.shape[first + n:]
    front = _permuted(e, x, tuple(dims) + tuple(range(first)) + tuple(range(first + n, len(x.shape))))
    rows = _reshaped(e, front, (math.prod(sizes), math.prod(lead) * math.prod(rest)))
    out = _reshaped(e, e.emit("embedding", rows, flat), flat.shape + lead + rest)
    b = len(flat.shape)  # back to lead + broadcast shape + rest
    return _permuted(e, out, tuple(range(b, b + first)) + tuple(range(b)) + tuple(range(b + first, len(out.shape))))


def _permuted(e: Emitter, x: Value, perm: tuple) -> Value:
    return x if perm == tuple(range(len(perm))) else e.emit("permute", x, perm=perm)


def _reshaped(e: Emitter, x: Value, shape: tuple) -> Value:
    return x if tuple(shape) == x.shape else e.emit("reshape", x, shape=tuple(shape))
