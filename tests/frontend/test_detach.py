"""x.detach() stops the gradient, as in torch: straight-through estimators x + (round(x) - x).detach(),
a product with a detached copy of itself, a target branch computed from detached features, a clamp
bound taken from detached values. torch.export's decomposition turns aten.detach into an alias, and
AOTAutograd's forward graph (traced under no_grad) drops it: et.compile's capture keeps it whole
(frontend/capture.py KEEP_UNDECOMPOSED) and torch.compile's backend swaps Dynamo's detach calls for an
opaque op (torch_backend/detach.py); both become the IR's `detach` (ops/shape.py), a view with no
gradient. Before, both paths let the gradient through: wrong gradients with no error."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgetrain as et
from edgetrain.torch_backend import last_programs
from tests.torch_backend.loops import train_loop

#: max |ours - torch| / max(|torch|, 1e-3) of a float64 gradient
FLOAT64_TOL = 1e-10
#: max |C - reference| / max(|reference|, 1e-3) of a float32 gradient
C_TOL = 1e-5
CLASSES = 5


class Detaching(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.target, self.fc = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, CLASSES)

    def forward(self, x):
        h = torch.tanh(self.enc(x))
        q = h + (torch.round(4 * h) / 4 - h).detach()  # a straight-through quantizer
        goal = self.target(h.detach())  # a target branch: trained through its own weights only
        capped = torch.clamp(h, max=h[:, :1].detach().abs() + 0.1)
        return self.fc(q + capped * h.detach()) + (goal * h).mean(1, keepdim=True)


def _model_and_input():
    torch.manual_seed(0)
    model = Detaching()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval(), torch.randn(4, 6, generator=torch.Generator().manual_seed(1))


def _labels(x) -> torch.Tensor:
    return torch.arange(x.shape[0]) % CLASSES


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-3))


def test_float64_gradients_equal_autograd():
    model, x = _model_and_input()
    model, x = model.double(), x.double()
    y = _labels(x)
    prog = et.compile(model, (x,), update=et.Full())
    assert sum(n.op == "detach" for n in prog.forward_graph.nodes) == 4
    ours = prog.gradients(x.numpy(), y.numpy())
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    want = {n: p.grad.numpy() for n, p in model.named_parameters()}
    assert set(ours) == set(want)
    for n, ref in want.items():
        assert _rel(ours[n], ref) <= FLOAT64_TOL, n


def test_c_backend_gradients_equal_the_reference():
    model, x = _model_and_input()
    xs, ys = x.numpy(), _labels(x).numpy()
    ref = et.compile(model, (x,), update=et.Full()).gradients(xs, ys)
    got = et.compile(model, (x,), update=et.Full(), backend="c").gradients(xs, ys)
    for n in ref:
        assert _rel(got[n], ref[n]) <= C_TOL, n


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_int8_program_runs_the_detach_on_both_backends(backend):
    model, x = _model_and_input()
    xs, ys = x.numpy(), _labels(x).numpy()
    progs = {b: et.compile(model, (x,), quantize="int8", calibration=[x], update=et.Full(), backend=b)
             for b in ("reference", backend)}
    assert any(n.op == "detach" for n in progs[backend].train_graph.nodes)
    losses = {b: [p.step(xs, ys) for _ in range(2)] for b, p in progs.items()}
    np.testing.assert_allclose(losses[backend], losses["reference"], rtol=1e-5)


def test_torch_compile_training_loop_gives_eager_losses():
    model, x = _model_and_input()
    model, x = model.double().train(), x.double()
    eager = copy.deepcopy(model)
    batches = [(x + 0.1 * k, _labels(x)) for k in range(3)]
    torch._dynamo.reset()
    le, ge = train_loop(eager, eager, batches, lr=0.1)
    lc, gc = train_loop(model, torch.compile(model, backend="edgetrain"), batches, lr=0.1)
    assert max(abs(a - b) / abs(a) for a, b in zip(le, lc)) < 1e-12, (le, lc)
    assert sum(n.op == "detach" for n in last_programs()[-1].forward.nodes) == 4
    for a, b in zip(ge, gc):
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=1e-9, atol=1e-12), k


def test_stop_gradient_run_by_pytorch_gives_no_gradient():
    """The op replacing detach in Dynamo's graph, where PyTorch runs it (a fallback): detach's values
    and gradients."""
    from edgetrain.torch_backend.detach import stop_gradient

    x = torch.randn(5, requires_grad=True)
    y = stop_gradient(x)
    assert torch.equal(y, x.detach())
    (x * stop_gradient(x)).sum().backward()
    assert torch.equal(x.grad, x.detach())
