"""Core-aten -> IR converters of layers: convolution, linear and matrix products, normalisation,
embedding, softmax, pooling (ceil mode included), padding, constants, attention. They register
into `converters.CONVERTERS` (the package's __init__ imports this module)."""
from __future__ import annotations

import math

import torch

from ..ir import Value
from ..ops.conv import conv_out_hw
from .aten import convert_slice
from .converters import CONVERTERS, TORCH_DTYPES, Known, aten, as_pair, const_aware, converts, unsupported
from .errors import UnsupportedOpError


# --- layers -----------------------------------------------------------------------------------
@converts(aten.convolution.default)
def _convolution(e, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    """conv2d / conv3d / conv_transpose2d; a 1-d convolution (N, C, L) runs as its 2-d op on the
    (N, C, 1, L) view with a (.., 1, K) kernel, as TFLite runs conv1d (so int8 lowers it to qconv2d)."""
    spatial = len(x.shape) - 2
    bias = (b,) if b is not None else ()
    if spatial == 1:
        return _convolution_1d(e, x, w, bias, stride, padding, dilation, transposed, output_padding, groups)
    if transposed and spatial == 2:
        return e.emit("conv_transpose2d", x, w, *bias, stride=as_pair(stride), padding=as_pair(padding),
                      dilation=as_pair(dilation), output_padding=as_pair(output_padding), groups=int(groups))
    if transposed:
        raise UnsupportedOpError(f"unsupported op aten.convolution (transposed {spatial}-d); only 1-d and 2-d "
                                 f"transposed convolutions")
    if spatial == 2:
        return e.emit("conv2d", x, w, *bias, stride=as_pair(stride), padding=as_pair(padding),
                      dilation=as_pair(dilation), groups=int(groups))
    if spatial == 3:
        return e.emit("conv3d", x, w, *bias, stride=_as_triple(stride), padding=_as_triple(padding),
                      dilation=_as_triple(dilation), groups=int(groups))
    raise UnsupportedOpError(f"unsupported op aten.convolution ({spatial}-d); only 1-d, 2-d and 3-d convolutions")


def _as_triple(v):
    v = tuple(int(i) for i in (v if isinstance(v, (list, tuple)) else (v,)))
    return v * 3 if len(v) == 1 else v


def _convolution_1d(e, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """A 1-d (transposed) convolution as the 2-d one on height 1: the kernel's height is 1, the
    height's stride, dilation and output padding 1, 1 and 0, its padding 0."""
    def pair(v, height):
        return (height, int(v[0] if isinstance(v, (list, tuple)) else v))

    n, c, length = x.shape
    x4 = e.emit("reshape", x, shape=(n, c, 1, length))
    w4 = e.emit("reshape", w, shape=tuple(w.shape[:2]) + (1, w.shape[2]))
    geo = dict(stride=pair(stride, 1), padding=pair(padding, 0), dilation=pair(dilation, 1), groups=int(groups))
    if transposed:
        y4 = e.emit("conv_transpose2d", x4, w4, *bias, output_padding=pair(output_padding, 0), **geo)
    else:
        y4 = e.emit("conv2d", x4, w4, *bias, **geo)
    return e.emit("reshape", y4, shape=(n, y4.shape[1], y4.shape[3]))


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
def convert_batch_norm(e, x, w, b, mean, var, momentum, eps):
    if (w is None) != (b is None):
        w = w if w is not None else e.emit("expand", e.const(1.0, x.dtype), shape=mean.shape)
        b = b if b is not None else e.emit("expand", e.const(0.0, x.dtype), shape=mean.shape)
    affine = (w, b) if w is not None else ()
    return e.emit("batch_norm", x, mean, var, *affine, eps=float(eps)), None, None


@converts(aten.native_layer_norm.default)
def convert_layer_norm(e, x, shape, w, b, eps):
    if w is None and b is not None:
        w = e.emit("expand", e.const(1.0, x.dtype), shape=tuple(shape))
    args = tuple(v for v in (w, b) if v is not None)
    return e.emit("layer_norm", x, *args, normalized_shape=tuple(shape), eps=float(eps)), None, None


@converts(aten.embedding.default)
def _embedding(e, w, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return e.emit("embedding", w, idx, padding_idx=int(padding_idx))


#: EmbeddingBag's modes (aten._embedding_bag's `mode`)
_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


def _bag_counts(e, keep, bag_of, bags: int, sizes: list, known: Known, keep_dtype: str) -> Value:
    """(bags, 1): each bag's number of rows, padding ids left out (`keep`: 1.0 / 0.0 per id, or None)."""
    if keep is None:
        return known.value(torch.tensor([[float(max(s, 1))] for s in sizes], dtype=getattr(torch, keep_dtype)))
    zeros = e.emit("expand", e.const(0.0, keep.dtype), shape=(bags,))
    count = e.emit("index_put", zeros, keep, bag_of, first=0, accumulate=True)
    return e.emit("reshape", e.emit("clamp", count, min=1.0), shape=(bags, 1))  # (an empty bag: 0 / 1)


@const_aware(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(e, w, idx, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
                   include_last_offset=False, padding_idx=-1, constant=None):
    """nn.EmbeddingBag / F.embedding_bag with the bags known at capture: a 2-D input (each row a bag)
    or 1-D ids with constant offsets. The ids' rows are read (`embedding`); a padding id's row counts
    for nothing (times 0, and left out of the mean's count); each bag reduces its rows: sum (each
    row times its per_sample_weight if given), mean (an empty bag gives zeros, as torch's) or max
    (bags of one size: the first largest row per feature, argmax and gather, whose gradient goes to
    that row as torch's). Bags of different sizes add their rows with an accumulating index_put.
    The op's other outputs (offset2bag, bag sizes, max indices) are not translated."""
    what = _BAG_MODES.get(int(mode))
    if what is None or scale_grad_by_freq:
        unsupported(f"unsupported op: EmbeddingBag with mode={mode}, scale_grad_by_freq={scale_grad_by_freq}")
    if not isinstance(offsets, Known):
        unsupported("unsupported op: EmbeddingBag with offsets computed at run time (the bags must be known at "
                    "capture: a 2-D input, or constant offsets)")
    w, idx = (v.value() if isinstance(v, Known) else v for v in (w, idx))
    n, dim = int(idx.shape[0]), int(w.shape[1])
    starts = [int(o) for o in offsets.tensor.reshape(-1).tolist()]
    ends = starts[1:] + ([] if include_last_offset else [n])
    starts = starts[:len(ends)]
    if (starts and starts[0] != 0) or any(not 0 <= s <= t <= n for s, t in zip(starts, ends)):
        raise ValueError(f"EmbeddingBag offsets {starts} do not split {n} ids into bags from the first")
    sizes, bags = [t - s for s, t in zip(starts, ends)], len(starts)
    pad = int(padding_idx) if padding_idx is not None else -1
    rows = e.emit("embedding", w, idx, padding_idx=pad)
    keep = weight = None
    if per_sample_weights is not None:
        if what != "sum":
            raise ValueError("EmbeddingBag: per_sample_weights need mode='sum', as in torch")
        weight = per_sample_weights.value() if isinstance(per_sample_weights, Known) else per_sample_weights
    if pad >= 0:
        if what == "max":
            unsupported("unsupported op: EmbeddingBag in max mode with a padding_idx")
        keep = e.emit("cast", e.emit("compare", idx, e.const(pad, idx.dtype), cmp="ne"), dtype=w.dtype)
        weight = keep if weight is None else e.emit("mul", weight, keep)
    if weight is not None:
        rows = e.emit("mul", rows, e.emit("reshape", weight, shape=(n, 1)))
    same = bool(sizes) and len(set(sizes)) == 1 and sizes[0] > 0
    if what == "max":
        if not same:
            unsupported("unsupported op: EmbeddingBag in max mode with bags of different sizes")
        stacked = e.emit("reshape", rows, shape=(bags, sizes[0], dim))
        at = e.emit("argmax", stacked, dim=1, keepdim=True)
        return e.emit("reshape", e.emit("gather", stacked, at, dim=1), shape=(bags, dim)), None, None, None
    bag_of = None if same and keep is None else offsets.value(  # (each id's bag, where an index_put needs it)
        torch.repeat_interleave(torch.arange(bags), torch.tensor(sizes, dtype=torch.int64)))
    if same:
        total = e.emit("sum", e.emit("reshape", rows, shape=(bags, sizes[0], dim)), dims=(1,), keepdim=False)
    else:
        zeros = e.emit("expand", e.const(0.0, w.dtype), shape=(bags, dim))
        total = e.emit("index_put", zeros, rows, bag_of, first=0, accumulate=True)
    if what != "sum":
        total = e.emit("div", total, _bag_counts(e, keep, bag_of, bags, sizes, offsets, w.dtype))
    return total, None, None, None  # (offset2bag, bag sizes, max indices: not translated)


@converts(aten._softmax.default)
def _softmax(e, x, dim, half_to_float=False):
    return e.emit("softmax", x, dim=dim % len(x.shape))


@converts(aten._safe_softmax.default)
def _safe_softmax(e, x, dim, dtype=None):
    """Attention's softmax when SDPA is decomposed (dropout in training mode): softmax; a row
    whose every entry is -inf (a query masked from every key) would be zeros in torch and is
    NaN here, which the step reports as a non-finite loss."""
    if dtype is not None and TORCH_DTYPES[dtype] != x.dtype:
        x = e.emit("cast", x, dtype=TORCH_DTYPES[dtype])
    return e.emit("softmax", x, dim=dim % len(x.shape))


@converts(aten._log_softmax.default)
def _log_softmax(e, x, dim, half_to_float=False):
    return e.emit("log_softmax", x, dim=dim % len(x.shape))


def ceil_out(size: int, k: int, s: int, p: int, d: int) -> int:
    """torch's ceil-mode output size: ceil((size + 2p - d(k-1) - 1) / s) + 1, less one when
    the last window would start past the input and its left padding (size + p)."""
    o = -(-(size + 2 * p - d * (k - 1) - 1) // s) + 1
    return o - 1 if (o - 1) * s >= size + p else o


def _ceil_extra(x, k, s, p, d, ceil_mode) -> tuple[int, int]:
    """The rows and columns that ceil_mode adds after the input (0, 0 without ceil_mode)."""
    if not ceil_mode:
        return 0, 0
    floor = conv_out_hw(x.shape[2:], k, s, p, d)
    ceil = tuple(ceil_out(x.shape[2 + i], k[i], s[i], p[i], d[i]) for i in range(2))
    return tuple((ceil[i] - floor[i]) * s[i] for i in range(2))


@const_aware(aten.avg_pool2d.default)
def _avg_pool(e, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None,
              constant=None):
    """ceil_mode=True (when it adds windows): the window sums of the input padded after its
    last row and column with zeros (as max pooling's rule), times 1 / torch's divisor per
    output position, a constant computed at capture time with torch on a tensor of ones."""
    if isinstance(x, Known):
        x = x.value()
    k = as_pair(kernel)
    s = as_pair(stride) if stride else k
    p = as_pair(padding)
    extra = _ceil_extra(x, k, s, p, (1, 1), ceil_mode)
    if not any(extra):
        return e.emit("avg_pool2d", x, kernel=k, stride=s, padding=p, count_include_pad=bool(count_include_pad),
                      divisor_override=int(divisor_override or 0))
    xp = e.emit("pad", x, before=(0, 0, 0, 0), after=(0, 0) + extra, value=0.0)
    if divisor_override:
        return e.emit("avg_pool2d", xp, kernel=k, stride=s, padding=p, count_include_pad=True,
                      divisor_override=int(divisor_override))
    if constant is None:
        unsupported("unsupported op: average pooling with ceil_mode=True outside capture")
    ones = torch.ones((1, 1) + tuple(x.shape[2:]), dtype=torch.float64)
    mean = torch.nn.functional.avg_pool2d(ones, k, s, p, ceil_mode=True, count_include_pad=bool(count_include_pad))
    total = torch.nn.functional.avg_pool2d(ones, k, s, p, ceil_mode=True, divisor_override=1)
    sums = e.emit("avg_pool2d", xp, kernel=k, stride=s, padding=p, count_include_pad=True, divisor_override=1)
    return e.emit("mul", sums, constant((mean / total)[0, 0].to(getattr(torch, x.dtype))))


@converts(aten.max_pool2d_with_indices.default)
def convert_max_pool(e, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    """ceil_mode=True is floor mode on the input padded after its last row and column with
    -inf, by (ceil size - floor size) * stride: those windows then exist and -inf never wins
    (each holds a real pixel, since torch drops a last window starting past input + padding)."""
    k = as_pair(kernel)
    s = as_pair(stride) if stride else k
    p, d = as_pair(padding), as_pair(dilation)
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
            x = convert_slice(e, x, dim, max(-before[dim], 0), size - max(-after[dim], 0))
            before[dim], after[dim] = max(before[dim], 0), max(after[dim], 0)
    if not any(before) and not any(after):
        return x
    return e.emit("pad", x, before=tuple(before), after=tuple(after), value=float(value))


@converts(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default)
def _adaptive_avg(e, x, output_size):
    """A global mean (1 x 1), an average pooling when the sizes divide (windows of one size:
    the int8 graph runs it), else adaptive_avg_pool2d (torch's windows of unequal size)."""
    oh, ow = as_pair(output_size)
    h, w = x.shape[-2:]
    rank = len(x.shape)
    if (oh, ow) == (1, 1):
        return e.emit("mean", x, dims=(rank - 2, rank - 1), keepdim=True)
    if rank == 4 and not h % oh and not w % ow:
        k = (h // oh, w // ow)
        return e.emit("avg_pool2d", x, kernel=k, stride=k, padding=(0, 0), count_include_pad=True,
                      divisor_override=0)
    return e.emit("adaptive_avg_pool2d", x, output_size=(int(oh), int(ow)))


def _filled(e, shape, value, dtype: str) -> Value:
    c = e.const(value, dtype)
    return c if not shape else e.emit("expand", c, shape=tuple(int(d) for d in shape))


@converts(aten.full.default)
def _full(e, size, value, dtype=None, **kw):
    return _filled(e, size, value, TORCH_DTYPES.get(dtype, "float32"))


# allocations shaped like a tensor computed at run time (torch.zeros_like(h) in a where, h.new_zeros(...)):
# they read its shape and dtype only (an empty one is zeros, as capture.py evaluates it)
for _op, _value in (("zeros_like", 0.0), ("ones_like", 1.0), ("empty_like", 0.0)):
    CONVERTERS[getattr(aten, _op).default] = (lambda v: lambda e, x, dtype=None, **kw: _filled(
        e, x.shape, v, TORCH_DTYPES.get(dtype, x.dtype)))(_value)
for _op, _value in (("new_zeros", 0.0), ("new_ones", 1.0), ("new_empty", 0.0)):
    CONVERTERS[getattr(aten, _op).default] = (lambda v: lambda e, x, size, dtype=None, **kw: _filled(
        e, size, v, TORCH_DTYPES.get(dtype, x.dtype)))(_value)


@converts(aten.full_like.default)
def _full_like(e, x, fill_value, dtype=None, **kw):
    return _filled(e, x.shape, fill_value, TORCH_DTYPES.get(dtype, x.dtype))


@converts(aten.new_full.default)
def _new_full(e, x, size, fill_value, dtype=None, **kw):
    return _filled(e, size, fill_value, TORCH_DTYPES.get(dtype, x.dtype))


@converts(aten.scalar_tensor.default)
def _scalar_tensor(e, value, dtype=None, **kw):
    return e.const(value, TORCH_DTYPES.get(dtype, "float32"))


# --- attention ----------------------------------------------------------------------------------
def _additive_mask(mask, causal: bool, q: Value, k: Value):
    """The attention mask as what is added to the scores: a float tensor known at capture
    time (0 where attended, -inf where not), a float Value (a boolean mask computed from the
    inputs arrives as where(mask, 0, -inf)), or None when every position is attended."""
    L, S = q.shape[-2], k.shape[-2]
    keep = torch.ones(L, S, dtype=torch.bool).tril() if causal else None
    if isinstance(mask, Known) and mask.tensor.dtype == torch.bool:
        keep = mask.tensor if keep is None else keep & mask.tensor
    elif mask is not None:
        if keep is not None:
            unsupported("unsupported op aten.scaled_dot_product_attention with both is_causal and attn_mask")
        return mask.tensor if isinstance(mask, Known) else mask
    if keep is None or bool(keep.all()):
        return None
    full = torch.broadcast_to(keep, torch.broadcast_shapes(keep.shape, tuple(q.shape[:-2]) + (L, S)))
    if not bool(full.any(-1).all()):
        unsupported("unsupported op aten.scaled_dot_product_attention: a query attends to no key")
    return torch.zeros(keep.shape, dtype=getattr(torch, q.dtype)).masked_fill(~keep, -math.inf)


def _run_time_mask(e, keep: Value, dtype: str) -> tuple:
    """(the additive mask, whether each query attends to some key (bool, keepdim)) of a boolean
    mask computed from the inputs (a padding mask): 0 where attended, -inf where not, except on a
    query that attends to no key (left padding under a causal mask), whose row is left open so its
    softmax stays finite and whose weights are then zeroed, as torch's SDPA gives such a row zeros."""
    rank = len(keep.shape)
    attends = e.emit("compare", e.emit("sum", e.emit("cast", keep, dtype="float32"), dims=(rank - 1,), keepdim=True),
                     e.const(0.0, "float32"), cmp="gt")
    open_ = e.emit("where", attends, keep, e.const(True, "bool"))
    return e.emit("where", open_, e.const(0.0, dtype), e.const(-math.inf, dtype)), attends


@const_aware(aten.scaled_dot_product_attention.default)
def _sdpa(e, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
          constant=None):
    """softmax(q k^T * scale + mask) v, from matmul, mul, add and softmax ops."""
    q, k, v = (x.value() if isinstance(x, Known) else x for x in (q, k, v))
    if dropout_p:
        unsupported("unsupported op aten.scaled_dot_product_attention with dropout: call model.eval()")
    if q.shape[:-2] != k.shape[:-2] and enable_gqa:
        unsupported("unsupported op aten.scaled_dot_product_attention with grouped-query attention")
    attends = None
    if isinstance(attn_mask, Value) and attn_mask.dtype == "bool":
        attn_mask, attends = _run_time_mask(e, attn_mask, q.dtype)
    mask = _additive_mask(attn_mask, bool(is_causal), q, k)
    if isinstance(mask, torch.Tensor):
        if constant is None:
            unsupported("unsupported op aten.scaled_dot_product_attention with a mask unknown at capture time")
        mask = constant(mask)
    rank = len(k.shape)
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    s = e.emit("matmul", q, e.emit("permute", k, perm=tuple(perm)))
    s = e.emit("mul", s, e.const(scale if scale is not None else 1 / math.sqrt(q.shape[-1]), q.dtype))
    if mask is not None:
        s = e.emit("add", s, mask)
    p = e.emit("softmax", s, dim=len(s.shape) - 1)
    if attends is not None:
        p = e.emit("where", attends, p, e.const(0.0, q.dtype))
    return e.emit("matmul", p, v)


@converts(aten._trilinear.default)
def _trilinear(e, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """nn.Bilinear's product (F.bilinear without its bias): each operand with a size-1 dim inserted at
    each of its `expand` dims, the three multiplied (broadcast) and summed over `sumdim`. The
    broadcast product is held whole (batch x out x in1 x in2 for a Bilinear), as the IR's sum
    reduces a stored tensor."""
    total = len(i1.shape) + len(expand1)
    ops = []
    for v, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        if len(v.shape) + len(expand) != total:
            raise ValueError(f"_trilinear: {v.shape} with size-1 dims at {list(expand)} is not rank {total}")
        sizes = iter(v.shape)
        at = {int(d) % total for d in expand}
        ops.append(e.emit("reshape", v, shape=tuple(1 if d in at else next(sizes) for d in range(total))))
    product = e.emit("mul", e.emit("mul", ops[0], ops[1]), ops[2])
    return e.emit("sum", product, dims=tuple(int(d) for d in sumdim), keepdim=False) if sumdim else product
