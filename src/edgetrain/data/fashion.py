"""Fashion-MNIST from the Debian package `dataset-fashion-mnist`
(install it with `apt-get install dataset-fashion-mnist`), which puts the idx files in
/usr/share/datasets/fashion-mnist/ under the same names as MNIST's."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .mnist import FILES, DataError, read_idx_split

FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
#: where the Debian package installs the files (and where a local install would)
FASHION_DIRS = (Path("/usr/share/datasets/fashion-mnist"),
                Path("/usr/local/share/datasets/fashion-mnist"))


def fashion_mnist_dir() -> Path:
    """The first of FASHION_DIRS holding all four idx files."""
    names = [name for pair in FILES.values() for name in pair]
    for folder in FASHION_DIRS:
        if all((folder / name).is_file() for name in names):
            return folder
    raise DataError("Fashion-MNIST comes from the Debian package dataset-fashion-mnist; install "
                    "it with `apt-get install dataset-fashion-mnist` (looked in "
                    f"{', '.join(map(str, FASHION_DIRS))})")


def load_fashion_mnist(split: str = "train",
                       limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 28, 28), labels int64 (N,)) of the 'train' or 'test' split, in file
    order; `limit` keeps the first `limit` images."""
    if split not in FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return read_idx_split(fashion_mnist_dir(), split, limit, "Fashion-MNIST")
