"""One cache directory for every C build (backends/c/cache.py): $EDGETRAIN_CACHE, else
$XDG_CACHE_HOME/edgetrain; host libraries under "c", the QEMU plugin under "qemu"; builds of one
product take turns (publish_build's lock), so a second caller reuses the first one's build."""
import shutil
import subprocess
import sys
import threading
import time
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


def _slow_build(calls, fail=False):
    def build(work):
        calls.append(work.name)
        time.sleep(0.3)  # long enough for the other caller to arrive while this one builds
        if fail:
            raise RuntimeError("the compiler failed")
        (work / "out.txt").write_text("built")
    return build


def test_builds_of_one_product_take_turns_and_the_second_builds_nothing(tmp_path):
    dest, calls = tmp_path / "c" / "kernels-abc", []
    threads = [threading.Thread(target=cache.publish_build, args=(dest, _slow_build(calls))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and (dest / "out.txt").read_text() == "built"
    assert [p.name for p in dest.parent.iterdir()] == ["kernels-abc"]  # no other build left behind
    assert cache.lock_path(dest) == tmp_path / "locks" / "c-kernels-abc.lock" and cache.lock_path(dest).is_file()


def test_another_process_waits_for_the_build_then_finds_it(tmp_path):
    dest, calls = tmp_path / "c" / "kernels-abc", []
    cache.lock_path(dest).parent.mkdir(parents=True)
    # a child process holds the lock for a while, as a build in another process would
    child = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time, pathlib\n"
        "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True)\n"
        "time.sleep(0.5); pathlib.Path(sys.argv[2]).mkdir(parents=True); "
        "(pathlib.Path(sys.argv[2]) / 'out.txt').write_text('theirs')\n"), str(cache.lock_path(dest)), str(dest)],
        stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "locked"
    cache.publish_build(dest, _slow_build(calls))
    assert child.wait(timeout=30) == 0
    assert calls == [] and (dest / "out.txt").read_text() == "theirs"


def test_a_failed_build_releases_its_turn(tmp_path):
    dest, calls = tmp_path / "c" / "kernels-abc", []
    with pytest.raises(RuntimeError, match="the compiler failed"):
        cache.publish_build(dest, _slow_build(calls, fail=True))
    cache.publish_build(dest, _slow_build(calls))
    assert len(calls) == 2 and (dest / "out.txt").read_text() == "built"
    assert [p.name for p in dest.parent.iterdir()] == ["kernels-abc"]
