"""`own_cache`: a test's own cache directory that shares the suite's compiled kernel parts.

A test about what a build leaves in the cache (one kernel library for two programs, one precompiled
header, one dependencies library) points EDGETRAIN_CACHE at a folder of its own. Each such folder
used to compile every part of the runtime's kernel library again. The parts are keyed by their
preprocessed text, flags and compiler (kernel_lib.part_key), as the real cache shares them between
flag sets: the fixture links the suite's parts in, and hands the parts the test compiled back to the
suite's cache. The kernel library itself (kernels-<key>), the precompiled headers, the dependencies
library and the programs are still built in the test's own folder."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgetrain.backends.c.cache import CACHE_ENV, cache_path, publish_build

#: the parts' folders (kernel_lib.kernels_object); a part being built has this prefix and "build-"
PART_PREFIX = "kernel-part-"


def _parts(folder: Path) -> dict[str, Path]:
    if not folder.is_dir():
        return {}
    return {p.name: p for p in folder.glob(PART_PREFIX + "*")
            if not p.name.startswith(PART_PREFIX + "build-") and (p / "part.o").is_file()}


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    """EDGETRAIN_CACHE set to tmp_path, whose "c" folder holds links to the suite's compiled kernel parts;
    the parts built under it go back to the suite's cache after the test."""
    suite = cache_path("c")
    own = tmp_path / "c"
    own.mkdir(parents=True)
    linked = _parts(suite)
    for name, p in linked.items():
        (own / name).symlink_to(p.resolve(), target_is_directory=True)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    yield tmp_path
    for name, p in _parts(own).items():
        if name not in linked and not p.is_symlink():
            publish_build(suite / name, lambda work, p=p: shutil.copyfile(p / "part.o", work / "part.o"),
                          prefix=PART_PREFIX + "build-")
