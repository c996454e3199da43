"""More pointwise activations and functions (elu, leaky_relu, softplus, log1p, expm1, sin, cos, abs, erf,
sign, floor, ceil, trunc, round) and their gradients.

Each forward op keeps its input's shape and dtype; its VJP is one pointwise gradient op
`*_grad(g, x)` of the saved forward input (as ops/elementwise.py's gelu_grad), or existing ops
where the derivative is one (sin, cos, log1p, expm1). Semantics are torch's:
- elu(x; alpha, scale, input_scale) = scale * (x if x > 0 else alpha * (exp(input_scale x) - 1))
  (nn.ELU, nn.SELU and nn.CELU all export to it);
- leaky_relu(x; negative_slope) = x if x > 0 else negative_slope * x;
- softplus(x; beta, threshold) = x where beta x > threshold, else log(1 + exp(beta x)) / beta;
- abs(x), whose gradient is g * sign(x), 0 at 0 as torch's;
- erf(x), whose gradient is g * 2 / sqrt(pi) * exp(-x^2);
- sign(x): -1, 0 or 1, and 0 for a NaN as torch's; its gradient is zero (a step function).
Leaky ReLU with a slope in (0, 1) runs on int8 data in an int8 program (ops/qpointwise.py).
"""
from __future__ import annotations

import numpy as np
from scipy.special import erf

from .base import SAME_SCALE_TAG, Emitter, Int8Rule, OpDef, register

#: torch's defaults (nn.ELU, nn.LeakyReLU, nn.Softplus)
ELU_DEFAULTS = dict(alpha=1.0, scale=1.0, input_scale=1.0)
LEAKY_RELU_DEFAULT_SLOPE = 0.01
SOFTPLUS_DEFAULTS = dict(beta=1.0, threshold=20.0)


def _same_infer(types, attrs):
    return [types[0]]


def _grad_infer(types, attrs):
    g, s = types
    if g != s:
        raise ValueError(f"a pointwise gradient's operands differ: {g} and {s}")
    return [g]


def _attrs(a, defaults) -> list:
    return [float(a.get(k, v)) for k, v in defaults.items()]


# --- the numpy references (in the operand's dtype; float64 inside where that is exact) -----------
def elu_ref(x, a):
    alpha, scale, input_scale = _attrs(a, ELU_DEFAULTS)
    neg = alpha * np.expm1(np.minimum(x, 0) * input_scale)  # (the minimum: no overflow where x > 0)
    return scale * np.where(x > 0, x, neg)


def elu_grad_ref(x, a):
    alpha, scale, input_scale = _attrs(a, ELU_DEFAULTS)
    return np.where(x > 0, scale, alpha * scale * input_scale * np.exp(np.minimum(x, 0) * input_scale))


def leaky_relu_ref(x, a):
    return np.where(x > 0, x, x * a.get("negative_slope", LEAKY_RELU_DEFAULT_SLOPE))


def leaky_relu_grad_ref(x, a):
    return np.where(x > 0, 1.0, a.get("negative_slope", LEAKY_RELU_DEFAULT_SLOPE))


def softplus_ref(x, a):
    """max(bx, 0) + log1p(exp(-|bx|)): log(1 + e^bx) without overflow, for any threshold."""
    beta, threshold = _attrs(a, SOFTPLUS_DEFAULTS)
    bx = x * beta
    soft = (np.maximum(bx, 0) + np.log1p(np.exp(-np.abs(bx)))) / beta
    return np.where(bx > threshold, x, soft)


def softplus_grad_ref(x, a):
    beta, threshold = _attrs(a, SOFTPLUS_DEFAULTS)
    bx = x * beta
    return np.where(bx > threshold, 1.0, 0.5 * (1.0 + np.tanh(0.5 * bx)))  # the logistic, overflow-free


def abs_grad_ref(x, a):
    return np.sign(x)


# --- VJPs ----------------------------------------------------------------------------------------
def _via_x(grad_op: str, *keep: str):
    """VJP emitting `grad_op(g, x)`, x the forward input, with the forward's attrs `keep`."""

    def vjp(e: Emitter, node, grads, needs):
        return [e.emit(grad_op, grads[0], node.inputs[0], **{k: node.attrs[k] for k in keep if k in node.attrs})]

    return vjp


def _vjp_log1p(e, node, grads, needs):  # d log(1 + x) = 1 / (1 + x)
    x = node.inputs[0]
    return [e.emit("div", grads[0], e.emit("add", x, e.const(1.0, x.dtype)))]


def _vjp_expm1(e, node, grads, needs):  # d (e^x - 1) = e^x
    return [e.emit("mul", grads[0], e.emit("exp", node.inputs[0]))]


def _vjp_sin(e, node, grads, needs):
    return [e.emit("mul", grads[0], e.emit("cos", node.inputs[0]))]


def _vjp_cos(e, node, grads, needs):
    return [e.emit("mul", grads[0], e.emit("neg", e.emit("sin", node.inputs[0])))]


#: d erf(x) / dx at 0, 2 / sqrt(pi)
_ERF_SLOPE = 2.0 / np.sqrt(np.pi)


def _vjp_erf(e, node, grads, needs):  # d erf(x) = 2 / sqrt(pi) exp(-x^2), as torch's erf backward
    x = node.inputs[0]
    d = e.emit("mul", e.emit("exp", e.emit("neg", e.emit("mul", x, x))), e.const(_ERF_SLOPE, x.dtype))
    return [e.emit("mul", d, grads[0])]


def sign_ref(x, a):
    return np.where(x > 0, 1.0, np.where(x < 0, -1.0, 0.0))


def _leaky_runs_on_int8(node) -> bool:
    """A slope in (0, 1) keeps the output inside the input's int8 range and its sign (the
    int8 backward reads the sign from the output): qleaky_relu; any other stays float32."""
    slope = node.attrs.get("negative_slope", LEAKY_RELU_DEFAULT_SLOPE)
    return 0.0 < slope < 1.0


def _unary(name, ref, vjp, **facts):
    register(OpDef(name, _same_infer, lambda xs, a: [np.asarray(ref(xs[0], a), dtype=xs[0].dtype)], vjp,
                   num_inputs=(1, 1), inplace=((0, 0),), **facts))


def _pointwise_grad(name, dref):
    """`name(g, x) = g * dref(x)`, x the saved forward input."""
    register(OpDef(name, _grad_infer, lambda xs, a: [np.asarray(xs[0] * dref(xs[1], a), dtype=xs[0].dtype)],
                   num_inputs=(2, 2), inplace=((0, 0),)))


_unary("elu", elu_ref, _via_x("elu_grad", *ELU_DEFAULTS))
_unary("leaky_relu", leaky_relu_ref, _via_x("leaky_relu_grad", "negative_slope"), tags={SAME_SCALE_TAG},
       int8=Int8Rule("same", "qleaky_relu", _leaky_runs_on_int8))
_unary("softplus", softplus_ref, _via_x("softplus_grad", *SOFTPLUS_DEFAULTS))
_unary("log1p", lambda x, a: np.log1p(x), _vjp_log1p)
_unary("expm1", lambda x, a: np.expm1(x), _vjp_expm1)
_unary("sin", lambda x, a: np.sin(x), _vjp_sin)
_unary("cos", lambda x, a: np.cos(x), _vjp_cos)
_unary("abs", lambda x, a: np.abs(x), _via_x("abs_grad"))
# floor, ceil, trunc, round (a half to even, as torch.round) and sign: step functions, their gradient
# zero wherever it exists (torch's backward gives zeros); stochastic depth's keep mask
# floor(keep_prob + rand) (timm's and transformers' drop_path), a straight-through estimator's
# x + (round(x) - x).detach()
for _name, _fn in (("floor", np.floor), ("ceil", np.ceil), ("trunc", np.trunc), ("round", np.round)):
    _unary(_name, (lambda f: lambda x, a: f(x))(_fn), lambda e, node, grads, needs: [None])
_unary("sign", sign_ref, lambda e, node, grads, needs: [None])
_unary("erf", lambda x, a: erf(x), _vjp_erf)

_pointwise_grad("elu_grad", elu_grad_ref)
_pointwise_grad("leaky_relu_grad", leaky_relu_grad_ref)
_pointwise_grad("softplus_grad", softplus_grad_ref)
_pointwise_grad("abs_grad", abs_grad_ref)
