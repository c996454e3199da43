"""Batch norm in training mode: et.compile(model, (x,), batchnorm="train") trains as torch's
model.train() does (batch statistics, the gradient through them, running statistics moved by
the momentum with the unbiased variance, num_batches_tracked counted), on the reference
runtime (float64) and on the C backend (float32)."""
import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import edgetrain as et


class BNNet(nn.Module):
    """conv + BatchNorm2d + relu, a linear layer + BatchNorm1d (no affine, momentum=None: a
    cumulative average), a linear head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6, momentum=0.3)
        self.fc = nn.Linear(6 * 4 * 4, 10)
        self.bn1 = nn.BatchNorm1d(10, affine=False, momentum=None)
        self.head = nn.Linear(10, 4)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.head(F.relu(self.bn1(self.fc(h.flatten(1)))))


LR, MOMENTUM = 0.1, 0.9
STATS = ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "bn1.running_mean", "bn1.running_var",
         "bn1.num_batches_tracked")


def _model(dtype):
    torch.manual_seed(0)
    model = BNNet().to(dtype)
    with torch.no_grad():
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.bias.uniform_(-0.3, 0.3)
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


def _batches(dtype, steps=3, batch=4):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 3, 8, 8, generator=g).to(dtype), torch.randint(0, 4, (batch,), generator=g))
            for _ in range(steps)]


def _eager(model, batches):
    """torch's train-mode steps: losses, gradients before each step, the state after each."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses, grads, states = [], [], []
    for x, y in batches:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return losses, grads, states


def _rel(a, b) -> float:
    """max |ours - torch| / max(|torch|, 1), as tests/ops: a conv's bias before a train-mode
    batch norm has a gradient of exactly zero in exact arithmetic (the batch mean removes it),
    rounding noise in both (about 1e-17 in float64), which a plain relative error would compare."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max(initial=0) / max(np.abs(b).max(initial=0), 1.0))


def _check(prog, model, batches, tol, with_grads=True):
    losses, grads, states = _eager(model, batches)
    worst = 0.0
    for (x, y), loss, grad, state in zip(batches, losses, grads, states):
        if with_grads:
            ours = prog.gradients(x.numpy(), y.numpy())  # does not move the running statistics
            for name, want in grad.items():
                worst = max(worst, _rel(ours[name], want.numpy()))
        got = prog.step(x.numpy(), y.numpy())
        worst = max(worst, abs(got - loss) / abs(loss))
        sd = prog.state_dict()
        for k, want in state.items():
            if k.endswith("num_batches_tracked"):
                assert int(sd[k]) == int(want), k
            else:
                worst = max(worst, _rel(sd[k].numpy(), want.numpy()))
    assert worst <= tol, worst
    return worst


def test_reference_matches_torch_train_mode_float64():
    model = _model(torch.float64)
    batches = _batches(torch.float64)
    prog = et.compile(copy.deepcopy(model), (batches[0][0],), optimizer=et.SGD(lr=LR, momentum=MOMENTUM),
                      batchnorm="train")
    ops = [n.op for n in prog.train_graph.nodes]
    assert ops.count("batch_norm_train") == 2 and ops.count("batch_norm_update_stats") == 2
    assert "batch_norm_update_stats" not in {n.op for n in prog.grad_graph.nodes}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _check(prog, model, batches, 1e-10)
    for k in STATS:  # the statistics did move (the test can fail)
        assert not torch.equal(prog.state_dict()[k], before[k]), k
    # predict uses the running statistics (model.eval())
    x = batches[0][0]
    model.eval()
    np.testing.assert_allclose(prog.predict(x.numpy()), model(x).detach().numpy(), rtol=1e-10, atol=1e-12)


def test_eval_mode_is_the_default_and_differs():
    model = _model(torch.float64)
    (x, y), = _batches(torch.float64, steps=1)
    prog = et.compile(copy.deepcopy(model), (x,))
    assert "batch_norm_train" not in {n.op for n in prog.train_graph.nodes}
    with pytest.raises(AssertionError):  # eval-mode training is not torch's train mode
        _check(prog, model, [(x, y)], 1e-6)


def test_option_is_checked():
    model = _model(torch.float32)
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(ValueError, match="batchnorm='batch'"):
        et.compile(model, (x,), batchnorm="batch")
    with pytest.raises(ValueError, match="needs a float program"):
        et.compile(model, (x,), quantize="int8", batchnorm="train")


def test_c_backend_matches_torch_train_mode_float32():
    model = _model(torch.float32)
    batches = _batches(torch.float32)
    prog = et.compile(copy.deepcopy(model), (batches[0][0],), optimizer=et.SGD(lr=LR, momentum=MOMENTUM),
                      batchnorm="train", backend="c")
    assert prog.backend == "c" and type(prog.runner).__name__ == "CRunner"
    _check(prog, model, batches, 1e-5)


def test_non_finite_step_leaves_the_running_statistics_as_they_were():
    """A step that turns the loss non-finite is undone whole: weights, momentum and the running
    statistics that train-mode batch norm updates in place."""
    model = _model(torch.float32)
    (x, y), = _batches(torch.float32, steps=1)
    prog = et.compile(model, (x,), batchnorm="train", optimizer=et.SGD(lr=0.1, momentum=0.9))
    prog.step(x, y)
    stats = [k for k in prog.state if k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert stats
    bad = x.numpy().copy()
    bad[0, 0, 0, 0] = np.inf  # input a step cannot train on: refused before the step runs
    before = {k: v.copy() for k, v in prog.state.items()}
    with pytest.raises(ValueError, match="non-finite"):
        prog.step(bad, y)
    assert all(np.array_equal(prog.state[k], v) for k, v in before.items())
    first = next(k for k in prog.trainable if prog.state[k].ndim == 4)
    prog.state[first][...] = 3e38  # the next step's arithmetic overflows
    before = {k: v.copy() for k, v in prog.state.items()}
    with np.errstate(all="ignore"), pytest.raises(et.program.NonFiniteLossError):
        prog.step(x, y)
    for k, v in before.items():
        np.testing.assert_array_equal(prog.state[k], v, err_msg=k)
