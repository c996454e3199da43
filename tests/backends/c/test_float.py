"""float32 C backend against the reference runtime: step losses, updated weights and
optimizer state, gradients and predictions agree within 1e-5 (relative to each tensor's
largest magnitude) on small models covering every float kernel, and on a zoo model."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.backends.c import CBackendError
from edgetrain.backends.c.emit import emit_sources
# a quicker build (the kernels' numerics do not depend on it; test_host.py builds with the defaults)
from edgetrain.backends.c.graph_lib import FAST_CFLAGS
from edgetrain.backends.c.host import to_c_program
from edgetrain.backends.c.kernels import KERNELS

RTOL = 1e-5


def close(ours, ref, rtol=RTOL) -> float:
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    err = float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30)) if ref.size else 0.0
    assert err <= rtol, f"relative error {err:.3g}"
    return err


class Block(nn.Module):
    """conv 3x3 s2 + BN + ReLU6, depthwise + BN + ReLU, pointwise with bias, residual add."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.pw = nn.Conv2d(8, 8, 1, bias=True)
        self.dw2 = nn.Sequential(nn.Conv2d(8, 8, 5, 2, 2, groups=8, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
        self.dense = nn.Conv2d(8, 12, 3, 1, 1, bias=False)
        self.fc = nn.Linear(12, 10)

    def forward(self, x):
        h = self.stem(x)
        h = h + self.pw(self.dw(h))
        h = self.dense(self.dw2(h))
        return self.fc(h.mean((2, 3)))


class MLP(nn.Module):
    """linear, relu, broadcasting arithmetic (a per-feature scale and shift), for the mse loss"""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 16)
        self.b = nn.Linear(16, 4, bias=False)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 16))

    def forward(self, x):
        h = torch.relu(self.a(x)) * self.scale
        h = (h - 0.25) / 1.5
        return self.b(h)


def _model(cls, seed=0):
    torch.manual_seed(seed)
    m = cls().eval()
    for mod in m.modules():  # non-trivial running statistics
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.2, 0.2)
    return m


def _pair(model, x, flags=FAST_CFLAGS, **kw):
    ref = et.compile(model, (x,), **kw)
    return ref, to_c_program(ref, flags)  # its own copy of the state


def _check_run(ref, c, x, y, steps=3):
    g_ref, g_c = ref.gradients(x, y), c.gradients(x, y)
    assert set(g_ref) == set(g_c)
    for k in g_ref:
        close(g_c[k], g_ref[k])
    close(c.predict(x), ref.predict(x))
    for _ in range(steps):
        lr_, lc = ref.step(x, y), c.step(x, y)
        close(lc, lr_)
    assert c.steps == ref.steps == steps
    for k in ref.state:
        close(c.state[k], ref.state[k])
    close(c.predict(x), ref.predict(x))
    assert c.runner.check_guards()


OPT = et.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3)


@pytest.mark.parametrize("scheme", [et.Full(), et.Sparse(bias_last=2, weights={1: 0.5, 2: 0.5, 3: 0.25})],
                         ids=["full", "sparse"])
def test_conv_net_matches_reference(scheme):
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    y = np.array([3, 7])
    ref, c = _pair(_model(Block), x, update=scheme, optimizer=OPT)
    if isinstance(scheme, et.Sparse):
        assert any(st.kind == "split" for st in c.runner.c_layout.states.values())
        assert any(sel is not None and sel.dim == 0 for sel in c.trainable.values())  # a depthwise weight
        assert any(sel is not None and sel.dim == 1 for sel in c.trainable.values())  # a dense weight
    _check_run(ref, c, x, y)


def test_mlp_mse_matches_reference():
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2))
    y = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    ref, c = _pair(_model(MLP), x, loss="mse", optimizer=et.SGD(lr=0.1))
    ops = {n.op for n in c.train_graph.nodes}
    assert {"mse", "mse_grad", "mul", "sub", "div", "linear", "relu"} <= ops
    _check_run(ref, c, x, y)


def test_zoo_model_small_resolution():
    """mbv2-w0.35 at 32x32, last 3 layers trained (BN + ReLU6 backward, fused), momentum."""
    model = et.models.get("mbv2-w0.35", num_classes=10).eval()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    y = np.array([5])
    ref, c = _pair(model, x, update=et.LastK(3), optimizer=et.SGD(lr=0.01, momentum=0.9))
    assert "batch_norm_backward_fused" in {n.op for n in c.train_graph.nodes}  # passes/fuse_batchnorm_backward.py
    assert "et_bn_backward_fused(" in c.runner.c_files["model.c"]
    _check_run(ref, c, x, y, steps=2)


def test_every_zoo_float_op_has_a_kernel():
    """The float ops of the zoo programs (checked on their train graphs' op sets) are registered."""
    zoo_ops = {"conv2d", "batch_norm", "sgd_update", "clamp", "sum", "batch_norm_grad_weight",
               "batch_norm_grad_input", "conv2d_grad_input", "add", "clamp_grad", "conv2d_grad_weight", "relu",
               "relu_grad", "const", "mean", "linear", "reshape", "cross_entropy", "cross_entropy_grad", "matmul",
               "expand", "mul", "linear_grad_weight", "index_select", "index_select_grad", "batch_norm_backward_fused"}
    assert zoo_ops <= set(KERNELS)


def test_unsupported_op_is_a_clear_error(monkeypatch):
    monkeypatch.delitem(KERNELS, "sigmoid")  # every float op has a kernel: take one away

    class Sig(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return torch.sigmoid(self.fc(x))

    prog = et.compile(Sig(), (torch.randn(2, 4),))
    with pytest.raises(CBackendError, match="sigmoid"):
        emit_sources(prog)
