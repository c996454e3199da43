"""`NAME:PATH` data sets (issue 18, item 12): MNIST and Fashion-MNIST from a folder of their
published idx .gz files, made here by the test; what is not a data set spec stays a folder."""
from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from edgetrain.data import DataError
from edgetrain.data.folder import FolderError, load_images, split_named
from edgetrain.data.mnist import FILES, IDX_MAGIC_IMAGES, IDX_MAGIC_LABELS

from .cifar_archive import make_batches_folder


def write_idx_folder(root, n_train=12, n_test=5):
    """root/ with the four MNIST-layout files: image i is filled with value i, label i % 10."""
    root.mkdir(parents=True)
    for split, n in (("train", n_train), ("test", n_test)):
        images = np.repeat(np.arange(n, dtype=np.uint8), 28 * 28).reshape(n, 28, 28)
        labels = (np.arange(n) % 10).astype(np.uint8)
        (root / FILES[split][0]).write_bytes(gzip.compress(struct.pack(">iiii", IDX_MAGIC_IMAGES, n, 28, 28)
                                                            + images.tobytes()))
        (root / FILES[split][1]).write_bytes(gzip.compress(struct.pack(">ii", IDX_MAGIC_LABELS, n) + labels.tobytes()))
    return root


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_sets_from_a_folder(tmp_path, name):
    folder = write_idx_folder(tmp_path / "idx")
    data = load_images(f"{name}:{folder}", (1, 28, 28))
    assert len(data) == 12 and data.images.shape == (12, 28, 28)
    assert data.labels.tolist() == [i % 10 for i in range(12)] and data.images[7].max() == 7
    test = load_images(f"{name}:{folder}", (1, 28, 28), split="test", limit=3)
    assert len(test) == 3 and data.source.startswith(f"{name}:{folder}")
    with pytest.raises(DataError, match=f"{name}:{tmp_path / 'none'}: no such folder"):
        load_images(f"{name}:{tmp_path / 'none'}", (1, 28, 28))


def test_what_is_a_spec():
    assert split_named("cifar10") == ("cifar10", None)
    assert split_named("cifar10:/d/cifar-10-python.tar.gz") == ("cifar10", "/d/cifar-10-python.tar.gz")
    assert split_named("photos/") == (None, None) and split_named("imagenet:/x") == (None, None)


def test_batches_folder_given_as_an_image_folder_is_explained(tmp_path):
    folder = make_batches_folder(tmp_path)
    with pytest.raises(FolderError, match=f"CIFAR-10's python folder, not an ImageFolder: give it as cifar10:{folder}"):
        load_images(str(folder), (3, 32, 32))
