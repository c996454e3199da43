"""Where the shared assets are looked for (issue 18, item 4): an explicit folder, then
EDGETRAIN_ASSETS, then `shared/assets` beside a source checkout; never `../shared/assets`
relative to the working directory. A missing asset names the one place looked at, once, and
how to choose another."""
from __future__ import annotations

from pathlib import Path

import pytest

from edgetrain.data import DataError, assets, load_cifar10
from edgetrain.data.assets import ASSETS_ENV, checkout_assets_dir, default_assets_dir, require_assets

from .cifar_archive import make_archive

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_setting(monkeypatch):
    """As an installed package with nothing set: no environment variable, no checkout."""
    monkeypatch.delenv(ASSETS_ENV, raising=False)
    monkeypatch.setattr(assets, "checkout_assets_dir", lambda: None)


def test_assets_beside_the_working_directory_are_not_read(tmp_path, monkeypatch, no_setting):
    """The reported probe: a `../shared/assets` next to the current directory was read."""
    planted = tmp_path / "shared" / "assets"
    make_archive(planted)
    (planted / "tiny-training").mkdir()
    (planted / "tiny-training" / "mbv2-w0.35.pkl").write_bytes(b"planted")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert default_assets_dir() is None
    with pytest.raises(DataError, match=f"none is set: pass --assets DIR or set {ASSETS_ENV}=DIR"):
        require_assets("tiny-training/mbv2-w0.35.pkl")
    with pytest.raises(DataError, match="no assets folder is set.*cifar10:PATH"):
        load_cifar10("test", limit=10)


def test_environment_variable_then_explicit_folder(tmp_path, monkeypatch, no_setting):
    by_env, by_arg = tmp_path / "env", tmp_path / "arg"
    make_archive(by_env)
    by_arg.mkdir()
    monkeypatch.setenv(ASSETS_ENV, str(by_env))
    assert default_assets_dir() == by_env
    assert require_assets("cifar-10-python.tar.gz") == by_env / "cifar-10-python.tar.gz"
    images, labels = load_cifar10("test", limit=10)
    assert images.shape == (10, 32, 32, 3) and sorted(labels.tolist()) == list(range(10))
    # an explicit folder (the CLI's --assets) wins over the environment
    assert default_assets_dir(by_arg) == by_arg
    with pytest.raises(DataError, match=f"looked for {by_arg / 'cifar-10-python.tar.gz'}; .*from --assets"):
        require_assets("cifar-10-python.tar.gz", by_arg)
    with pytest.raises(DataError, match=f"not found in the assets folder {by_arg} \\(from --assets"):
        load_cifar10("test", assets=by_arg)


def test_missing_asset_names_each_path_once_and_how_to_set_it(tmp_path, monkeypatch, no_setting):
    gone = tmp_path / "nowhere"
    monkeypatch.setenv(ASSETS_ENV, str(gone))
    assert default_assets_dir() is None
    with pytest.raises(DataError) as err:
        require_assets("tiny-training/mbv2-w0.35.pkl")
    message = str(err.value)
    assert message.count(str(gone / "tiny-training" / "mbv2-w0.35.pkl")) == 1
    assert f"{gone} (from {ASSETS_ENV}) does not exist" in message
    assert "--assets DIR" in message and f"{ASSETS_ENV}=DIR" in message


def test_checkout_default_only_in_a_source_checkout(tmp_path):
    assert checkout_assets_dir() == REPO_ROOT.parent / "shared" / "assets"
    repo = tmp_path / "repo"
    (repo / "src" / "edgetrain" / "data").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("[project]\n")
    assert checkout_assets_dir(repo / "src/edgetrain/data/assets.py") == tmp_path / "shared" / "assets"
    installed = tmp_path / "venv/lib/python3.12/site-packages/edgetrain/data/assets.py"
    installed.parent.mkdir(parents=True)
    (tmp_path / "venv/lib/pyproject.toml").write_text("")  # even beside a stray pyproject.toml
    assert checkout_assets_dir(installed) is None
