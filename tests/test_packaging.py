"""Packaging (issue 34, item 13): the MIT licence text ships in the wheel and the sdist, and the
version is written once (src/edgetrain/__init__.py), which the built metadata follows."""
from __future__ import annotations

import email
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]
#: a version nobody releases: the copy's __init__.py says it, and the built metadata must follow
PROBE_VERSION = "0.0.0.dev34"
BUILD_TIMEOUT_S = 300


def _copy_project(dest: Path) -> Path:
    """The files a build reads (pyproject.toml, README.md, LICENSE, src/), with the copy's
    __version__ set to PROBE_VERSION."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src" / "edgetrain", dest / "src" / "edgetrain",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.o"))
    init = dest / "src" / "edgetrain" / "__init__.py"
    text, n = re.subn(r'(?m)^__version__ = "[^"]*"$', f'__version__ = "{PROBE_VERSION}"', init.read_text())
    assert n == 1, "__init__.py must say __version__ = \"...\" once"
    init.write_text(text)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(wheel, sdist) built from a copy of the project, from another directory, offline."""
    pytest.importorskip("setuptools", minversion="77", reason="builds without isolation need setuptools >= 77 "
                        "(license-files), the test extra's")
    pytest.importorskip("pip", reason="builds the wheel with pip")
    tmp = tmp_path_factory.mktemp("packaging")
    project = _copy_project(tmp / "project")
    work = tmp / "elsewhere"
    work.mkdir()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp / "dist"), str(project)], cwd=work, capture_output=True, text=True,
                       timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                        "print(b.build_sdist(sys.argv[1]))", str(tmp / "sdist")], cwd=project,
                       capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp / "dist").glob("edgetrain-*.whl")
    (sdist,) = (tmp / "sdist").glob("edgetrain-*.tar.gz")
    return wheel, sdist


def _wheel_metadata(wheel: Path) -> tuple[email.message.Message, dict[str, bytes]]:
    with zipfile.ZipFile(wheel) as z:
        info = {n: z.read(n) for n in z.namelist() if ".dist-info/" in n}
    (meta,) = [v for n, v in info.items() if n.endswith(".dist-info/METADATA")]
    return email.message_from_bytes(meta), info


def test_the_licence_ships_in_the_wheel_and_the_sdist(built):
    wheel, sdist = built
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License\n") and "Copyright (c) 2026 the edgetrain authors" in licence
    meta, info = _wheel_metadata(wheel)
    assert meta["License-Expression"] == "MIT" and meta.get_all("License-File") == ["LICENSE"]
    (text,) = [v for n, v in info.items() if n.endswith(".dist-info/licenses/LICENSE")]
    assert text.decode() == licence
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1]: n for n in t.getnames() if "/" in n}
        assert "LICENSE" in names
        assert t.extractfile(names["LICENSE"]).read().decode() == licence


def test_the_wheel_carries_every_runtime_file(built):
    """Every file of backends/c/runtime (headers, the Cortex-M and RISC-V firmware runtimes) is in
    the wheel: a target whose startup files were left out would build only from a checkout."""
    wheel, _ = built
    runtime = ROOT / "src" / "edgetrain" / "backends" / "c" / "runtime"
    want = {"edgetrain/backends/c/runtime/" + f.relative_to(runtime).as_posix()
            for f in runtime.rglob("*") if f.is_file() and "__pycache__" not in f.parts}
    with zipfile.ZipFile(wheel) as z:
        missing = sorted(want - set(z.namelist()))
    assert not missing, missing


def test_the_version_is_written_once(built):
    wheel, sdist = built
    meta, _ = _wheel_metadata(wheel)
    assert meta["Version"] == PROBE_VERSION  # follows __init__.py, not a second copy in pyproject
    assert wheel.name.startswith(f"edgetrain-{PROBE_VERSION}-") and sdist.name == f"edgetrain-{PROBE_VERSION}.tar.gz"
    text = (ROOT / "pyproject.toml").read_text()
    assert not re.search(r'(?m)^version\s*=\s*"', text)  # no literal version anywhere in it
    if tomllib is not None:
        project = tomllib.loads(text)["project"]
        assert "version" not in project and "version" in project["dynamic"]
    import edgetrain  # and the package installed here (editable or a wheel) says the module's

    assert importlib.metadata.version("edgetrain") == edgetrain.__version__


def test_the_firmware_project_has_a_readme_and_builds_into_build(tmp_path):
    """The emitted Cortex-M project says what its files are and how to build and run them, and
    `make` keeps its objects in build/, not beside the sources; `make run` and `make clean` work."""
    import numpy as np
    import torch
    from torch import nn

    import edgetrain as et
    from edgetrain.backends.c import cortexm

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    prog = et.compile(model, (torch.zeros(1, 6),), update=et.BiasOnly(), optimizer=et.SGD(lr=0.05))
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((1, 6)).astype(np.float32), np.array([i % 3])) for i in range(2)]
    d = cortexm.emit_firmware(prog, tmp_path / "fw", "cortex-m4", data)
    readme = (d / "README.md").read_text()
    assert readme.startswith("# edgetrain training firmware (cortex-m4)")
    assert "${" not in readme and "mps2-an386" in readme and "2 training" in readme
    named = set(re.findall(r"`([\w.]+\.(?:c|h|ld|mk))`", readme))
    assert {"model.c", "model.h", "main.c", "samples.h", "startup.c", "board.c", "link.ld", "config.mk"} <= named
    assert all((d / f).exists() for f in named)
    for target in ("make run", "make size", "make clean", "build/"):
        assert target in readme
    if cortexm.missing_tools():
        pytest.skip(f"missing {', '.join(cortexm.missing_tools())}")
    r = subprocess.run(["make", "-s", "-j2"], cwd=d, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (d / "firmware.elf").is_file() and not list(d.glob("*.o")) and not (d / "firmware.map").exists()
    assert sorted(p.name for p in (d / "build").iterdir()) == ["board.o", "firmware.map", "main.o", "model.o",
                                                                "startup.o"]
    r = subprocess.run(["make", "-s", "run"], cwd=d, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split()[:2] for line in r.stdout.splitlines() if line.startswith("step ")] == [["step", "1"],
                                                                                              ["step", "2"]]
    subprocess.run(["make", "-s", "clean"], cwd=d, check=True, capture_output=True, timeout=60)
    assert not (d / "build").exists() and not (d / "firmware.elf").exists() and (d / "model.c").exists()
