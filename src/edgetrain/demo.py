"""`edgetrain demo`: the main job end to end on what exists so far.

Capture a small MobileNet-style CNN, compile its training program (autodiff at compile
time, pruned backward, updates applied as soon as each gradient exists, every byte
accounted), then train it on real MNIST digits with the reference runtime and report
accuracy before and after and the program's memory.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

#: MNIST pixel statistics (mean, std of the training set in [0, 1]) used to normalise input.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


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


@dataclass(frozen=True)
class DemoConfig:
    train_images: int = 4000
    test_images: int = 1000
    batch: int = 16
    epochs: int = 1
    lr: float = 0.01
    momentum: float = 0.9
    seed: int = 0


def normalise(images: np.ndarray) -> np.ndarray:
    return ((images.astype(np.float32) / 255.0 - MNIST_MEAN) / MNIST_STD)[:, None]


def accuracy(prog, x: np.ndarray, y: np.ndarray) -> float:
    return float((prog.predict(x).argmax(axis=1) == y).mean())


def run_demo(cfg: DemoConfig = DemoConfig(), echo=print) -> dict:
    import edgetrain as et
    from edgetrain.data import load_mnist
    from tqdm import tqdm

    xtr, ytr = load_mnist("train", cfg.train_images)
    xte, yte = load_mnist("test", cfg.test_images)
    xtr, xte = normalise(xtr), normalise(xte)
    torch.manual_seed(cfg.seed)
    model = DigitNet()
    t0 = time.perf_counter()
    prog = et.compile(model, (torch.zeros(cfg.batch, 1, 28, 28),), loss="cross_entropy", update=et.Full(),
                      optimizer=et.SGD(lr=cfg.lr, momentum=cfg.momentum))
    echo(f"compiled {type(model).__name__} in {time.perf_counter() - t0:.1f} s: "
         f"{len(prog.stages['captured'].nodes)} forward nodes -> {len(prog.train_graph.nodes)} training nodes")
    echo(f"memory of one training step (batch {cfg.batch}): {prog.memory.summary()}")
    before = accuracy(prog, xte, yte)
    echo(f"test accuracy before training: {before:.1%}")
    rng = np.random.default_rng(cfg.seed)
    losses = []
    steps = len(xtr) // cfg.batch
    for epoch in range(cfg.epochs):
        order = rng.permutation(len(xtr))
        bar = tqdm(range(steps), desc=f"epoch {epoch + 1}/{cfg.epochs}", unit="step")
        for s in bar:
            idx = order[s * cfg.batch:(s + 1) * cfg.batch]
            losses.append(prog.step(xtr[idx], ytr[idx]))
            if s % 10 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
    after = accuracy(prog, xte, yte)
    echo(f"test accuracy after {len(losses)} steps: {after:.1%} (loss {np.mean(losses[:20]):.3f} -> "
         f"{np.mean(losses[-20:]):.3f})")
    model.load_state_dict(prog.state_dict())
    with torch.no_grad():
        torch_acc = float((model.eval()(torch.from_numpy(xte)).argmax(1).numpy() == yte).mean())
    echo(f"trained weights loaded back into the PyTorch model: accuracy {torch_acc:.1%}")
    return {"before": before, "after": after, "torch_after": torch_acc, "losses": losses,
            "peak_bytes": prog.memory.peak_bytes}
