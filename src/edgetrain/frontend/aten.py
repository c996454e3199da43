"""Core-aten -> IR converters, one small function per aten op: plumbing, elementwise,
reductions, shapes and indexing (layers in aten_layers.py, run-time data in aten_data.py; the
table they register into is converters.py)."""
from __future__ import annotations

import math
import operator

import torch

from ..ir import Value
from ..ops import Emitter
from .aten_data import index_at_run_time, promoted
from .aten_dynamic import dynamic_select, dynamic_view, masked_rows
from .converters import (CONVERTERS, DYNAMIC_AWARE, LAYOUT_AWARE, TORCH_DTYPES, Dynamic, Known, aten, const_aware,
                         converts, unsupported)
from .errors import UnsupportedOpError

IDENTITY_OPS = ("clone", "alias", "contiguous", "lift_fresh_copy")


def _tensor(e: Emitter, x, like: Value) -> Value:
    """A Value for x, making Python scalars constants of `like`'s dtype."""
    return x if isinstance(x, Value) else e.const(x, like.dtype)


# --- identity and plumbing ---------------------------------------------------------------
@converts(operator.getitem)
def _getitem(e, xs, i):
    out = xs[i]
    if out is None:
        raise UnsupportedOpError(f"output {i} of a multi-output op is not supported")
    return out


@converts(*[getattr(aten, n).default for n in IDENTITY_OPS], aten.dropout.default)
def _identity(e, x, *args, **kw):
    return x


# ops that hand data-dependent shapes (x[mask], its view and select) to aten_dynamic.py
DYNAMIC_AWARE.update([operator.getitem, aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                      aten.select.int, aten.detach.default] + [getattr(aten, n).default for n in IDENTITY_OPS])


@converts(aten.detach.default)
def _detach(e, x):
    """x without a gradient (capture keeps aten.detach whole: torch.export's decomposition makes it an
    alias, which would let the gradient through)."""
    return e.emit("detach", x) if isinstance(x, Value) and x.dtype in _FLOATS else x


@converts(aten._assert_tensor_metadata.default)
def _assert_metadata(e, *args, **kw):
    """A check torch.export inserts (dtype/device of a .to()); shapes and dtypes are static here."""
    return None


@converts(aten._to_copy.default)
def _to_copy(e, x, dtype=None, **kw):
    want = TORCH_DTYPES.get(dtype, x.dtype) if dtype is not None else x.dtype
    return x if want == x.dtype else e.emit("cast", x, dtype=want)


# --- elementwise -------------------------------------------------------------------------
_FLOATS = ("float64", "float32")


def _promoted(a: str, b: str, op: str) -> str:
    """The dtype torch gives an elementwise op of tensors of dtypes a and b: the float one (the
    wider of two floats); float32 for a division of integers (true division); else the wider
    integer (an int64 position times a boolean mask)."""
    for f in _FLOATS:
        if f in (a, b):
            return f
    if op == "div":
        return "float32"
    want = promoted(a, b)
    if want == "bool":
        raise ValueError(f"aten.{op} of two boolean tensors: only numeric results are supported")
    return want


def binary_converter(op):
    def conv(e, a, b, alpha=1):
        like = a if isinstance(a, Value) else b
        a, b = _tensor(e, a, like), _tensor(e, b, like)
        if a.dtype != b.dtype or a.dtype not in _FLOATS and (op == "div" or a.dtype == "bool"):
            want = _promoted(a.dtype, b.dtype, op)  # a float tensor times a boolean mask: the float one
            a, b = (v if v.dtype == want else e.emit("cast", v, dtype=want) for v in (a, b))
        if alpha != 1:
            b = e.emit("mul", b, e.const(alpha, b.dtype))
        return e.emit(op, a, b)

    return conv


for _op in ("add", "sub", "mul", "div"):
    for _ov in ("Tensor", "Scalar"):
        CONVERTERS[getattr(getattr(aten, _op), _ov)] = binary_converter(_op)


@converts(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(e, a, b, alpha=1):
    sub = binary_converter("sub")
    return sub(e, b, a, alpha) if alpha == 1 else sub(e, binary_converter("mul")(e, b, 1), a, alpha)


def _unary(op, **fixed):
    return lambda e, x: e.emit(op, x, **fixed)


for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "neg"):
    CONVERTERS[getattr(aten, _name).default] = _unary(_name)


@converts(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(e, a, b, rounding_mode=None):
    """torch.div with rounding_mode "trunc" or "floor" (a // b): the float quotient rounded. Floats
    only (an integer quotient would need exact integer division, which no op here computes). Where
    a / b rounds up onto an integer from just below it, floor(a / b) is that integer and torch's
    (computed from fmod(a, b)) the one below; its gradient is zero either way."""
    q = binary_converter("div")(e, a, b)
    if rounding_mode is None:
        return q
    like = a if isinstance(a, Value) else b
    if like.dtype not in _FLOATS:
        unsupported(f"unsupported op aten.div with rounding_mode={rounding_mode!r} of {like.dtype} tensors "
                    "(only float ones)")
    return e.emit({"trunc": "trunc", "floor": "floor"}[rounding_mode], q)


@converts(aten.pow.Scalar)
def _pow_scalar(e, base, x):
    """base ** x of a number base > 0 (2 ** x, 10 ** x): exp(x log(base)), whose gradient is torch's
    g base^x log(base)."""
    if not float(base) > 0:
        unsupported(f"unsupported op aten.pow of the number {base} to a tensor power (only a base > 0)")
    return e.emit("exp", e.emit("mul", x, e.const(math.log(float(base)), x.dtype)))


@converts(aten.reciprocal.default)
def _reciprocal(e, x):
    return e.emit("div", e.const(1.0, x.dtype), x)


for _name, _base in (("log2", 2.0), ("log10", 10.0)):  # log(x) / log(base), as a product with its inverse
    CONVERTERS[getattr(aten, _name).default] = (
        lambda b: lambda e, x: e.emit("mul", e.emit("log", x), e.const(1.0 / math.log(b), x.dtype)))(_base)


@converts(aten.gelu.default)
def _gelu(e, x, approximate="none"):
    return e.emit("gelu", x, approximate=approximate)


@converts(aten.silu.default)
def _silu(e, x):
    return e.emit("mul", x, e.emit("sigmoid", x))


@converts(aten.hardtanh.default)
def _hardtanh(e, x, min_val=-1.0, max_val=1.0):
    return e.emit("clamp", x, min=float(min_val), max=float(max_val))


@converts(aten.clamp.default)
def _clamp(e, x, min=None, max=None):
    bounds = {k: float(v) for k, v in (("min", min), ("max", max)) if v is not None}
    return e.emit("clamp", x, **bounds)


@converts(aten.clamp.Tensor, aten.clamp_min.Tensor)
def _clamp_tensor(e, x, min=None, max=None):
    """torch.clamp with tensor bounds (F.cosine_similarity's eps on the norms): x where it is below
    `min` becomes min, then where above `max` max, each a where: torch's values (max where min > max)
    and gradients (to x where min <= x <= max, to a bound where it is taken)."""
    for bound, cmp in ((min, "lt"), (max, "gt")):
        if bound is not None:
            b = _tensor(e, bound, x)
            b = b if b.dtype == x.dtype else e.emit("cast", b, dtype=x.dtype)
            x = e.emit("where", e.emit("compare", x, b, cmp=cmp), b, x)
    return x


@converts(aten.clamp_max.Tensor)
def _clamp_max_tensor(e, x, max):
    return _clamp_tensor(e, x, None, max)


@converts(aten.clamp_min.default)
def _clamp_min(e, x, bound):  # F.normalize's norm.clamp_min(eps), as AOTAutograd leaves it
    return e.emit("clamp", x, min=float(bound))


@converts(aten.clamp_max.default)
def _clamp_max(e, x, bound):
    return e.emit("clamp", x, max=float(bound))


@converts(aten.hardswish.default)
def _hardswish(e, x):  # x * relu6(x + 3) / 6
    r = e.emit("clamp", e.emit("add", x, e.const(3.0, x.dtype)), min=0.0, max=6.0)
    return e.emit("mul", x, e.emit("mul", r, e.const(1 / 6, x.dtype)))


@converts(aten.hardsigmoid.default)
def _hardsigmoid(e, x):  # relu6(x + 3) / 6
    r = e.emit("clamp", e.emit("add", x, e.const(3.0, x.dtype)), min=0.0, max=6.0)
    return e.emit("mul", r, e.const(1 / 6, x.dtype))


@converts(aten.pow.Tensor_Scalar)
def _pow(e, x, exponent):
    return e.emit("pow", x, exponent=float(exponent))


# --- reductions ----------------------------------------------------------------------------
def _reduce(op):
    def conv(e, x, dims=None, keepdim=False, dtype=None):
        if op == "sum" and x.dtype == "bool":  # a count of True, int64 as torch's (float32: exact below 2**24)
            count = e.emit(op, e.emit("cast", x, dtype="float32"), dims=tuple(dims) if dims else None,
                           keepdim=bool(keepdim))
            return e.emit("cast", count, dtype="int64")
        return e.emit(op, x, dims=tuple(dims) if dims else None, keepdim=bool(keepdim))

    return conv


CONVERTERS[aten.mean.dim] = _reduce("mean")
CONVERTERS[aten.sum.dim_IntList] = _reduce("sum")
CONVERTERS[aten.mean.default] = lambda e, x, dtype=None: e.emit("mean", x, dims=None)
CONVERTERS[aten.sum.default] = lambda e, x, dtype=None: _reduce("sum")(e, x)


# --- shapes ----------------------------------------------------------------------------------
def _resolve_shape(x: Value, shape) -> tuple[int, ...]:
    shape = [int(d) for d in shape]
    if -1 in shape:
        known = 1
        for d in shape:
            known *= d if d != -1 else 1
        shape[shape.index(-1)] = x.type.numel // max(known, 1)
    return tuple(shape)


@converts(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(e, x, shape):
    if isinstance(x, Dynamic) or any(isinstance(d, Dynamic) for d in shape):
        return dynamic_view(e, x, shape)
    shape = _resolve_shape(x, shape)
    return x if shape == x.shape else e.emit("reshape", x, shape=shape)


def _reshape_to(e, x, shape):
    return x if tuple(shape) == x.shape else e.emit("reshape", x, shape=tuple(shape))


@converts(aten.unsqueeze.default)
def _unsqueeze(e, x, dim):
    s = list(x.shape)
    s.insert(dim % (len(s) + 1), 1)
    return _reshape_to(e, x, s)


@converts(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(e, x, dims=None):
    rank = len(x.shape)
    dims = range(rank) if dims is None else ([dims] if isinstance(dims, int) else dims)
    drop = {d % rank for d in dims if x.shape[d % rank] == 1}
    return _reshape_to(e, x, [d for i, d in enumerate(x.shape) if i not in drop])


@converts(aten.permute.default)
def _permute(e, x, perm):
    perm = tuple(p % len(x.shape) for p in perm)
    return x if perm == tuple(range(len(perm))) else e.emit("permute", x, perm=perm)


@converts(aten.t.default, aten.transpose.int)
def _transpose(e, x, d0=0, d1=1):
    perm = list(range(len(x.shape)))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permute(e, x, perm)


@converts(aten.expand.default)
def _expand(e, x, shape, implicit=False):
    lead = len(shape) - len(x.shape)
    shape = tuple(x.shape[i - lead] if d == -1 else int(d) for i, d in enumerate(shape))
    return x if shape == x.shape else e.emit("expand", x, shape=shape)


@converts(aten.slice.Tensor)
def convert_slice(e, x, dim=0, start=None, end=None, step=1):
    dim = dim % len(x.shape)
    size = x.shape[dim]
    start, end, step = slice(start, end, step).indices(size)
    if (start, end, step) == (0, size, 1):
        return x
    return e.emit("slice", x, dim=dim, start=start, end=end, step=step)


@converts(aten.select.int)
def _select(e, x, dim, index):
    if isinstance(x, Dynamic):
        return dynamic_select(e, x, dim, index)
    dim = dim % len(x.shape)
    index = index % x.shape[dim]
    s = e.emit("slice", x, dim=dim, start=index, end=index + 1, step=1)
    return _reshape_to(e, s, x.shape[:dim] + x.shape[dim + 1:])


@converts(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def _split_with_sizes(e, x, sizes, dim=0):
    """chunk / split: one `slice` per piece (a piece of the whole dim is the input itself)."""
    dim = dim % len(x.shape)
    if sum(int(n) for n in sizes) != x.shape[dim]:
        raise ValueError(f"split sizes {list(sizes)} do not add up to dim {dim} of {x.shape}")
    out, start = [], 0
    for n in sizes:
        out.append(convert_slice(e, x, dim, start, start + int(n)))
        start += int(n)
    return tuple(out)


@converts(aten.split.Tensor, aten.split_copy.Tensor)
def _split(e, x, split_size, dim=0):
    size = x.shape[dim % len(x.shape)]
    n = int(split_size)
    return _split_with_sizes(e, x, [min(n, size - i) for i in range(0, size, n)] if n else [size], dim)


@converts(aten.unbind.int, aten.unbind_copy.int)
def _unbind(e, x, dim=0):
    return tuple(_select(e, x, dim, i) for i in range(x.shape[dim % len(x.shape)]))


@converts(aten.cat.default)
def _cat(e, xs, dim=0):
    xs = [x for x in xs if x.type.numel > 0]
    return xs[0] if len(xs) == 1 else e.emit("cat", *xs, dim=dim % len(xs[0].shape))


@converts(aten.roll.default)
def _roll(e, x, shifts, dims=()):
    """torch.roll (Swin's shifted windows) along each dim: the last `shift` entries moved to
    the front, two slices and a cat (torch.export decomposes it into indexing; AOTAutograd
    leaves it whole)."""
    shifts, dims = list(shifts), list(dims)
    if not dims:  # roll of the flattened tensor
        return _view(e, _roll(e, _view(e, x, [x.type.numel]), shifts, [0]), list(x.shape))
    if len(shifts) != len(dims):
        raise ValueError(f"roll with {len(shifts)} shifts and {len(dims)} dims")
    for shift, dim in zip(shifts, dims):
        dim = dim % len(x.shape)
        n = x.shape[dim]
        k = int(shift) % n
        if k:
            x = e.emit("cat", convert_slice(e, x, dim, n - k, n), convert_slice(e, x, dim, 0, n - k), dim=dim)
    return x


@converts(aten.flatten.using_ints)
def _flatten(e, x, start=0, end=-1):
    r = len(x.shape)
    start, end = start % r, end % r
    n = 1
    for d in x.shape[start:end + 1]:
        n *= d
    return _reshape_to(e, x, x.shape[:start] + (n,) + x.shape[end + 1:])


@converts(*LAYOUT_AWARE)
def _as_strided(e, x, size, stride, storage_offset=None, layout=None):
    """A view of x's storage. Our values are row-major, torch's input had the strides of
    `layout`: which element of x each output element reads is worked out with torch on
    positions (the storage filled with each element's row-major number, read through the
    view); the identity is a reshape, anything else one index_select of x's flat elements."""
    if layout is None:
        unsupported("unsupported op aten.as_strided on a tensor whose strides are unknown")
    xstride, xoff = layout
    size, stride, off = [int(d) for d in size], [int(d) for d in stride], int(storage_offset or 0)
    n = math.prod(x.shape)
    if any(s < 0 for s in stride) or any(s < 0 for s in xstride):
        unsupported("unsupported op aten.as_strided with negative strides")
    where = torch.full((), xoff, dtype=torch.long)
    for sz, st in zip(x.shape, xstride):
        where = where[..., None] + torch.arange(sz) * st
    extent = max(int(where.max()) + 1 if n else 0,
                 off + sum((a - 1) * b for a, b in zip(size, stride)) + 1 if math.prod(size) else 0)
    storage = torch.full((extent,), -1, dtype=torch.long)
    storage[where.reshape(-1)] = torch.arange(n)  # an expanded input: any of its equal elements
    read = torch.as_strided(storage, size, stride, off).reshape(-1)
    if bool((read < 0).any()):
        unsupported("unsupported op aten.as_strided reading storage outside its input")
    if read.numel() == n and bool((read == torch.arange(n)).all()):
        return _reshape_to(e, x, size)
    flat = _reshape_to(e, x, (n,))
    return _reshape_to(e, e.emit("index_select", flat, dim=0, index=tuple(int(i) for i in read)), size)


@converts(aten.gather.default)
def _gather(e, x, dim, index, sparse_grad=False):
    return e.emit("gather", x, index, dim=dim % len(x.shape))


@const_aware(aten.index_select.default)
def _index_select(e, x, dim, index, constant=None):
    if isinstance(x, Known):
        x = x.value()
    if not isinstance(index, Known):
        unsupported("unsupported op aten.index_select with indices computed from the inputs "
                     "(only indices known at capture time)")
    dim = dim % len(x.shape)
    size = x.shape[dim]
    idx = index.tensor.reshape(-1).long()
    if bool(((idx < -size) | (idx >= size)).any()):
        raise ValueError(f"index out of range for a dim of size {size}")
    return e.emit("index_select", x, dim=dim, index=tuple(int(v) for v in idx % size))


@converts(aten.flip.default)
def _flip(e, x, dims):
    """x reversed along `dims` (a bidirectional RNN's reverse direction): one index_select per dim."""
    for d in sorted({d % len(x.shape) for d in dims}):
        x = e.emit("index_select", x, dim=d, index=tuple(range(x.shape[d] - 1, -1, -1)))
    return x


@const_aware(aten.index.Tensor)
def _index(e, x, indices, constant=None):
    """x[..., i0, i1, ...] with index tensors known at capture time (a relative-position
    table read through its index buffer, as Swin and LeViT do): the indexed dims, merged into
    one by a reshape, are read with one index_select of the flat positions, then reshaped to
    x's leading dims + the indices' broadcast shape + x's trailing dims. An index computed at
    run time (GPT-2's classifier reads each row's last real token) goes to
    aten_data.index_at_run_time instead."""
    if isinstance(x, Known):
        x = x.value()
    idx = list(indices)
    if any(isinstance(i, Value) and i.dtype == "bool" for i in idx):  # x[mask]: a data-dependent shape
        return masked_rows(e, x, idx)
    if any(isinstance(i, Value) for i in idx):  # positions computed from the inputs (an argmax)
        return index_at_run_time(e, x, idx)
    tensors = []  # (dim, long index tensor)
    dim = 0
    for i in idx:
        if i is None:
            dim += 1
            continue
        if i.tensor.dtype == torch.bool:  # torch.export turns a mask into nonzero(): never seen here
            unsupported("unsupported op aten.index.Tensor with a boolean mask")
        tensors.append((dim, i.tensor.long()))
        dim += 1
    dims = [d for d, _ in tensors]
    if dims != list(range(dims[0], dims[0] + len(dims))):
        unsupported("unsupported op aten.index.Tensor with index tensors on non-adjacent dims")
    first, n = dims[0], len(dims)
    sizes = x.shape[first:first + n]
    bshape = torch.broadcast_shapes(*(t.shape for _, t in tensors))
    flat = torch.zeros(bshape, dtype=torch.long)
    for (_, t), size in zip(tensors, sizes):
        if bool(((t < -size) | (t >= size)).any()):
            raise ValueError(f"index out of range for a dim of size {size}")
        flat = flat * size + torch.broadcast_to(t % size, bshape)
    merged = _reshape_to(e, x, x.shape[:first] + (math.prod(sizes),) + x.shape[first + n:])
    picked = e.emit("index_select", merged, dim=first, index=tuple(int(v) for v in flat.reshape(-1)))
    return _reshape_to(e, picked, x.shape[:first] + tuple(bshape) + x.shape[first + n:])

