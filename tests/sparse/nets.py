"""A small network built like the paper's MCU models (batch norm already folded: convs with
bias, ReLU6, an inverted-residual block), and a learnable synthetic task for it."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from edgetrain.scale import SerialExecutor
from edgetrain.sparse import FineTune

CLASSES = 4
SIZE = 16


class Block(nn.Module):
    def __init__(self, c: int, expand: int):
        super().__init__()
        self.pointwise1 = nn.Conv2d(c, c * expand, 1)
        self.depthwise = nn.Conv2d(c * expand, c * expand, 3, 1, 1, groups=c * expand)
        self.pointwise2 = nn.Conv2d(c * expand, c, 1)

    def forward(self, x):
        y = torch.clamp(self.pointwise1(x), 0, 6)
        y = torch.clamp(self.depthwise(y), 0, 6)
        return x + self.pointwise2(y)


class TinyNet(nn.Module):
    """Sparse layers: 0 stem, 1-3 block1, 4-6 block2, 7 head; then the classifier."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.stem = nn.Conv2d(3, 8, 3, 2, 1)
        self.block1 = Block(8, 2)
        self.block2 = Block(8, 2)
        self.head = nn.Conv2d(8, 16, 1)
        self.classifier = nn.Linear(16, CLASSES)

    def forward(self, x):
        x = self.block2(self.block1(torch.clamp(self.stem(x), 0, 6)))
        return self.classifier(torch.clamp(self.head(x), 0, 6).mean((2, 3)))


def tiny_net(seed: int = 0) -> TinyNet:
    return TinyNet(seed).eval()


def task(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Images (n, 3, SIZE, SIZE) whose label is the brightest of four quadrants."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, n)
    x = rng.normal(0, 1, (n, 3, SIZE, SIZE)).astype(np.float32)
    h = SIZE // 2
    for i, label in enumerate(y):
        r, c = divmod(int(label), 2)
        x[i, :, r * h:(r + 1) * h, c * h:(c + 1) * h] += 1.0
    return x, y.astype(np.int64)


def tiny_auto_case():
    """(model, x, table, base): TinyNet, one input, a small contribution table over its layers
    (few pieces: each is one compile, mostly torch.export's capture) and the int8 peak of
    Sparse() (nothing trained), the floor of any budget, for update="auto" end to end."""
    import edgetrain as et
    from edgetrain.sparse import ContributionTable, scheme_layers

    model = tiny_net()
    x = torch.from_numpy(task(1)[0])
    names = tuple(layer.weight for layer in scheme_layers(model, (x,)).dense[:-1])
    table = ContributionTable("tiny", names, 0.4, {8: 0.06}, {(3, 1.0): 0.04, (6, 0.25): 0.02, (7, 1.0): 0.03})
    base = et.compile(model, (x,), update=et.Sparse(), quantize="int8").memory.peak_bytes
    return model, x, table, base



#: a fine-tune of one short epoch, and a small grid of the tiny net's layers, ratios and bias
#: depths: the contribution analyses of tests/sparse and tests/scale share them
FAST = FineTune(epochs=1, batch=8, lr=0.05, momentum=0.9, seed=0)
GRID = dict(layers=[2, 5, 6], ratios=[0.5, 1.0], bias_ks=[2, 4], config=FAST)


class Counting(SerialExecutor):
    """The serial executor, recording the pieces it runs (a rerun from a results file runs none)."""

    def __init__(self):
        self.ran = []

    def map(self, fn, shared, pieces):
        self.ran += list(pieces)
        yield from super().map(fn, shared, pieces)
