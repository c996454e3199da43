"""The fused weight-gradient updates (ops/gradupdate.py, ops/embedding_update.py) against
torch over several training steps, in compiled programs (the reference runtime):

- an embedding's sparse gradient and update equal dense SGD (torch.optim.SGD on a dense
  nn.Embedding) with momentum and weight decay, and torch's nn.Embedding(sparse=True) under
  SGD with momentum (whose sparse momentum buffer keeps decaying the rows it holds); torch
  refuses weight decay with sparse gradients, which the op defines as dense SGD does;
- convolutions and linear layers fused with their update (here in blocks of one row: a
  gradient that fits one block of BLOCK_BYTES is not fused) equal torch.autograd +
  torch.optim.SGD with momentum and weight decay.
The op table (tests/ops/cases.py) checks each op on drawn operands against torch, the C
kernels included (test_backends.py)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.ops import gradupdate

STEPS = 3
TOL = 2e-5


class EmbedNet(nn.Module):
    def __init__(self, sparse=False, num=40):
        super().__init__()
        self.emb = nn.Embedding(num, 6, sparse=sparse)
        self.fc = nn.Linear(6, 3)

    def forward(self, t):
        return self.fc(self.emb(t).mean(1))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6, bias=False)
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.dw(torch.relu(self.conv(x)))).flatten(1))


def _batches(make):
    g = torch.Generator().manual_seed(1)
    return [make(g) for _ in range(STEPS)]


def _token_batch(g):
    # rows 0..19 only: rows 20..39 are never touched, rows touched once and twice in a batch
    return torch.randint(0, 20, (4, 5), generator=g), torch.randint(0, 3, (4,), generator=g)


def _torch_train(model, batches, **sgd):
    opt = torch.optim.SGD(model.parameters(), **sgd)
    for x, y in batches:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def _ours(model, batches, **sgd):
    prog = et.compile(model, (batches[0][0],), optimizer=et.SGD(**sgd))
    for x, y in batches:
        prog.step(x, y)
    return prog, {k: v.detach().numpy() for k, v in prog.state_dict().items()}


def _assert_close(ours, want):
    for k, w in want.items():
        err = np.abs(ours[k] - w).max() / max(np.abs(w).max(), 1e-30)
        assert err <= TOL, f"{k}: relative error {err:.3g}"


@pytest.mark.parametrize("sgd", [dict(lr=0.5), dict(lr=0.5, momentum=0.9),
                                 dict(lr=0.5, momentum=0.9, weight_decay=0.05)], ids=["plain", "momentum", "momentum_wd"])
def test_embedding_sparse_update_equals_dense_sgd(sgd):
    torch.manual_seed(0)
    model = EmbedNet()
    batches = _batches(_token_batch)
    initial = model.emb.weight.detach().numpy().copy()
    want = _torch_train(copy.deepcopy(model), batches, **sgd)
    prog, ours = _ours(model, batches, **sgd)
    assert "embedding_grad_update" in {n.op for n in prog.train_graph.nodes}
    _assert_close(ours, want)
    # rows 20..39, never touched, move by weight decay only (their momentum stays zero)
    assert np.any(ours["emb.weight"][20:] != initial[20:]) == bool(sgd.get("weight_decay"))


@pytest.mark.parametrize("sgd", [dict(lr=0.5), dict(lr=0.5, momentum=0.9)], ids=["plain", "momentum"])
def test_embedding_sparse_update_equals_torch_sparse_embedding(sgd):
    """torch's nn.Embedding(sparse=True) under SGD: the same weights after every step."""
    torch.manual_seed(0)
    model = EmbedNet(sparse=True)
    batches = _batches(_token_batch)
    want = _torch_train(copy.deepcopy(model), batches, **sgd)
    _, ours = _ours(model, batches, **sgd)
    _assert_close(ours, want)


def test_torch_refuses_weight_decay_on_a_sparse_embedding_which_we_define_as_dense_sgd():
    model = EmbedNet(sparse=True)
    x, y = _token_batch(torch.Generator().manual_seed(1))
    opt = torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.05)
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(RuntimeError):
        opt.step()


def test_momentum_keeps_moving_rows_a_later_batch_does_not_touch():
    """Dense SGD's momentum (and torch's sparse buffer) keeps stepping a row touched earlier."""
    torch.manual_seed(0)
    model = EmbedNet()
    batches = [(torch.tensor([[1, 2, 3]]), torch.tensor([0])), (torch.tensor([[4, 5, 6]]), torch.tensor([1]))]
    prog = et.compile(model, (batches[0][0],), optimizer=et.SGD(lr=0.5, momentum=0.9))
    prog.step(*batches[0])
    after_first = prog.state_dict()["emb.weight"].numpy().copy()
    prog.step(*batches[1])
    after_second = prog.state_dict()["emb.weight"].numpy()
    assert np.all(after_second[1:4] != after_first[1:4])  # not in the second batch, still moved
    np.testing.assert_array_equal(after_second[7:], after_first[7:])  # never touched: no momentum


@pytest.mark.parametrize("sgd", [dict(lr=0.1), dict(lr=0.1, momentum=0.9, weight_decay=0.01)],
                         ids=["plain", "momentum_wd"])
def test_conv_and_linear_fused_updates_equal_torch_sgd(sgd, monkeypatch):
    monkeypatch.setattr(gradupdate, "BLOCK_BYTES", 3 * 3 * 4)  # these small layers in several blocks each
    torch.manual_seed(0)
    model = ConvNet()
    batches = _batches(lambda g: (torch.randn(2, 3, 8, 8, generator=g), torch.randint(0, 5, (2,), generator=g)))
    want = _torch_train(copy.deepcopy(model), batches, **sgd)
    prog, ours = _ours(model, batches, **sgd)
    ops = {n.op for n in prog.train_graph.nodes}
    assert {"conv2d_grad_weight_update", "linear_grad_weight_update"} <= ops
    assert not {"conv2d_grad_weight", "linear_grad_weight"} & ops
    _assert_close(ours, want)
