"""Update schemes respect requires_grad: LastK, BiasOnly and Sparse count only the layers with
a trainable parameter, never train a frozen one, and say which layers they chose."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import edgetrain as et
from edgetrain.sparse import scheme_layers
from edgetrain.trainable import SchemeError


class FrozenFeatures(nn.Module):
    """A frozen feature extractor (two convolutions) and a trainable head (two linears)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU())
        self.fc1 = nn.Linear(16, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.features(x).flatten(1))))


def _model():
    torch.manual_seed(0)
    m = FrozenFeatures()
    for p in m.features.parameters():
        p.requires_grad_(False)
    return m


X = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("scheme, trained, summary", [
    (et.LastK(1), ["fc2.weight", "fc2.bias"], "trains linear:fc2.weight"),
    (et.LastK(2), ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
     "trains linear:fc1.weight, linear:fc2.weight"),
    (et.BiasOnly(), ["fc1.bias", "fc2.bias"], "linear:fc1.weight (bias only), linear:fc2.weight (bias only)"),
    (et.Sparse(bias_last=1, weights={0: 0.5}), ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
     "linear:fc1.weight (some channels), linear:fc2.weight"),
], ids=["last1", "last2", "bias", "sparse"])
def test_schemes_count_only_trainable_layers(scheme, trained, summary):
    prog = et.compile(_model(), (X,), update=scheme)
    assert list(prog.trainable) == trained
    assert summary in prog.update_summary()
    assert not any(k.startswith("features.") for k in prog.trainable)


def test_frozen_parameters_stay_as_they_are_and_the_head_learns():
    model = _model()
    prog = et.compile(model, (X,), update=et.LastK(2), optimizer=et.SGD(lr=0.1))
    before = {k: v.copy() for k, v in prog.state.items()}
    prog.step(X, np.array([0, 2]))
    assert all(np.array_equal(before[k], prog.state[k]) for k in before if k.startswith("features."))
    assert not np.array_equal(before["fc1.weight"], prog.state["fc1.weight"])


def test_too_many_layers_names_the_frozen_ones_skipped():
    with pytest.raises(SchemeError, match=r"only 2 conv/linear layers with a trainable parameter \(2 layers with "
                                          r"requires_grad=False skipped\)"):
        et.compile(_model(), (X,), update=et.LastK(3))


def test_scheme_layers_number_the_trainable_layers_as_compile_does():
    layers = scheme_layers(_model(), (X,), quantize=None)
    assert [layer.weight for layer in layers.dense] == ["fc1.weight", "fc2.weight"]
    assert layers.n_sparse_layers == 1


def test_a_model_without_frozen_parameters_is_numbered_as_before():
    torch.manual_seed(0)
    prog = et.compile(FrozenFeatures(), (X,), update=et.LastK(3))
    assert list(prog.trainable) == ["features.2.weight", "features.2.bias", "fc1.weight", "fc1.bias",
                                    "fc2.weight", "fc2.bias"]


def _peft():
    try:
        import peft
    except Exception as err:  # an install whose transformers / torchvision do not import
        pytest.skip(f"peft does not import: {type(err).__name__}")
    return peft


def test_peft_lora_model_with_last_k():
    peft = _peft()
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["0", "2"]))
    x = torch.randn(2, 6)
    prog = et.compile(model, (x,), update=et.LastK(2))
    assert prog.trainable and all("lora_" in k for k in prog.trainable)
