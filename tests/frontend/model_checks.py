"""Checks shared by the frontend's model tests (one model with its input and labels each): float64
gradients against torch.autograd on the reference runtime, the C backend's float32 gradients
against the reference's, a torch.compile training loop against eager, and a Cortex-M4 firmware's
losses (QEMU) against the host build's."""
from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import edgetrain as et
from edgetrain.torch_backend import last_programs
from tests.backends.c.firmware_agreement import firmware_prints_host_steps
from tests.torch_backend.loops import train_loop

#: max |ours - torch| / max(|torch|, 1e-3) of a float64 gradient
FLOAT64_TOL = 1e-10
#: max |C - reference| / max(|reference|, 1e-3) of a float32 gradient
C_TOL = 1e-5
#: max relative difference of a compiled float64 loop's losses from eager's
LOOP_TOL = 1e-12


def rel(ours: np.ndarray, ref: np.ndarray, floor: float = 1e-3) -> float:
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), floor))


def _double(x: torch.Tensor) -> torch.Tensor:
    return x.double() if x.is_floating_point() else x


def float64_gradients_equal_autograd(model, x, y, want_ops=(), tol: float = FLOAT64_TOL):
    """The float64 program's gradients (cross entropy against y) equal torch.autograd's for every
    parameter torch gives one, and its forward holds `want_ops`; the program."""
    model, x = model.double(), _double(x)
    prog = et.compile(model, (x,), update=et.Full())
    assert set(want_ops) <= {n.op for n in prog.forward_graph.nodes}
    ours = prog.gradients(x.numpy(), y.numpy())
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    want = {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
    assert set(ours) == set(want)
    for n, ref in want.items():
        assert rel(ours[n], ref) <= tol, n
    return prog


def c_gradients_equal_the_reference(model, x, y, tol: float = C_TOL):
    xs, ys = x.numpy(), y.numpy()
    ref = et.compile(model, (x,), update=et.Full()).gradients(xs, ys)
    got = et.compile(model, (x,), update=et.Full(), backend="c").gradients(xs, ys)
    assert set(got) == set(ref)
    for n in ref:
        assert rel(got[n], ref[n]) <= tol, n


def compiled_loop_gives_eager_losses(model, batches, want_ops=(), lr: float = 0.05):
    """An unchanged training loop of the float64 model in train mode under torch.compile(backend=
    "edgetrain") gives eager's losses and gradients, and edgetrain ran its forward (`want_ops`)."""
    model = model.double().train()
    batches = [(_double(x), y) for x, y in batches]
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    le, ge = train_loop(eager, eager, batches, lr=lr)
    lc, gc = train_loop(model, torch.compile(model, backend="edgetrain"), batches, lr=lr)
    assert max(abs(a - b) / abs(a) for a, b in zip(le, lc)) < LOOP_TOL, (le, lc)
    assert set(want_ops) <= {n.op for n in last_programs()[-1].forward.nodes}
    for a, b in zip(ge, gc):
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=1e-9, atol=1e-12), k


def firmware_prints_host_losses(model, x, classes: int, tmp_path, want_ops=(), scale: float = 1.0):
    """A Cortex-M4 firmware (QEMU) of the model's float32 training program prints the host build's
    step lines on three random batches shaped as x, and the reference's losses (skipped without
    the toolchain)."""
    from edgetrain.backends.c import cortexm

    if cortexm.missing_tools() or shutil.which("make") is None:
        pytest.skip(f"missing {', '.join(cortexm.missing_tools()) or 'make'}")
    prog = et.compile(model, (x,), optimizer=et.SGD(lr=0.05))
    assert set(want_ops) <= {n.op for n in prog.train_graph.nodes}
    rng = np.random.default_rng(0)
    data = [(scale * rng.standard_normal(tuple(x.shape)).astype(np.float32), np.arange(x.shape[0]) % classes)
            for _ in range(3)]
    fw = firmware_prints_host_steps(prog, data, tmp_path)
    np.testing.assert_allclose(fw.run.losses, [prog.step(a, b) for a, b in data], rtol=1e-5)
    return fw
