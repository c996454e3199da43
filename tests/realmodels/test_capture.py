"""Real models capture and train: our gradients (reference runtime, float64) equal
torch.autograd's for every parameter."""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import edgetrain as et
from .conftest import build

#: float64 relative error of every gradient
TOL = 1e-10
#: torch's hardsigmoid_backward multiplies by a float32 1/6 even in float64 (its
#: BinaryOpsKernel writes `static_cast<opmath_t>(1.0 / 6.0)` with float32 opmath for
#: the scalar?); we use the float64 1/6 in every place, so those models differ by ~3e-8
TOL_HARDSIGMOID = 1e-6

QUICK = ["tv.shufflenet_v2_x0_5", "hf.bert", "hf.distilbert", "hf.gpt2lm", "hf.vit", "timm.vit_tiny_patch16_224"]
SLOW = ["tv.vit_b_16", "timm.mobilevit_xxs"]


def torch_gradients(model, x, y) -> dict[str, np.ndarray]:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}


#: gradients that are zero in exact arithmetic (a key projection's bias: softmax ignores a
#: per-row constant) come out of both sides as rounding noise (~1e-18); they are measured
#: against this fraction of the model's largest gradient instead of their own size
FLOOR = 1e-3


def rel_err(ours: np.ndarray, ref: np.ndarray, floor: float) -> float:
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), floor, 1e-300))


def check_model(name: str, tol: float = TOL):
    model, x, y = build(name)
    prog = et.compile(model, (x,), update=et.Full())
    ours = prog.gradients(x.numpy(), y.numpy())
    ref = torch_gradients(model, x, y)
    assert set(ours) == set(ref), f"{name}: gradients for {sorted(set(ours) ^ set(ref))}"
    floor = FLOOR * max(np.abs(g).max() for g in ref.values())
    errs = {k: rel_err(ours[k], ref[k], floor) for k in ref}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= tol, f"{name}: {worst} relative error {errs[worst]:.2e}"


@pytest.mark.parametrize("name", QUICK)
def test_gradients_match_torch(name):
    check_model(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_gradients_match_torch_slow(name):
    check_model(name)
