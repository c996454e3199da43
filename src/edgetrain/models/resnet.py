"""ResNet-18 (He et al. 2016) with torchvision's layout and parameter names.

"resnet18": 7x7 stride-2 stem conv + 3x3 stride-2 max pool (ImageNet style), meant for
128x128 input. "resnet18-cifar": 3x3 stride-1 stem conv and no max pool, for 32x32 input.

Parameter names (as torchvision's `resnet18`, so its state dicts map one to one)::

    conv1.weight, bn1.*                          the stem
    layer<s>.<b>.conv1.weight, .bn1.*            s in 1..4, b in 0..1 (BasicBlock)
    layer<s>.<b>.conv2.weight, .bn2.*
    layer<s>.0.downsample.0.weight, .1.*         1x1 conv + BN shortcut, layers 2..4
    fc.{weight,bias}                             Linear(512, num_classes)
"""
from __future__ import annotations

import torch
from torch import nn

IN_CHANNELS, STEM_CHANNELS = 3, 64
#: (output channels, stride of the first block) per stage layer1..layer4
STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))
BLOCKS_PER_STAGE = 2


class BasicBlock(nn.Module):
    """conv3x3 -> BN -> ReLU -> conv3x3 -> BN, plus the (downsampled) input, then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(shortcut + self.branch(x))


class ResNet18(nn.Module):
    """stem -> layer1..layer4 (two BasicBlocks each) -> global average pool -> fc."""

    def __init__(self, num_classes: int = 10, cifar: bool = False):
        super().__init__()
        if cifar:
            self.conv1 = nn.Conv2d(IN_CHANNELS, STEM_CHANNELS, 3, 1, 1, bias=False)
        else:
            self.conv1 = nn.Conv2d(IN_CHANNELS, STEM_CHANNELS, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(STEM_CHANNELS)
        self.relu = nn.ReLU()
        self.maxpool = None if cifar else nn.MaxPool2d(3, 2, 1)
        cin = STEM_CHANNELS
        for s, (cout, stride) in enumerate(STAGES, start=1):
            blocks = [BasicBlock(cin, cout, stride)] + [BasicBlock(cout, cout, 1) for _ in range(BLOCKS_PER_STAGE - 1)]
            setattr(self, f"layer{s}", nn.Sequential(*blocks))
            cin = cout
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        if self.maxpool is not None:
            x = self.maxpool(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))
