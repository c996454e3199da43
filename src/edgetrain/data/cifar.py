"""CIFAR-10 from the shared asset `cifar10-jpg.zip`: a stored zip of 32x32 JPEGs named
`<split>/<class>/NNNN.jpg`. Members are decoded straight from the zip with Pillow, and only
the ones asked for."""
from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from .assets import require_assets
from .mnist import DataError

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck")
CIFAR10_ZIP = "cifar10-jpg.zip"
CIFAR10_SIZE = 32
CIFAR10_SPLIT_SIZES = {"train": 50_000, "test": 10_000}
IMAGE_SUFFIX = ".jpg"


def _class_members(archive: zipfile.ZipFile, split: str) -> list[list[str]]:
    """Member names of `split`, one list per class in CIFAR10_CLASSES order, sorted by name.
    A top-level folder in front of `<split>/<class>/` is allowed."""
    index = {name: label for label, name in enumerate(CIFAR10_CLASSES)}
    members: list[list[str]] = [[] for _ in CIFAR10_CLASSES]
    for name in archive.namelist():
        parts = PurePosixPath(name).parts
        if len(parts) >= 3 and parts[-3] == split and parts[-2] in index and name.endswith(IMAGE_SUFFIX):
            members[index[parts[-2]]].append(name)
    empty = [CIFAR10_CLASSES[i] for i, names in enumerate(members) if not names]
    if empty:
        raise DataError(f"{archive.filename}: no {split}/<class>/*{IMAGE_SUFFIX} members for {empty}")
    return [sorted(names) for names in members]


def _select(members: list[list[str]], limit: int | None,
            seed: int | None) -> list[tuple[str, int]]:
    """(member, label) pairs: a class-balanced choice (first by name, or random with `seed`),
    interleaved so labels are mixed, cut to `limit`, then shuffled when `seed` is given."""
    per_class = None if limit is None else -(-limit // len(members))
    rng = None if seed is None else np.random.default_rng(seed)
    chosen = []
    for names in members:
        picks = range(len(names)) if rng is None else rng.permutation(len(names))
        chosen.append([names[i] for i in list(picks)[:per_class]])
    longest = max(len(names) for names in chosen)
    order = [(names[i], label) for i in range(longest)
             for label, names in enumerate(chosen) if i < len(names)][:limit]
    if rng is not None:
        order = [order[i] for i in rng.permutation(len(order))]
    return order


def _decode(archive: zipfile.ZipFile, name: str) -> np.ndarray:
    with Image.open(io.BytesIO(archive.read(name))) as image:
        pixels = np.asarray(image.convert("RGB"))
    if pixels.shape != (CIFAR10_SIZE, CIFAR10_SIZE, 3):
        raise DataError(f"{archive.filename}:{name} has shape {pixels.shape}, "
                        f"expected {(CIFAR10_SIZE, CIFAR10_SIZE, 3)}")
    return pixels


def load_cifar10(split: str = "train", limit: int | None = None, *,
                 path: str | os.PathLike[str] | None = None,
                 seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 32, 32, 3) RGB, labels int64 (N,)) of the 'train' or 'test' split.

    Without `limit`, the whole split; with it, a class-balanced subset of `limit` images (the
    first by member name of each class; class counts differ by at most one). Labels are
    interleaved (0, 1, ..., 9, 0, 1, ...). With `seed`, each class's images are chosen at
    random and the result is shuffled, deterministically, with numpy's default_rng(seed)."""
    if split not in CIFAR10_SPLIT_SIZES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of images, got {limit}")
    zip_path = require_assets(CIFAR10_ZIP) if path is None else Path(path)
    if not zip_path.is_file():
        raise DataError(f"CIFAR-10 zip not found at {zip_path}; it is the shared asset "
                        f"{CIFAR10_ZIP} (expected in ../shared/assets/), or pass path=")
    try:
        with zipfile.ZipFile(zip_path) as archive:
            order = _select(_class_members(archive, split), limit, seed)
            images = np.empty((len(order), CIFAR10_SIZE, CIFAR10_SIZE, 3), dtype=np.uint8)
            for i, (name, _) in enumerate(order):
                images[i] = _decode(archive, name)
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(f"cannot read CIFAR-10 from {zip_path}: {err}") from None
    labels = np.array([label for _, label in order], dtype=np.int64)
    return images, labels
