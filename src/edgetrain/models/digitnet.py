"""DigitNet: the demo's 28x28 digit classifier, built like the MCU networks (conv,
depthwise-separable blocks), and its MNIST weights shipped in the package (weights/,
made by scripts/pretrain_digitnet.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

WEIGHTS = Path(__file__).resolve().parent / "weights" / "digitnet-mnist.npz"


class DigitNet(nn.Module):
    """A 28x28 digit classifier built like the MCU networks: conv, depthwise-separable blocks."""

    def __init__(self, width: int = 16, num_classes: int = 10):
        super().__init__()

        def cbr(cin, cout, k, s, groups=1):
            return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU6())

        self.features = nn.Sequential(
            cbr(1, width, 3, 2),  # 14x14
            cbr(width, width, 3, 1, groups=width), cbr(width, 2 * width, 1, 1),
            cbr(2 * width, 2 * width, 3, 2, groups=2 * width), cbr(2 * width, 2 * width, 1, 1),  # 7x7
        )
        self.classifier = nn.Linear(2 * width * 7 * 7, num_classes)  # flatten keeps where strokes are
        for m in self.modules():  # fan-in init keeps activations at unit scale: eval-mode BN does not renormalise
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def pretrained_digitnet() -> DigitNet:
    """DigitNet with the MNIST weights shipped in the package (eval mode)."""
    model = DigitNet()
    with np.load(WEIGHTS) as z:
        model.load_state_dict({k: torch.from_numpy(z[k]) for k in z.files})
    return model.eval()
