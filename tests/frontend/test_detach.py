"""x.detach() stops the gradient, as in torch: straight-through estimators x + (round(x) - x).detach(),
a product with a detached copy of itself, a target branch computed from detached features, a clamp
bound taken from detached values. torch.export's decomposition turns aten.detach into an alias, and
AOTAutograd's forward graph (traced under no_grad) drops it: et.compile's capture keeps it whole
(frontend/capture.py KEEP_UNDECOMPOSED) and torch.compile's backend swaps Dynamo's detach calls for an
opaque op (torch_backend/detach.py); both become the IR's `detach` (ops/shape.py), a view with no
gradient. Before, both paths let the gradient through: wrong gradients with no error."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.torch_backend import last_programs
from tests.frontend.model_checks import (c_gradients_equal_the_reference, compiled_loop_gives_eager_losses,
                                         float64_gradients_equal_autograd)

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


def test_float64_gradients_equal_autograd():
    model, x = _model_and_input()
    prog = float64_gradients_equal_autograd(model, x, _labels(x), {"detach"})
    assert sum(n.op == "detach" for n in prog.forward_graph.nodes) == 4


def test_c_backend_gradients_equal_the_reference():
    model, x = _model_and_input()
    c_gradients_equal_the_reference(model, x, _labels(x))


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
    compiled_loop_gives_eager_losses(model, [(x + 0.1 * k, _labels(x)) for k in range(3)], {"detach"}, lr=0.1)
    assert sum(n.op == "detach" for n in last_programs()[-1].forward.nodes) == 4


def test_stop_gradient_run_by_pytorch_gives_no_gradient():
    """The op replacing detach in Dynamo's graph, where PyTorch runs it (a fallback): detach's values
    and gradients."""
    from edgetrain.torch_backend.detach import stop_gradient

    x = torch.randn(5, requires_grad=True)
    y = stop_gradient(x)
    assert torch.equal(y, x.detach())
    (x * stop_gradient(x)).sum().backward()
    assert torch.equal(x.grad, x.detach())
