"""CIFAR-10 from its published python form (issue 18, item 12): cifar-10-python.tar.gz and the
cifar-10-batches-py folder, read from a path the user gives, with an unpickler that refuses
anything but numpy arrays; made here by the test (cifar_archive.py), never the shared assets."""
from __future__ import annotations

import pickle
import tarfile

import numpy as np
import pytest

from edgetrain.data import DataError, load_cifar10
from edgetrain.data import cifar_python
from edgetrain.data.folder import FolderError, load_images

from .cifar_archive import BATCHES, PER_CLASS, batch_images, make_archive, make_batches_folder, malicious_pickle

N_TRAIN = 5 * PER_CLASS * 10


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    return make_archive(tmp_path_factory.mktemp("cifar"))


def _expected(split):
    parts = [batch_images(i) for i, name in enumerate(BATCHES) if (name == "test_batch") == (split == "test")]
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


@pytest.mark.parametrize("split", ["train", "test"])
def test_archive_and_folder_read_every_image_in_file_order(archive, split):
    images, labels = load_cifar10(split, path=archive)
    want_x, want_y = _expected(split)
    assert images.dtype == np.uint8 and images.shape == want_x.shape and labels.dtype == np.int64
    # the channel planes become RGB in the right place: class, position and batch come back
    assert np.array_equal(images, want_x) and np.array_equal(labels, want_y)
    assert images[0, 0, 1, 0] == 255 and images[0, 1, 0, 0] != 255, "row-major 32x32 planes"
    folder = archive.parent / "src"  # holds cifar-10-batches-py: either folder may be given
    for path in (folder, folder / "cifar-10-batches-py"):
        again, again_labels = load_cifar10(split, path=path)
        assert np.array_equal(again, images) and np.array_equal(again_labels, labels)


def test_limit_is_class_balanced_and_seeded(archive):
    _, labels = load_cifar10("train", limit=25, path=archive)
    assert np.bincount(labels, minlength=10).tolist() == [3] * 5 + [2] * 5
    assert labels[:10].tolist() == list(range(10))
    a, la = load_cifar10("train", limit=30, path=archive, seed=1)
    b, lb = load_cifar10("train", limit=30, path=archive, seed=1)
    assert np.array_equal(a, b) and np.array_equal(la, lb)
    assert np.bincount(la, minlength=10).tolist() == [3] * 10


def test_load_images_takes_name_colon_path(archive):
    data = load_images(f"cifar10:{archive}", (3, 32, 32))
    assert len(data) == N_TRAIN and data.classes[0] == "airplane" and data.images.shape[1:] == (32, 32, 3)
    val = load_images(f"cifar10:{archive}", (3, 32, 32), split="test", limit=10)
    assert sorted(val.labels.tolist()) == list(range(10))
    with pytest.raises(DataError, match="give the path after 'cifar10:'"):
        load_images("cifar10:", (3, 32, 32))
    with pytest.raises(FolderError, match=f"cifar10:{archive}"):  # the archive itself is no ImageFolder
        load_images(str(archive), (3, 32, 32))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    bad = make_archive(tmp_path / "a", {"data_batch_1": malicious_pickle(f"touch {marker}")})
    with pytest.raises(DataError, match=r"data_batch_1: refused to load: it asks for posix\.system"):
        load_cifar10("train", path=bad)
    assert not marker.exists()
    folder = make_batches_folder(tmp_path / "b", {"batches.meta": malicious_pickle(f"touch {marker}")})
    with pytest.raises(DataError, match="batches.meta: refused to load"):
        load_cifar10("test", path=folder)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [
    pickle.dumps({b"data": eval}, protocol=2),  # builtins.eval
    b"\x80\x02c_codecs\nencode\nX\x03\x00\x00\x00abcX\x04\x00\x00\x00zlib\x86R.",  # a codec other than latin-1
    # numpy's own reconstruction, asked for a 1 TB array (a 70-byte file) or for another class
    b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n\x8a\x06" + (2**40).to_bytes(6, "little")
    + b"\x85U\x01b\x87R.",
    b"\x80\x02cnumpy.core.multiarray\n_reconstruct\ncnumpy\ndtype\nK\x00\x85U\x01b\x87R.",
], ids=["eval", "codec", "huge-array", "not-an-array"])
def test_other_globals_are_refused(tmp_path, payload):
    with pytest.raises(DataError, match="refused to load"):
        load_cifar10("test", path=make_batches_folder(tmp_path, {"test_batch": payload}))


@pytest.mark.parametrize("raw, message", [
    (b"not a pickle at all", "not a CIFAR-10 batch pickle"),
    (pickle.dumps([1, 2, 3], protocol=2), "a list, expected a dict"),
    (pickle.dumps({b"data": np.zeros((2, 5), np.uint8), b"labels": [0, 1]}, protocol=2), r"expected uint8 \(N, 3072\)"),
    (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, protocol=2), "integers in 0..9"),
])
def test_malformed_batch_names_the_file(tmp_path, raw, message):
    with pytest.raises(DataError, match=f"test_batch.*{message}"):
        load_cifar10("test", path=make_batches_folder(tmp_path, {"test_batch": raw}))


def test_bad_archives_give_data_errors(tmp_path, monkeypatch):
    junk = tmp_path / "cifar-10-python.tar.gz"
    junk.write_bytes(b"\x1f\x8b\x08" + b"\x00" * 40)  # a truncated gzip header
    with pytest.raises(DataError, match="cannot read .* as cifar-10-python.tar.gz"):
        load_cifar10("train", path=junk)
    partial = tmp_path / "partial.tar.gz"
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(make_batches_folder(tmp_path / "p") / "batches.meta", arcname="cifar-10-batches-py/batches.meta")
    with pytest.raises(DataError, match="has no data_batch_1, .*https://www.cs.toronto.edu/~kriz/cifar-10-python"):
        load_cifar10("train", path=partial)
    good = make_archive(tmp_path / "big")
    monkeypatch.setattr(cifar_python, "MAX_MEMBER_BYTES", 1000)  # a member larger than any real batch
    with pytest.raises(DataError, match="more than a CIFAR-10 batch"):
        load_cifar10("test", path=good)


def test_other_classes_are_not_cifar10(tmp_path):
    from .cifar_archive import py2_pickle

    meta = py2_pickle({b"label_names": [b"apple"] * 10})
    with pytest.raises(DataError, match="are not CIFAR-10's"):
        load_cifar10("test", path=make_batches_folder(tmp_path, {"batches.meta": meta}))


def test_missing_path_says_where_to_get_it(tmp_path):
    with pytest.raises(DataError, match="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz") as err:
        load_cifar10("test", path=tmp_path / "nowhere.tar.gz")
    assert str(err.value).count(str(tmp_path / "nowhere.tar.gz")) == 1
