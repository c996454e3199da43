"""prog.predict(x) returns the model's own output shape on every backend: batch-size-free
prediction where the output leads with the batch, the whole output of one compiled batch
otherwise (a language model's flattened (N*T, V) logits), and a clear error for a batch it
cannot cut into samples."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import edgetrain as et

BACKENDS = ["reference", "c"]
#: float32 predictions of the two backends and torch agree to this (absolute, outputs of order 1)
TOL = 1e-5


class FlatLM(nn.Module):
    """Token ids (N, T) -> flattened (N*T, V) logits, as a loop calling
    F.cross_entropy(logits.view(-1, V), labels.view(-1)) wants them."""

    def __init__(self, vocab=9, dim=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)
        self.vocab = vocab

    def forward(self, ids):
        return self.head(self.emb(ids)).reshape(-1, self.vocab)


class PerPixel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_flattened_language_model_logits_keep_their_shape(backend):
    torch.manual_seed(0)
    model = FlatLM()
    ids = torch.randint(0, 9, (2, 5))
    prog = et.compile(model, (ids,), backend=backend)
    got = prog.predict(ids)
    assert got.shape == (10, 9)
    np.testing.assert_allclose(got, model(ids).detach().numpy(), atol=TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_output_not_led_by_the_batch_needs_exactly_the_compiled_batch(backend):
    torch.manual_seed(0)
    prog = et.compile(FlatLM(), (torch.randint(0, 9, (2, 5)),), backend=backend)
    with pytest.raises(ValueError, match=r"does not lead with the batch of 2.*give exactly 2 samples, got 3"):
        prog.predict(torch.randint(0, 9, (3, 5)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_led_by_the_batch_predict_any_batch_size(backend):
    torch.manual_seed(0)
    model = PerPixel()
    prog = et.compile(model, (torch.zeros(2, 2, 4, 4),), backend=backend)
    for n in (1, 2, 5):
        x = torch.randn(n, 2, 4, 4)
        got = prog.predict(x)
        assert got.shape == (n, 3, 4, 4)
        np.testing.assert_allclose(got, model(x).detach().numpy(), atol=TOL)
