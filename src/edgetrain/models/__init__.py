"""The model zoo: architectures only (no downloads), deterministic initialisation.

`get(name, num_classes=10, seed=0)`; `example_input(name, batch=1)` gives an input of
the size the model is meant for (vision models 128x128, resnet18-cifar 32x32, bert-tiny
128 tokens)."""
from __future__ import annotations

import torch
from torch import nn

from .bert import BertTiny
from .mcu import TABLES, mcu_model
from .resnet import ResNet18

#: model name -> (input resolution or sequence length)
INPUT_SIZE = {"mbv2-w0.35": 128, "mcunet-5fps": 128, "proxyless-w0.3": 128, "resnet18": 128,
              "resnet18-cifar": 32, "bert-tiny": 128}
#: ranges of the random batch-norm statistics and affine parameters, so that eval-mode
#: batch norm is not the identity and gradient tests exercise all of it
BN_VAR_RANGE, BN_MEAN_STD, BN_SCALE_RANGE, BN_SHIFT_STD = (0.5, 1.5), 0.1, (0.5, 1.5), 0.1


def names() -> list[str]:
    return list(INPUT_SIZE)


def _build(name: str, num_classes: int) -> nn.Module:
    if name in TABLES:
        return mcu_model(name, num_classes)
    if name.startswith("resnet18"):
        return ResNet18(num_classes, cifar=name == "resnet18-cifar")
    return BertTiny(num_classes)


def _init(model: nn.Module, gen: torch.Generator) -> None:
    """Fan-in He init (unit-scale activations through eval-mode batch norm) and random
    but valid batch-norm statistics."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            fan_in = m.weight[0].numel()
            m.weight.data.copy_(torch.randn(m.weight.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
        elif isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            lo, hi = BN_VAR_RANGE
            m.running_var.copy_(torch.rand(c, generator=gen) * (hi - lo) + lo)
            m.running_mean.copy_(torch.randn(c, generator=gen) * BN_MEAN_STD)
            lo, hi = BN_SCALE_RANGE
            m.weight.data.copy_(torch.rand(c, generator=gen) * (hi - lo) + lo)
            m.bias.data.copy_(torch.randn(c, generator=gen) * BN_SHIFT_STD)


def get(name: str, num_classes: int = 10, seed: int = 0) -> nn.Module:
    """A freshly initialised zoo model, in eval mode."""
    if name not in INPUT_SIZE:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(names())}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _build(name, num_classes)
        _init(model, torch.Generator().manual_seed(seed))
    return model.eval()


def example_input(name: str, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """A random input of the size `name` is meant for."""
    if name not in INPUT_SIZE:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(names())}")
    gen = torch.Generator().manual_seed(seed)
    n = INPUT_SIZE[name]
    if name == "bert-tiny":
        return torch.randint(0, 30522, (batch, n), generator=gen)
    return torch.randn(batch, 3, n, n, generator=gen)
