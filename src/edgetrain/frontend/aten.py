"""Core-aten -> IR translation table: one small converter per aten op."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..ir import Value
from ..ops import Emitter
from ..ops.conv import conv_out_hw

aten = torch.ops.aten
CONVERTERS: dict[Any, Callable] = {}
#: converters that read their first input's strides in torch (keyword `layout`)
LAYOUT_AWARE = (aten.as_strided.default, aten.as_strided_copy.default)
#: converters that take inputs known at capture time as torch tensors (constant indices, masks)
#: instead of graph Values; they also accept Values (torch.compile's graphs know none)
CONST_AWARE: dict[Any, Callable] = {}
IDENTITY_OPS = ("clone", "alias", "contiguous", "detach", "lift_fresh_copy")


def registrar(table: dict) -> Callable:
    """A decorator factory: `@reg(op, ...)` puts the function in `table` under each op."""
    def register(*ops):
        def deco(fn):
            for op in ops:
                table[op] = fn
            return fn

        return deco

    return register


converts = registrar(CONVERTERS)


def const_aware(*ops):
    """Register a converter in CONVERTERS that also takes capture-time constants raw."""
    def deco(fn):
        for op in ops:
            CONVERTERS[op] = CONST_AWARE[op] = fn
        return fn

    return deco


@dataclass(frozen=True, eq=False)
class Known:
    """A tensor known at capture time, as a CONST_AWARE converter receives it: `tensor` to
    read, `value(t)` to put it (or a tensor derived from it) in the graph as a constant."""

    tensor: torch.Tensor
    make: Callable[[torch.Tensor], Value]

    @property
    def shape(self):
        return tuple(self.tensor.shape)

    def value(self, t: torch.Tensor = None) -> Value:
        return self.make(self.tensor if t is None else t)


def convert_node(e: Emitter, node, env: dict, known: dict = None, materialize: Callable = None):
    """Translate one fx node. Inputs computed at capture time (`known`) reach a CONST_AWARE
    converter as `Known` tensors, any other converter as Values (`materialize(name, tensor)`
    makes them)."""
    from .capture import UnsupportedOpError

    known = known or {}
    raw = node.target in CONST_AWARE

    def arg(a):
        if isinstance(a, torch.fx.Node):
            k = known.get(a.name)
            if a.name in known and not isinstance(k, torch.Tensor):
                return k  # a Python number (a shape, a scalar) or None
            if a.name in known and raw:
                return Known(k, lambda t, name=a.name: materialize(name, t))
            return env[a.name] if a.name in env else materialize(a.name, k)
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return a

    fn = CONVERTERS.get(node.target)
    if fn is None:
        raise UnsupportedOpError(f"unsupported op {node.target}")
    kwargs = {k: arg(v) for k, v in node.kwargs.items()}
    if node.target in LAYOUT_AWARE:  # the strides torch gave the input (export records them)
        val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if val is not None:
            kwargs["layout"] = (tuple(int(d) for d in val.stride()), int(val.storage_offset()))
    if raw and materialize is not None:  # a constant the converter derives (a causal mask)
        kwargs["constant"] = lambda t: materialize(node.name, t)
    return fn(e, *arg(tuple(node.args)), **kwargs)


def _tensor(e: Emitter, x, like: Value) -> Value:
    """A Value for x, making Python scalars constants of `like`'s dtype."""
    return x if isinstance(x, Value) else e.const(x, like.dtype)


def _pair(v):
    return tuple(v) * (2 // len(v)) if isinstance(v, (list, tuple)) else (int(v), int(v))


# --- identity and plumbing ---------------------------------------------------------------
@converts(operator.getitem)
def _getitem(e, xs, i):
    out = xs[i]
    if out is None:
        from .capture import UnsupportedOpError

        raise UnsupportedOpError(f"output {i} of a multi-output op is not supported")
    return out


@converts(*[getattr(aten, n).default for n in IDENTITY_OPS], aten.dropout.default)
def _identity(e, x, *args, **kw):
    return x


@converts(aten._assert_tensor_metadata.default)
def _assert_metadata(e, *args, **kw):
    """A check torch.export inserts (dtype/device of a .to()); shapes and dtypes are static here."""
    return None


@converts(aten._to_copy.default)
def _to_copy(e, x, dtype=None, **kw):
    from .capture import TORCH_DTYPES

    want = TORCH_DTYPES.get(dtype, x.dtype) if dtype is not None else x.dtype
    return x if want == x.dtype else e.emit("cast", x, dtype=want)


# --- elementwise -------------------------------------------------------------------------
_FLOATS = ("float64", "float32")


def _promoted(a: str, b: str) -> str:
    """The dtype torch gives an elementwise op of tensors of dtypes a and b (the float one;
    the wider of two floats)."""
    for f in _FLOATS:
        if f in (a, b):
            return f
    raise ValueError(f"operands of dtypes {a} and {b}: only float results are supported")


def _binary(op):
    def conv(e, a, b, alpha=1):
        like = a if isinstance(a, Value) else b
        a, b = _tensor(e, a, like), _tensor(e, b, like)
        if a.dtype != b.dtype:  # torch promotes (a float tensor times a boolean mask): to the float one
            want = _promoted(a.dtype, b.dtype)
            a, b = (v if v.dtype == want else e.emit("cast", v, dtype=want) for v in (a, b))
        if alpha != 1:
            b = e.emit("mul", b, e.const(alpha, like.dtype))
        return e.emit(op, a, b)

    return conv


for _op in ("add", "sub", "mul", "div"):
    for _ov in ("Tensor", "Scalar"):
        CONVERTERS[getattr(getattr(aten, _op), _ov)] = _binary(_op)


@converts(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(e, a, b, alpha=1):
    return _binary("sub")(e, b, a, alpha) if alpha == 1 else _binary("sub")(e, _binary("mul")(e, b, 1), a, alpha)


def _unary(op, **fixed):
    return lambda e, x: e.emit(op, x, **fixed)


for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "rsqrt", "neg"):
    CONVERTERS[getattr(aten, _name).default] = _unary(_name)


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
        return e.emit(op, x, dims=tuple(dims) if dims else None, keepdim=bool(keepdim))

    return conv


CONVERTERS[aten.mean.dim] = _reduce("mean")
CONVERTERS[aten.sum.dim_IntList] = _reduce("sum")
CONVERTERS[aten.mean.default] = lambda e, x, dtype=None: e.emit("mean", x, dims=None)
CONVERTERS[aten.sum.default] = lambda e, x, dtype=None: e.emit("sum", x, dims=None)


@converts(aten.linalg_vector_norm.default)
def _vector_norm(e, x, ord=2, dim=None, keepdim=False, dtype=None):
    """The 2-norm (F.normalize's) as sqrt(sum(x * x)); other orders are refused."""
    if float(ord) != 2.0:
        _unsupported(f"unsupported op aten.linalg_vector_norm with ord={ord} (only the 2-norm)")
    dims = None if dim is None or len(dim) == 0 else tuple(d % len(x.shape) for d in dim)
    return e.emit("sqrt", e.emit("sum", e.emit("mul", x, x), dims=dims, keepdim=bool(keepdim)))


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
def _slice(e, x, dim=0, start=None, end=None, step=1):
    dim = dim % len(x.shape)
    size = x.shape[dim]
    start, end, step = slice(start, end, step).indices(size)
    if (start, end, step) == (0, size, 1):
        return x
    return e.emit("slice", x, dim=dim, start=start, end=end, step=step)


@converts(aten.select.int)
def _select(e, x, dim, index):
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
        out.append(_slice(e, x, dim, start, start + int(n)))
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
        _unsupported("unsupported op aten.as_strided on a tensor whose strides are unknown")
    xstride, xoff = layout
    size, stride, off = [int(d) for d in size], [int(d) for d in stride], int(storage_offset or 0)
    n = math.prod(x.shape)
    if any(s < 0 for s in stride) or any(s < 0 for s in xstride):
        _unsupported("unsupported op aten.as_strided with negative strides")
    where = torch.full((), xoff, dtype=torch.long)
    for d, (sz, st) in enumerate(zip(x.shape, xstride)):
        where = where[..., None] + torch.arange(sz) * st
    extent = max(int(where.max()) + 1 if n else 0,
                 off + sum((a - 1) * b for a, b in zip(size, stride)) + 1 if math.prod(size) else 0)
    storage = torch.full((extent,), -1, dtype=torch.long)
    storage[where.reshape(-1)] = torch.arange(n)  # an expanded input: any of its equal elements
    read = torch.as_strided(storage, size, stride, off).reshape(-1)
    if bool((read < 0).any()):
        _unsupported("unsupported op aten.as_strided reading storage outside its input")
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
        _unsupported("unsupported op aten.index_select with indices computed from the inputs "
                     "(only indices known at capture time)")
    dim = dim % len(x.shape)
    size = x.shape[dim]
    idx = index.tensor.reshape(-1).long()
    if bool(((idx < -size) | (idx >= size)).any()):
        raise ValueError(f"index out of range for a dim of size {size}")
    return e.emit("index_select", x, dim=dim, index=tuple(int(v) for v in idx % size))


@const_aware(aten.index.Tensor)
def _index(e, x, indices, constant=None):
    """x[..., i0, i1, ...] with index tensors known at capture time (a relative-position
    table read through its index buffer, as Swin and LeViT do): the indexed dims, merged into
    one by a reshape, are read with one index_select of the flat positions, then reshaped to
    x's leading dims + the indices' broadcast shape + x's trailing dims."""
    if isinstance(x, Known):
        x = x.value()
    idx = list(indices)
    if any(isinstance(i, Value) for i in idx):
        _unsupported("unsupported op aten.index.Tensor with indices computed from the inputs "
                     "(only indices known at capture time)")
    tensors = []  # (dim, long index tensor)
    dim = 0
    for i in idx:
        if i is None:
            dim += 1
            continue
        if i.tensor.dtype == torch.bool:  # torch.export turns a mask into nonzero(): never seen here
            _unsupported("unsupported op aten.index.Tensor with a boolean mask")
        tensors.append((dim, i.tensor.long()))
        dim += 1
    dims = [d for d, _ in tensors]
    if dims != list(range(dims[0], dims[0] + len(dims))):
        _unsupported("unsupported op aten.index.Tensor with index tensors on non-adjacent dims")
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


# --- layers -----------------------------------------------------------------------------------
@converts(aten.convolution.default)
def _convolution(e, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    from .capture import UnsupportedOpError

    if transposed:
        raise UnsupportedOpError("unsupported op aten.convolution (transposed)")
    if len(x.shape) != 4:
        raise UnsupportedOpError(f"unsupported op aten.convolution ({len(x.shape) - 2}-d); only 2-d convolutions")
    args = (x, w) + ((b,) if b is not None else ())
    return e.emit("conv2d", *args, stride=_pair(stride), padding=_pair(padding), dilation=_pair(dilation),
                  groups=int(groups))


@converts(aten.linear.default)
def _linear(e, x, w, b=None):
    return e.emit("linear", *((x, w) + ((b,) if b is not None else ())))


@converts(aten.addmm.default)
def _addmm(e, bias, a, b, beta=1, alpha=1):
    y = e.emit("matmul", a, b)
    if alpha != 1:
        y = e.emit("mul", y, e.const(alpha, y.dtype))
    if beta != 1:
        bias = e.emit("mul", bias, e.const(beta, bias.dtype))
    return e.emit("add", y, bias)


@converts(aten.mm.default, aten.bmm.default, aten.matmul.default)
def _mm(e, a, b):
    return e.emit("matmul", a, b)


@converts(aten._native_batch_norm_legit_no_training.default)
def _bn(e, x, w, b, mean, var, momentum, eps):
    if (w is None) != (b is None):
        w = w if w is not None else e.emit("expand", e.const(1.0, x.dtype), shape=mean.shape)
        b = b if b is not None else e.emit("expand", e.const(0.0, x.dtype), shape=mean.shape)
    affine = (w, b) if w is not None else ()
    return e.emit("batch_norm", x, mean, var, *affine, eps=float(eps)), None, None


@converts(aten.native_layer_norm.default)
def _layer_norm(e, x, shape, w, b, eps):
    if w is None and b is not None:
        w = e.emit("expand", e.const(1.0, x.dtype), shape=tuple(shape))
    args = tuple(v for v in (w, b) if v is not None)
    return e.emit("layer_norm", x, *args, normalized_shape=tuple(shape), eps=float(eps)), None, None


@converts(aten.embedding.default)
def _embedding(e, w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return e.emit("embedding", w, idx, padding_idx=int(padding_idx))


@converts(aten._softmax.default)
def _softmax(e, x, dim, half_to_float=False):
    return e.emit("softmax", x, dim=dim % len(x.shape))


@converts(aten._log_softmax.default)
def _log_softmax(e, x, dim, half_to_float=False):
    return e.emit("log_softmax", x, dim=dim % len(x.shape))


def _ceil_out(size: int, k: int, s: int, p: int, d: int) -> int:
    """torch's ceil-mode output size: ceil((size + 2p - d(k-1) - 1) / s) + 1, less one when
    the last window would start past the input and its left padding (size + p)."""
    o = -(-(size + 2 * p - d * (k - 1) - 1) // s) + 1
    return o - 1 if (o - 1) * s >= size + p else o


def _ceil_extra(x, k, s, p, d, ceil_mode) -> tuple[int, int]:
    """The rows and columns that ceil_mode adds after the input (0, 0 without ceil_mode)."""
    if not ceil_mode:
        return 0, 0
    floor = conv_out_hw(x.shape[2:], k, s, p, d)
    ceil = tuple(_ceil_out(x.shape[2 + i], k[i], s[i], p[i], d[i]) for i in range(2))
    return tuple((ceil[i] - floor[i]) * s[i] for i in range(2))


@const_aware(aten.avg_pool2d.default)
def _avg_pool(e, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None,
              constant=None):
    """ceil_mode=True (when it adds windows): the window sums of the input padded after its
    last row and column with zeros (as max pooling's rule), times 1 / torch's divisor per
    output position, a constant computed at capture time with torch on a tensor of ones."""
    if isinstance(x, Known):
        x = x.value()
    k = _pair(kernel)
    s = _pair(stride) if stride else k
    p = _pair(padding)
    extra = _ceil_extra(x, k, s, p, (1, 1), ceil_mode)
    if not any(extra):
        return e.emit("avg_pool2d", x, kernel=k, stride=s, padding=p, count_include_pad=bool(count_include_pad),
                      divisor_override=int(divisor_override or 0))
    xp = e.emit("pad", x, before=(0, 0, 0, 0), after=(0, 0) + extra, value=0.0)
    if divisor_override:
        return e.emit("avg_pool2d", xp, kernel=k, stride=s, padding=p, count_include_pad=True,
                      divisor_override=int(divisor_override))
    if constant is None:
        _unsupported("unsupported op: average pooling with ceil_mode=True outside capture")
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=torch.float64)
    mean = torch.nn.functional.avg_pool2d(ones, k, s, p, ceil_mode=True, count_include_pad=bool(count_include_pad))
    total = torch.nn.functional.avg_pool2d(ones, k, s, p, ceil_mode=True, divisor_override=1)
    sums = e.emit("avg_pool2d", xp, kernel=k, stride=s, padding=p, count_include_pad=True, divisor_override=1)
    return e.emit("mul", sums, constant((mean / total)[0, 0].to(getattr(torch, x.dtype))))


@converts(aten.max_pool2d_with_indices.default)
def _max_pool(e, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    """ceil_mode=True is floor mode on the input padded after its last row and column with
    -inf, by (ceil size - floor size) * stride: those windows then exist and -inf never wins
    (each holds a real pixel, since torch drops a last window starting past input + padding)."""
    k = _pair(kernel)
    s = _pair(stride) if stride else k
    p, d = _pair(padding), _pair(dilation)
    extra = _ceil_extra(x, k, s, p, d, ceil_mode)
    if any(extra):
        x = e.emit("pad", x, before=(0, 0, 0, 0), after=(0, 0) + extra, value=-math.inf)
    return e.emit("max_pool2d", x, kernel=k, stride=s, padding=p, dilation=d), None


@converts(aten.constant_pad_nd.default)
def _constant_pad(e, x, pad, value=0):
    """torch lists (before, after) from the last dim backwards; a negative width crops."""
    rank = len(x.shape)
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise ValueError(f"constant_pad_nd: {list(pad)} is not (before, after) pairs for a rank-{rank} tensor")
    before, after = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        before[rank - 1 - i], after[rank - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    for dim in range(rank):  # crops first
        if before[dim] < 0 or after[dim] < 0:
            size = x.shape[dim]
            x = _slice(e, x, dim, max(-before[dim], 0), size - max(-after[dim], 0))
            before[dim], after[dim] = max(before[dim], 0), max(after[dim], 0)
    if not any(before) and not any(after):
        return x
    return e.emit("pad", x, before=tuple(before), after=tuple(after), value=float(value))


@converts(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default)
def _adaptive_avg(e, x, output_size):
    from .capture import UnsupportedOpError

    oh, ow = _pair(output_size)
    h, w = x.shape[2:]
    if (oh, ow) == (1, 1):
        return e.emit("mean", x, dims=(2, 3), keepdim=True)
    if h % oh or w % ow:
        raise UnsupportedOpError(f"unsupported op: adaptive average pooling {h}x{w} -> {oh}x{ow} (not divisible)")
    k = (h // oh, w // ow)
    return e.emit("avg_pool2d", x, kernel=k, stride=k, padding=(0, 0), count_include_pad=True, divisor_override=0)


@converts(aten.full.default)
def _full(e, size, value, dtype=None, **kw):
    from .capture import TORCH_DTYPES

    c = e.const(value, TORCH_DTYPES.get(dtype, "float32"))
    return c if not size else e.emit("expand", c, shape=tuple(size))


@converts(aten.scalar_tensor.default)
def _scalar_tensor(e, value, dtype=None, **kw):
    from .capture import TORCH_DTYPES

    return e.const(value, TORCH_DTYPES.get(dtype, "float32"))


# --- attention ----------------------------------------------------------------------------------
def _unsupported(msg: str):
    from .capture import UnsupportedOpError

    raise UnsupportedOpError(msg)


def _additive_mask(mask, causal: bool, q: Value, k: Value):
    """The attention mask as what is added to the scores: a float tensor known at capture
    time (0 where attended, -inf where not), a float Value, or None when every position is
    attended. A boolean mask must be known at capture time (built from shapes, as models do)."""
    L, S = q.shape[-2], k.shape[-2]
    keep = torch.ones(L, S, dtype=torch.bool).tril() if causal else None
    if isinstance(mask, Known) and mask.tensor.dtype == torch.bool:
        keep = mask.tensor if keep is None else keep & mask.tensor
    elif mask is not None:
        if isinstance(mask, Value) and mask.dtype == "bool":
            _unsupported("unsupported op aten.scaled_dot_product_attention with a boolean mask computed from "
                         "the inputs (only masks known at capture time)")
        if keep is not None:
            _unsupported("unsupported op aten.scaled_dot_product_attention with both is_causal and attn_mask")
        return mask.tensor if isinstance(mask, Known) else mask
    if keep is None or bool(keep.all()):
        return None
    full = torch.broadcast_to(keep, torch.broadcast_shapes(keep.shape, tuple(q.shape[:-2]) + (L, S)))
    if not bool(full.any(-1).all()):
        _unsupported("unsupported op aten.scaled_dot_product_attention: a query attends to no key")
    return torch.zeros(keep.shape, dtype=getattr(torch, q.dtype)).masked_fill(~keep, -math.inf)


@const_aware(aten.scaled_dot_product_attention.default)
def _sdpa(e, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
          constant=None):
    """softmax(q k^T * scale + mask) v, from matmul, mul, add and softmax ops."""
    q, k, v = (x.value() if isinstance(x, Known) else x for x in (q, k, v))
    if dropout_p:
        _unsupported("unsupported op aten.scaled_dot_product_attention with dropout: call model.eval()")
    if q.shape[:-2] != k.shape[:-2] and enable_gqa:
        _unsupported("unsupported op aten.scaled_dot_product_attention with grouped-query attention")
    mask = _additive_mask(attn_mask, bool(is_causal), q, k)
    if isinstance(mask, torch.Tensor):
        if constant is None:
            _unsupported("unsupported op aten.scaled_dot_product_attention with a mask unknown at capture time")
        mask = constant(mask)
    rank = len(k.shape)
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    s = e.emit("matmul", q, e.emit("permute", k, perm=tuple(perm)))
    s = e.emit("mul", s, e.const(scale if scale is not None else 1 / math.sqrt(q.shape[-1]), q.dtype))
    if mask is not None:
        s = e.emit("add", s, mask)
    p = e.emit("softmax", s, dim=len(s.shape) - 1)
    return e.emit("matmul", p, v)
