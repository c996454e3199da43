"""Real models on the C backend (float32): gradients equal the reference runtime's within
float32 rounding (the tolerance of the backend matrix, tests/backends/test_matrix.py)."""
from __future__ import annotations

import numpy as np
import pytest

import edgetrain as et
from .conftest import build

#: float32, relative to the largest gradient of the weight (or 1e-3 of the model's largest)
TOL = 1e-5


def check_c_backend(name: str):
    model, x, y = build(name)
    model = model.float()
    x = x.float() if x.is_floating_point() else x
    ref = et.compile(model, (x,), update=et.Full()).gradients(x.numpy(), y.numpy())
    got = et.compile(model, (x,), update=et.Full(), backend="c").gradients(x.numpy(), y.numpy())
    assert set(got) == set(ref)
    floor = 1e-3 * max(np.abs(g).max() for g in ref.values())
    for k in ref:
        err = np.abs(got[k] - ref[k]).max() / max(np.abs(ref[k]).max(), floor)
        assert err <= TOL, f"{name}: {k} relative error {err:.2e}"


def test_gpt2_on_the_c_backend():
    """Embedding, constants folded from shapes, causal attention, tied weights."""
    check_c_backend("hf.gpt2lm")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hf.bert", "tv.googlenet", "timm.efficientvit_b0"])
def test_c_backend_slow(name):
    """BERT (folded buffers), GoogLeNet (max pooling with ceil_mode: pad), EfficientViT (pad, split)."""
    check_c_backend(name)
