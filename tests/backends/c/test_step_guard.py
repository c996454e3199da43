"""The host library's checked step (backends/c/step_guard.py): each array a step writes is backed
up just before its first writer and checked just after, or, written by a fused update alone,
double-buffered (the new rows go to the other copy, which the step commits by a pointer flip); a
step whose loss or a weight turns non-finite leaves every state tensor as it was, names the
tensor, and the next step runs normally. The guard is compiled into the ctypes library
(-DET_STEP_GUARD) and, by default (STEP_GUARD=1), into an emitted project's drivers."""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import host
from edgetrain.backends.c.step_guard import GUARD_FLAG, double_buffered, guarded_arrays, row_guarded
from edgetrain.ops import gradupdate
from edgetrain.program import NonFiniteLossError

X = torch.randn(2, 1, 6, 6, generator=torch.Generator().manual_seed(0))
Y = np.array([2, 1])


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 5)).eval()


@pytest.fixture(scope="module")
def prog():
    return et.compile(_net(), (X,), optimizer=et.SGD(lr=0.1, momentum=0.9), backend="c")


def test_weight_overflow_under_a_finite_loss_is_undone(prog):
    """The loss stays finite (class 0's logit is -3.3e38, so its probability is 0), but the
    momentum update takes the bias past float32's range: the error names it, nothing changes."""
    prog.step(X, Y)
    bias = "4.bias"
    mom = f"momentum:{bias}"
    prog.state[bias][0] = -3.3e38
    prog.state[mom][0] = 3.4e38  # d = 0.9 * 3.4e38, w - 0.1 * d < -float32 max
    saved = {k: v.copy() for k, v in prog.state.items()}
    steps = prog.steps
    with pytest.raises(NonFiniteLossError, match=f"{bias} became non-finite"):
        prog.step(X, Y)
    assert prog.steps == steps
    for k, v in saved.items():
        np.testing.assert_array_equal(prog.state[k], v, err_msg=k)
    # sane values back: the next checked step trains again (the guard's per-step flags reset)
    prog.state[bias][0], prog.state[mom][0] = 0.0, 0.0
    before = {k: v.copy() for k, v in prog.state.items()}
    assert np.isfinite(prog.step(X, Y)) and prog.steps == steps + 1
    assert any(not np.array_equal(prog.state[k], v) for k, v in before.items())


def test_every_array_a_step_changes_is_guarded():
    """A sparse scheme (split weights, a bias-only layer): the arrays whose values one step
    changes are all among the guard's slots."""
    scheme = et.Sparse(bias_last=1, weights={0: 0.5})
    p = et.compile(_net(), (X,), update=scheme, optimizer=et.SGD(lr=0.1, momentum=0.9), backend="c")
    p.step(X, Y)  # momentum non-zero from here on
    before = {k: v.copy() for k, v in p.state.items()}
    p.step(X, Y)
    changed = {k for k, v in before.items() if not np.array_equal(p.state[k], v)}
    guarded = {st.name for st in guarded_arrays(p.runner.c_layout)}
    assert changed and changed <= guarded


def _symbols(tmp_path, files, flags):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    subprocess.run([host.find_cc(), *flags, "-c", "-o", "model.o", "model.c"], cwd=tmp_path, check=True)
    return subprocess.run(["nm", "model.o"], cwd=tmp_path, check=True, capture_output=True, text=True).stdout


def test_guard_only_in_the_host_library(prog, tmp_path):
    """An emitted project's model.c (no ET_STEP_GUARD) has neither the checked step nor the backup."""
    plain = _symbols(tmp_path, prog.runner.c_files, ("-O1", "-std=gnu11"))
    assert "et_backup" not in plain and "et_train_step_checked" not in plain and "et_train_step" in plain
    guarded = _symbols(tmp_path, prog.runner.c_files, ("-O1", "-std=gnu11", GUARD_FLAG))
    assert "et_backup" in guarded and "et_train_step_checked" in guarded


def test_per_tensor_copies_and_scans_are_calls(prog):
    """The state accessors, the guard's backup and the checked step's restore copy each tensor
    through et_copy, and the guard scans each through et_any_nonfinite: in the host library
    (-O3) both are functions of their own, called once per tensor, not a copy GCC expands (and
    vectorizes) in every case of the switches, which made a large program's library slow to
    compile (bench/compile_time.py)."""
    syms = subprocess.run(["nm", str(prog.runner.c_library)], check=True, capture_output=True, text=True).stdout
    names = {line.split()[-1].split(".")[0] for line in syms.splitlines() if line.split()[-2:-1] == ["t"]}
    assert {"et_copy", "et_any_nonfinite"} <= names
    text = prog.runner.c_files["model.c"]
    assert re.search(r"case \d+: et_copy\(et_backup\.a\d+, ", text) and "case 0: et_copy(dst, " in text
    assert re.search(r"if \(et_guard_saved\[\d+\]\) et_copy\(\(float \*\)", text)  # the restore
    assert not re.search(r"(case \d+: (if \(ET_MAP_WEIGHTS\) return -2; )?|if \(et_guard_saved\[\d+\]\) )memcpy\(", text)


def _fused_program(monkeypatch, block: int, **sgd):
    """_net with both weights' gradients fused with their update (blocks of `block` bytes)."""
    monkeypatch.setattr(gradupdate, "BLOCK_BYTES", block)
    return et.compile(_net(), (X,), optimizer=et.SGD(lr=0.1, **sgd), backend="c")


@pytest.fixture(params=[16, 64])
def fused(monkeypatch, request):
    """The fused kernels write each row of the double-buffered weights and momenta into their
    other copies and check it (step_guard.row_guarded, et_float_fused.h): blocks of 16 bytes
    (rows of 4 and 9 floats, element by element), 64 bytes (the linear layer's rows of 144 floats
    through the vector loop with its non-temporal stores)."""
    p = _fused_program(monkeypatch, request.param, momentum=0.9)
    rows = [n for n in p.runner.c_layout.graphs["train"].graph.nodes if row_guarded(p.runner.c_layout, n)]
    assert {n.op for n in rows} == {"conv2d_grad_weight_update", "linear_grad_weight_update"}
    assert len(re.findall(r"^ +ET_GUARD_ROWS\(", p.runner.c_files["model.c"], re.M)) == 2
    assert {st.name for st in double_buffered(p.runner.c_layout)} == {
        "0.weight", "momentum:0.weight", "4.weight", "momentum:4.weight"}
    p.step(X, Y)  # momentum non-zero from here on
    return p


def test_double_buffers_only_in_the_host_library(fused, tmp_path):
    """The fused weights are two arrays each with ET_STEP_GUARD, one without (a project's)."""
    plain = _symbols(tmp_path, fused.runner.c_files, ("-O1", "-std=gnu11"))
    guarded = _symbols(tmp_path, fused.runner.c_files, ("-O1", "-std=gnu11", GUARD_FLAG))
    assert re.search(r"\bet_s\d+_4_weight$", plain, re.M) and "_4_weight_b1" not in plain
    assert re.search(r"\bet_s\d+_4_weight_b1$", guarded, re.M)


@pytest.mark.parametrize("block, sgd", [(16, {"momentum": 0.9}), (64, {"momentum": 0.9}),
                                        (64, {"weight_decay": 0.01}), (16, {"momentum": 0.5, "weight_decay": 0.1})])
def test_checked_step_equals_the_raw_step_bit_for_bit(monkeypatch, block, sgd):
    """Three checked steps (the fused updates out of place into the other copies, flipped to after
    each) leave every state tensor bit for bit where three raw steps (in place) leave a copy of the
    program, with and without momentum and weight decay; `prog.state` follows the flips."""
    checked = _fused_program(monkeypatch, block, **sgd)
    raw = checked.replace()
    g = raw.compiled.train_graph
    xin = raw.runner.input_bytes(g, X, training=True)
    yin = np.ascontiguousarray(raw.runner.label_feed(g, Y))
    moved = {st.name: checked.state[st.name].ctypes.data for st in double_buffered(checked.runner.c_layout)}
    for _ in range(3):
        loss = checked.step(X, Y)
        assert raw.runner.raw_step(xin, yin) == loss
    for name, addr in moved.items():
        assert checked.state[name].ctypes.data != addr, name  # an odd number of flips: the other copy
    for k, v in raw.state.items():
        np.testing.assert_array_equal(checked.state[k], v, err_msg=k)


@pytest.mark.parametrize("name, index", [("4.weight", (0, 0)), ("0.bias", (0,))])
def test_overflow_undoes_the_rows_the_fused_kernels_saved(fused, name, index):
    """A fused weight overflowing under a finite loss is named by its kernel's row check; one
    updated after both fused weights (the first convolution's bias: its channel is 0 after the
    ReLU, so the loss stays finite) is named by the array check: either way every array, the fused
    weights and momenta saved row by row included, is as it was, and the next step trains."""
    mom = f"momentum:{name}"
    fused.state[name][index] = -3.3e38
    fused.state[mom][index] = 3.4e38  # w - 0.1 * 0.9 * 3.4e38 < -float32 max
    saved = {k: v.copy() for k, v in fused.state.items()}
    steps = fused.steps
    with pytest.raises(NonFiniteLossError, match=f"{name} became non-finite"):
        fused.step(X, Y)
    assert fused.steps == steps
    for k, v in saved.items():
        np.testing.assert_array_equal(fused.state[k], v, err_msg=k)
    fused.state[name][index], fused.state[mom][index] = 0.0, 0.0
    before = {k: v.copy() for k, v in fused.state.items()}
    assert np.isfinite(fused.step(X, Y)) and fused.steps == steps + 1
    assert all(not np.array_equal(fused.state[k], before[k]) for k in ("0.weight", "4.weight"))
