"""Core-aten -> IR converters of the activations and functions of ops/pointwise.py (they register
into converters.CONVERTERS). torch.export's decompositions give elu, leaky_relu, abs, sin, cos,
log1p, erf, sign and the roundings; under torch.compile AOTAutograd also hands over softplus, mish,
celu and _prelu_kernel undecomposed, which become the same ops (_prelu_kernel: where,
ops/select.py)."""
from __future__ import annotations

from ..ops import Emitter
from ..ops.pointwise import SOFTPLUS_DEFAULTS
from .converters import aten, converts

#: torch's mish is x tanh(softplus(x)) with softplus's default beta and threshold: above the
#: threshold log(1 + e^x) - x < e^-20, which tanh's slope there (< 1e-16) makes vanish
_MISH_SOFTPLUS = dict(SOFTPLUS_DEFAULTS)


@converts(aten.elu.default)
def _elu(e: Emitter, x, alpha=1.0, scale=1.0, input_scale=1.0):
    return e.emit("elu", x, alpha=float(alpha), scale=float(scale), input_scale=float(input_scale))


@converts(aten.celu.default)
def _celu(e, x, alpha=1.0):  # max(0, x) + min(0, alpha (exp(x / alpha) - 1))
    return e.emit("elu", x, alpha=float(alpha), scale=1.0, input_scale=1.0 / float(alpha))


@converts(aten.leaky_relu.default)
def _leaky_relu(e, x, negative_slope=0.01):
    return e.emit("leaky_relu", x, negative_slope=float(negative_slope))


@converts(aten.softplus.default)
def _softplus(e, x, beta=1.0, threshold=20.0):
    return e.emit("softplus", x, beta=float(beta), threshold=float(threshold))


@converts(aten.mish.default)
def _mish(e, x):
    return e.emit("mul", x, e.emit("tanh", e.emit("softplus", x, **_MISH_SOFTPLUS)))


@converts(aten._prelu_kernel.default)
def _prelu(e, x, weight):
    """x where x > 0, else weight x (weight broadcast as torch's): torch.export's decomposition of
    PReLU, so the gradients are torch's everywhere (weight * g to x at 0 too)."""
    positive = e.emit("compare", x, e.const(0.0, x.dtype), cmp="gt")
    return e.emit("where", positive, x, e.emit("mul", weight, x))


# (expm1: nn.CELU's decomposition)
for _name in ("abs", "sin", "cos", "log1p", "expm1", "floor", "ceil", "trunc", "round", "erf", "sign"):
    converts(getattr(aten, _name).default)((lambda op: lambda e, x: e.emit(op, x))(_name))
converts(aten.sgn.default)(lambda e, x: e.emit("sign", x))  # (torch.sgn of a real tensor: its sign)
