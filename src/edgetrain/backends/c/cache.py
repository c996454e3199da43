"""Where the C backend keeps what it builds, one setting for every build: the directory named by
$EDGETRAIN_CACHE, else $XDG_CACHE_HOME/edgetrain (~/.cache/edgetrain when XDG_CACHE_HOME is
unset, empty or relative, as the XDG base-directory spec asks). Under it, one folder per kind:
"c" the host libraries (host.build_library, keyed by a content hash) and, beside them in
kernels-<key>, the runtime's kernels compiled once per machine (kernel_lib.py; their parts in
kernel-part-<key>), in deps-<key> the host libraries' shared-library dependencies linked once
(link_deps.py), "qemu" the QEMU instruction-count plugin
(cortexm.run_qemu)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

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


def publish_build(dest: Path, build: Callable[[Path], None], prefix: str = "build-") -> None:
    """Build into a fresh folder beside `dest` (`build(work)` writes and compiles there), then
    rename it to `dest` in one step: a reader sees a whole build or none, and a build that
    fails or is interrupted leaves nothing behind. When another process published `dest`
    meanwhile, its build is kept and this one dropped."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=dest.parent))
    try:
        build(work)
        try:
            work.rename(dest)
        except OSError:  # another process built it meanwhile
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
