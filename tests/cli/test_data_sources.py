"""`--data NAME:PATH` and `demo --assets` (issue 18, items 4 and 12): CIFAR-10 in its published
python form from a path the user gives, a planted pickle refused with exit 2, and the assets
folder chosen explicitly (never `../shared/assets` beside the working directory)."""
from __future__ import annotations

import numpy as np

from edgetrain.app.checkpoint import load_checkpoint
from edgetrain.data.assets import ASSETS_ENV

from ..data.cifar_archive import make_archive, malicious_pickle
from .conftest import SIDE

INPUT32 = "1x3x32x32"


def test_train_on_cifar10_archive_from_a_path(cli, model_file, tmp_path):
    archive = make_archive(tmp_path / "dl")
    run = tmp_path / "run"
    code, out, err = cli("train", f"{model_file}:build", "--input", INPUT32, "--classes", "10", "--data",
                         f"cifar10:{archive}", "--val", f"cifar10:{archive}", "--limit", "20", "-o", run,
                         "--no-progress")
    assert code == 0, err
    ck = load_checkpoint(run / "epoch-0001.ckpt")
    assert ck.steps == 20
    assert ck.train["data"]  # the fingerprint of the images trained on
    # the extracted folder is the same data: the same fingerprint, the same trained weights
    again = tmp_path / "again"
    code, _, err = cli("train", f"{model_file}:build", "--input", INPUT32, "--classes", "10", "--data",
                       f"cifar10:{archive.parent / 'src' / 'cifar-10-batches-py'}", "--limit", "20", "-o", again,
                       "--no-progress")
    assert code == 0, err
    other = load_checkpoint(again / "epoch-0001.ckpt")
    assert other.train["data"] == ck.train["data"]
    assert all(np.array_equal(other.state[k], ck.state[k]) for k in ck.state)


def test_planted_pickle_in_a_cifar_archive_is_refused(cli, model_file, tmp_path):
    marker = tmp_path / "pwned"
    bad = make_archive(tmp_path / "dl", {"data_batch_3": malicious_pickle(f"touch {marker}")})
    code, _, err = cli("train", f"{model_file}:build", "--input", f"1x3x{SIDE}x{SIDE}", "--classes", "10",
                       "--data", f"cifar10:{bad}", "-o", tmp_path / "run", "--no-progress")
    assert code == 2, err
    assert "data_batch_3: refused to load: it asks for posix.system" in err and "Traceback" not in err
    assert not marker.exists()


def test_missing_cifar_path_says_where_to_get_it(cli, model_file, tmp_path):
    code, _, err = cli("train", f"{model_file}:build", "--input", INPUT32, "--data", f"cifar10:{tmp_path / 'no.tgz'}",
                       "-o", tmp_path / "run")
    assert code == 2
    assert "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz" in err and err.count(str(tmp_path / "no.tgz")) == 1


def test_demo_assets_flag_names_the_folder_once(cli, tmp_path, monkeypatch):
    monkeypatch.setenv(ASSETS_ENV, str(tmp_path / "env-assets"))  # the flag wins over the environment
    empty = tmp_path / "assets"
    empty.mkdir()
    code, _, err = cli("demo", "--task", "cifar10", "--assets", empty)
    assert code == 2, err
    model = empty / "tiny-training" / "mbv2-w0.35.pkl"
    assert err.count(str(model)) == 1 and "from --assets" in err and f"{ASSETS_ENV}=DIR" in err
    assert "env-assets" not in err


def test_demo_auto_ignores_assets_beside_the_working_directory(tmp_path, monkeypatch):
    from edgetrain.data import assets
    from edgetrain.app.demo import resolve_task

    planted = tmp_path / "shared" / "assets"
    make_archive(planted)
    (planted / "tiny-training").mkdir()
    (planted / "tiny-training" / "mbv2-w0.35.pkl").write_bytes(b"planted")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.delenv(ASSETS_ENV, raising=False)
    monkeypatch.setattr(assets, "checkout_assets_dir", lambda: None)
    assert resolve_task("auto") == "digits"
    assert resolve_task("auto", planted) == "cifar10"  # named explicitly, the same folder is used
