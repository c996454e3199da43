"""torch.compile(backend="edgetrain") of a model in train(): dropout and stochastic depth draw
their masks with torch at each call, in the order eager draws them, so a seeded compiled loop
gives eager's losses and gradients (the backward reuses the call's masks)."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from edgetrain.torch_backend import last_programs
from .loops import train_loop


class DropNet(nn.Module):
    """Dropout twice (two draws per call, their order matters), batch norm in training mode,
    and a per-sample stochastic-depth branch (bernoulli of an empty tensor)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop1 = nn.Dropout(0.3)
        self.branch = nn.Conv2d(8, 8, 1)
        self.drop2 = nn.Dropout(0.5)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = self.drop1(torch.relu(self.bn(self.conv(x))))
        if self.training:  # torchvision's StochasticDepth(p=0.4, mode="row")
            keep = h.new_empty((h.shape[0], 1, 1, 1)).bernoulli_(0.6).div_(0.6)
            h = h + self.branch(h) * keep
        return self.fc(self.drop2(h.mean((2, 3))))


def _loop(model, fn, seed):
    torch.manual_seed(seed)
    batches = [(torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(k), dtype=torch.float64),
                torch.tensor([0, 1, 2, 3]))
               for k in range(3)]
    return train_loop(model, fn, batches, lr=0.1)


def test_train_mode_dropout_gives_eager_losses_and_gradients():
    torch.manual_seed(0)
    model = DropNet().double().train()
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    le, ge = _loop(eager, eager, seed=7)
    lc, gc = _loop(model, torch.compile(model, backend="edgetrain"), seed=7)
    assert max(abs(a - b) / abs(a) for a, b in zip(le, lc)) < 1e-12, (le, lc)
    for a, b in zip(ge, gc):
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=1e-10, atol=1e-13), k
    for k in ("bn.running_mean", "bn.running_var"):
        assert torch.allclose(model.state_dict()[k], eager.state_dict()[k], rtol=1e-12, atol=0)
    assert any(n.startswith("random:") for n in (v.name for v in last_programs()[-1].forward.inputs))


def test_masks_change_from_call_to_call_and_follow_the_seed():
    """The masks are drawn at each call (not once at compile time) from torch's generator."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5)).double().train()
    comp = torch.compile(model, backend="edgetrain")
    x = torch.randn(8, 16, dtype=torch.float64)
    torch._dynamo.reset()
    with torch.no_grad():
        a, b = comp(x), comp(x)
        torch.manual_seed(3)
        c = comp(x)
        torch.manual_seed(3)
        d = model(x)
    assert not torch.equal(a == 0, b == 0)
    assert torch.equal(c == 0, d == 0) and torch.allclose(c, d, rtol=1e-14, atol=0)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(comp(x), model[0](x), rtol=1e-14, atol=0)  # eval: no dropout
    F.mse_loss(comp(x), x).backward()  # a backward outside no_grad still works after the mode switch
