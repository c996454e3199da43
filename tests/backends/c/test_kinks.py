"""The float64 runs with flipped ReLU / clamp decisions (kinks.py) that the backend matrix
accepts a float32 result by: a flip is the exact computation with that pre-activation on the
other side (checked against torch.autograd with the input moved across), only near kinks are
offered, and a result no flip explains (a kernel fault) is refused."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from tests.backends.c.float_agreement import relative_error
from tests.backends.c.kinks import KINK_NEAR, feeds_copy, first_explaining, flipped_runs, run_float64

def _gap(threshold: float) -> float:
    """One float32 step above `threshold`: within KINK_NEAR of a layer whose largest
    pre-activation is about 1 or the threshold."""
    return float(np.spacing(np.float32(threshold))) if threshold else 2.0 ** -24


def _net(act: nn.Module, threshold: float) -> tuple[nn.Module, torch.Tensor, np.ndarray]:
    """Linear(2, 3) -> act -> Linear(3, 4) whose first hidden unit is its bias for sample 0:
    one float32 step above `threshold` (_gap), and 2 more for sample 1."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 3), act, nn.Linear(3, 4)).eval()
    with torch.no_grad():
        model[0].weight[0] = torch.tensor([0.0, 1.0])
        model[0].bias[0] = threshold + _gap(threshold)
    x = torch.tensor([[1.0, 0.0], [0.5, 2.0]])
    return model, x, np.array([1, 3])


def _torch_grads(model: nn.Module, x: torch.Tensor, y: np.ndarray, bias_shift: float = 0.0) -> dict:
    """float64 autograd gradients, the first hidden bias moved by `bias_shift`."""
    m = copy.deepcopy(model).double()
    with torch.no_grad():
        m[0].bias[0] += bias_shift
    loss = nn.functional.cross_entropy(m(x.double()), torch.from_numpy(y))
    loss.backward()
    return {k: p.grad.numpy() for k, p in m.named_parameters()}


def _grad_runs(prog, x, y):
    g = prog.compiled.grad_graph
    feeds = feeds_copy(prog, g, x.numpy(), y)
    return g, feeds, ((f, prog.runner.full_gradients(out)) for f, out, _ in flipped_runs(g, feeds))


def _meets(want: dict, tol: float = 1e-9):
    return lambda got: all(relative_error(got[k], want[k]) <= tol for k in want)


@pytest.mark.parametrize("act,threshold", [(nn.ReLU(), 0.0), (nn.ReLU6(), 6.0), (nn.Hardtanh(-1.0, 4.0), -1.0)])
def test_a_flip_is_the_computation_with_the_pre_activation_across_its_threshold(act, threshold):
    model, x, y = _net(act, threshold)
    prog = et.compile(model, (x,), update=et.Full())
    g, feeds, runs = _grad_runs(prog, x, y)
    _, _, kinks = run_float64(g, feeds)
    assert kinks and kinks[0].threshold == threshold and kinks[0].distance <= KINK_NEAR
    assert kinks[0].index == 0  # sample 0, unit 0
    plain, across = _torch_grads(model, x, y), _torch_grads(model, x, y, -2 * _gap(threshold))
    assert np.abs(plain["0.bias"] - across["0.bias"]).max() > 1e-3  # the decision matters
    assert first_explaining(runs, _meets(across, 1e-6)) == (kinks[0],)
    # the unflipped float64 run is the exact computation
    assert first_explaining(_grad_runs(prog, x, y)[2], _meets(plain, 1e-6)) == ()


def test_a_result_no_flip_explains_is_refused():
    model, x, y = _net(nn.ReLU(), 0.0)
    prog = et.compile(model, (x,), update=et.Full())
    across = _torch_grads(model, x, y, -2 * _gap(0.0))
    wrong = dict(across, **{"0.weight": across["0.weight"] * 1.001})  # a fault on the flipped side
    assert first_explaining(_grad_runs(prog, x, y)[2], _meets(wrong, 1e-6)) is None


def test_far_from_every_threshold_there_is_nothing_to_flip():
    model, x, y = _net(nn.ReLU(), 0.0)
    with torch.no_grad():
        model[0].bias[0] = 0.25
    prog = et.compile(model, (x,), update=et.Full())
    g, feeds, runs = _grad_runs(prog, x, y)
    assert run_float64(g, feeds)[2] == []
    assert [f for f, _ in runs] == [()]


def test_a_fused_batch_norm_relu_offers_its_normalised_sum():
    """conv -> batch norm -> (+ residual) -> ReLU fuses into one node (ops/bnact.py) whose
    pre-activation is never stored: the kink is found in the recomputed sum."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.fc = nn.Conv2d(1, 1, 1, bias=False), nn.BatchNorm2d(1), nn.Linear(16, 3)

        def forward(self, x):
            return self.fc(torch.relu(self.bn(self.conv(x)) + x).flatten(1))

    torch.manual_seed(1)
    model = Block().eval()
    x = torch.rand(1, 1, 4, 4) + 0.5
    pixel = 6  # (1, 2)
    with torch.no_grad():  # channel 0's bias cancels its sum at the pixel, to float32 rounding
        model.conv.weight.fill_(1.0)
        model.bn.bias[0] = -(x.flatten()[pixel] / torch.sqrt(torch.tensor(1.0 + model.bn.eps)) + x.flatten()[pixel])
    prog = et.compile(model, (x,), update=et.Full())
    g = prog.train_graph
    fused = [i for i, n in enumerate(g.nodes) if n.op == "batch_norm_act"]
    assert len(fused) == 1 and g.nodes[fused[0]].attrs["residual"]
    feeds = feeds_copy(prog, g, x.numpy(), np.array([2]))
    _, _, kinks = run_float64(g, feeds)
    assert [(k.node, k.index) for k in kinks] == [(fused[0], pixel)]
