"""Writing a project folder whole: a crash or a full disk while writing leaves the old project
or the new one, never a mix of the two.

`write_files(folder, files)` writes every file of the new project into a temporary sibling
folder (`.<name>.tmp-<pid>-<random>`), with the files of the old folder that the new project
does not replace (a checkpoint, a lock file, the user's notes, build outputs) carried over as
hard links, fsyncs it, and only then swaps it with the old folder in one step (Linux
renameat2 RENAME_EXCHANGE; elsewhere two renames, and a later write puts an old folder left
between them back). The old folder is deleted after the swap. Before anything is written the
project's bytes are compared with the free space; a write that fails anyway (ENOSPC, EDQUOT,
EIO) raises ProjectWriteError naming the file and the bytes needed.

When the folder cannot be swapped (it is the current directory or holds it, it is a mount
point, or its parent is not writable) the files are staged in a temporary folder inside it and
renamed over the old ones one by one: a full disk still changes nothing, a crash in the middle
of the renames can leave a mix."""
from __future__ import annotations

import ctypes
import errno
import glob
import os
import shutil
import sys
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Mapping, Union

#: marks of the temporary folders (the staged project, the old project between two renames);
#: each name carries the writer's pid so that only a dead writer's leftovers are removed
STAGE_MARK = ".tmp-"
OLD_MARK = ".old-"
#: the staging folder inside a folder that cannot be swapped
INNER_STAGE = ".edgetrain-stage-"
#: Linux renameat2 flag: exchange the two paths atomically (linux/fs.h)
RENAME_EXCHANGE = 2
AT_FDCWD = -100


class ProjectWriteError(OSError):
    """A project could not be written (full disk, permissions); the old project is unchanged.
    Its text is the message alone (errno and filename are attributes, as of any OSError)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def write_files(folder, files: Mapping[str, Union[str, bytes]]) -> Path:
    """Make `folder` hold `files` ({relative name: text or bytes}) besides the files it held
    that are not among them, in one step; returns the folder. On error the folder is as it
    was and no temporary folder is left."""
    folder = Path(folder)
    data = {name: text.encode() if isinstance(text, str) else bytes(text) for name, text in files.items()}
    real = folder.resolve()
    parent = real.parent
    if real.exists() and not real.is_dir():
        raise ProjectWriteError(f"{folder} is a file, not a folder: give the project a folder")
    _makedirs(parent, folder)
    _clean_leftovers(real)
    _check_space(real, data)
    if _swappable(real):
        _write_swapped(real, data)
    else:
        _write_in_place(real, data)
    return folder


# --- the two ways -------------------------------------------------------------------------------
def _write_swapped(real: Path, data: dict) -> None:
    stage = Path(tempfile.mkdtemp(prefix=f".{real.name}{STAGE_MARK}{os.getpid()}-", dir=real.parent))
    try:
        if real.is_dir():
            os.chmod(stage, real.stat().st_mode & 0o7777)
            _carry_over(real, stage, set(data))
        else:
            os.chmod(stage, 0o777 & ~_umask())
        _write_all(stage, data, real)
        _fsync_dir(stage)
        if real.is_dir():
            _swap(stage, real)  # `stage` now names the old folder
        else:
            os.rename(stage, real)
        _fsync_dir(real.parent)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _write_in_place(real: Path, data: dict) -> None:
    real.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f"{INNER_STAGE}{os.getpid()}-", dir=real))
    try:
        _write_all(stage, data, real)
        for name in data:
            target = real / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / name, target)
        _fsync_dir(real)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _swappable(real: Path) -> bool:
    if real.exists() and (not real.is_dir() or os.path.ismount(real)):
        return False
    if not os.access(real.parent, os.W_OK | os.X_OK):
        return False
    with suppress(OSError):
        cwd = Path.cwd().resolve()
        if cwd == real or real in cwd.parents:
            return False
    return True


def _swap(a: Path, b: Path) -> None:
    """Exchange folders `a` and `b`: one step where the kernel can (a crash leaves either),
    else `b` aside as `.<name>.old-<pid>-...`, `a` to `b`, and (next write) back on a crash."""
    if sys.platform.startswith("linux"):
        with suppress(AttributeError, OSError):
            libc = ctypes.CDLL(None, use_errno=True)
            rc = libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
            if rc == 0:
                return
    old = Path(tempfile.mkdtemp(prefix=f".{b.name}{OLD_MARK}{os.getpid()}-", dir=b.parent))
    os.rmdir(old)
    os.rename(b, old)
    try:
        os.rename(a, b)
    except BaseException:
        os.rename(old, b)
        raise
    os.rename(old, a)  # the caller deletes `a`: now the old folder


# --- writing --------------------------------------------------------------------------------------
def _write_file(path: Path, data: bytes) -> None:
    """One file, flushed to the disk (tests replace this to simulate a full disk)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_all(stage: Path, data: dict, real: Path) -> None:
    need = sum(map(len, data.values()))
    for name, blob in data.items():
        path = stage / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_file(path, blob)
        except OSError as err:
            raise _write_error(real, name, err, need) from None


def _write_error(real: Path, name: str, err: OSError, need: int) -> ProjectWriteError:
    where = f"writing {real / name}"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        msg = (f"{where}: the disk is full ({err.strerror or err}): the project needs {need:,} B, "
               f"{_free(real.parent):,} B are free; {real} is unchanged")
    else:
        msg = f"{where}: {err.strerror or err}; {real} is unchanged"
    out = ProjectWriteError(msg)
    out.errno, out.filename = err.errno, str(real / name)
    return out


def _check_space(real: Path, data: dict) -> None:
    need = sum(map(len, data.values()))
    free = _free(real.parent)
    if need > free:
        first = next(iter(data), "")
        raise ProjectWriteError(f"writing {real / first}: the project needs {need:,} B but only {free:,} B are "
                                f"free on {real.parent}; {real} is unchanged")


def _free(path: Path) -> int:
    return shutil.disk_usage(path).free


def _carry_over(src: Path, dst: Path, replaced: set) -> None:
    """Hard links (a copy where the file system has none) in `dst` of the entries of `src`
    that the new project does not replace."""
    _link_tree(src, dst, replaced, "")


def _link_tree(src: Path, dst: Path, replaced: set, prefix: str) -> None:
    for entry in os.scandir(src):
        rel = prefix + entry.name
        target = dst / entry.name
        if rel in replaced:
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir():
            target.mkdir()
            os.chmod(target, entry.stat().st_mode & 0o7777)
            _link_tree(Path(entry.path), target, replaced, rel + "/")
        else:
            try:
                os.link(entry.path, target)
            except OSError:
                shutil.copy2(entry.path, target)


# --- leftovers of a killed writer -------------------------------------------------------------------
def _clean_leftovers(real: Path) -> None:
    """Remove the staging folders of dead writers; put back an old folder that a writer killed
    between its two renames left aside."""
    if not real.parent.is_dir():
        return
    for p in real.parent.glob(f".{glob.escape(real.name)}{OLD_MARK}*"):
        pid = _pid_of(p.name[len(real.name) + 1 + len(OLD_MARK):])
        if pid is not None and not _alive(pid):
            if not real.exists():
                with suppress(OSError):
                    os.rename(p, real)
                    continue
            shutil.rmtree(p, ignore_errors=True)
    for p in real.parent.glob(f".{glob.escape(real.name)}{STAGE_MARK}*"):
        pid = _pid_of(p.name[len(real.name) + 1 + len(STAGE_MARK):])
        if pid is not None and not _alive(pid):
            shutil.rmtree(p, ignore_errors=True)
    if real.is_dir():
        for p in real.glob(INNER_STAGE + "*"):
            pid = _pid_of(p.name[len(INNER_STAGE):])
            if pid is not None and not _alive(pid):
                shutil.rmtree(p, ignore_errors=True)


def _pid_of(tail: str):
    head = tail.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process is not writing that folder now: its leftover is from an earlier error
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


# --- small helpers ---------------------------------------------------------------------------------
def _makedirs(parent: Path, folder: Path) -> None:
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ProjectWriteError(f"cannot create the folder of {folder}: {err.strerror or err}") from None


def _fsync_dir(path: Path) -> None:
    with suppress(OSError):  # not possible on every file system
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
