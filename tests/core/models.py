"""Models the zoo does not contain, together covering every supported op."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _randomize_bn(model, gen):
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


class SEMobile(nn.Module):
    """conv/bn, hardswish, depthwise, squeeze-excite (hardsigmoid, broadcast mul), silu,
    grouped conv with dilation, residual, max/avg pool, dropout, classifier."""

    def __init__(self, classes=7):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 5, 1, 2, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.se1, self.se2 = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 8, 1)
        self.group = nn.Conv2d(8, 8, 3, 1, 2, dilation=2, groups=2)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.avg = nn.AvgPool2d(2, 2, 1, count_include_pad=False)
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(8, classes)
        _randomize_bn(self, torch.Generator().manual_seed(1))

    def forward(self, x):
        y = self.dw(self.stem(x))
        s = F.hardsigmoid(self.se2(F.relu(self.se1(y.mean((2, 3), keepdim=True)))))
        y = y * s
        y = F.silu(self.group(y)) + y
        y = self.avg(self.pool(y))
        return self.fc(self.drop(F.adaptive_avg_pool2d(y, 1).flatten(1)))


class MixedOps(nn.Module):
    """sigmoid, tanh, gelu (both), cat, slice, permute/transpose, sub, div, layer norm,
    softmax, matmul, embedding, pow, sqrt, exp."""

    def __init__(self, classes=5):
        super().__init__()
        self.emb = nn.Embedding(20, 12)
        self.proj = nn.Linear(12, 12)
        self.ln = nn.LayerNorm(12)
        self.q, self.k = nn.Linear(12, 12), nn.Linear(12, 12, bias=False)  # a key bias has zero gradient
        self.head = nn.Linear(24, classes)
        self.scale = nn.Parameter(torch.tensor(1.5))

    def forward(self, ids):
        h = self.ln(self.emb(ids))  # (B, T, 12)
        a = torch.softmax(self.q(h) @ self.k(h).transpose(1, 2) / 12 ** 0.5, dim=-1)
        h = h + F.gelu(a @ self.proj(h)) - F.gelu(h, approximate="tanh") * 0.1
        h = torch.cat([torch.sigmoid(h[:, :, :6]), torch.tanh(h[:, :, 6:])], dim=-1)
        h = h.permute(0, 2, 1).mean(-1)  # (B, 12)
        z = torch.cat([h, torch.sqrt(h.pow(2) + 1.0) * self.scale], dim=1)
        return self.head(torch.exp(-z * z) / (2.0 + z * z))
