"""The three MCU networks of "On-Device Training Under 256KB Memory" (tiny-training) as
float PyTorch modules with batch norm, built from block tables that match the paper's
int8 files in ../shared/assets/tiny-training.

Parameter names: `first_conv` (Sequential conv, bn, ReLU6); `blocks.<i>` with optional
`pointwise1`, then `depthwise`, `pointwise2` (each Sequential conv, bn[, ReLU6]; no
activation after pointwise2); `classifier` (Linear after global average pooling).
Convolutions in forward order: first_conv, then per block pointwise1 (if any),
depthwise, pointwise2. A block adds its input when its stride is 1 and its input and
output channels are equal.
"""
from __future__ import annotations

import torch
from torch import nn

#: first conv: 3 -> FIRST_CHANNELS, 3x3, stride 2 (identical in the three networks)
FIRST_CHANNELS = 16

# (expanded channels or None for no pointwise1, depthwise kernel, stride, output channels)
TABLES = {
    "mbv2-w0.35": [(None, 3, 1, 8), (48, 3, 2, 8), (48, 3, 1, 8), (48, 3, 2, 16), (96, 3, 1, 16), (96, 3, 1, 16),
                   (96, 3, 2, 24), (144, 3, 1, 24), (144, 3, 1, 24), (144, 3, 1, 24), (144, 3, 1, 32),
                   (192, 3, 1, 32), (192, 3, 1, 32), (192, 3, 2, 56), (336, 3, 1, 56), (336, 3, 1, 56),
                   (336, 3, 1, 112)],
    "mcunet-5fps": [(None, 3, 1, 8), (32, 3, 2, 16), (48, 3, 1, 16), (48, 7, 2, 24), (120, 3, 1, 24),
                    (120, 3, 2, 40), (160, 7, 1, 40), (160, 5, 1, 48), (144, 3, 1, 48), (192, 3, 1, 48),
                    (240, 7, 2, 96), (384, 5, 1, 96), (384, 5, 1, 96), (576, 3, 1, 160)],
    "proxyless-w0.3": [(None, 3, 1, 8), (24, 5, 2, 16), (48, 3, 1, 16), (48, 7, 2, 16), (48, 3, 1, 16),
                       (48, 5, 1, 16), (48, 5, 1, 16), (96, 7, 2, 24), (72, 5, 1, 24), (72, 5, 1, 24),
                       (72, 5, 1, 24), (144, 5, 1, 32), (96, 5, 1, 32), (96, 5, 1, 32), (96, 5, 1, 32),
                       (192, 7, 2, 64), (384, 7, 1, 64), (192, 7, 1, 64), (192, 7, 1, 64), (384, 7, 1, 96)],
}


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, expand, kernel: int, stride: int, cout: int):
        super().__init__()
        mid = expand or cin
        self.pointwise1 = conv_bn(cin, mid, 1) if expand else None
        self.depthwise = conv_bn(mid, mid, kernel, stride, groups=mid)
        self.pointwise2 = conv_bn(mid, cout, 1, act=False)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.pointwise1(x) if self.pointwise1 is not None else x
        y = self.pointwise2(self.depthwise(y))
        return x + y if self.residual else y


class MCUNet(nn.Module):
    def __init__(self, table, num_classes: int = 10):
        super().__init__()
        self.first_conv = conv_bn(3, FIRST_CHANNELS, 3, 2)
        blocks, cin = [], FIRST_CHANNELS
        for expand, kernel, stride, cout in table:
            blocks.append(InvertedResidual(cin, expand, kernel, stride, cout))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.classifier = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.classifier(self.blocks(self.first_conv(x)).mean((2, 3)))


def mcu_model(name: str, num_classes: int = 10) -> MCUNet:
    return MCUNet(TABLES[name], num_classes)
