"""CIFAR-10 from a path the user gives or from the assets folder (see assets.py), in one of
three forms, told apart by content:

- cifar-10-python.tar.gz, the published archive (https://www.cs.toronto.edu/~kriz/), or the
  cifar-10-batches-py folder it extracts to: read by cifar_python.py (restricted unpickler);
- cifar10-jpg.zip, this project's shared asset: a stored zip of 32x32 JPEGs named
  `<split>/<class>/NNNN.jpg`, decoded straight from the zip with Pillow, only the ones asked for.

In the assets folder they are looked for under those three names, in that order."""
from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np
from PIL import Image

from .assets import assets_setting
from .cifar_python import BATCH_FOLDER, CIFAR10_PYTHON_URL, read_cifar10_python
from .mnist import DataError

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                   "dog", "frog", "horse", "ship", "truck")
CIFAR10_ZIP = "cifar10-jpg.zip"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
#: the names looked for in the assets folder, in order
ASSET_NAMES = (CIFAR10_ZIP, CIFAR10_ARCHIVE, BATCH_FOLDER)
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


def _select(members: list[list], limit: int | None,
            seed: int | None) -> list[tuple[object, int]]:
    """(member, label) pairs (a member is a zip member name or an image index): a class-balanced choice (first by name, or random with `seed`),
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


def find_cifar10(path=None, assets=None) -> Path:
    """The CIFAR-10 source: `path` when given, else the first of ASSET_NAMES in the assets
    folder; DataError saying where to get it and how to point at it otherwise."""
    get = (f"download {CIFAR10_PYTHON_URL} and give its path (`--data cifar10:PATH`, or "
           f"load_cifar10(path=PATH)): the archive or the {BATCH_FOLDER} folder it extracts to")
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise DataError(f"CIFAR-10 not found at {path}; {get}")
        return path
    folder, origin = assets_setting(assets)
    if folder is not None:
        found = next((folder / name for name in ASSET_NAMES if (folder / name).exists()), None)
        if found is not None:
            return found
        raise DataError(f"CIFAR-10 not found in the assets folder {folder} (from {origin}; looked for "
                        f"{', '.join(ASSET_NAMES)}); {get}")
    raise DataError(f"CIFAR-10 has no default location here (no assets folder is set); {get}")


def _load_zip(zip_path: Path, split: str, limit: int | None, seed: int | None):
    try:
        with zipfile.ZipFile(zip_path) as archive:
            order = _select(_class_members(archive, split), limit, seed)
            images = np.empty((len(order), CIFAR10_SIZE, CIFAR10_SIZE, 3), dtype=np.uint8)
            for i, (name, _) in enumerate(order):
                images[i] = _decode(archive, name)
    except (zipfile.BadZipFile, OSError) as err:
        raise DataError(f"cannot read CIFAR-10 from {zip_path}: {err}") from None
    return images, np.array([label for _, label in order], dtype=np.int64)


def _load_python(source: Path, split: str, limit: int | None, seed: int | None):
    images, labels = read_cifar10_python(source, split, CIFAR10_CLASSES)
    members = [np.flatnonzero(labels == c).tolist() for c in range(len(CIFAR10_CLASSES))]
    empty = [CIFAR10_CLASSES[c] for c, m in enumerate(members) if not m]
    if empty:
        raise DataError(f"{source}: the {split} split has no images of {empty}")
    index = np.array([i for i, _ in _select(members, limit, seed)], dtype=np.int64)
    return images[index], labels[index]


def load_cifar10(split: str = "train", limit: int | None = None, *,
                 path: str | os.PathLike[str] | None = None,
                 seed: int | None = None, assets=None) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 32, 32, 3) RGB, labels int64 (N,)) of the 'train' or 'test' split,
    from `path` (cifar-10-python.tar.gz, cifar-10-batches-py/ or cifar10-jpg.zip) or, without
    it, from the assets folder (`assets`, else $EDGETRAIN_ASSETS, else a checkout's default).

    Without `limit`, the whole split; with it, a class-balanced subset of `limit` images (the
    first of each class, by file order or member name; class counts differ by at most one).
    Labels are interleaved (0, 1, ..., 9, 0, 1, ...). With `seed`, each class's images are
    chosen at random and the result is shuffled, deterministically, with numpy's
    default_rng(seed)."""
    if split not in CIFAR10_SPLIT_SIZES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive number of images, got {limit}")
    source = find_cifar10(path, assets)
    if source.is_file() and zipfile.is_zipfile(source):
        return _load_zip(source, split, limit, seed)
    return _load_python(source, split, limit, seed)
