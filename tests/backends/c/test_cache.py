"""One cache directory for every C build (backends/c/cache.py): $EDGETRAIN_CACHE, else
$XDG_CACHE_HOME/edgetrain; host libraries under "c", the QEMU plugin under "qemu"."""
import shutil
from pathlib import Path

import pytest

from edgetrain.backends.c import cache, host, qemu_run


def test_edgetrain_cache_moves_every_build(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETRAIN_CACHE", str(tmp_path / "et"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "et"
    assert host.cache_dir() == tmp_path / "et" / "c"
    lib = host.build_library({"model.c": "int et_answer(void) { return 42; }\n"})
    assert lib.parent.parent == tmp_path / "et" / "c"


def test_default_is_under_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGETRAIN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert host.cache_dir() == tmp_path / "edgetrain" / "c"
    for unusable in ("", "relative/dir"):  # the XDG spec: ignored
        monkeypatch.setenv("XDG_CACHE_HOME", unusable)
        assert cache.cache_root() == Path.home() / ".cache" / "edgetrain"


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no host C compiler")
def test_qemu_plugin_is_built_into_the_same_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETRAIN_CACHE", str(tmp_path))
    so = qemu_run.plugin_path()
    assert so.parent == tmp_path / "qemu" and so.exists()
