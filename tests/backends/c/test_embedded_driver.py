"""The host project with embedded samples (project.HOST_MAIN, `make main`) runs the checked step
as the standalone trainer does (STEP_GUARD=1 by default): a sample that makes the step
non-finite stops it with exit 4 and the weights from before it, instead of printing a nan loss
and training on."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c.toolchain import host_compiler

pytestmark = pytest.mark.skipif(host_compiler() is None, reason="no host C compiler")


def _project(tmp_path, guard: str):
    torch.manual_seed(0)
    prog = et.compile(nn.Sequential(nn.Flatten(), nn.Linear(16, 3)), (torch.randn(1, 1, 4, 4),),
                      optimizer=et.SGD(lr=0.1))
    x = np.random.default_rng(0).standard_normal((1, 1, 4, 4)).astype(np.float32)
    bad = x.copy()
    bad[0, 0, 0, 0] = np.inf
    out = prog.emit_c(tmp_path / guard, target="host", samples=[(x, np.array([1])), (bad, np.array([2])),
                                                                  (x, np.array([0]))])
    subprocess.run(["make", "-s", "main", f"STEP_GUARD={guard}"], cwd=out, check=True, capture_output=True)
    return subprocess.run(["./main"], cwd=out, capture_output=True, text=True, timeout=60)


def test_a_non_finite_step_stops_the_embedded_driver_with_exit_4(tmp_path):
    run = _project(tmp_path, "1")
    assert run.returncode == 4, run.stdout
    lines = run.stdout.splitlines()
    assert lines[0].startswith("step 1 loss ") and "nan" not in lines[0]
    assert lines[1] == "error: step 2 came out non-finite (the loss); stopped with the weights from before it"
    assert len(lines) == 2  # nothing trained on after it


def test_without_the_guard_it_still_stops_at_the_non_finite_loss(tmp_path):
    run = _project(tmp_path, "0")
    assert run.returncode == 4 and "step 2 came out non-finite" in run.stdout
