"""torch.compile(backend="edgetrain") in train(): every dropout mask is the one eager draws, for
models whose dropouts meet tensors torch lays out transposed (TransformerEncoderLayer's
attention output with batch_first=True): torch's CPU dropout fills its mask in the input's
memory order, so the draw must be made on a tensor laid out as the input is."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from .loops import train_loop

#: float64 losses of the same seeded loop differ by rounding only (the kernels sum in another order)
LOSS_RTOL = 1e-10


class Transposed(nn.Module):
    """Dropout of a transposed activation, then of a contiguous one."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 3)
        self.drop1, self.drop2 = nn.Dropout(0.4), nn.Dropout(0.2)

    def forward(self, x):  # x: (N, 5, 6)
        h = self.drop1(self.fc1(x).transpose(0, 1))  # (5, N, 6), strides of (N, 5, 6)
        return self.fc2(self.drop2(torch.relu(h)).mean(0))


class EncoderClassifier(nn.Module):
    """TransformerEncoder (2 layers, batch_first; each layer: dropout on the attention output,
    in the feed-forward block and on its output), mean-pooled into a linear classifier."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.2, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(self.encoder(self.embed(x)).mean(1))


def _losses(model, fn, shape, steps=3):
    torch.manual_seed(11)
    batches = [(torch.randn(*shape, generator=torch.Generator().manual_seed(k), dtype=torch.float64),
                torch.tensor([0, 1, 2][:shape[0]])) for k in range(steps)]
    return train_loop(model, fn, batches, lr=0.05)


def _check(model, shape):
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    le, ge = _losses(eager, eager, shape)
    lc, gc = _losses(model, torch.compile(model, backend="edgetrain"), shape)
    assert all(abs(a - b) <= LOSS_RTOL * abs(a) for a, b in zip(le, lc)), (le, lc)
    for a, b in zip(ge, gc):
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=1e-8, atol=1e-12), k


def test_dropout_of_a_transposed_activation_draws_eagers_mask():
    torch.manual_seed(0)
    _check(Transposed().double().train(), (3, 5, 6))


def test_transformer_encoder_train_losses_equal_eager():
    torch.manual_seed(0)
    _check(EncoderClassifier().double().train(), (3, 5, 8))
