"""Variances, norms, tensor bounds and numerics as models write them (frontend/aten_moments.py,
aten.py, aten_data.py): torch.var / std / var_mean with any correction, torch.linalg.vector_norm of
orders 1, 2, 3, inf, -inf and 0, F.cosine_similarity (its eps is a clamp with a tensor bound),
torch.clamp with tensor bounds (min above max included), erf, sign and the roundings
(ops/pointwise.py), reciprocal, log2 and log10, isnan / isinf, a number to a tensor power, and
division rounded by torch.div's rounding_mode or //. Float64 gradients equal torch.autograd's on the
reference runtime; the C backend's float32 ones equal the reference's; torch.compile's training loop
gives eager's losses; a Cortex-M4 (QEMU) prints the host build's losses for the roundings and the
norms."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgetrain as et
from tests.frontend.model_checks import (c_gradients_equal_the_reference, compiled_loop_gives_eager_losses,
                                         firmware_prints_host_losses, float64_gradients_equal_autograd)

CLASSES = 5


class _Head(nn.Module):
    """linear -> fn -> linear, fn the function under test"""

    def __init__(self, fn, width: int = 12):
        super().__init__()
        self.fn, self.lin, self.fc = fn, nn.Linear(6, width), nn.Linear(width, CLASSES)

    def forward(self, x):
        return self.fc(self.fn(self.lin(x)))


def _standardize(h):  # per row, Bessel-corrected, and the batch's biased variance per feature
    return (h - h.mean(1, keepdim=True)) / h.std(1, keepdim=True) + h.var(0, unbiased=False)


def _var_mean(h):
    var, mean = torch.var_mean(h, 1, keepdim=True, correction=2)
    return var * h + torch.var_mean(h, 0)[1] + torch.std(h, 1, correction=0, keepdim=True) + torch.var(h)


def _norms(h):
    v = torch.linalg.vector_norm
    return (h / v(h, 1, dim=1, keepdim=True) + v(h, float("inf"), dim=1, keepdim=True) + v(h, 3.0, dim=1, keepdim=True)
            + v(h, -float("inf"), dim=0) + v(h, 0, dim=1, keepdim=True) + F.normalize(h, dim=0))


def _bounds(h):  # tensor bounds: a 0-d one, a per-row one, and min above max in some rows
    lo, hi = -h.abs().mean(), h[:, :1] * 0.5
    return torch.clamp(h, min=lo, max=hi) + torch.clamp(h, min=h[:, 1:2]) + torch.clamp(h, max=h[:1])


def _rounding(h):  # straight-through roundings, erf and sign
    steps = torch.round(2 * h) + torch.floor(h) + torch.ceil(h) + torch.trunc(3 * h)
    return h + (steps - h).detach() + torch.erf(h) + torch.sign(h) * h * h + torch.sgn(h)


def _logs(h):
    return torch.reciprocal(h.abs() + 1) + torch.log2(h.abs() + 1) + torch.log10(h * h + 0.5)


def _numerics(h):  # NaN / inf masking, 2 ** x, division rounded both ways (straight through)
    clean = torch.where(torch.isnan(h) | torch.isinf(h), torch.zeros_like(h), h)
    steps = torch.div(h, 0.3, rounding_mode="floor") + torch.div(h, 0.7, rounding_mode="trunc") + h // 0.5
    return clean + torch.pow(2.0, h.tanh()) + 10 ** h.sigmoid() + steps.detach()


class Prototypes(nn.Module):
    """a cosine classifier: 10 x cos(features, class prototype)"""

    def __init__(self):
        super().__init__()
        self.lin, self.proto = nn.Linear(6, 8), nn.Parameter(torch.randn(CLASSES, 8))

    def forward(self, x):
        return 10 * F.cosine_similarity(self.lin(x)[:, None, :], self.proto[None], dim=-1)


MODELS = {"standardize": lambda: _Head(_standardize), "var_mean": lambda: _Head(_var_mean),
          "norms": lambda: _Head(_norms), "bounds": lambda: _Head(_bounds), "rounding": lambda: _Head(_rounding),
          "logs": lambda: _Head(_logs), "numerics": lambda: _Head(_numerics), "cosine": Prototypes}
#: ops each model's forward lowers to
WANT_OPS = {"standardize": {"mean", "sqrt", "div"}, "var_mean": {"mean", "sqrt"},
            "norms": {"abs", "amax", "amin", "pow"},
            "bounds": {"where", "compare"}, "rounding": {"round", "floor", "ceil", "trunc", "erf", "sign", "detach"},
            "logs": {"div", "log"}, "numerics": {"compare", "exp", "floor", "trunc"}, "cosine": {"where", "sqrt"}}


def _model_and_input(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval(), 1.5 * torch.randn(4, 6, generator=torch.Generator().manual_seed(1))


def _labels(x):
    return torch.arange(x.shape[0]) % CLASSES


@pytest.mark.parametrize("name", sorted(MODELS))
def test_float64_gradients_equal_autograd(name):
    model, x = _model_and_input(name)
    prog = float64_gradients_equal_autograd(model, x, _labels(x), WANT_OPS[name])
    with torch.no_grad():
        np.testing.assert_allclose(prog.predict(x.double().numpy()), model(x.double()).numpy(), rtol=1e-12, atol=1e-12)


def test_the_bounds_case_has_min_above_max():
    model, x = _model_and_input("bounds")
    with torch.no_grad():
        h = model.lin(x)
    assert (-h.abs().mean() > h[:, :1] * 0.5).any() and (-h.abs().mean() < h[:, :1] * 0.5).any()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_c_backend_gradients_equal_the_reference(name):
    model, x = _model_and_input(name)
    c_gradients_equal_the_reference(model, x, _labels(x))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_torch_compile_training_loop_gives_eager_losses(name):
    model, x = _model_and_input(name)
    compiled_loop_gives_eager_losses(model, [(x + 0.1 * k, _labels(x)) for k in range(3)], WANT_OPS[name])


def test_a_negative_norm_order_is_refused_by_name():
    model = _Head(lambda h: torch.linalg.vector_norm(h, -2.0, dim=1, keepdim=True) * h)
    with pytest.raises(et.frontend.UnsupportedOpError, match="ord=-2.0"):
        et.compile(model, (torch.randn(2, 6),), update=et.Full())


@pytest.mark.parametrize("name", ["rounding", "norms"])
def test_on_cortex_m_print_the_host_builds_losses(tmp_path, name):
    """the roundings, erf and sign (libm-free double helpers), the norms' amax / amin / pow"""
    model, x = _model_and_input(name)
    firmware_prints_host_losses(model, x, CLASSES, tmp_path, WANT_OPS[name], scale=1.5)
