"""One run per output folder: `edgetrain train` and `edgetrain compile` hold an exclusive lock
on their -o folder while they write it, so that a second run into the same folder stops at
once (exit 2, naming the run that holds it) instead of silently overwriting the first one's
files or deleting its temporary files.

The lock is an fcntl.flock on `<folder>/.edgetrain.lock`, a small JSON file naming the holder
(pid, host, command, start time). The kernel drops a flock when its holder exits, however it
exits, so a lock file that a killed run left behind blocks nothing: the next run takes it over.
A run that ends removes the file (and the folder, when the run created it and left it empty).
The file's identity is checked after locking, so a run that opened the file just before its
holder removed it tries again on the new one instead of holding a lock on a deleted file."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

LOCK_NAME = ".edgetrain.lock"
#: a holder removes the file as it ends; a run that raced with that many removals gives up
MAX_ATTEMPTS = 20


class OutputInUseError(OSError):
    """Another run holds the output folder (exit 2: wait for it, or write elsewhere)."""


@dataclass
class OutputLock:
    folder: Path
    fd: int
    created_folder: bool  # the folder did not exist before this run: removed on release when empty

    @property
    def path(self) -> Path:
        return self.folder / LOCK_NAME

    def release(self) -> None:
        """Remove the lock file (if it is still ours) and drop the lock."""
        if self.fd < 0:
            return
        try:
            if _same_file(self.fd, self.path):
                with suppress(OSError):
                    os.unlink(self.path)
            if self.created_folder:
                with suppress(OSError):
                    os.rmdir(self.folder)  # only when empty: a run that failed before writing anything
        finally:
            os.close(self.fd)  # the flock goes with the last descriptor
            self.fd = -1


def acquire(folder, command: str) -> OutputLock:
    """Lock `folder` (created when missing) for this process, recording `command` as the
    holder's; OutputInUseError naming the holder when another live process has it."""
    folder = Path(folder)
    created = False
    for _ in range(MAX_ATTEMPTS):
        if folder.exists() and not folder.is_dir():
            raise NotADirectoryError(f"{folder} is a file, not a folder: give -o a folder")
        if not folder.exists():
            folder.mkdir(parents=True, exist_ok=True)
            created = True
        path = folder / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            continue  # the folder was removed meanwhile (its last holder had created it): again
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read(fd)
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise OutputInUseError(f"{folder} is in use by another run: {describe(holder)}; wait for it to "
                                       f"end, or write to another -o folder") from None
            raise OSError(err.errno, f"cannot lock {path}: {err.strerror}") from None
        if not _same_file(fd, path):
            os.close(fd)  # its holder removed it as we opened it: lock the new one
            continue
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                  "argv": list(sys.argv), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        return OutputLock(folder, fd, created)
    raise OutputInUseError(f"{folder}: could not take its lock ({LOCK_NAME}) after {MAX_ATTEMPTS} attempts: other "
                           f"runs keep starting and ending there")


@contextmanager
def output_lock(folder, command: str) -> Iterator[OutputLock]:
    """`with output_lock(out, "edgetrain train"):` the body runs holding `out`'s lock."""
    lock = acquire(folder, command)
    try:
        yield lock
    finally:
        lock.release()


def holder_of(folder) -> dict:
    """What the lock file of `folder` says about its holder ({} when there is none)."""
    try:
        fd = os.open(Path(folder) / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        return _read(fd)
    finally:
        os.close(fd)


def describe(holder: dict) -> str:
    if not holder:
        return "a run that is starting (its details are not written yet)"
    where = f" on {holder['host']}" if holder.get("host") and holder["host"] != socket.gethostname() else ""
    since = f", since {holder['started']}" if holder.get("started") else ""
    return f"pid {holder.get('pid', '?')}{where}, `{holder.get('command', '?')}`{since}"


def _read(fd: int) -> dict:
    with suppress(OSError, ValueError):
        data = os.pread(fd, 1 << 16, 0)
        value = json.loads(data.decode())
        if isinstance(value, dict):
            return value
    return {}


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
