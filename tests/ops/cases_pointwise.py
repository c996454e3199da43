"""Op-table cases of the pointwise family (merged into tests/ops/cases.py's CASES)."""
from __future__ import annotations

import hypothesis.strategies as st
import torch
import torch.nn.functional as F

from tests.ops.cases import Arg, Case, positive, real, shapes, unary

#: SELU's constants (Klambauer et al. 2017), as torch's nn.SELU
SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805


@st.composite
def _elu(draw):
    attrs = draw(st.sampled_from([dict(alpha=1.0, scale=1.0, input_scale=1.0),
                                  dict(alpha=SELU_ALPHA, scale=SELU_SCALE, input_scale=1.0),  # SELU
                                  dict(alpha=0.7, scale=1.0, input_scale=1 / 0.7),  # CELU(0.7)
                                  dict(alpha=0.3, scale=2.0, input_scale=0.5)]))
    return [real(*draw(shapes(max_dims=4)))], attrs


def _torch_elu(t, a):
    return torch.ops.aten.elu(t[0], a["alpha"], a["scale"], a["input_scale"])


@st.composite
def _leaky_relu(draw):
    return [real(*draw(shapes(max_dims=4)))], {"negative_slope": draw(st.sampled_from([0.01, 0.2, 0.0, -0.5, 1.5]))}


@st.composite
def _softplus(draw):
    # thresholds the normal draws cross (0.5, 1) and torch's default
    attrs = draw(st.sampled_from([dict(beta=1.0, threshold=20.0), dict(beta=2.0, threshold=1.0),
                                  dict(beta=0.5, threshold=0.5), dict(beta=3.0, threshold=20.0)]))
    return [real(*draw(shapes(max_dims=4)))], attrs


CASES: dict = {
    "elu": Case(_elu(), _torch_elu),
    "leaky_relu": Case(_leaky_relu(), lambda t, a: F.leaky_relu(t[0], a["negative_slope"])),
    "softplus": Case(_softplus(), lambda t, a: F.softplus(t[0], a["beta"], a["threshold"])),
    "log1p": unary(torch.log1p, positive),  # (x near 0: tests/backends/c/test_pointwise_math.py)
    "expm1": unary(torch.expm1),
    "sin": unary(torch.sin),
    "cos": unary(torch.cos),
    "abs": unary(torch.abs),
    "erf": unary(torch.erf),
    # its gradient is zero; integral inputs hold zeros
    "sign": Case(unary(torch.sign).spec | shapes(max_dims=4).map(lambda s: ([Arg(s, "integral", 3)], {})),
                 lambda t, a: torch.sign(t[0]), diff=()),
    # their gradient is zero (no VJP node to compare); integral inputs (ties), halves (round's ties to
    # even) and fractional ones
    **{name: Case(unary(fn).spec | shapes(max_dims=4).map(lambda s: ([Arg(s, "integral", 5)], {}))
                  | shapes(max_dims=4).map(lambda s: ([Arg(s, "halves", 9)], {})), (lambda f: lambda t, a: f(t[0]))(fn),
                  diff=())
       for name, fn in (("floor", torch.floor), ("ceil", torch.ceil), ("trunc", torch.trunc), ("round", torch.round))},
}
