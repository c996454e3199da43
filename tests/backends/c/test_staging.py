"""Writing a project folder whole (backends/c/staging.py): a full disk in the middle of the
writes leaves the old folder as it was and no temporary folder behind; files the new project
does not replace are kept; a killed writer's leftovers are cleaned (or put back) by the next
write."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from edgetrain.backends.c import staging
from edgetrain.backends.c.staging import ProjectWriteError, write_files


def tree(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def old_project(tmp_path):
    d = tmp_path / "proj"
    write_files(d, {"model.c": "int old;\n", "model.h": "/* old */\n", "samples.h": "old samples\n"})
    (d / "notes.txt").write_text("the user's")
    (d / "build").mkdir()
    (d / "build" / "model.o").write_bytes(b"\x7fELF old")
    return d


def full_disk_after(n_files, monkeypatch):
    """Make staging's writer fail with ENOSPC on file n_files + 1, after half of its bytes."""
    real, seen = staging._write_file, []

    def write(path, data):
        if len(seen) == n_files:
            with open(path, "wb") as f:
                f.write(data[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        seen.append(path.name)
        real(path, data)

    monkeypatch.setattr(staging, "_write_file", write)
    return seen


def test_full_disk_leaves_the_old_folder_and_no_temporary(old_project, tmp_path, monkeypatch):
    before = tree(old_project)
    new = {"model.c": "int new_model[] = {" + "1," * 5000 + "};\n", "model.h": "/* new */\n", "samples.h": "new\n"}
    full_disk_after(1, monkeypatch)  # model.c written, model.h cut in the middle
    with pytest.raises(ProjectWriteError) as e:
        write_files(old_project, new)
    msg = str(e.value)
    need = sum(len(v.encode()) for v in new.values())
    assert f"writing {old_project.resolve() / 'model.h'}" in msg and "the disk is full" in msg
    assert f"the project needs {need:,} B" in msg and "B are free" in msg and "is unchanged" in msg
    assert e.value.errno == errno.ENOSPC
    assert tree(old_project) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]  # no temporary sibling


def test_not_enough_free_space_is_refused_before_writing(old_project, tmp_path, monkeypatch):
    before = tree(old_project)
    monkeypatch.setattr(staging, "_free", lambda path: 10)
    with pytest.raises(ProjectWriteError, match=r"the project needs 1,000 B but only 10 B are free"):
        write_files(old_project, {"model.c": "x" * 1000})
    assert tree(old_project) == before and sorted(p.name for p in tmp_path.iterdir()) == ["proj"]


def test_new_files_replace_old_ones_and_the_rest_is_kept(old_project, tmp_path):
    notes = (old_project / "notes.txt").stat().st_ino
    write_files(old_project, {"model.c": "int new;\n", "model.h": "/* new */\n", "README.md": "# new\n"})
    assert tree(old_project) == {"model.c": b"int new;\n", "model.h": b"/* new */\n", "README.md": b"# new\n",
                                 "samples.h": b"old samples\n", "notes.txt": b"the user's",
                                 "build/model.o": b"\x7fELF old"}
    assert (old_project / "notes.txt").stat().st_ino == notes  # carried over as a hard link, not copied
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]


def test_without_an_atomic_exchange_two_renames_do(old_project, tmp_path, monkeypatch):
    monkeypatch.setattr(staging.sys, "platform", "darwin")  # no renameat2: the fallback
    write_files(old_project, {"model.c": "int new;\n"})
    assert (old_project / "model.c").read_text() == "int new;\n" and (old_project / "notes.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]


def test_the_current_folder_is_written_in_place(old_project, tmp_path, monkeypatch):
    monkeypatch.chdir(old_project)  # swapping it would leave the shell in a deleted folder
    ino = old_project.stat().st_ino
    full_disk_after(0, monkeypatch)
    before = tree(old_project)
    with pytest.raises(ProjectWriteError, match="the disk is full"):
        write_files(".", {"model.c": "int new;\n", "model.h": "/* new */\n"})
    assert tree(old_project) == before
    monkeypatch.undo()
    monkeypatch.chdir(old_project)
    write_files(".", {"model.c": "int new;\n"})
    assert old_project.stat().st_ino == ino and (old_project / "model.c").read_text() == "int new;\n"
    assert tree(old_project)["samples.h"] == b"old samples\n"
    assert not [p for p in old_project.iterdir() if p.name.startswith(staging.INNER_STAGE)]


def test_a_killed_writers_leftovers_are_cleaned_or_put_back(old_project, tmp_path):
    pid = dead_pid()
    stage = tmp_path / f".proj{staging.STAGE_MARK}{pid}-abc"
    stage.mkdir()
    (stage / "model.c").write_text("half")
    live = tmp_path / f".proj{staging.STAGE_MARK}{os.getppid()}-abc"  # a live process's: not touched
    live.mkdir()
    # killed between its two renames (no atomic exchange): the old folder set aside, none in place
    aside = tmp_path / f".proj{staging.OLD_MARK}{pid}-xyz"
    old_project.rename(aside)
    write_files(old_project, {"model.h": "/* new */\n"})
    assert tree(old_project)["model.c"] == b"int old;\n" and tree(old_project)["model.h"] == b"/* new */\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["proj", live.name])


KILLED_WRITER = """
import sys, time
from pathlib import Path
from edgetrain.backends.c import staging
real, count = staging._write_file, [0]
def write(path, data):
    count[0] += 1
    if count[0] == int(sys.argv[2]):
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
        print("paused", flush=True)
        time.sleep(600)
    real(path, data)
staging._write_file = write
staging.write_files(sys.argv[1], {"model.c": "int new_model;\\n" * 100, "model.h": "/* new */\\n",
                                  "samples.h": "new samples\\n"})
"""


@pytest.mark.parametrize("at", [1, 3])
def test_a_writer_killed_mid_write_leaves_the_old_folder(old_project, tmp_path, at):
    before = tree(old_project)
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(old_project), str(at)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "paused"
    finally:
        child.kill()
        child.wait()
    assert tree(old_project) == before  # the old project, whole: nothing of the new one
    left = [p.name for p in tmp_path.iterdir() if p.name != "proj"]
    assert left and all(n.startswith(f".proj{staging.STAGE_MARK}{child.pid}-") for n in left)
    write_files(old_project, {"model.h": "/* newer */\n"})  # the next write removes the dead writer's stage
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj"]
    assert tree(old_project) == dict(before, **{"model.h": b"/* newer */\n"})
