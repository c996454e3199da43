"""Core-aten -> IR converters of where, cumsum and index_put (ops/select.py); they register into
converters.CONVERTERS (the package's __init__ imports this module).

- torch.where(cond, a, b) and x.masked_fill(mask, v) (a where with aten.scalar_tensor) ->
  aten.where.self: the `where` op, a and b in torch's promoted dtype, cond as bool.
- x.cumsum(d) -> aten.cumsum.default: `cumsum` in the result dtype torch gives (the `dtype`
  argument, else int64 for integer and boolean inputs: position ids from a padding mask).
- y.index_put((i0, ...), v, accumulate) -> aten.index_put.default: `index_put`, the index
  tensors on adjacent dims after leading Nones; indices known at capture time become constant
  operands (a boolean mask known then: the positions it selects), computed ones stay Values;
  x[mask] = v with a computed boolean mask and one value v (h[h > 0] = 0) is a where.
- t[:, 1:] = ids[:, :-1] (a write into a slice of a new tensor: BART's shift_tokens_right) ->
  aten.copy.default (src broadcast to the slice) and aten.slice_scatter.default (a cat of the
  tensor's slices around it; step 1).
- x.scatter_add(dim, index, src) -> aten.scatter_add.default: x + gather_grad(src, index).
"""
from __future__ import annotations

import math

import torch

from ..ir import Value
from ..ops import Emitter
from .aten import convert_slice
from .aten_data import promoted
from .converters import TORCH_DTYPES, Known, aten, const_aware, converts, unsupported

_FLOATS = ("float64", "float32")
_INDEX_DTYPES = ("int32", "int64")


def _as_value(e: Emitter, x, dtype: str) -> Value:
    """A Value of `dtype` for a tensor Value, a capture-time tensor or a Python scalar."""
    if isinstance(x, Known):
        x = x.value()
    if not isinstance(x, Value):
        return e.const(x, dtype)
    return x if x.dtype == dtype else e.emit("cast", x, dtype=dtype)


def _result_dtype(a, b) -> str:
    """torch's dtype of where(cond, a, b): the tensors' promoted dtype; a Python float beside an
    integer tensor gives float32 (torch's default dtype)."""
    ts = [v.dtype for v in (a, b) if isinstance(v, Value)]
    if not ts:
        return "float32" if any(isinstance(v, float) for v in (a, b)) else "int64"
    want = ts[0] if len(ts) == 1 else promoted(ts[0], ts[1])
    if want not in _FLOATS and any(isinstance(v, float) for v in (a, b)):
        return "float32"
    return want


@converts(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(e, cond, a, b):
    if not isinstance(cond, Value):
        unsupported("unsupported op aten.where with a condition that is not a tensor")
    cond = cond if cond.dtype == "bool" else e.emit("cast", cond, dtype="bool")
    want = _result_dtype(a, b)
    return e.emit("where", cond, _as_value(e, a, want), _as_value(e, b, want))


@converts(aten.cumsum.default)
def _cumsum(e, x, dim, dtype=None):
    want = TORCH_DTYPES.get(dtype) if dtype is not None else (x.dtype if x.dtype in _FLOATS else "int64")
    if want is None or want not in _FLOATS + _INDEX_DTYPES:
        unsupported(f"unsupported op aten.cumsum with dtype {dtype}")
    x = x if x.dtype == want else e.emit("cast", x, dtype=want)
    return e.emit("cumsum", x, dim=int(dim) % max(len(x.shape), 1), reverse=False)


def _index_tensors(indices) -> tuple:
    """(first indexed dim, index Values) of index_put's index list (None: a whole dim)."""
    idx = list(indices)
    while idx and idx[-1] is None:
        idx.pop()
    first = 0
    while first < len(idx) and idx[first] is None:
        first += 1
    tensors = idx[first:]
    if not tensors or any(i is None for i in tensors):
        unsupported("unsupported op aten.index_put with index tensors on non-adjacent dims")
    out = []
    for i in tensors:
        if isinstance(i, Known):
            t = i.tensor
            if t.dtype == torch.bool:  # a mask known at capture time: the positions it selects
                out += [i.value(p) for p in torch.nonzero(t, as_tuple=True)]
                continue
            if t.dtype.is_floating_point or t.dtype.is_complex:
                unsupported(f"unsupported op aten.index_put with a {t.dtype} index")
            out.append(i.value(t.long()))
        elif i.dtype == "bool":
            unsupported("unsupported op aten.index_put with a boolean mask computed from the inputs "
                        "(its positions have a data-dependent count)")
        elif i.dtype not in _INDEX_DTYPES:
            unsupported(f"unsupported op aten.index_put with a {i.dtype} index")
        else:
            out.append(i)
    return first, out


def _broadcast(a: tuple, b: tuple):
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


def _masked_scalar(e: Emitter, x: Value, indices, values, accumulate: bool):
    """x[mask] = v (or += v) with a boolean mask computed from the inputs and one value, or one
    row that every masked position takes: a `where` over the masked dims (None when the index
    list is anything else)."""
    idx = list(indices)
    first = 0
    while first < len(idx) and idx[first] is None:
        first += 1
    rest = idx[first + 1:]
    mask = idx[first] if first < len(idx) else None
    if not (isinstance(mask, Value) and mask.dtype == "bool" and all(i is None for i in rest)):
        return None
    if tuple(mask.shape) != tuple(x.shape[first:first + len(mask.shape)]):
        return None
    rows = tuple(x.shape[first + len(mask.shape):])  # what each masked position holds
    vshape = tuple(values.shape) if isinstance(values, (Value, Known)) else ()
    count = math.prod(vshape)
    if count != 1 and (len(vshape) > len(rows) or _broadcast(vshape, rows) != rows):
        return None  # one value, or one row for every masked position (Hubert's masked_spec_embed)
    v = _as_value(e, values, x.dtype)
    trailing = len(rows)
    mask = mask if not trailing else e.emit("reshape", mask, shape=tuple(mask.shape) + (1,) * trailing)
    if count == 1:
        v = v if v.shape == () else e.emit("reshape", v, shape=())
    if accumulate:
        return e.emit("add", x, e.emit("where", mask, v, e.const(0.0, x.dtype)))
    return e.emit("where", mask, v, x)


@const_aware(aten.index_put.default)
def _index_put(e, x, indices, values, accumulate=False, constant=None):
    """index_put; x[mask] = v with a mask computed from the inputs and one value v is a where."""
    x = x.value() if isinstance(x, Known) else x
    masked = _masked_scalar(e, x, indices, values, bool(accumulate))
    if masked is not None:
        return masked
    first, idx = _index_tensors(indices)
    if first + len(idx) > len(x.shape):
        raise ValueError(f"index_put: {len(idx)} index tensors from dim {first} for a {x.shape} tensor")
    v = _as_value(e, values, x.dtype)
    return e.emit("index_put", x, v, *idx, first=first, accumulate=bool(accumulate))


# --- writes into a slice, as functionalization leaves them -----------------------------------------
def _shape_dtype(x) -> tuple:
    if isinstance(x, Known):
        return x.shape, TORCH_DTYPES[x.tensor.dtype]
    return tuple(x.shape), x.dtype


@const_aware(aten.copy.default)
def _copy(e, dst, src, non_blocking=False, constant=None):
    """dst.copy_(src) made functional (`t[:, 1:] = ids[:, :-1]`, BART's shift_tokens_right): src
    broadcast to dst's shape in dst's dtype; dst's values are not read."""
    shape, dtype = _shape_dtype(dst)
    v = _as_value(e, src, dtype)
    if tuple(v.shape) != shape:
        if _broadcast(tuple(v.shape), shape) != shape:
            raise ValueError(f"copy of a {tuple(v.shape)} tensor into a {shape} one")
        v = e.emit("expand", v, shape=shape)
    return v


@const_aware(aten.slice_scatter.default)
def _slice_scatter(e, x, src, dim=0, start=None, end=None, step=1, constant=None):
    """x with x[..., start:end] (on dim) replaced by src: a cat of x's slices before and after
    and src (step 1 only)."""
    shape, dtype = _shape_dtype(x)
    dim = dim % len(shape)
    start, end, step = slice(start, end, step).indices(shape[dim])
    if step != 1:
        unsupported(f"unsupported op aten.slice_scatter with step {step} (only 1)")
    v = _as_value(e, src, dtype)
    want = shape[:dim] + (max(end - start, 0),) + shape[dim + 1:]
    if tuple(v.shape) != want:
        raise ValueError(f"slice_scatter of a {tuple(v.shape)} tensor into {want} of a {shape} tensor")

    def piece(a: int, b: int) -> Value:
        if isinstance(x, Known):
            return x.value(x.tensor.narrow(dim, a, b - a))
        return e.emit("slice", x, dim=dim, start=a, end=b, step=1)

    parts = ([piece(0, start)] if start > 0 else []) + [v] + ([piece(end, shape[dim])] if end < shape[dim] else [])
    return parts[0] if len(parts) == 1 else e.emit("cat", *parts, dim=dim)


@const_aware(aten.scatter_add.default)
def _scatter_add(e, x, dim, index, src, constant=None):
    """x.scatter_add(dim, index, src) (a graph network's sum of messages per node): x plus src's
    elements (those index covers) added at their index along dim, the gather_grad op (a scatter-add,
    ops/gather.py; gather is its gradient, as torch's); index may be computed at run time."""
    x, index, src = (v.value() if isinstance(v, Known) else v for v in (x, index, src))
    if src.dtype != x.dtype:
        src = e.emit("cast", src, dtype=x.dtype)
    if len(index.shape) != len(x.shape) or len(src.shape) != len(x.shape):
        raise ValueError(f"scatter_add: index {tuple(index.shape)} and src {tuple(src.shape)} must have the rank "
                         f"of x {tuple(x.shape)}")
    if any(i > s for i, s in zip(index.shape, src.shape)):
        raise ValueError(f"scatter_add: index {tuple(index.shape)} exceeds src {tuple(src.shape)}")
    for k, want in enumerate(index.shape):  # only the part index covers is added
        src = convert_slice(e, src, k, 0, int(want))
    d = int(dim) % len(x.shape)
    return e.emit("add", x, e.emit("gather_grad", src, index, input_shape=tuple(x.shape), dim=d))

