"""The host libraries' dependencies linked once (backends/c/link_deps.py): a program's libmodel.so
names one small cached library, that one names the BLAS (and oneDNN), programs of one BLAS share
it, the program loads and computes with that BLAS, and a library that cannot be linked is a clear
error that leaves nothing in the cache."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.backends.c import blas, link_deps
from edgetrain.backends.c.host import find_cc, to_c_program
from edgetrain.backends.c.kernel_lib import compiler_version
from edgetrain.backends.c.layout import CBackendError
from tests.backends.c.test_blas import FAST

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no host C compiler")
needs_readelf = pytest.mark.skipif(shutil.which("readelf") is None, reason="no readelf (binutils)")


def _needed(lib: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    return [ln.split("[", 1)[1].rstrip("]") for ln in out.splitlines() if "(NEEDED)" in ln]


def _program(width: int):
    torch.manual_seed(width)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, width, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(width * 6 * 6, 3))
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    return et.compile(model, (x,), update=et.Full(), optimizer=et.SGD(lr=0.1)), x.numpy(), np.array([0, 2])


@needs_readelf
@pytest.mark.skipif(not blas.link_flags(FAST), reason="no BLAS installed: nothing to link")
def test_programs_name_one_library_that_names_the_blas(own_cache):
    libs = []
    for width in (4, 5):
        prog, x, y = _program(width)
        c = to_c_program(prog, FAST)
        for _ in range(2):
            assert c.step(x, y) == pytest.approx(prog.step(x, y), rel=1e-5, abs=1e-6)
        libs.append(c.runner.c_library)
    deps = sorted((own_cache / "c").glob("deps-*/" + link_deps.NAME))
    assert len(deps) == 1 and libs[0] != libs[1]  # two programs, one dependencies library
    for lib in libs:
        needed = _needed(lib)
        assert str(deps[0]) in needed  # by its absolute path: no soname to mistake
        assert not any(k in n for n in needed for k in ("mkl", "openblas", "dnnl"))
    wanted = [f.split(":", 1)[1] for f in blas.link_flags(FAST) if f.startswith("-l:")]
    assert wanted and set(wanted) <= set(_needed(deps[0]))
    maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
    if maps:  # Linux: the BLAS the flags name is what the loaded programs run on
        assert all(w in maps for w in wanted)


def test_a_library_that_cannot_be_linked_is_a_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETRAIN_CACHE", str(tmp_path))
    cc = find_cc()
    with pytest.raises(CBackendError, match="libet_no_such_library"):
        link_deps.deps_library(cc, ("-l:libet_no_such_library.so",), compiler_version(cc))
    assert list((tmp_path / "c").iterdir()) == []


def test_no_libraries_no_flags():
    assert link_deps.link_flags("cc", (), "any") == ()
