"""An -o folder is never left half-written or shared: a disk that fills up during `compile`
leaves the previous project whole (it still builds), and a second `train` / `compile` into a
folder that a live run holds stops with exit 2 naming that run, without deleting its
temporary files; a lock file left by a killed run blocks nothing."""
from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from edgetrain.backends.c import staging
from edgetrain.app.checkpoint import TMP_PREFIX, remove_stale_temporaries
from edgetrain.app.outlock import LOCK_NAME, holder_of

from .conftest import INPUT, snapshot
from .test_kill import Child, _train_argv

NO_CC = shutil.which("make") is None or shutil.which("cc") is None


def compile_args(model_file, out, *extra):
    return ("compile", f"{model_file}:build", "--input", INPUT, "--target", "host", "--no-plot", "-o", out, *extra)


@pytest.mark.skipif(NO_CC, reason="needs make and a C compiler")
def test_disk_full_during_compile_keeps_the_previous_project(cli, model_file, tmp_path, monkeypatch):
    out = tmp_path / "proj"
    code, _, err = cli(*compile_args(model_file, out))
    assert code == 0, err
    before = snapshot(out)
    real, written = staging._write_file, []

    def full_disk(path, data):  # the third file is cut in the middle: the disk is full
        if len(written) == 2:
            with open(path, "wb") as f:
                f.write(data[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(path.name)
        real(path, data)

    monkeypatch.setattr(staging, "_write_file", full_disk)
    code, _, err = cli(*compile_args(model_file, out, "--update", "bias"))
    monkeypatch.undo()
    assert code == 2, err
    m = re.search(r"writing (\S+): the disk is full .*: the project needs ([\d,]+) B, ([\d,]+) B are free", err)
    assert m, err
    failed = m.group(1)
    assert os.path.dirname(failed) == str(out.resolve()) and os.path.basename(failed) not in written
    assert f"{out.resolve()} is unchanged" in err and "Traceback" not in err
    # the old project, byte for byte, and nothing beside it
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]
    # the bytes named are the new project's: the same compile, written for real elsewhere
    ref = tmp_path / "ref"
    assert cli(*compile_args(model_file, ref, "--update", "bias"))[0] == 0
    assert int(m.group(2).replace(",", "")) == sum(len(v) for v in snapshot(ref).values())
    # ... and the old project still builds
    r = subprocess.run(["make", "-s", "main"], cwd=out, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["./main"], cwd=out, capture_output=True, text=True)
    assert r.returncode == 0 and "guards ok" in r.stdout


def test_compile_refuses_a_disk_without_room(cli, model_file, tmp_path, monkeypatch):
    out = tmp_path / "proj"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    monkeypatch.setattr(staging, "_free", lambda path: 4096)
    code, _, err = cli(*compile_args(model_file, out))
    assert code == 2 and re.search(r"the project needs [\d,]+ B but only 4,096 B are free", err), err
    assert snapshot(out) == {"keep.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]


HOLDER = """
import sys, time
from edgetrain.app.outlock import acquire
lock = acquire(sys.argv[1], "edgetrain train --epochs 100")
print("locked", flush=True)
time.sleep(600)
"""


def test_a_held_folder_refuses_train_and_compile_until_its_holder_dies(cli, model_file, image_folder, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert holder_of(out)["pid"] == holder.pid
        before = snapshot(out)
        for argv in (("train", f"{model_file}:build", "--input", INPUT, "--data", image_folder, "-o", out,
                      "--no-progress"), compile_args(model_file, out)):
            code, _, err = cli(*argv)
            assert code == 2, err
            assert f"{out} is in use by another run: pid {holder.pid}, `edgetrain train --epochs 100`" in err
            assert "another -o folder" in err
        assert snapshot(out) == before
    finally:
        holder.kill()
        holder.wait()
    # killed: its lock file stays, naming a dead process, and blocks nothing
    assert holder_of(out)["pid"] == holder.pid
    code, _, err = cli(*compile_args(model_file, out))
    assert code == 0, err
    assert not (out / LOCK_NAME).exists() and (out / "notes.txt").read_text() == "mine"  # released at the end


def test_a_live_runs_temporary_file_survives_another_runs_start(cli, model_file, image_folder, tmp_path):
    out = tmp_path / "run"
    child = Child(_train_argv(model_file, image_folder, out), "save:1:300")  # paused before its first rename
    try:
        child.wait_for("paused in save 1")
        tmps = [p for p in out.iterdir() if p.name.startswith(TMP_PREFIX)]
        assert len(tmps) == 1 and f".{child.proc.pid}." in tmps[0].name
        code, _, err = cli("train", f"{model_file}:build", "--input", INPUT, "--data", image_folder, "-o", out,
                           "--no-progress")
        assert code == 2 and f"pid {child.proc.pid}, `edgetrain train`" in err, err
        assert remove_stale_temporaries(out) == [] and tmps[0].exists()  # a live writer's file is left alone
    finally:
        if child.proc.poll() is None:
            child.finish(signal.SIGKILL)
    assert remove_stale_temporaries(out) == tmps  # its writer is dead now
