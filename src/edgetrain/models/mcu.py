"""The three MCU networks of "On-Device Training Under 256KB Memory" (MCUNetV3 /
tiny-training): mbv2-w0.35, mcunet-5fps and proxyless-w0.3, as float PyTorch modules with
batch norm. Each is built from a block table (`TABLES`) whose shapes match the paper's
int8 files (../shared/assets/tiny-training/<name>.pkl, batch norm folded there).

Parameter names (the contract for mapping the int8 files onto these modules)::

    first_conv.0.weight                      conv 3 -> 16, 3x3, stride 2 (bias=False)
    first_conv.1.{weight,bias,running_mean,running_var}   its batch norm; first_conv.2 is ReLU6
    blocks.<i>.pointwise1.{0,1}.*            1x1 expansion conv + BN + ReLU6 (absent when the
                                             table's expansion is None)
    blocks.<i>.depthwise.{0,1}.*             kxk depthwise conv (groups = channels) + BN + ReLU6
    blocks.<i>.pointwise2.{0,1}.*            1x1 projection conv + BN, no activation
    classifier.{weight,bias}                 Linear(last channels, num_classes) after global
                                             average pooling (a 1x1 conv in the int8 files)

Convolutions in forward order: first_conv, then per block pointwise1 (if present),
depthwise, pointwise2. `blocks.<i>.residual` is True exactly when the block adds its
input (stride 1 and equal input and output channels), written `x + branch(x)`.
"""
from __future__ import annotations

import torch
from torch import nn

IN_CHANNELS = 3
#: the first conv, identical in the three networks: 3 -> FIRST_CHANNELS, FIRST_KERNEL, FIRST_STRIDE
FIRST_CHANNELS, FIRST_KERNEL, FIRST_STRIDE = 16, 3, 2

#: one row per block: (expanded channels, or None for a block without pointwise1;
#: depthwise kernel; depthwise stride; output channels)
TABLES: dict[str, list[tuple[int | None, int, int, int]]] = {
    "mbv2-w0.35": [
        (None, 3, 1, 8),
        (48, 3, 2, 8), (48, 3, 1, 8),
        (48, 3, 2, 16), (96, 3, 1, 16), (96, 3, 1, 16),
        (96, 3, 2, 24), (144, 3, 1, 24), (144, 3, 1, 24), (144, 3, 1, 24),
        (144, 3, 1, 32), (192, 3, 1, 32), (192, 3, 1, 32),
        (192, 3, 2, 56), (336, 3, 1, 56), (336, 3, 1, 56),
        (336, 3, 1, 112),
    ],
    "mcunet-5fps": [
        (None, 3, 1, 8),
        (32, 3, 2, 16), (48, 3, 1, 16),
        (48, 7, 2, 24), (120, 3, 1, 24),
        (120, 3, 2, 40), (160, 7, 1, 40),
        (160, 5, 1, 48), (144, 3, 1, 48), (192, 3, 1, 48),
        (240, 7, 2, 96), (384, 5, 1, 96), (384, 5, 1, 96),
        (576, 3, 1, 160),
    ],
    "proxyless-w0.3": [
        (None, 3, 1, 8),
        (24, 5, 2, 16), (48, 3, 1, 16),
        (48, 7, 2, 16), (48, 3, 1, 16), (48, 5, 1, 16), (48, 5, 1, 16),
        (96, 7, 2, 24), (72, 5, 1, 24), (72, 5, 1, 24), (72, 5, 1, 24),
        (144, 5, 1, 32), (96, 5, 1, 32), (96, 5, 1, 32), (96, 5, 1, 32),
        (192, 7, 2, 64), (384, 7, 1, 64), (192, 7, 1, 64), (192, 7, 1, 64),
        (384, 7, 1, 96),
    ],
}


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, relu6: bool = True) -> nn.Sequential:
    """Conv (same padding, no bias) + BatchNorm [+ ReLU6], as one Sequential."""
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([nn.ReLU6()] if relu6 else []))


class InvertedResidual(nn.Module):
    """[pointwise1 ->] depthwise -> pointwise2, plus the input when `residual`."""

    def __init__(self, cin: int, expand: int | None, kernel: int, stride: int, cout: int):
        super().__init__()
        mid = expand or cin
        self.pointwise1 = conv_bn(cin, mid, 1) if expand is not None else None
        self.depthwise = conv_bn(mid, mid, kernel, stride, groups=mid)
        self.pointwise2 = conv_bn(mid, cout, 1, relu6=False)
        self.residual = stride == 1 and cin == cout

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        if self.pointwise1 is not None:
            x = self.pointwise1(x)
        return self.pointwise2(self.depthwise(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x) if self.residual else self.branch(x)


class MCUNet(nn.Module):
    """first_conv -> blocks (from a table) -> global average pool -> classifier."""

    def __init__(self, table: list[tuple[int | None, int, int, int]], num_classes: int = 10):
        super().__init__()
        self.first_conv = conv_bn(IN_CHANNELS, FIRST_CHANNELS, FIRST_KERNEL, FIRST_STRIDE)
        blocks, cin = [], FIRST_CHANNELS
        for expand, kernel, stride, cout in table:
            blocks.append(InvertedResidual(cin, expand, kernel, stride, cout))
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.classifier = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.blocks(self.first_conv(x)).mean((2, 3)))


def mcu_net(name: str, num_classes: int = 10) -> MCUNet:
    """The MCU network `name` (a key of TABLES)."""
    return MCUNet(TABLES[name], num_classes)
