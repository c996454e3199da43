"""Models that take the largest or smallest element (frontend/aten_extremes.py): PointNet's max over
points (x.max(dim)), DGCNN's k nearest neighbours (topk) and max over them, a text CNN's max and min
over time (amax, amin), torch.max / torch.min of a whole tensor, x.min(dim)'s positions used as an
index, argmin, torch.maximum / minimum of two tensors (and torch.max(a, b)), log-sigmoid (a
minimum), torch.topk / sort / argsort (topk_indices and a gather), and nn.Bilinear
(aten._trilinear). Float64 gradients equal torch.autograd's on the reference runtime, ties included
(torch shares an amax's gradient evenly among equal elements, gives x.max(dim)'s to the first, and
splits a maximum's between equal operands); the C backend's float32 gradients equal the reference's;
a NaN propagates on both (torch.sort / topk: the largest, in the order of the positions);
torch.compile(backend="edgetrain") gives eager's losses; a Cortex-M4 (QEMU) prints the host build's
losses."""
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


class PointNet(nn.Module):
    """PointNet's classifier (Qi et al. 2017) without its transform nets: a shared MLP over each
    point (1x1 convolutions with batch norm), the max over the points, an MLP."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Conv1d(3, 16, 1), nn.BatchNorm1d(16), nn.ReLU(), nn.Conv1d(16, 32, 1),
                                 nn.BatchNorm1d(32), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, CLASSES))

    def forward(self, points):  # (B, 3, N)
        return self.head(torch.max(self.mlp(points), 2)[0])


def _neighbours(x, k: int):
    """DGCNN's edge features (Wang et al. 2019, as its reference code writes them): each point's k
    nearest points (topk of the negative squared distances), read by advanced indexing, as
    (neighbour - point, point) pairs"""
    b, c, n = x.shape
    inner = -2 * torch.matmul(x.transpose(2, 1), x)
    xx = torch.sum(x ** 2, dim=1, keepdim=True)
    idx = (-xx - inner - xx.transpose(2, 1)).topk(k=k, dim=-1)[1] + torch.arange(b).view(-1, 1, 1) * n
    xt = x.transpose(2, 1).contiguous()
    feat = xt.view(b * n, -1)[idx.view(-1), :].view(b, n, k, c)
    xt = xt.view(b, n, 1, c).repeat(1, 1, k, 1)
    return torch.cat((feat - xt, xt), dim=3).permute(0, 3, 1, 2).contiguous()


class DGCNN(nn.Module):
    """Two EdgeConv layers (1x1 convolutions with batch norm and leaky ReLU over the edge features, the
    max over the neighbours), max and mean pooled over the points."""

    def __init__(self, k: int = 4):
        super().__init__()
        self.k = k
        self.edge1 = nn.Sequential(nn.Conv2d(6, 16, 1, bias=False), nn.BatchNorm2d(16), nn.LeakyReLU(0.2))
        self.edge2 = nn.Sequential(nn.Conv2d(32, 16, 1, bias=False), nn.BatchNorm2d(16), nn.LeakyReLU(0.2))
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, points):  # (B, 3, N)
        x1 = self.edge1(_neighbours(points, self.k)).max(dim=-1)[0]
        x2 = self.edge2(_neighbours(x1, self.k)).max(dim=-1)[0]
        h = torch.cat((x1, x2), 1)
        return self.fc(torch.cat((F.adaptive_max_pool1d(h, 1).flatten(1), F.adaptive_avg_pool1d(h, 1).flatten(1)), 1))


class TextCNN(nn.Module):
    """Kim (2014)'s sentence classifier: embeddings, a 1-D convolution, the max (and here the min)
    over time."""

    def __init__(self):
        super().__init__()
        self.embed, self.conv = nn.Embedding(40, 8), nn.Conv1d(8, 12, 3)
        self.fc = nn.Linear(24, CLASSES)

    def forward(self, tokens):
        h = torch.relu(self.conv(self.embed(tokens).transpose(1, 2)))
        return self.fc(torch.cat([h.amax(-1), torch.amin(h, dim=-1)], 1))


class Extremes(nn.Module):
    """torch.max / torch.min of a whole tensor, maximum / minimum of two, torch.max(a, b),
    log-sigmoid, and x.min(dim)'s positions and argmin's indexing another tensor."""

    def __init__(self):
        super().__init__()
        self.lin, self.lin2, self.fc = nn.Linear(6, 8), nn.Linear(6, 8), nn.Linear(8, CLASSES)

    def forward(self, x):
        a, b = self.lin(x), self.lin2(x)
        h = torch.maximum(a, b) + torch.minimum(a, 0.5 * b) + F.logsigmoid(a) + torch.max(a, torch.tanh(b))
        low, at = b.min(dim=1, keepdim=True)
        picked = torch.gather(a, 1, at) + torch.gather(h, 1, torch.argmin(a, dim=1, keepdim=True))
        return self.fc(h) + low + picked + torch.max(h) - torch.min(b)


class Ties(nn.Module):
    """Ties on purpose: small integers times a per-channel scale, so that equal elements share the
    largest of a row (amax, torch.max) and the two operands of a maximum are often equal."""

    def __init__(self):
        super().__init__()
        self.scale, self.other = nn.Parameter(torch.ones(1, 4, 1)), nn.Parameter(torch.ones(1, 4, 1))
        self.fc = nn.Linear(8, CLASSES)

    def forward(self, x):  # x: (B, 4, 6), integers 0..2
        h = x * self.scale
        m = torch.maximum(h, x * self.other)
        return self.fc(torch.cat([h.amax(2), m.max(2)[0] + torch.max(m)], 1))


class Ranks(nn.Module):
    """torch.topk (largest and smallest), torch.sort both ways, argsort's positions used as an index"""

    def __init__(self):
        super().__init__()
        self.lin, self.fc = nn.Linear(6, 10), nn.Linear(10, CLASSES)

    def forward(self, x):
        h = self.lin(x)
        top, _ = h.topk(3, 1)
        order = torch.argsort(h, 0)
        return (self.fc(h.sort(1, descending=True)[0] * 0.5 + torch.sort(h, 1)[0]) + top.sum(1, keepdim=True)
                + torch.gather(h, 0, order)[:, :CLASSES] + torch.topk(h, 2, 0, largest=False)[0].sum())


class BilinearNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 5), nn.Linear(6, 4)
        self.bil = nn.Bilinear(5, 4, CLASSES)

    def forward(self, x):
        return self.bil(torch.tanh(self.a(x)), self.b(x))


def _input(name: str):
    g = torch.Generator().manual_seed(1)
    if name == "textcnn":
        return torch.randint(0, 40, (3, 10), generator=g)
    if name == "ties":
        return torch.randint(0, 3, (3, 4, 6), generator=g).float()
    return torch.randn(MODELS[name][1], generator=g)


MODELS = {"pointnet": (PointNet, (3, 3, 20)), "dgcnn": (DGCNN, (2, 3, 16)), "textcnn": (TextCNN, None),
          "extremes": (Extremes, (4, 6)),
          "ties": (Ties, None), "bilinear": (BilinearNet, (3, 6)), "ranks": (Ranks, (4, 6))}
#: ops each model's forward lowers to
WANT_OPS = {"pointnet": {"argmax", "gather"}, "dgcnn": {"topk_indices", "argmax", "gather"},
            "textcnn": {"amax", "amin"},
            "extremes": {"maximum", "minimum", "amax", "amin", "argmax", "gather"},
            "ties": {"amax", "maximum", "argmax"}, "bilinear": {"mul", "sum"}, "ranks": {"topk_indices", "gather"}}


def _model_and_input(name: str):
    torch.manual_seed(0)
    model = MODELS[name][0]()
    with torch.no_grad():  # weights and batch-norm statistics away from their initial ones
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.normal_(0, 0.2), m.running_var.uniform_(0.5, 2.0)
    return model.eval(), _input(name)


def _labels(x) -> torch.Tensor:
    return torch.arange(x.shape[0]) % CLASSES



@pytest.mark.parametrize("name", sorted(MODELS))
def test_float64_gradients_equal_autograd(name):
    model, x = _model_and_input(name)
    float64_gradients_equal_autograd(model, x, _labels(x), WANT_OPS[name])


def test_ties_share_the_gradient_as_torch():
    """The tied case's gradients are not those of one winner: the shares matter (checked above
    against torch); here, that the input has ties where the scale's gradient is taken."""
    _, x = _model_and_input("ties")
    rows = x.numpy()
    assert any((r == r.max()).sum() > 1 for r in rows.reshape(-1, rows.shape[-1]))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_c_backend_gradients_equal_the_reference(name):
    model, x = _model_and_input(name)
    c_gradients_equal_the_reference(model, x, _labels(x))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_torch_compile_training_loop_gives_eager_losses(name):
    model, x = _model_and_input(name)
    batches = [(x + 0.1 * k if x.is_floating_point() else x, _labels(x)) for k in range(3)]
    compiled_loop_gives_eager_losses(model, batches, WANT_OPS[name])


class _NaNs(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x):  # (B, 8)
        h = x * self.w
        ranks = (torch.sort(h, dim=1, descending=True, stable=True)[1].to(h.dtype)
                 + torch.sort(h, dim=1, stable=True)[1].to(h.dtype))
        return torch.cat([torch.stack([h.amax(1), h.amin(1), torch.maximum(h[:, :4], h[:, 4:]).sum(1),
                                       torch.minimum(h[:, 4:], h[:, :4]).sum(1), h.max(1)[0]], 1), ranks], 1)


def test_a_nan_propagates_on_both_backends():
    x = np.arange(32, dtype=np.float32).reshape(4, 8) - 10
    x[1, 0] = x[2, 7] = x[3, 3] = x[3, 5] = np.nan
    x[2, 1] = x[2, 4]  # (a tie: sorted in the order of the positions, as torch's stable sort)
    model = _NaNs().eval()
    example = torch.from_numpy(x)
    want = model(example).detach().numpy()
    for backend in ("reference", "c"):
        got = et.compile(model, (example,), update=et.Full(), backend=backend).predict(x)
        np.testing.assert_array_equal(got, want, err_msg=backend)  # (NaNs in the same places)
    assert np.isnan(want[1:, :5]).all() and not np.isnan(want[0]).any() and not np.isnan(want[:, 5:]).any()


@pytest.mark.parametrize("name", ["extremes", "ranks"])
def test_extremes_on_cortex_m_print_the_host_builds_losses(tmp_path, name):
    model, x = _model_and_input(name)
    firmware_prints_host_losses(model, x, CLASSES, tmp_path, WANT_OPS[name])
