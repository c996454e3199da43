"""Elementwise arithmetic with numpy broadcasting, activations, constants and casts."""
from __future__ import annotations

import numpy as np
from scipy.special import erf

from ..ir import TensorType
from .base import (ACTIVATION_TAG, GRAD_MASK_TAG, SAME_SCALE_TAG, Emitter, Int8Rule, OpDef, broadcast_shapes, register,
                   same_dtype, zero_mac_cost)

# tanh-approximation constants of GELU (Hendrycks & Gimpel 2016)
_GELU_C = float(np.sqrt(2.0 / np.pi))
_GELU_K = 0.044715


# --- binary ---------------------------------------------------------------------------
def _binary_infer(op):
    def infer(types, attrs):
        return [TensorType(broadcast_shapes(types[0].shape, types[1].shape), same_dtype(types, op))]

    return infer


def _vjp_add(e: Emitter, node, grads, needs):
    (g,) = grads
    a, b = node.inputs
    return [e.sum_to(g, a.shape) if needs[0] else None, e.sum_to(g, b.shape) if needs[1] else None]


def _vjp_sub(e: Emitter, node, grads, needs):
    (g,) = grads
    a, b = node.inputs
    return [e.sum_to(g, a.shape) if needs[0] else None,
            e.emit("neg", e.sum_to(g, b.shape)) if needs[1] else None]


def _vjp_mul(e: Emitter, node, grads, needs):
    (g,) = grads
    a, b = node.inputs
    return [e.sum_to(e.emit("mul", g, b), a.shape) if needs[0] else None,
            e.sum_to(e.emit("mul", g, a), b.shape) if needs[1] else None]


def _vjp_div(e: Emitter, node, grads, needs):
    (g,) = grads
    a, b = node.inputs
    ga = e.sum_to(e.emit("div", g, b), a.shape) if needs[0] else None
    gb = None
    if needs[1]:  # d(a/b)/db = -(a/b)/b
        gb = e.emit("neg", e.sum_to(e.emit("div", e.emit("mul", g, node.out), b), b.shape))
    return [ga, gb]


for _name, _fn, _vjp in [("add", np.add, _vjp_add), ("sub", np.subtract, _vjp_sub),
                         ("mul", np.multiply, _vjp_mul), ("div", np.divide, _vjp_div)]:
    register(OpDef(_name, _binary_infer(_name), (lambda f: lambda xs, a: [f(xs[0], xs[1])])(_fn), _vjp,
                   num_inputs=(2, 2), inplace=((0, 0), (0, 1)),
                   int8=Int8Rule("qadd", "qadd") if _name == "add" else None))


#: maximum / minimum (torch.maximum / torch.minimum): the larger / smaller of a and b, a NaN in
#: either giving NaN. The gradient is torch's: g to the operand that wins, half of g to each where
#: a == b, 0 to the one that loses ("lt": a loses to b in maximum where a < b)
_EXTREMES = {"maximum": (np.maximum, "lt"), "minimum": (np.minimum, "gt")}
_OTHER_SIDE = {"lt": "gt", "gt": "lt"}


def _vjp_extreme(e: Emitter, node, grads, needs):
    (g,) = grads
    a, b = node.inputs
    zero = e.const(0.0, g.dtype)
    shared = e.emit("where", e.emit("compare", a, b, cmp="eq"), e.emit("mul", g, e.const(0.5, g.dtype)), g)
    a_loses = _EXTREMES[node.op][1]
    return [e.sum_to(e.emit("where", e.emit("compare", a, b, cmp=loses), zero, shared), v.shape) if need else None
            for v, loses, need in ((a, a_loses, needs[0]), (b, _OTHER_SIDE[a_loses], needs[1]))]


for _name, (_fn, _) in _EXTREMES.items():
    register(OpDef(_name, _binary_infer(_name), (lambda f: lambda xs, a: [f(xs[0], xs[1])])(_fn), _vjp_extreme,
                   num_inputs=(2, 2), inplace=((0, 0), (0, 1))))


# --- unary forward ops and their pointwise-derivative backward ops ---------------------
def _same_infer(types, attrs):
    return [types[0]]


def _unary(name, fn, vjp, **facts):
    register(OpDef(name, _same_infer, lambda xs, a: [np.asarray(fn(xs[0], a), dtype=xs[0].dtype)], vjp,
                   num_inputs=(1, 1), inplace=((0, 0),), **facts))


def _pointwise_grad(name, dfn, **facts):
    """Backward op `name(g, s) = g * dfn(s)`, s being the saved forward input or output."""
    register(OpDef(name, lambda ts, a: [ts[0]],
                   lambda xs, a: [np.asarray(xs[0] * dfn(xs[1], a), dtype=xs[0].dtype)], num_inputs=(2, 2),
                   inplace=((0, 0),), **facts))


def _via(grad_op: str, saved: str, *keep: str):
    """VJP emitting `grad_op(g, saved)`; saved is 'x' (forward input) or 'y' (output)."""

    def vjp(e: Emitter, node, grads, needs):
        s = node.out if saved == "y" else node.inputs[0]
        return [e.emit(grad_op, grads[0], s, **{k: node.attrs[k] for k in keep if k in node.attrs})]

    return vjp


def _gelu(x, a):
    if a.get("approximate", "none") == "tanh":
        return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + _GELU_K * x**3)))
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _gelu_d(x, a):
    if a.get("approximate", "none") == "tanh":
        t = np.tanh(_GELU_C * (x + _GELU_K * x**3))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _GELU_C * (1 + 3 * _GELU_K * x * x)
    return 0.5 * (1.0 + erf(x / np.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)


def _vjp_neg(e, node, grads, needs):
    return [e.emit("neg", grads[0])]


def _vjp_exp(e, node, grads, needs):
    return [e.emit("mul", grads[0], node.out)]


def _vjp_log(e, node, grads, needs):
    return [e.emit("div", grads[0], node.inputs[0])]


def _vjp_sqrt(e, node, grads, needs):  # d sqrt(x) = 1 / (2 sqrt(x))
    return [e.emit("div", grads[0], e.emit("mul", node.out, e.const(2.0, node.out.dtype)))]


def _vjp_rsqrt(e, node, grads, needs):  # d x^-1/2 = -1/2 y^3
    y = node.out
    y3 = e.emit("mul", e.emit("mul", y, y), y)
    return [e.emit("mul", grads[0], e.emit("mul", y3, e.const(-0.5, y.dtype)))]


def _vjp_pow(e, node, grads, needs):  # d x^p = p x^(p-1)
    p = node.attrs["exponent"]
    x = node.inputs[0]
    d = e.emit("mul", e.emit("pow", x, exponent=p - 1.0), e.const(p, x.dtype))
    return [e.emit("mul", grads[0], d)]


_unary("neg", lambda x, a: -x, _vjp_neg)
#: ReLU and clamp keep their input's int8 scale (run as qclamp) and fuse into an int8 layer
_ACTIVATION = dict(tags={SAME_SCALE_TAG, ACTIVATION_TAG}, int8=Int8Rule("same", "qclamp"))
_unary("relu", lambda x, a: np.maximum(x, 0), _via("relu_grad", "y"), **_ACTIVATION)
_unary("clamp", lambda x, a: np.clip(x, a.get("min", -np.inf), a.get("max", np.inf)),
       _via("clamp_grad", "x", "min", "max"), **_ACTIVATION)
_unary("sigmoid", lambda x, a: 0.5 * (1.0 + np.tanh(0.5 * x)), _via("sigmoid_grad", "y"))  # overflow-free
_unary("tanh", lambda x, a: np.tanh(x), _via("tanh_grad", "y"))
_unary("gelu", _gelu, _via("gelu_grad", "x", "approximate"))
_unary("exp", lambda x, a: np.exp(x), _vjp_exp)
_unary("log", lambda x, a: np.log(x), _vjp_log)
_unary("sqrt", lambda x, a: np.sqrt(x), _vjp_sqrt)
_unary("rsqrt", lambda x, a: 1.0 / np.sqrt(x), _vjp_rsqrt)
_unary("pow", lambda x, a: np.power(x, a["exponent"]), _vjp_pow)

_pointwise_grad("relu_grad", lambda y, a: y > 0, tags={GRAD_MASK_TAG})
_pointwise_grad("clamp_grad", lambda x, a: (x > a.get("min", -np.inf)) & (x < a.get("max", np.inf)),
                tags={GRAD_MASK_TAG})
_pointwise_grad("sigmoid_grad", lambda y, a: y * (1 - y))
_pointwise_grad("tanh_grad", lambda y, a: 1 - y * y)
_pointwise_grad("gelu_grad", _gelu_d)

# --- constants and casts ---------------------------------------------------------------
register(OpDef("const", lambda ts, a: [TensorType((), a["dtype"])],
               lambda xs, a: [np.asarray(a["value"], dtype=a["dtype"])], cost=zero_mac_cost, num_inputs=(0, 0)))


def _vjp_cast(e, node, grads, needs):
    return [e.emit("cast", grads[0], dtype=node.inputs[0].dtype)]


register(OpDef("cast", lambda ts, a: [TensorType(ts[0].shape, a["dtype"])],
               lambda xs, a: [xs[0].astype(a["dtype"])], _vjp_cast, cost=zero_mac_cost, num_inputs=(1, 1)))
