"""The compiled program is a frozen value; runners run it (runtime/runner.py;
backends/reference_runner.py, backends/c/host.py). The import rules that keep them one way
are tests/test_architecture.py's.

The reference runner and the C runner, made from one compiled program, train the same steps;
the compiled program never changes, whatever runs it; a schedule maps a compiled program to
another; the Program facade reads the compiled program's fields and keeps the runner's kind."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c.host import CRunner, to_c_program
from edgetrain.runtime.compiled import CompiledProgram
from edgetrain.program import Program
from edgetrain.backends.reference_runner import ReferenceRunner
from edgetrain.runtime.runner import Runner
from edgetrain.remat.apply import apply_schedule


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(2, 4, 3, 1, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(self.conv(x).flatten(1))


X = torch.randn(2, 2, 6, 6, generator=torch.Generator().manual_seed(0)).numpy()
Y = np.array([1, 4])


@pytest.fixture(scope="module", params=[None, "int8"])
def compiled(request) -> CompiledProgram:
    torch.manual_seed(0)
    return et.compile(Tiny().eval(), (X,), quantize=request.param, optimizer=et.SGD(lr=0.05, momentum=0.9)).compiled


def _snapshot(c: CompiledProgram) -> dict:
    return {k: np.array(v, copy=True) for k, v in c.initial_state.items()}


def test_both_runners_train_the_same_steps(compiled):
    before = _snapshot(compiled)
    ref, c = ReferenceRunner(compiled), CRunner(compiled)
    assert isinstance(ref, Runner) and isinstance(c, Runner)
    assert (ref.backend, c.backend) == ("reference", "c")
    for k, v in ref.gradients(X, Y).items():
        np.testing.assert_allclose(c.gradients(X, Y)[k], v, rtol=1e-4, atol=1e-6)
    for _ in range(3):
        lr_, lc = ref.step(X, Y), c.step(X, Y)
        assert abs(lc - lr_) <= 1e-5 * max(abs(lr_), 1.0)
    assert ref.steps == c.steps == 3
    for k in ref.state:
        np.testing.assert_allclose(np.asarray(c.state[k]), ref.state[k], rtol=1e-4, atol=1e-5, err_msg=k)
    np.testing.assert_allclose(c.predict(X[:1]), ref.predict(X[:1]), rtol=1e-4, atol=1e-5)
    # neither runner touched the compiled program's initial state
    for k, v in before.items():
        assert np.array_equal(compiled.initial_state[k], v), k


def test_the_compiled_program_is_immutable(compiled):
    with pytest.raises(dataclasses.FrozenInstanceError):
        compiled.memory = None
    with pytest.raises(TypeError):
        compiled.stages["x"] = compiled.train_graph
    with pytest.raises(TypeError):
        compiled.trainable["x"] = None
    with pytest.raises(ValueError):
        next(iter(compiled.initial_state.values()))[...] = 0
    prog = Program(compiled)
    for name in ("memory", "train_graph", "search", "schedule", "compiled"):
        with pytest.raises(AttributeError):
            setattr(prog, name, None)
    assert prog.memory is compiled.memory and prog.train_graph is compiled.train_graph
    again = prog.replace(search="why")
    assert again.search == "why" and prog.search is None and again.compiled is not compiled


def test_program_facade_keeps_its_runner_kind_and_state():
    torch.manual_seed(0)
    prog = et.compile(Tiny().eval(), (X,), optimizer=et.SGD(lr=0.05))
    assert isinstance(prog.runner, ReferenceRunner) and prog.backend == "reference"
    prog.step(X, Y)
    c = to_c_program(prog)
    assert c.compiled is prog.compiled and isinstance(c.runner, CRunner) and c.steps == 1
    for k in prog.state:
        assert np.array_equal(np.asarray(c.state[k]), prog.state[k]), k
    # state in: a checkpoint's state and step count
    w = {k: v + 1 for k, v in prog.state.items()}
    c.load_state(w, steps=7)
    assert c.steps == 7 and all(np.array_equal(np.asarray(c.state[k]), w[k]) for k in w)
    # a shallow copy shares the state until its state is rebound (as before)
    plain = copy.copy(prog)
    plain.state = {k: np.array(v, copy=True) for k, v in prog.state.items()}
    before = {k: v.copy() for k, v in prog.state.items()}
    plain.step(X, Y)
    assert all(np.array_equal(prog.state[k], before[k]) for k in before)


def test_a_schedule_maps_a_compiled_program_to_another():
    torch.manual_seed(0)
    prog = et.compile(Tiny().eval(), (X,), optimizer=et.SGD(lr=0.05), backend="c")
    sched = et.schedule(prog, solver="chen")
    new = apply_schedule(prog.compiled, sched)
    assert isinstance(new, CompiledProgram) and new.schedule is sched and prog.compiled.schedule is None
    assert "scheduled" in new.stages and "scheduled" not in prog.compiled.stages
    sp = prog.apply(sched)
    assert isinstance(sp.runner, CRunner) and sp.schedule is sched
    want = prog.step(X, Y)
    assert sp.step(X, Y) == pytest.approx(want, rel=1e-5)
