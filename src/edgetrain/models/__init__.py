"""The model zoo: architectures only (nothing is downloaded), deterministically initialised.

`get(name, num_classes=10, seed=0, **kw)` builds a model in eval mode (extra keywords go
to its constructor, e.g. `vocab_size` for bert-tiny); `names()` lists the zoo;
`example_input(name, batch=1)` is a random input of the size the model is meant for.

- "mbv2-w0.35", "mcunet-5fps", "proxyless-w0.3": the MCU networks of the tiny-training
  paper (`mcu.py`), float32 NCHW (B, 3, 128, 128);
- "resnet18" (B, 3, 128, 128) and "resnet18-cifar" (B, 3, 32, 32) (`resnet.py`);
- "bert-tiny": int64 token ids (B, 128) (`bert.py`);
- "ds-cnn" (B, 1, 49, 10) and "ad-autoencoder" (B, 640): MLPerf Tiny's keyword spotting and
  anomaly detection models (`mlperf_tiny.py`).

Initialisation (all from `seed`, the global RNG untouched): He-normal convolutions, then
rescaled in forward order to unit output std on `example_input(name, seed=seed)` (LSUV),
so activations stay near unit scale through every net; random norm-layer affines and
batch-norm running statistics (ranges below), so that eval-mode normalisation is never
the identity; Linear and Embedding layers keep PyTorch's default init.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

import torch
from torch import nn

from .bert import VOCAB_SIZE, BertTiny
from .mcu import TABLES, mcu_net
from .mlperf_tiny import ZOO as MLPERF_TINY
from .norm_init import BN_MEAN_STD, BN_VAR_RANGE, NORM_SCALE_RANGE, NORM_SHIFT_STD
from .resnet import ResNet18
from .tiny_training import from_tiny_training as from_tiny_training  # re-exported (the demo, docs)
from .tiny_training import load_tiny_training as load_tiny_training

IMAGE_SIZE, CIFAR_IMAGE_SIZE, SEQ_LEN = 128, 32, 128


class _Entry(NamedTuple):
    build: Callable[..., nn.Module]  # (num_classes, **kw) -> model
    input_shape: tuple[int, ...]  # one example, without the batch dimension
    token_ids: bool = False  # int64 token ids rather than a float image


_ZOO: dict[str, _Entry] = {
    **{name: _Entry(partial(mcu_net, name), (3, IMAGE_SIZE, IMAGE_SIZE)) for name in TABLES},
    "resnet18": _Entry(partial(ResNet18, cifar=False), (3, IMAGE_SIZE, IMAGE_SIZE)),
    "resnet18-cifar": _Entry(partial(ResNet18, cifar=True), (3, CIFAR_IMAGE_SIZE, CIFAR_IMAGE_SIZE)),
    "bert-tiny": _Entry(BertTiny, (SEQ_LEN,), token_ids=True),
    **{name: _Entry(build, shape) for name, (build, shape) in MLPERF_TINY.items()},  # mlperf_tiny.py
}


def names() -> list[str]:
    """The zoo's model names."""
    return list(_ZOO)


def _entry(name: str) -> _Entry:
    if name not in _ZOO:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(names())}")
    return _ZOO[name]


@torch.no_grad()
def _init(model: nn.Module) -> None:
    """He (fan-in) init of convolutions, random norm-layer affines and batch-norm
    statistics, from the global RNG (seeded by the caller). Linear and embedding layers
    keep PyTorch's default init."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
            nn.init.uniform_(m.weight, *NORM_SCALE_RANGE)
            nn.init.normal_(m.bias, 0.0, NORM_SHIFT_STD)
        if isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.running_mean, 0.0, BN_MEAN_STD)
            nn.init.uniform_(m.running_var, *BN_VAR_RANGE)


@torch.no_grad()
def _normalize_convs(model: nn.Module, convs: list[nn.Conv2d], x: torch.Tensor) -> None:
    """Rescale each of `convs`, in forward order, so that its output has unit standard
    deviation on `x` (LSUV, Mishkin & Matas 2016), with the model in eval mode. The random
    batch-norm statistics then describe what they normalise, and activations stay near
    unit scale through the whole net instead of growing with depth and residual adds
    (which would saturate ReLU6) or shrinking."""
    def rescale(conv, inputs, out):
        std = out.std()
        conv.weight.div_(std)
        return out / std

    hooks = [conv.register_forward_hook(rescale) for conv in convs]
    try:
        model.eval()(x)
    finally:
        for h in hooks:
            h.remove()


def get(name: str, num_classes: int = 10, *, seed: int = 0, **kw) -> nn.Module:
    """A freshly initialised zoo model in eval mode; the same (name, num_classes, seed, kw)
    always gives the same weights, and the global RNG state is left untouched. `kw` goes
    to the model's constructor (bert-tiny: vocab_size, max_position)."""
    entry = _entry(name)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = entry.build(num_classes=num_classes, **kw)
        _init(model)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    if convs:
        _normalize_convs(model, convs, example_input(name, seed=seed))
    return model.eval()


def example_input(name: str, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """A random input of the size `name` is meant for: N(0, 1) float32 images, or token
    ids uniform over BERT's vocabulary."""
    entry = _entry(name)
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, *entry.input_shape)
    if entry.token_ids:
        return torch.randint(0, VOCAB_SIZE, shape, generator=gen)
    return torch.randn(shape, generator=gen)
