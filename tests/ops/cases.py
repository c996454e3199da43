"""The op table of the suite: one case per forward op of OPS.

A case's `spec` is a hypothesis strategy drawing valid operands (declared as `Arg`s: a
shape and a fill) and the op's attrs; `make_inputs` fills the operands from a seed, so
hypothesis draws only small integers. `torch_fn` is the torch function the op must equal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import hypothesis.strategies as st
import numpy as np
import torch
import torch.nn.functional as F
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

from edgetrain.ops.conv import conv_out_hw
from edgetrain.ops.gradupdate import block_rows


@dataclass(frozen=True)
class Arg:
    """One operand. Float operands take the dtype under test; index operands their own."""

    shape: tuple[int, ...]
    fill: str = "normal"  # "normal", "positive" (>= 0.5), "index" (integers in [0, high)),
    #                       "integral" (integers in [0, high) in the float dtype under test: ties), or
    #                       "halves" (k / 2 for integers -high < k < high, in the float dtype)
    high: int = 0
    dtype: Optional[str] = None  # of an index operand


def real(*shape: int) -> Arg:
    return Arg(tuple(shape))


def positive(*shape: int) -> Arg:
    return Arg(tuple(shape), "positive")


def index(shape, high: int, dtype: str) -> Arg:
    return Arg(tuple(shape), "index", high, dtype)


@dataclass(frozen=True)
class Case:
    spec: st.SearchStrategy  # draws (list of Arg, attrs)
    torch_fn: Callable  # (list of torch tensors, attrs) -> a tensor, or a tuple of them
    diff: Optional[tuple[int, ...]] = None  # operands with a gradient; None: every float operand


def make_inputs(args: list[Arg], seed: int, dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for a in args:
        if a.fill in ("index", "integral"):
            out.append(np.asarray(rng.integers(0, a.high, size=a.shape), dtype=a.dtype if a.fill == "index" else dtype))
        elif a.fill == "halves":  # k / 2 for k in (-high, high): rounding's ties, both signs
            out.append(np.asarray(rng.integers(-a.high + 1, a.high, size=a.shape) / 2, dtype=dtype))
        else:
            x = rng.normal(size=a.shape)
            out.append(np.asarray(np.abs(x) + 0.5 if a.fill == "positive" else x, dtype=dtype))
    return out


def shapes(min_dims=0, max_dims=3, max_side=4):
    return array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side)


def pairs(lo: int, hi: int):
    return st.tuples(st.integers(lo, hi), st.integers(lo, hi))


def dim_of(shape):
    """A dim of `shape`, possibly negative."""
    return st.integers(-len(shape), len(shape) - 1)


# --- elementwise ------------------------------------------------------------------------
def unary(torch_fn, fill=real) -> Case:
    return Case(shapes(max_dims=4).map(lambda s: ([fill(*s)], {})), lambda t, a: torch_fn(t[0]))


def binary(torch_fn, fill_b=real, ints=False) -> Case:
    """Two broadcast operands; with `ints`, sometimes two int32 or int64 ones (index arithmetic)."""
    spec = mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4).map(
        lambda s: ([real(*s.input_shapes[0]), fill_b(*s.input_shapes[1])], {}))
    if ints:
        spec = spec | st.tuples(mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4),
                                st.sampled_from(["int32", "int64"])).map(
            lambda s: ([index(sh, 50, s[1]) for sh in s[0].input_shapes], {}))
    return Case(spec, lambda t, a: torch_fn(t[0], t[1]))


@st.composite
def _compare(draw):
    """Broadcast operands of one dtype (the float under test, small integers in it so that
    equal elements occur, int32 or int64) and one of the six comparisons."""
    s = draw(mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4)).input_shapes
    kind = draw(st.sampled_from(["normal", "integral", "int32", "int64"]))
    if kind == "normal":
        args = [real(*sh) for sh in s]
    else:
        args = [Arg(tuple(sh), "integral", 3) if kind == "integral" else index(sh, 3, kind) for sh in s]
    return args, {"cmp": draw(st.sampled_from(["eq", "ne", "lt", "le", "gt", "ge"]))}


@st.composite
def _argmax(draw):
    """argmax along a dim (or over all elements: dim None), of floats, of small integers in the
    float dtype (ties: the first maximum wins), or of int32 / int64."""
    shape = draw(shapes())
    kind = draw(st.sampled_from(["normal", "integral", "int32", "int64"]))
    x = real(*shape) if kind == "normal" else Arg(shape, "integral", 3) if kind == "integral" else \
        index(shape, 3, kind)
    dim = draw(st.none() | dim_of(shape)) if shape else draw(st.sampled_from([None, 0, -1]))
    return [x], {"dim": dim, "keepdim": draw(st.booleans())}


@st.composite
def _pow(draw):
    p = draw(st.sampled_from([2.0, 3.0, 1.0, 0.0, 0.5, -1.5, -2.0, 2.5]))
    fill = real if p.is_integer() and p >= 0 else positive
    return [fill(*draw(shapes()))], {"exponent": p}


@st.composite
def _clamp(draw):
    lo = draw(st.sampled_from([-1.0, -0.3, 0.0, 0.5]))
    hi = lo + draw(st.sampled_from([0.2, 1.0, 2.0]))
    bounds = draw(st.sampled_from([{"min": lo}, {"max": hi}, {"min": lo, "max": hi}]))
    return [real(*draw(shapes()))], bounds


@st.composite
def _gelu(draw):
    return [real(*draw(shapes()))], {"approximate": draw(st.sampled_from(["none", "tanh"]))}


@st.composite
def _cast(draw):
    return [real(*draw(shapes()))], {"dtype": draw(st.sampled_from(["float32", "float64"]))}


@st.composite
def _const(draw):
    value = draw(st.floats(-10, 10, allow_nan=False))
    return [], {"value": value, "dtype": draw(st.sampled_from(["float32", "float64"]))}


# --- reductions and shape ops -------------------------------------------------------------
@st.composite
def _reduce(draw):
    shape = draw(shapes(min_dims=1, max_dims=4))
    dims = draw(st.none() | st.sets(st.integers(0, len(shape) - 1), min_size=1))
    if dims is not None:  # some written as negative dims
        dims = tuple(d - len(shape) if draw(st.booleans()) else d for d in sorted(dims))
    return [real(*shape)], {"dims": dims, "keepdim": draw(st.booleans())}


@st.composite
def _reshape(draw):
    shape = draw(shapes(min_dims=1, max_dims=4))
    target = list(draw(st.permutations(shape)))
    if len(target) > 1 and draw(st.booleans()):  # merge two neighbours
        i = draw(st.integers(0, len(target) - 2))
        target[i:i + 2] = [target[i] * target[i + 1]]
    if draw(st.booleans()):
        target.insert(draw(st.integers(0, len(target))), 1)
    return [real(*shape)], {"shape": tuple(target)}


@st.composite
def _permute(draw):
    shape = draw(shapes(min_dims=1, max_dims=4))
    return [real(*shape)], {"perm": tuple(draw(st.permutations(range(len(shape)))))}


@st.composite
def _expand(draw):
    target = draw(shapes(min_dims=1, max_dims=4))
    rank = draw(st.integers(0, len(target)))
    src = [1 if draw(st.booleans()) else d for d in target[len(target) - rank:]]
    return [real(*src)], {"shape": target}


@st.composite
def _slice(draw):
    shape = draw(shapes(min_dims=1, max_side=6))
    dim = draw(dim_of(shape))
    size = shape[dim]
    start = draw(st.integers(0, size - 1))
    end = draw(st.integers(start + 1, size + 2))
    if draw(st.booleans()):  # the same slice, with negative bounds
        start, end = start - size, end - size if end < size else end
    return [real(*shape)], {"dim": dim, "start": start, "end": end, "step": draw(st.integers(1, 3))}


def _torch_slice(t, a):
    x = t[0]
    return x[(slice(None),) * (a["dim"] % x.dim()) + (slice(a["start"], a["end"], a["step"]),)]


@st.composite
def _cat(draw):
    shape = list(draw(shapes(min_dims=1)))
    dim = draw(dim_of(shape))
    args = []
    for _ in range(draw(st.integers(1, 3))):
        shape[dim] = draw(st.integers(1, 4))
        args.append(real(*shape))
    return args, {"dim": dim}


@st.composite
def _index_select(draw):
    shape = draw(shapes(min_dims=1))
    dim = draw(dim_of(shape))
    idx = draw(st.lists(st.integers(0, shape[dim] - 1), min_size=1, max_size=5))  # repeats allowed
    return [real(*shape)], {"dim": dim, "index": tuple(idx)}


@st.composite
def _pad(draw):
    shape = draw(shapes(min_dims=1, max_dims=4))
    before = tuple(draw(st.integers(0, 2)) for _ in shape)
    after = tuple(draw(st.integers(0, 2)) for _ in shape)
    return [real(*shape)], {"before": before, "after": after, "value": draw(st.sampled_from([0.0, 1.5, -2.0]))}


def _torch_pad(t, a):
    widths = [w for b, e in zip(a["before"][::-1], a["after"][::-1]) for w in (b, e)]
    return F.pad(t[0], widths, value=a["value"])


@st.composite
def _gather(draw):
    shape = draw(shapes(min_dims=1))
    dim = draw(dim_of(shape))
    idx = [draw(st.integers(1, 4)) if d == dim % len(shape) else draw(st.integers(1, s)) for d, s in enumerate(shape)]
    return [real(*shape), index(idx, shape[dim], draw(st.sampled_from(["int64", "int32"])))], {"dim": dim}


# --- layers --------------------------------------------------------------------------------
@st.composite
def _conv2d(draw):
    kind = draw(st.sampled_from(["dense", "grouped", "depthwise", "depthwise x2"]))
    groups = 1 if kind == "dense" else draw(st.integers(2, 3))
    cin = 1 if kind.startswith("depthwise") else draw(st.integers(1, 3))  # per group
    cout = {"depthwise": 1, "depthwise x2": 2}.get(kind) or draw(st.integers(1, 3))  # per group
    # kernels 1 to 7 (the C backend's direct convolution keeps up to 7 taps of a row in registers)
    k, stride, pad, dil = draw(pairs(1, 7)), draw(pairs(1, 2)), draw(pairs(0, 3)), draw(pairs(1, 2))
    lo = [max(1, dil[i] * (k[i] - 1) + 1 - 2 * pad[i]) for i in range(2)]  # the smallest input side
    hw = [draw(st.integers(lo[i], lo[i] + 5)) for i in range(2)]  # odd and even sides
    args = [real(draw(st.integers(1, 3)), groups * cin, *hw), real(groups * cout, cin, *k)]
    if draw(st.booleans()):
        args.append(real(groups * cout))
    return args, {"stride": stride, "padding": pad, "dilation": dil, "groups": groups}


def _torch_conv2d(t, a):
    bias = t[2] if len(t) > 2 else None
    return F.conv2d(t[0], t[1], bias, a["stride"], a["padding"], a["dilation"], a["groups"])


@st.composite
def _linear(draw):
    lead = draw(shapes(max_dims=2))  # inputs of rank 1 to 3
    fan_in, fan_out = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    args = [real(*lead, fan_in), real(fan_out, fan_in)]
    return args + ([real(fan_out)] if draw(st.booleans()) else []), {}


def _matmul():
    spec = mutually_broadcastable_shapes(signature="(m,k),(k,n)->(m,n)", max_dims=2, max_side=4)
    return spec.map(lambda s: ([real(*s.input_shapes[0]), real(*s.input_shapes[1])], {}))


@st.composite
def _batch_norm(draw):
    x = draw(shapes(min_dims=2, max_dims=4))
    c = x[1]
    affine = [real(c), real(c)] if draw(st.booleans()) else []
    return [real(*x), real(c), positive(c)] + affine, {"eps": draw(st.sampled_from([1e-5, 1e-3]))}


def _torch_batch_norm(t, a):
    w, b = t[3:5] if len(t) == 5 else (None, None)
    return F.batch_norm(t[0], t[1], t[2], w, b, training=False, eps=a["eps"])


def _bn_shape(draw):
    """x for train-mode batch norm: more than one value per channel (batch statistics)."""
    return draw(shapes(min_dims=2, max_dims=4).filter(lambda s: int(np.prod(s)) // s[1] >= 2))


@st.composite
def _batch_norm_train(draw):
    x = _bn_shape(draw)
    affine = [real(x[1]), real(x[1])] if draw(st.booleans()) else []
    return [real(*x)] + affine, {"eps": draw(st.sampled_from([1e-5, 1e-3]))}


def _torch_batch_norm_train(t, a):
    w, b = t[1:3] if len(t) == 3 else (None, None)
    return F.batch_norm(t[0], None, None, w, b, training=True, eps=a["eps"])


@st.composite
def _batch_norm_update_stats(draw):
    x = _bn_shape(draw)
    momentum = draw(st.sampled_from([0.1, 0.5, None]))
    tracked = [index((), 5, "int64")] if momentum is None or draw(st.booleans()) else []
    return [real(x[1]), positive(x[1]), real(*x)] + tracked, {"momentum": momentum}


def _torch_update_stats(t, a):
    """torch's running statistics after one train-mode batch norm (and its batch count)."""
    mean, var, x = t[0].clone(), t[1].clone(), t[2]
    count = t[3] + 1 if len(t) == 4 else None
    momentum = a["momentum"] if a["momentum"] is not None else 1.0 / float(count)
    F.batch_norm(x, mean, var, training=True, momentum=momentum)
    return (mean, var) + ((count,) if count is not None else ())


@st.composite
def _layer_norm(draw):
    x = draw(shapes(min_dims=1))
    k = x[len(x) - draw(st.integers(1, len(x))):]  # may be the whole shape
    affine = [real(*k) for _ in range(draw(st.integers(0, 2)))]  # none, weight, weight and bias
    return [real(*x)] + affine, {"normalized_shape": k, "eps": draw(st.sampled_from([1e-5, 1e-3]))}


def _torch_layer_norm(t, a):
    w, b = (t[1:] + [None, None])[:2]
    return F.layer_norm(t[0], a["normalized_shape"], w, b, eps=a["eps"])


@st.composite
def _pool2d(draw, avg: bool):
    k, stride = draw(pairs(1, 3)), draw(pairs(1, 3))
    pad = tuple(draw(st.integers(0, ki // 2)) for ki in k)
    dil = (1, 1) if avg else draw(pairs(1, 2))
    # every window holds a real pixel: no all-padding window (whose max is -inf)
    hw = [draw(st.integers(max(1, k[i] - 2 * pad[i]) if avg else dil[i] * (k[i] - 1) + 1, 7)) for i in range(2)]
    attrs = {"kernel": k, "stride": stride, "padding": pad}
    if avg:
        attrs.update(count_include_pad=draw(st.booleans()), divisor_override=draw(st.sampled_from([0, 0, 3])))
    else:
        attrs["dilation"] = dil
    return [real(draw(st.integers(1, 2)), draw(st.integers(1, 3)), *hw)], attrs


def _torch_avg_pool2d(t, a):
    return F.avg_pool2d(t[0], a["kernel"], a["stride"], a["padding"], count_include_pad=a["count_include_pad"],
                        divisor_override=a["divisor_override"] or None)


def _torch_max_pool2d(t, a):
    return F.max_pool2d(t[0], a["kernel"], a["stride"], a["padding"], a["dilation"])


@st.composite
def _along_dim(draw):
    shape = draw(shapes(min_dims=1))
    return [real(*shape)], {"dim": draw(dim_of(shape))}


@st.composite
def _embedding(draw):
    num, width = draw(st.integers(2, 8)), draw(st.integers(1, 5))
    idx = index(draw(shapes(max_dims=2)), num, draw(st.sampled_from(["int64", "int32"])))
    return [real(num, width), idx], {"padding_idx": draw(st.sampled_from([-1, 0, num - 1]))}


def _torch_embedding(t, a):
    return F.embedding(t[1].long(), t[0], padding_idx=a["padding_idx"] if a["padding_idx"] >= 0 else None)


@st.composite
def _mse(draw):
    shape = draw(shapes())
    return [real(*shape), real(*shape)], {}



@st.composite
def _batch_norm_backward_fused(draw):
    """The fused batch-norm backward (ops/bnfused.py) with each optional part present or not."""
    x = draw(shapes(min_dims=2, max_dims=4))
    c = x[1]
    mask = draw(st.sampled_from(["", "relu_grad", "clamp_grad"]))
    attrs = {"mask": mask, "eps": draw(st.sampled_from([1e-5, 1e-3])), "affine": draw(st.booleans()),
             "grad_weight": draw(st.booleans()), "grad_bias": draw(st.booleans())}
    if mask == "clamp_grad":  # ReLU6, a lower bound only, an upper bound only (the absent one left out)
        attrs.update(draw(st.sampled_from([{"min": 0.0, "max": 6.0}, {"min": 0.0}, {"max": 0.5}])))
    args = [real(*x), positive(c)] + ([real(c)] if attrs["affine"] else []) + ([real(*x)] if mask else [])
    return args + ([real(*x), real(c)] if attrs["grad_weight"] else []), attrs


def _torch_batch_norm_backward_fused(t, a):
    """torch autograd through eval-mode batch norm, from the gradient masked as relu / clamp's
    backward masks it (w = 1 where the op has no weight operand: the same input gradient)."""
    from edgetrain.ops.bnfused import operands

    o = operands(t, a)
    g = o.g
    if a["mask"] == "relu_grad":
        g = torch.where(o.saved > 0, g, torch.zeros_like(g))
    elif a["mask"] == "clamp_grad":
        keep = (o.saved > a.get("min", -math.inf)) & (o.saved < a.get("max", math.inf))
        g = torch.where(keep, g, torch.zeros_like(g))
    c = g.shape[1]
    x = (o.x if o.x is not None else torch.zeros_like(g)).detach().requires_grad_()
    w = (o.w if o.w is not None else torch.ones(c, dtype=g.dtype)).detach().requires_grad_()
    b = torch.zeros(c, dtype=g.dtype, requires_grad=True)
    mean = o.mean if o.mean is not None else torch.zeros(c, dtype=g.dtype)
    y = F.batch_norm(x, mean.detach(), o.var.detach(), w, b, training=False, eps=a["eps"])
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), g.detach())
    return (gx,) + ((gw,) if a["grad_weight"] else ()) + ((gb,) if a["grad_bias"] else ())

@st.composite
def _batch_norm_act(draw):
    """Batch norm, an optional residual add and a ReLU / clamp as one op (ops/bnact.py)."""
    x = draw(shapes(min_dims=2, max_dims=4))
    c = x[1]
    attrs = {"eps": draw(st.sampled_from([1e-5, 1e-3])), "affine": draw(st.booleans()),
             "residual": draw(st.booleans()), "act": draw(st.sampled_from(["relu", "clamp"]))}
    if attrs["act"] == "clamp":  # ReLU6, a lower bound only, an upper bound only
        attrs.update(draw(st.sampled_from([{"min": 0.0, "max": 6.0}, {"min": 0.0}, {"max": 0.5}])))
    args = [real(*x), real(c), positive(c)] + ([real(c), real(c)] if attrs["affine"] else [])
    return args + ([real(*x)] if attrs["residual"] else []), attrs


def _torch_batch_norm_act(t, a):
    """torch's eval-mode batch norm, the residual added, then relu / clamp."""
    w, b = (t[3], t[4]) if a["affine"] else (None, None)
    y = F.batch_norm(t[0], t[1], t[2], w, b, training=False, eps=a["eps"])
    if a["residual"]:
        y = y + t[-1]
    return torch.relu(y) if a["act"] == "relu" else torch.clamp(y, a.get("min"), a.get("max"))


# --- optimizer ------------------------------------------------------------------------------
@st.composite
def _sgd_update(draw):
    shape = draw(shapes(min_dims=1))
    dim = draw(st.integers(0, len(shape) - 1))
    subset = draw(st.none() | st.sets(st.integers(0, shape[dim] - 1), min_size=1).map(lambda s: tuple(sorted(s))))
    sel = list(shape)
    sel[dim] = len(subset) if subset is not None else shape[dim]
    momentum = draw(st.sampled_from([0.0, 0.9]))
    args = [real(*shape), real(*sel)] + ([real(*sel)] if momentum else [])  # weight, gradient[, buffer]
    attrs = {"lr": draw(st.sampled_from([0.1, 0.01])), "momentum": momentum,
             "weight_decay": draw(st.sampled_from([0.0, 0.01])), "dim": dim, "index": subset}
    return args, attrs


def _torch_sgd(t, a):
    """One torch.optim.SGD step on the selected part of the weight, from the given buffer."""
    w, dim = t[0].clone(), a["dim"]
    idx = torch.arange(w.shape[dim]) if a["index"] is None else torch.tensor(a["index"])
    p = torch.nn.Parameter(w.index_select(dim, idx))
    p.grad = t[1].clone()
    opt = torch.optim.SGD([p], lr=a["lr"], momentum=a["momentum"], weight_decay=a["weight_decay"])
    if a["momentum"]:
        opt.state[p]["momentum_buffer"] = t[2].clone()
    opt.step()
    w.index_copy_(dim, idx, p.detach())
    return (w, opt.state[p]["momentum_buffer"]) if a["momentum"] else (w,)



# --- a weight gradient fused with its SGD update (ops/gradupdate.py, ops/embedding_update.py) ----
def _sgd_attrs(draw) -> dict:
    return {"lr": draw(st.sampled_from([0.1, 0.01])), "momentum": draw(st.sampled_from([0.0, 0.9])),
            "weight_decay": draw(st.sampled_from([0.0, 0.01])), "dim": 0, "index": None}


def _prefixed(gw: dict, up: dict) -> dict:
    return {**{"gw_" + k: v for k, v in gw.items()}, **{"up_" + k: v for k, v in up.items()}}


@st.composite
def _conv2d_grad_weight_update(draw):
    """conv2d's operands (x, w) and an output gradient gy of its output's shape, then m."""
    (x, w, *_), geo = draw(_conv2d())
    ho, wo = conv_out_hw(x.shape[2:], w.shape[2:], geo["stride"], geo["padding"], geo["dilation"])
    up = _sgd_attrs(draw)
    args = [x, real(x.shape[0], w.shape[0], ho, wo), w] + ([w] if up["momentum"] else [])
    count = w.shape[0] if geo["groups"] == 1 else geo["groups"]  # rows or groups per block: a divisor
    block = draw(st.sampled_from([d for d in range(1, count + 1) if count % d == 0]))
    return args, {**_prefixed({"weight_shape": w.shape, **geo}, up), "block": block}


@st.composite
def _linear_grad_weight_update(draw):
    (x, w, *_), _ = draw(_linear())
    up = _sgd_attrs(draw)
    block = draw(st.sampled_from([d for d in range(1, w.shape[0] + 1) if w.shape[0] % d == 0]))
    return ([x, real(*x.shape[:-1], w.shape[0]), w] + ([w] if up["momentum"] else []),
            {**_prefixed({}, up), "block": block})


@st.composite
def _embedding_grad_update(draw):
    (w, idx), a = draw(_embedding())
    up = _sgd_attrs(draw)
    args = [real(*idx.shape, w.shape[1]), idx, w] + ([w] if up["momentum"] else [])
    return args, _prefixed({"num_embeddings": w.shape[0], "padding_idx": a["padding_idx"]}, up)


def _torch_sgd_step(w, grad, m, a):
    """One torch.optim.SGD step of a copy of w with gradient grad (and momentum buffer m)."""
    p = torch.nn.Parameter(w.detach().clone())
    p.grad = grad.detach().clone()
    opt = torch.optim.SGD([p], lr=a["up_lr"], momentum=a["up_momentum"], weight_decay=a["up_weight_decay"])
    if m is not None:
        opt.state[p]["momentum_buffer"] = m.detach().clone()
    opt.step()
    return (p.detach(),) + ((opt.state[p]["momentum_buffer"],) if m is not None else ())


def _torch_weight_grad(layer, x, gy, w, a):
    wv = w.detach().clone().requires_grad_()
    (layer(x, wv, a) * gy).sum().backward()
    return wv.grad


def _torch_grad_update(layer):
    """torch.autograd's weight gradient of layer(x, w) against gy, then torch's SGD step; the
    scratch outputs as the kernel leaves them: the last block of rows (ops.gradupdate.block_rows);
    then, with fewer rows than all, a linear layer's block of gy columns, and (batch > 1) a
    conv's block of gy channels (one group) or last sample's share of the block (grouped)."""
    def fn(t, a):
        x, gy, w = t[:3]
        grad = _torch_weight_grad(layer, x, gy, w, a)
        out = _torch_sgd_step(w, grad, t[3] if len(t) > 3 else None, a)
        o = w.shape[0]
        rows = list(block_rows(a, o))
        if "gw_groups" not in a:  # linear: the block's columns of gy, when not all of them
            return out + (grad[rows],) + ((gy.reshape(-1, o)[:, rows],) if len(rows) < o else ())
        second = ()
        if x.shape[0] > 1 and len(rows) < o:  # one group: the block's gy channels; grouped: the last sample's share
            second = ((gy[:, rows],) if a["gw_groups"] == 1
                      else (_torch_weight_grad(layer, x[-1:], gy[-1:], w, a)[rows],))
        return out + (grad[rows],) + second
    return fn


def _torch_embedding_grad_update(t, a):
    """torch's dense embedding gradient and SGD step; then the touched rows' list (increasing,
    padding_idx left out, -1 after) and the last touched row's gradient (zeros: none)."""
    g, idx, w = t[:3]
    pad = a["gw_padding_idx"]
    wv = w.detach().clone().requires_grad_()
    (F.embedding(idx.long(), wv, padding_idx=pad if pad >= 0 else None) * g).sum().backward()
    rows = sorted({int(i) for i in idx.reshape(-1) if int(i) != pad})
    ids = torch.full((max(idx.numel(), 1),), -1, dtype=torch.int32)
    ids[:len(rows)] = torch.tensor(rows, dtype=torch.int32)
    last = wv.grad[rows[-1]:rows[-1] + 1] if rows else torch.zeros(1, w.shape[1], dtype=w.dtype)
    return _torch_sgd_step(w, wv.grad, t[3] if len(t) > 3 else None, a) + (last, ids)


def _gw_geo(a):
    return a["gw_stride"], a["gw_padding"], a["gw_dilation"], a["gw_groups"]


FUSED_UPDATE_CASES = {
    "conv2d_grad_weight_update": Case(_conv2d_grad_weight_update(),
                                      _torch_grad_update(lambda x, w, a: F.conv2d(x, w, None, *_gw_geo(a))), diff=()),
    "linear_grad_weight_update": Case(_linear_grad_weight_update(),
                                      _torch_grad_update(lambda x, w, a: F.linear(x, w)), diff=()),
    "embedding_grad_update": Case(_embedding_grad_update(), _torch_embedding_grad_update, diff=()),
}

CASES: dict[str, Case] = {
    "add": binary(torch.add, ints=True), "sub": binary(torch.sub, ints=True), "mul": binary(torch.mul, ints=True),
    "compare": Case(_compare(), lambda t, a: getattr(torch, a["cmp"])(t[0], t[1])),
    "argmax": Case(_argmax(), lambda t, a: torch.argmax(t[0], a["dim"], a["keepdim"])),
    "div": binary(torch.div, fill_b=positive),
    "neg": unary(torch.neg), "relu": unary(torch.relu), "sigmoid": unary(torch.sigmoid),
    "tanh": unary(torch.tanh), "exp": unary(torch.exp),
    "log": unary(torch.log, positive), "sqrt": unary(torch.sqrt, positive), "rsqrt": unary(torch.rsqrt, positive),
    "pow": Case(_pow(), lambda t, a: t[0] ** a["exponent"]),
    "gelu": Case(_gelu(), lambda t, a: F.gelu(t[0], approximate=a["approximate"])),
    "clamp": Case(_clamp(), lambda t, a: torch.clamp(t[0], a.get("min"), a.get("max"))),
    "cast": Case(_cast(), lambda t, a: t[0].to(getattr(torch, a["dtype"]))),
    "const": Case(_const(), lambda t, a: torch.tensor(a["value"], dtype=getattr(torch, a["dtype"]))),
    "sum": Case(_reduce(), lambda t, a: t[0].sum(a["dims"], keepdim=a["keepdim"])),
    "mean": Case(_reduce(), lambda t, a: t[0].mean(a["dims"], keepdim=a["keepdim"])),
    "reshape": Case(_reshape(), lambda t, a: t[0].reshape(a["shape"])),
    "detach": Case(unary(torch.detach).spec, lambda t, a: t[0].detach(), diff=()),  # (no gradient passes)
    "permute": Case(_permute(), lambda t, a: t[0].permute(a["perm"])),
    "expand": Case(_expand(), lambda t, a: t[0].expand(a["shape"])),
    "slice": Case(_slice(), _torch_slice),
    "cat": Case(_cat(), lambda t, a: torch.cat(t, a["dim"])),
    "index_select": Case(_index_select(), lambda t, a: t[0].index_select(a["dim"], torch.tensor(a["index"]))),
    "pad": Case(_pad(), _torch_pad),
    "gather": Case(_gather(), lambda t, a: torch.gather(t[0], a["dim"], t[1].long()), diff=(0,)),
    "conv2d": Case(_conv2d(), _torch_conv2d),
    "linear": Case(_linear(), lambda t, a: F.linear(*t)),
    "matmul": Case(_matmul(), lambda t, a: torch.matmul(t[0], t[1])),
    "batch_norm": Case(_batch_norm(), _torch_batch_norm, diff=(0, 3, 4)),  # running stats are buffers
    "batch_norm_train": Case(_batch_norm_train(), _torch_batch_norm_train),
    "batch_norm_update_stats": Case(_batch_norm_update_stats(), _torch_update_stats, diff=()),  # in place
    "batch_norm_backward_fused": Case(_batch_norm_backward_fused(), _torch_batch_norm_backward_fused, diff=()),
    "batch_norm_act": Case(_batch_norm_act(), _torch_batch_norm_act, diff=()),
    "layer_norm": Case(_layer_norm(), _torch_layer_norm),
    "avg_pool2d": Case(_pool2d(avg=True), _torch_avg_pool2d),
    "max_pool2d": Case(_pool2d(avg=False), _torch_max_pool2d),
    "softmax": Case(_along_dim(), lambda t, a: torch.softmax(t[0], a["dim"])),
    "log_softmax": Case(_along_dim(), lambda t, a: torch.log_softmax(t[0], a["dim"])),
    "embedding": Case(_embedding(), _torch_embedding),
    "mse": Case(_mse(), lambda t, a: F.mse_loss(t[0], t[1])),
    "sgd_update": Case(_sgd_update(), _torch_sgd),
    **FUSED_UPDATE_CASES,
}

# the op families with their own case files (each defines CASES; they import the helpers above)
from tests.ops import (cases_check, cases_conv_nd, cases_extremes, cases_lmloss, cases_loss, cases_norm,  # noqa: E402
                       cases_pointwise, cases_qweights, cases_resample, cases_select)

for _family in (cases_check, cases_conv_nd, cases_extremes, cases_lmloss, cases_loss, cases_norm, cases_pointwise,
                cases_qweights, cases_resample, cases_select):
    CASES.update(_family.CASES)
