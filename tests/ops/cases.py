"""One test case per forward op: a generator of inputs and attrs from hypothesis draws,
the torch function it must equal, and which inputs are differentiable."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import hypothesis.strategies as st
import numpy as np
import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Case:
    make: Callable  # (draw, rng) -> (list of np inputs, attrs)
    torch_fn: Callable  # (list of torch tensors, attrs) -> tensor
    diff: tuple = None  # indices of differentiable inputs (None: every float input)


def _f(rng, *shape, positive=False):
    x = rng.normal(size=shape)
    return np.abs(x) + 0.5 if positive else x


def _shape(draw, rank=None):
    r = rank if rank is not None else draw(st.integers(1, 3))
    return tuple(draw(st.integers(1, 4)) for _ in range(r))


def _binary(fn, positive_b=False):
    def make(draw, rng):
        a = (2, 3, 4)
        b = draw(st.sampled_from([(4,), (3, 1), (1, 3, 4), (2, 3, 4), ()]))
        return [_f(rng, *a), _f(rng, *b, positive=positive_b)], {}

    return Case(make, lambda t, a: fn(t[0], t[1]))


def _unary(fn, positive=False, **attrs):
    return Case(lambda d, r: ([_f(r, *_shape(d), positive=positive)], dict(attrs)), lambda t, a: fn(t[0], a))


def _clamp(draw, rng):
    kind = draw(st.sampled_from(["min", "max", "both"]))
    attrs = {"min": -0.3} if kind == "min" else {"max": 0.4} if kind == "max" else {"min": -0.5, "max": 0.5}
    return [_f(rng, *_shape(draw))], attrs


def _reduce(draw, rng):
    x = _f(rng, 2, 3, 4)
    dims = draw(st.sampled_from([(0,), (1, 2), (-1,), (0, 1, 2)]))
    return [x], {"dims": dims, "keepdim": draw(st.booleans())}


def _conv(draw, rng):
    n, c = draw(st.integers(1, 2)), draw(st.sampled_from([2, 4]))
    g = draw(st.sampled_from([1, 2, c]))
    o = c if g == c else draw(st.sampled_from([2, 4]))
    k, s, p, dil = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(0, 1)), draw(st.integers(1, 2))
    h = draw(st.integers(dil * (k - 1) + 1, 7))
    ins = [_f(rng, n, c, h, h + 1), _f(rng, o, c // g, k, k)] + ([_f(rng, o)] if draw(st.booleans()) else [])
    return ins, {"stride": (s, s), "padding": (p, p), "dilation": (dil, dil), "groups": g}


def _torch_conv(t, a):
    return F.conv2d(t[0], t[1], t[2] if len(t) > 2 else None, a["stride"], a["padding"], a["dilation"], a["groups"])


def _bn(draw, rng):
    c = 3
    ins = [_f(rng, 2, c, 3, 3), _f(rng, c), _f(rng, c, positive=True)]
    return ins + ([_f(rng, c), _f(rng, c)] if draw(st.booleans()) else []), {"eps": 1e-5}


def _torch_bn(t, a):
    w, b = (t[3], t[4]) if len(t) == 5 else (None, None)
    return F.batch_norm(t[0], t[1], t[2], w, b, training=False, eps=a["eps"])


def _ln(draw, rng):
    k = draw(st.sampled_from([(4,), (3, 4)]))
    n = draw(st.integers(0, 2))
    return [_f(rng, 2, 3, 4)] + [_f(rng, *k) for _ in range(n)], {"normalized_shape": k, "eps": 1e-5}


def _pool(draw, rng, avg):
    k, s = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    p = draw(st.integers(0, k // 2))
    attrs = {"kernel": (k, k), "stride": (s, s), "padding": (p, p)}
    if avg:
        attrs.update(count_include_pad=draw(st.booleans()), divisor_override=0)
    else:
        attrs["dilation"] = (1, 1)
    return [_f(rng, 2, 3, 5, 6)], attrs


CASES: dict[str, Case] = {
    "add": _binary(torch.add), "sub": _binary(torch.sub), "mul": _binary(torch.mul),
    "div": _binary(torch.div, positive_b=True),
    "neg": _unary(lambda x, a: -x), "relu": _unary(lambda x, a: torch.relu(x)),
    "sigmoid": _unary(lambda x, a: torch.sigmoid(x)), "tanh": _unary(lambda x, a: torch.tanh(x)),
    "exp": _unary(lambda x, a: torch.exp(x)), "log": _unary(lambda x, a: torch.log(x), positive=True),
    "sqrt": _unary(lambda x, a: torch.sqrt(x), positive=True),
    "rsqrt": _unary(lambda x, a: torch.rsqrt(x), positive=True),
    "pow": _unary(lambda x, a: x ** a["exponent"], positive=True, exponent=2.5),
    "gelu": Case(lambda d, r: ([_f(r, *_shape(d))], {"approximate": d(st.sampled_from(["none", "tanh"]))}),
                 lambda t, a: F.gelu(t[0], approximate=a["approximate"])),
    "clamp": Case(_clamp, lambda t, a: torch.clamp(t[0], a.get("min"), a.get("max"))),
    "cast": Case(lambda d, r: ([_f(r, 3, 2)], {"dtype": "float32"}), lambda t, a: t[0].float()),
    "const": Case(lambda d, r: ([], {"value": 2.5, "dtype": "float64"}),
                  lambda t, a: torch.tensor(2.5, dtype=torch.float64)),
    "sum": Case(_reduce, lambda t, a: t[0].sum(a["dims"], keepdim=a["keepdim"])),
    "mean": Case(_reduce, lambda t, a: t[0].mean(a["dims"], keepdim=a["keepdim"])),
    "reshape": Case(lambda d, r: ([_f(r, 2, 3, 4)], {"shape": d(st.sampled_from([(6, 4), (24,), (2, 12, 1)]))}),
                    lambda t, a: t[0].reshape(a["shape"])),
    "permute": Case(lambda d, r: ([_f(r, 2, 3, 4)], {"perm": tuple(d(st.permutations([0, 1, 2])))}),
                    lambda t, a: t[0].permute(*a["perm"])),
    "expand": Case(lambda d, r: ([_f(r, 3, 1)], {"shape": d(st.sampled_from([(3, 4), (2, 3, 5)]))}),
                   lambda t, a: t[0].expand(a["shape"])),
    "slice": Case(lambda d, r: ([_f(r, 4, 7)], {"dim": d(st.integers(0, 1)), "start": 1, "end": 4,
                                                  "step": d(st.integers(1, 2))}),
                  lambda t, a: t[0][(slice(None),) * a["dim"] + (slice(a["start"], a["end"], a["step"]),)]),
    "cat": Case(lambda d, r: ([_f(r, 2, 3), _f(r, 2, d(st.integers(1, 3))), _f(r, 2, 1)], {"dim": 1}),
                lambda t, a: torch.cat(t, a["dim"])),
    "index_select": Case(lambda d, r: ([_f(r, 2, 5, 3)], {"dim": 1, "index": (0, 2, 3)}),
                         lambda t, a: t[0][:, list(a["index"])]),
    "conv2d": Case(_conv, _torch_conv),
    "linear": Case(lambda d, r: ([_f(r, *((2, 3, 4) if d(st.booleans()) else (3, 4))), _f(r, 5, 4)]
                                 + ([_f(r, 5)] if d(st.booleans()) else []), {}),
                   lambda t, a: F.linear(*t)),
    "matmul": Case(lambda d, r: ([_f(r, *d(st.sampled_from([(3, 4), (2, 3, 4), (1, 3, 4)]))),
                                  _f(r, *d(st.sampled_from([(4, 2), (2, 4, 2)])))], {}),
                   lambda t, a: torch.matmul(t[0], t[1])),
    "batch_norm": Case(_bn, _torch_bn, diff=(0, 3, 4)),
    "layer_norm": Case(_ln, lambda t, a: F.layer_norm(t[0], a["normalized_shape"], *(t[1:] + [None] * 2)[:2],
                                                      eps=a["eps"])),
    "avg_pool2d": Case(lambda d, r: _pool(d, r, True),
                       lambda t, a: F.avg_pool2d(t[0], a["kernel"], a["stride"], a["padding"],
                                                 count_include_pad=a["count_include_pad"])),
    "max_pool2d": Case(lambda d, r: _pool(d, r, False),
                       lambda t, a: F.max_pool2d(t[0], a["kernel"], a["stride"], a["padding"])),
    "softmax": Case(lambda d, r: ([_f(r, 2, 3, 4)], {"dim": d(st.integers(0, 2))}),
                    lambda t, a: torch.softmax(t[0], a["dim"])),
    "log_softmax": Case(lambda d, r: ([_f(r, 2, 3, 4)], {"dim": d(st.integers(0, 2))}),
                        lambda t, a: torch.log_softmax(t[0], a["dim"])),
    "embedding": Case(lambda d, r: ([_f(r, 6, 3), r.integers(0, 6, size=(2, 4))], {"padding_idx": -1}),
                      lambda t, a: F.embedding(t[1], t[0])),
    "cross_entropy": Case(lambda d, r: ([_f(r, 4, 5), r.integers(0, 5, size=4)], {}),
                          lambda t, a: F.cross_entropy(t[0], t[1])),
    "mse": Case(lambda d, r: ([_f(r, 3, 4), _f(r, 3, 4)], {}), lambda t, a: F.mse_loss(t[0], t[1]), diff=(0,)),
}
