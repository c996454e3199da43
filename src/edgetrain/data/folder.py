"""Labelled images for fine-tuning from the command line: an ImageFolder tree or a named
offline set, turned into the model's input as batches are drawn.

    data = load_images("photos/", (3, 64, 64))        # photos/<class>/<image>, classes sorted
    data = load_images("mnist", (1, 28, 28), limit=500)
    data = load_images("cifar10:dl/cifar-10-python.tar.gz", (3, 32, 32))  # NAME:PATH (split_named)
    x = data.batch([0, 5], mean=(0.5,), std=(0.25,))  # float32 (2, C, H, W)

Every image of a folder is decoded (Pillow) and resized to the model's input when loaded, so
a corrupt or truncated file is found before training starts: FolderError lists all of them,
or with `skip_bad` they are left out and listed in `ImageSet.skipped`."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .mnist import DataError

#: file name suffixes read as images (as torchvision's ImageFolder); other files are ignored
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm", ".pbm", ".tif", ".tiff", ".webp")
NAMED_SETS = ("mnist", "fashion-mnist", "cifar10")
#: how many bad files an error message lists by name
MAX_LISTED = 10


class FolderError(DataError):
    """An image folder cannot be used as it is (its message lists the files at fault)."""


class SingleClassWarning(UserWarning):
    """Training images of one class only: a classifier learns nothing from them (every label is
    the same; the loss falls by predicting that class)."""


@dataclass
class ImageSet:
    """uint8 images (N, H, W) or (N, H, W, 3), int64 labels, class names, and where they are from."""

    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    source: str
    skipped: tuple[str, ...] = ()  # "file: reason" of the images left out (skip_bad)
    files: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.labels)

    def conversion(self, shape: tuple[int, int, int]) -> Optional[str]:
        """In words, how batches turn these images into the model's `shape` (C, H, W) (a named
        set keeps its own size: fashion-mnist's 1x28x28 digits feed a 3x32x32 model only
        converted); None when they already have it."""
        c, h, w = shape
        c0 = 1 if self.images.ndim == 3 else self.images.shape[3]
        h0, w0 = self.images.shape[1:3]
        if (c0, h0, w0) == (c, h, w):
            return None
        how = [f"{'grey copied to 3 channels' if c0 == 1 else 'colour turned to grey'}"] if c0 != c else []
        how += [f"resized (bilinear) from {h0}x{w0}"] if (h0, w0) != (h, w) else []
        return f"{self.source}: {c0}x{h0}x{w0} images converted to the model's input {c}x{h}x{w} ({', '.join(how)})"

    def batch(self, index: Sequence[int], shape: tuple[int, int, int], mean=(0.0,), std=(1.0,)) -> np.ndarray:
        """Images `index` as float32 (len(index), C, H, W): resized to H x W (bilinear) where
        they are not, in [0, 1], then (x - mean) / std per channel."""
        c, h, w = shape
        out = np.empty((len(index), c, h, w), dtype=np.float32)
        for j, i in enumerate(index):
            out[j] = _to_chw(self.images[int(i)], shape)
        m = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1)
        s = np.asarray(std, dtype=np.float32).reshape(-1, 1, 1)
        return (out - m) / s

    def fingerprint(self) -> str:
        """sha256 of the pixels and labels (what a resumed run must train on again)."""
        h = hashlib.sha256()
        h.update(np.ascontiguousarray(self.images).tobytes())
        h.update(np.ascontiguousarray(self.labels).tobytes())
        return h.hexdigest()


def _to_chw(image: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    from PIL import Image

    c, h, w = shape
    if image.shape[:2] != (h, w):
        image = np.asarray(Image.fromarray(image).resize((w, h), Image.BILINEAR))
    if image.ndim == 2 and c == 3:
        image = np.repeat(image[:, :, None], 3, axis=2)
    elif image.ndim == 3 and c == 1:  # ITU-R 601-2 luma, as Pillow's convert("L")
        image = np.asarray(Image.fromarray(image).convert("L"))
    pixels = image.astype(np.float32) / 255.0
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def check_image_shape(shape: Sequence[int], what: str = "the model") -> tuple[int, int, int]:
    """(C, H, W) of an image input (B, C, H, W) with C 1 or 3; a sequence input (B, C, L) (time
    series: --data ts:PATH) as (C, 1, L)."""
    if len(shape) == 3:
        return int(shape[1]), 1, int(shape[2])
    if len(shape) != 4 or shape[1] not in (1, 3):
        raise DataError(f"training on images needs a float input (batch, 1 or 3 channels, height, width); "
                        f"{what} takes {'x'.join(map(str, shape))}")
    return int(shape[1]), int(shape[2]), int(shape[3])


def decode_image(file: Path, shape: tuple[int, int, int]) -> np.ndarray:
    """One image file as uint8 (H, W) for C=1 or (H, W, 3) for C=3 at the model's size.
    Any failure of Pillow (corrupt, truncated, not an image) raises DataError."""
    from PIL import Image

    c, h, w = shape
    try:
        with Image.open(file) as image:
            image.load()
            image = image.convert("L" if c == 1 else "RGB")
            if image.size != (w, h):
                image = image.resize((w, h), Image.BILINEAR)
            return np.asarray(image, dtype=np.uint8).copy()
    except Exception as err:  # Pillow raises many types on malformed files (OSError, SyntaxError, ...)
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"{file}: {msg}") from None


def load_folder(root, shape: tuple[int, int, int], skip_bad: bool = False) -> ImageSet:
    """An ImageFolder tree: root/<class>/<image>, classes in sorted order labelled 0, 1, ...;
    every image decoded and resized to `shape` (C, H, W)."""
    root = Path(root)
    if not root.exists():
        raise FolderError(f"data folder {root} does not exist")
    if not root.is_dir():
        raise FolderError(f"{root} is not a folder (ImageFolder layout: {root}/<class>/<image>); a data set "
                          f"archive is given as NAME:PATH, e.g. cifar10:{root}")
    if (root / "batches.meta").is_file():
        raise FolderError(f"{root} is CIFAR-10's python folder, not an ImageFolder: give it as cifar10:{root}")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise FolderError(f"{root} has no class subfolders (ImageFolder layout: {root}/<class>/<image>)")
    files, labels = [], []
    empty = []
    for label, name in enumerate(classes):
        found = sorted(p for p in (root / name).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
                       and not any(part.startswith(".") for part in p.relative_to(root).parts))
        if not found:
            empty.append(name)
        files += found
        labels += [label] * len(found)
    if empty:
        raise FolderError(f"{root}: class folder(s) {', '.join(empty)} hold no images "
                          f"({', '.join(IMAGE_SUFFIXES)})")
    images, kept, bad = [], [], []
    for f, label in zip(files, labels):
        try:
            images.append(decode_image(f, shape))
            kept.append((f, label))
        except DataError as err:
            bad.append(str(err))
    if bad and not skip_bad:
        listed = "\n  ".join(bad[:MAX_LISTED]) + (f"\n  ... and {len(bad) - MAX_LISTED} more"
                                                  if len(bad) > MAX_LISTED else "")
        raise FolderError(f"{len(bad)} of {len(files)} images in {root} cannot be read:\n  {listed}\n"
                          f"(fix or remove them, or pass --skip-bad-images to train without them)")
    if not kept:
        raise FolderError(f"none of the {len(files)} images in {root} can be read")
    return ImageSet(np.stack(images), np.array([l for _, l in kept], dtype=np.int64), tuple(classes), str(root),
                    tuple(bad), tuple(str(f.relative_to(root)) for f, _ in kept))


def split_named(data: str) -> tuple[Optional[str], Optional[str]]:
    """(name, path) of a named set `NAME` (path None) or `NAME:PATH`; (None, None) for anything
    else (an ImageFolder path)."""
    if data in NAMED_SETS:
        return data, None
    name, sep, path = data.partition(":")
    if not sep or name not in NAMED_SETS:
        return None, None
    if not path:
        raise DataError(f"{data!r}: give the path after '{name}:' (or just {name!r} for its default location)")
    return name, path


def load_named(name: str, split: str = "train", limit: Optional[int] = None, path=None, assets=None) -> ImageSet:
    """One of NAMED_SETS, from `path` (its published form) when given, else its default place
    (see edgetrain.data)."""
    from . import load_cifar10, load_fashion_mnist, load_mnist
    from .cifar import CIFAR10_CLASSES
    from .fashion import FASHION_CLASSES
    from .mnist import read_idx_split

    if name in ("mnist", "fashion-mnist") and path is not None and not Path(path).is_dir():
        raise DataError(f"{name}:{path}: no such folder (it holds the four idx .gz files, e.g. "
                        f"train-images-idx3-ubyte.gz)")
    if name == "mnist":
        x, y = load_mnist(split, limit) if path is None else read_idx_split(Path(path), split, limit, "MNIST")
        classes = tuple(str(i) for i in range(10))
    elif name == "fashion-mnist":
        x, y = load_fashion_mnist(split, limit) if path is None else \
            read_idx_split(Path(path), split, limit, "Fashion-MNIST")
        classes = tuple(FASHION_CLASSES)
    elif name == "cifar10":
        x, y = load_cifar10(split, limit, path=path, assets=assets)
        classes = tuple(CIFAR10_CLASSES)
    else:
        raise DataError(f"unknown data set {name!r}; named sets: {', '.join(NAMED_SETS)}")
    source = f"{name} ({split})" if path is None else f"{name}:{path} ({split})"
    return ImageSet(np.ascontiguousarray(x), y.astype(np.int64), classes, source)


def load_images(data: str, shape: tuple[int, int, int], *, split: str = "train", limit: Optional[int] = None,
                skip_bad: bool = False, assets=None) -> ImageSet:
    """A named set (NAME or NAME:PATH: cifar10:ARCHIVE|DIR, mnist:DIR, fashion-mnist:DIR) or an ImageFolder path; with `limit`, that
    many images (a named set's first or class-balanced choice; for a folder, a fixed random
    choice, kept in file order). An existing path is always read as a folder."""
    if limit is not None and limit < 1:
        raise DataError(f"--limit must be a positive number of images, got {limit}")
    if data.startswith("ts:"):  # UCR/UEA time series (timeseries.py): a _TRAIN.ts file, its folder or a set's name
        from .timeseries import load_ts_split
        return load_ts_split(data[len("ts:"):], split, limit)
    if shape[1] == 1:  # check_image_shape's (C, 1, L) of a sequence input
        raise DataError(f"{data}: a model taking (batch, channels, length) trains on time series: --data ts:PATH")
    if not Path(data).exists():
        name, path = split_named(data)
        if name is not None:
            return load_named(name, split, limit, path, assets)
    s = load_folder(data, shape, skip_bad)
    if limit is not None and limit < len(s):
        keep = np.sort(np.random.default_rng(0).permutation(len(s))[:limit])
        s = ImageSet(s.images[keep], s.labels[keep], s.classes, s.source, s.skipped, tuple(s.files[i] for i in keep))
    present = np.unique(s.labels)
    if split == "train" and len(present) == 1:
        import warnings

        warnings.warn(SingleClassWarning(
            f"{data}: all {len(s)} training images are of one class ({s.classes[int(present[0])]!r}); a single "
            f"class cannot teach a classifier: add a folder per class"), stacklevel=2)
    return s
