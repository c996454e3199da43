"""The static checks CI runs (issue 34, item 16): ruff's pyflakes and bugbear rules over all of
src/, and mypy on the IR, the ops, the pipeline and the runtimes, both clean. What each checks
is configured in pyproject.toml ([tool.ruff], [tool.mypy]); the tools are in the test extra.
A finding fails the test with the tool's own report."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    """`python -m <tool> ...` from the project root (the project's configuration applies)."""
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def _tool(module: str) -> None:
    pytest.importorskip(module, reason=f"{module} is in the test extra: pip install -e '.[test]'")


def test_ruff_pyflakes_and_bugbear_find_nothing_in_src():
    _tool("ruff")
    r = _run("ruff", "check", "--no-cache", "--output-format", "concise", "src")
    assert r.returncode == 0, f"ruff check src (exit {r.returncode}):\n{r.stdout}{r.stderr}"


def test_mypy_finds_no_type_error_in_ir_ops_pipeline_and_runtime():
    _tool("mypy")
    r = _run("mypy")  # the files of [tool.mypy] in pyproject.toml
    assert r.returncode == 0, f"mypy (exit {r.returncode}):\n{r.stdout}{r.stderr}"
    assert "Success: no issues found" in r.stdout, r.stdout


def test_the_checks_cover_what_the_issue_names():
    """The configuration checks the whole of src/ with F and B, and mypy on the four parts;
    nothing is switched off wholesale."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())
    lint = conf["tool"]["ruff"]["lint"]
    assert set(lint["select"]) == {"F", "B"} and "exclude" not in conf["tool"]["ruff"]
    assert set(lint.get("ignore", ())) <= {"B905"}  # zip(strict=): an opinionated B9 check (pyproject.toml)
    mypy = conf["tool"]["mypy"]
    assert set(mypy["files"]) == {"src/edgetrain/ir", "src/edgetrain/ops", "src/edgetrain/pipeline.py",
                                  "src/edgetrain/runtime"}
    overrides = [mypy, *mypy.get("overrides", [])]
    assert not any(o.get("ignore_errors") for o in overrides) and "exclude" not in mypy
