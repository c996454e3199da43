"""Fixtures of the command-line tests: a model file that is not in the zoo, a small
ImageFolder tree of generated images, and running `edgetrain` in-process or as a process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgetrain.app.cli import main

#: a model written for these tests (not in the zoo): conv + batch norm, a depthwise-separable
#: block, global average pooling, a classifier
MODEL_SOURCE = '''
import torch
from torch import nn


class PetNet(nn.Module):
    def __init__(self, width=8, num_classes=3):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, 2, 1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.dw = nn.Conv2d(width, width, 3, 1, 1, groups=width)
        self.pw = nn.Conv2d(width, 2 * width, 1)
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = torch.relu(self.pw(torch.relu(self.dw(x))))
        return self.head(x.mean((2, 3)))


def build(width=8, num_classes=3):
    return PetNet(width, num_classes)
'''
CLASSES = ("cat", "dog", "owl")
IMAGES_PER_CLASS = 6
SIDE = 16  # the tests' input: 1x3x16x16
INPUT = f"1x3x{SIDE}x{SIDE}"


@pytest.fixture(scope="session")
def model_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "petnet.py"
    path.write_text(MODEL_SOURCE)
    return path


def make_image_folder(root: Path, classes=CLASSES, per_class=IMAGES_PER_CLASS, seed=0) -> Path:
    """root/<class>/<n>.png|jpg: colour images of several sizes, each class its own brightness."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, name in enumerate(classes):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = (rng.random((12 + 2 * i, 20, 3)) * 60 + 60 * c).astype(np.uint8)
            Image.fromarray(pixels).save(d / (f"{i}.png" if i % 2 else f"{i}.jpg"))
    return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data") / "pets")


def snapshot(folder: Path) -> dict:
    """{relative path: bytes} of every file under `folder` (to show that nothing changed)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def cli(capsys):
    """cli(*argv) -> (exit code, stdout, stderr) of `edgetrain argv` run in this process."""
    def run(*argv):
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse: usage errors and --help
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def edgetrain_process(*argv, env_extra=None, pause=None, **kw) -> subprocess.Popen:
    """`edgetrain argv` as a child process (stdout and stderr piped, text); `pause`
    ("save:N:SECONDS" or "step:N:SECONDS") runs it through pause_launcher.py, which pauses the
    training loop at the Nth checkpoint save or before step N."""
    env = dict(os.environ, **(env_extra or {}))
    env.setdefault("PYTHONUNBUFFERED", "1")
    launch = ["-m", "edgetrain.app.cli"] if pause is None else [str(Path(__file__).with_name("pause_launcher.py")), pause]
    return subprocess.Popen([sys.executable, *launch, *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw)
