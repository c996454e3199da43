"""Offline data loaders: shapes, dtypes, labels, balanced subsets, determinism, and a clear
DataError when a source is missing. Each test skips when its source is not installed."""
import numpy as np
import pytest

from edgetrain.data import (CIFAR10_CLASSES, FASHION_CLASSES, DataError, center_crop, default_assets_dir,
                            load_cifar10, load_cifar_samples, load_fashion_mnist,
                            load_imagenet_samples, resize)
from edgetrain.data import fashion, wheels
from edgetrain.data.cifar import CIFAR10_ZIP
from edgetrain.data.fashion import fashion_mnist_dir
from edgetrain.data.imagenet_samples import foolbox_data_dir

#: mean absolute pixel difference below which two 32x32 images count as the same picture
#: (the zip holds JPEG re-encodings; different pictures differ by ~30)
SAME_PICTURE = 12


def _skip_unless(source, reason):
    try:
        source()
    except DataError as err:
        pytest.skip(f"{reason}: {err}")


@pytest.fixture(scope="module")
def cifar_zip():
    folder = default_assets_dir()
    if folder is None or not (folder / CIFAR10_ZIP).is_file():
        pytest.skip(f"{CIFAR10_ZIP} not found in the assets folder (EDGETRAIN_ASSETS or ../shared/assets "
                    f"beside the checkout)")
    return folder / CIFAR10_ZIP


@pytest.fixture(scope="module")
def fashion_source():
    _skip_unless(fashion_mnist_dir, "Debian package dataset-fashion-mnist not installed")


@pytest.fixture(scope="module")
def foolbox_source():
    _skip_unless(foolbox_data_dir, "PyPI wheel foolbox neither installed nor downloaded")


def test_cifar_class_names():
    assert CIFAR10_CLASSES == ("airplane", "automobile", "bird", "cat", "deer",
                               "dog", "frog", "horse", "ship", "truck")


@pytest.mark.parametrize("split", ["train", "test"])
def test_cifar_balanced_limit(cifar_zip, split):
    images, labels = load_cifar10(split, limit=40)
    assert images.shape == (40, 32, 32, 3) and images.dtype == np.uint8
    assert labels.shape == (40,) and labels.dtype == np.int64
    assert list(labels[:10]) == list(range(10)), "labels are interleaved"
    assert np.bincount(labels, minlength=10).tolist() == [4] * 10
    assert images.std() > 10, "decoded pixels are not blank"


def test_cifar_uneven_limit_and_full_test_split(cifar_zip):
    _, labels = load_cifar10("test", limit=25)
    assert len(labels) == 25 and np.bincount(labels, minlength=10).tolist() == [3] * 5 + [2] * 5
    images, labels = load_cifar10("test")
    assert images.shape == (10_000, 32, 32, 3)
    assert np.bincount(labels).tolist() == [1000] * 10


def test_cifar_deterministic_and_seeded(cifar_zip):
    first, first_labels = load_cifar10("train", limit=30, path=cifar_zip)
    again, again_labels = load_cifar10("train", limit=30)
    assert np.array_equal(first, again) and np.array_equal(first_labels, again_labels)
    seeded, seeded_labels = load_cifar10("train", limit=30, seed=1)
    assert np.bincount(seeded_labels, minlength=10).tolist() == [3] * 10
    repeat, repeat_labels = load_cifar10("train", limit=30, seed=1)
    assert np.array_equal(seeded, repeat) and np.array_equal(seeded_labels, repeat_labels)
    other, _ = load_cifar10("train", limit=30, seed=2)
    assert not np.array_equal(seeded, other) and not np.array_equal(seeded, first)


def test_cifar_missing_zip_raises(tmp_path):
    with pytest.raises(DataError, match="CIFAR-10 not found at .*nowhere.zip"):
        load_cifar10("test", limit=10, path=tmp_path / "nowhere.zip")
    with pytest.raises(ValueError, match="split"):
        load_cifar10("val", path=tmp_path / "nowhere.zip")


def test_cifar_labels_agree_with_foolbox_samples(cifar_zip, foolbox_source):
    """foolbox's CIFAR-10 samples are the first test images; the zip's <class>/0000.jpg and
    0001.jpg are the first of each class, so both sources must agree on labels."""
    samples, sample_labels = load_cifar_samples()
    images, labels = load_cifar10("test", limit=20)
    for sample, label in zip(samples[:4], sample_labels[:4]):
        diff = np.abs(images.astype(int) - sample.astype(int)).mean(axis=(1, 2, 3))
        assert diff.min() < SAME_PICTURE and labels[diff.argmin()] == label


def test_fashion_mnist(fashion_source):
    assert len(FASHION_CLASSES) == 10 and FASHION_CLASSES[0] == "T-shirt/top"
    images, labels = load_fashion_mnist("test")
    assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and np.bincount(labels).tolist() == [1000] * 10
    few, few_labels = load_fashion_mnist("train", limit=100)
    assert few.shape == (100, 28, 28) and few_labels.shape == (100,)
    assert set(few_labels.tolist()) <= set(range(10))


def test_fashion_missing_raises(monkeypatch, tmp_path):
    monkeypatch.setattr(fashion, "FASHION_DIRS", (tmp_path,))
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist("test")


def test_imagenet_samples(foolbox_source):
    images, labels = load_imagenet_samples()
    assert images.shape == (20, 224, 224, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and labels[0] == 243 and labels.min() >= 0 and labels.max() < 1000
    small, small_labels = load_imagenet_samples(128)
    assert small.shape == (20, 128, 128, 3) and np.array_equal(labels, small_labels)


def test_cifar_samples(foolbox_source):
    images, labels = load_cifar_samples()
    assert images.shape == (20, 32, 32, 3) and images.dtype == np.uint8
    assert labels.tolist()[:4] == [3, 8, 8, 0]


def test_foolbox_missing_raises(monkeypatch, tmp_path):
    monkeypatch.setattr(wheels, "installed_dir", lambda package: None)
    monkeypatch.setenv(wheels.WHEELS_ENV, str(tmp_path))
    with pytest.raises(DataError, match="foolbox==3.3.4, read without installing it: run `python -m edgetrain.data.wheels`"):
        load_imagenet_samples()


def test_resize_and_center_crop():
    images = np.arange(2 * 6 * 8 * 3, dtype=np.uint8).reshape(2, 6, 8, 3)
    assert resize(images, 4).shape == (2, 4, 4, 3)
    assert resize(images[..., 0], (3, 5)).shape == (2, 3, 5)
    flat = np.full((1, 10, 10, 3), 77, dtype=np.uint8)
    assert np.all(resize(flat, 7) == 77)
    crop = center_crop(images, (2, 4))
    assert np.array_equal(crop, images[:, 2:4, 2:6])
    with pytest.raises(ValueError):
        center_crop(images, 7)
