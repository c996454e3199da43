"""Where the C backend keeps what it builds, one setting for every build: the directory named by
$EDGETRAIN_CACHE, else $XDG_CACHE_HOME/edgetrain (~/.cache/edgetrain when XDG_CACHE_HOME is
unset, empty or relative, as the XDG base-directory spec asks). Under it, one folder per kind:
"c" the host libraries (host.build_library, keyed by a content hash) and, beside them in
kernels-<key>, the runtime's kernels compiled once per machine (kernel_lib.py; their parts in
kernel-part-<key>), in pch-<key> the runtime headers precompiled (front_pch.py), in deps-<key> the
host libraries' shared-library dependencies linked once (link_deps.py), "qemu" the QEMU instruction-count plugin
(cortexm.run_qemu); "locks" the lock files that make builds of one product take turns
(publish_build)."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: concurrent builds of one product both run, and the rename keeps one
    fcntl = None  # type: ignore[assignment]

#: the environment variable that moves the cache
CACHE_ENV = "EDGETRAIN_CACHE"


def cache_root() -> Path:
    """The cache directory (not created here)."""
    d = os.environ.get(CACHE_ENV)
    if d:
        return Path(d)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "edgetrain"


def cache_path(kind: str) -> Path:
    """The folder of one kind of build product under the cache directory (not created here)."""
    return cache_root() / kind


def lock_path(dest: Path) -> Path:
    """The lock file of build product `dest` (<kind folder>/<name>): <cache root>/locks/<kind>-<name>.lock,
    apart from the products, so that a kind's folder holds builds only."""
    return dest.parent.parent / "locks" / f"{dest.parent.name}-{dest.name}.lock"


@contextlib.contextmanager
def _build_lock(dest: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) on lock_path(dest), held while `dest` is built: another
    process (or thread) that wants the same product waits, then finds it built. The kernel drops the
    lock when its holder exits, however it ends, so a lock file left behind locks nothing (and is not
    removed: removing it could hand one product's lock to two holders)."""
    if fcntl is None:
        yield
        return
    path = lock_path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def publish_build(dest: Path, build: Callable[[Path], None], prefix: str = "build-") -> None:
    """Build into a fresh folder beside `dest` (`build(work)` writes and compiles there), then
    rename it to `dest` in one step: a reader sees a whole build or none, and a build that
    fails or is interrupted leaves nothing behind. Builds of one `dest` take turns (_build_lock):
    one that finds `dest` published when its turn comes builds nothing (before, two processes
    starting on an empty cache could each compile the same kernel library, and one build was
    dropped). Without flock, when another process published `dest` meanwhile, its build is kept
    and this one dropped."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(dest):
        if dest.exists():  # built by another process while this one waited
            return
        work = Path(tempfile.mkdtemp(prefix=prefix, dir=dest.parent))
        try:
            build(work)
            try:
                work.rename(dest)
            except OSError:  # another process built it meanwhile (no flock here)
                shutil.rmtree(work, ignore_errors=True)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
