"""bench/step_speed.py --profile's names for the training graph's nodes (node_kind): each
convolution by its kind and pass, counted on MobileNetV2's and ResNet-18's graphs."""
import collections
import sys
from pathlib import Path

import torch

import edgetrain as et

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from step_speed import node_kind  # noqa: E402


def _kinds(name):
    model = et.models.get(name, num_classes=10).eval()
    prog = et.compile(model, (torch.randn(2, 3, 32, 32),), update=et.Full(), optimizer=et.SGD(lr=0.01, momentum=0.9))
    return collections.Counter(node_kind(n) for n in prog.train_graph.nodes)


def test_mobilenet_v2s_convolutions_by_kind_and_pass():
    k = _kinds("mbv2-w0.35")
    # 17 inverted residual blocks: a depthwise 3x3 each and 33 pointwise 1x1 among them (expansions and
    # projections); the stem's 3x3 is the only dense one
    assert k["depthwise conv, forward"] == k["depthwise conv, input gradient"] == 17
    assert k["pointwise conv, forward"] == k["pointwise conv, input gradient"] == 33
    assert k["dense conv, forward"] == 1 and "dense conv, input gradient" not in k  # the image needs no gradient
    weight = sum(v for n, v in k.items() if "weight gradient" in n)
    assert weight == 17 + 33 + 1
    assert not any(n.startswith("grouped") for n in k)


def test_resnet18s_convolutions_by_kind_and_pass():
    k = _kinds("resnet18-cifar")
    # 17 3x3 convolutions (the stem and 16 in the blocks) and 3 1x1 shortcuts
    assert k["dense conv, forward"] == 17 and k["pointwise conv, forward"] == 3
    assert k["dense conv, input gradient"] == 16 and k["pointwise conv, input gradient"] == 3
    weight = {n: v for n, v in k.items() if "weight gradient" in n}
    assert sum(weight.values()) == 20
    assert all(n.startswith(("dense", "pointwise")) for n in weight)


def test_the_papers_int8_mobilenet_by_kind_and_pass():
    """the int8 program's convolutions ("int8 ..."), their forward, input gradients (1x1 and depthwise) and fused
    weight-gradient updates, on a MobileNetV2 block stack quantized here (no model file needed)"""
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU6(),
                          nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU6(), nn.Conv2d(8, 16, 1), nn.ReLU6(),
                          nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16), nn.ReLU6(), nn.Conv2d(16, 8, 1),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    prog = et.compile(model, (torch.randn(2, 3, 32, 32),), update=et.Full(), quantize="int8",
                      optimizer=et.SGD(lr=0.01, momentum=0.9))
    k = collections.Counter(node_kind(n) for n in prog.train_graph.nodes)
    assert k["int8 depthwise conv, forward"] == k["int8 depthwise conv, input gradient"] == 2
    # two 1x1 convolutions and the classifier (an int8 program's dense layer is a 1x1 convolution)
    assert k["int8 pointwise conv, forward"] == k["int8 pointwise conv, input gradient"] == 3
    assert k["int8 dense conv, forward"] == 1 and "int8 dense conv, input gradient" not in k
    assert sum(v for n, v in k.items() if n.startswith("int8") and "weight gradient" in n) == 6
    assert not any(n.startswith(("dense", "pointwise", "depthwise")) for n in k)  # no float convolution
