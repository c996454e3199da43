"""nn.LSTM / nn.GRU under torch.compile(backend="edgetrain"): TorchDynamo hands their graphs to
edgetrain (by default it skips any frame calling an RNN module, so the model ran in PyTorch),
AOTAutograd decomposes them one cell per time step, and edgetrain trains them with eager's
gradients; a 2-layer RNN's inter-layer dropout in train() draws eager's mask (PyTorch's own
decomposition of aten.lstm leaves it out)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from edgetrain.torch_backend import last_programs
from .loops import train_loop

HIDDEN, FEATURES, CLASSES, BATCH, STEPS = 6, 4, 3, 2, 5
#: float64 gradients differ from eager's by rounding only
GRAD_TOL = 1e-10
#: float32 C kernels over three SGD steps with momentum (they sum in another order than torch's)
C_TOL = 1e-4


def _newest():
    """The graph edgetrain compiled last (None before any): last_programs() keeps only the
    newest few, so a count does not show that a new one came."""
    progs = last_programs()
    return progs[-1] if progs else None


class Recurrent(nn.Module):
    """An RNN over a (batch, time, features) or (time, batch, features) sequence, its last
    step's output into a linear classifier; `state` passes h0 (and c0) explicitly."""

    def __init__(self, kind="LSTM", batch_first=True, bidirectional=False, layers=1, state=False, dropout=0.0):
        super().__init__()
        self.kind, self.batch_first, self.state = kind, batch_first, state
        self.rnn = getattr(nn, kind)(FEATURES, HIDDEN, num_layers=layers, batch_first=batch_first,
                                     bidirectional=bidirectional, dropout=dropout)
        self.states = layers * (2 if bidirectional else 1)
        self.fc = nn.Linear(HIDDEN * (2 if bidirectional else 1), CLASSES)

    def forward(self, x):
        if self.state:
            batch = x.shape[0] if self.batch_first else x.shape[1]
            h = torch.full((self.states, batch, HIDDEN), 0.1, dtype=x.dtype)
            y = self.rnn(x, (h, -h) if self.kind == "LSTM" else h)[0]
        else:
            y = self.rnn(x)[0]
        return self.fc(y[:, -1] if self.batch_first else y[-1])


def _batches(batch_first, dtype=torch.float64, steps=3):
    shape = (BATCH, STEPS, FEATURES) if batch_first else (STEPS, BATCH, FEATURES)
    return [(torch.randn(*shape, generator=torch.Generator().manual_seed(k), dtype=dtype),
             torch.tensor([k % CLASSES, (k + 1) % CLASSES])) for k in range(steps)]


def _run(model, fn, batches, seed=5):
    torch.manual_seed(seed)
    return train_loop(model, fn, batches)


VARIANTS = {
    "lstm": dict(kind="LSTM"),
    "lstm-seq-first-2-layers-h0": dict(kind="LSTM", batch_first=False, layers=2, state=True),
    "lstm-bidirectional": dict(kind="LSTM", bidirectional=True, layers=2),
    "gru-bidirectional-h0": dict(kind="GRU", bidirectional=True, state=True, batch_first=False),
    "gru-2-layers": dict(kind="GRU", layers=2),
    "lstm-2-layers-dropout": dict(kind="LSTM", layers=2, dropout=0.3),
    "gru-2-layers-bidirectional-dropout": dict(kind="GRU", layers=2, bidirectional=True, dropout=0.4),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rnn_trains_with_eagers_gradients(variant):
    cfg = VARIANTS[variant]
    torch.manual_seed(0)
    model = Recurrent(**cfg).double().train()
    eager = copy.deepcopy(model)
    batches = _batches(cfg.get("batch_first", True))
    torch._dynamo.reset()
    before = _newest()
    lc, gc = _run(model, torch.compile(model, backend="edgetrain"), batches)
    le, ge = _run(eager, eager, batches)
    assert _newest() is not before  # the RNN ran in edgetrain, not in PyTorch
    assert all(abs(a - b) <= GRAD_TOL * abs(a) for a, b in zip(le, lc)), (le, lc)
    for a, b in zip(ge, gc):
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=GRAD_TOL, atol=1e-14), k
    drawn = [v.name for v in last_programs()[-1].forward.inputs if v.name.startswith("random:")]
    assert len(drawn) == (1 if cfg.get("dropout") else 0)  # one inter-layer dropout: layers - 1


def test_rnn_inter_layer_dropout_changes_from_call_to_call():
    torch.manual_seed(0)
    model = Recurrent(layers=2, dropout=0.5).double().train()
    comp = torch.compile(model, backend="edgetrain")
    x = _batches(True, steps=1)[0][0]
    torch._dynamo.reset()
    with torch.no_grad():
        a, b = comp(x), comp(x)
        model.eval()
        c, d = comp(x), model(x)
    assert not torch.allclose(a, b)
    assert torch.allclose(c, d, rtol=1e-12, atol=0)


@pytest.mark.parametrize("variant", ["lstm-2-layers-dropout", "gru-bidirectional-h0"])
def test_rnn_trains_in_c(variant):
    cfg = VARIANTS[variant]
    torch.manual_seed(0)
    model = Recurrent(**cfg).train()
    eager = copy.deepcopy(model)
    batches = _batches(cfg.get("batch_first", True), dtype=torch.float32)
    torch._dynamo.reset()
    lc, gc = _run(model, torch.compile(model, backend="edgetrain", options={"backend": "c"}), batches)
    le, ge = _run(eager, eager, batches)
    assert last_programs()[-1].backend == "c"
    assert lc == pytest.approx(le, rel=C_TOL)
    for a, b in zip(ge, gc):
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=C_TOL, atol=C_TOL), k
