"""Models with the activations and functions of ops/pointwise.py (ELU, SELU, CELU, LeakyReLU,
PReLU, Softplus, Mish, sin / cos of a rotary embedding, abs, log1p), captured and trained exactly:
float64 gradients equal torch.autograd's on the reference runtime, the C backend's float32
gradients equal the reference's, the same modules under torch.compile(backend="edgetrain") in a
training loop give eager's losses, and a Cortex-M4 (QEMU) prints the host build's losses.
PReLU, Softplus, Mish and CELU export through torch.where (ops/select.py): their cases run once
that op exists."""
from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgetrain as et
from edgetrain.ops import OPS
from edgetrain.torch_backend import last_programs
from tests.torch_backend.loops import train_loop
from tests.backends.c.firmware_agreement import firmware_prints_host_steps
from tests.frontend.model_checks import float64_gradients_equal_autograd

#: max |ours - torch| / max(|torch|, 1e-3) of a float64 gradient
FLOAT64_TOL = 1e-10
#: max |C - reference| / max(|reference|, 1e-3) of a float32 gradient
C_TOL = 1e-5
#: max relative difference of a compiled float64 loop's losses from eager's
LOOP_TOL = 1e-12
#: classes of the models' outputs
CLASSES = 5
#: the rotary embedding's base (Llama's, RoFormer's)
ROPE_BASE = 10000.0


class Act(nn.Module):
    """linear -> activation -> linear -> activation -> linear (a convolution first for PReLU's
    per-channel weight)"""

    def __init__(self, act: nn.Module, act2: nn.Module = None):
        super().__init__()
        self.lin, self.act, self.mid, self.act2 = nn.Linear(6, 8), act, nn.Linear(8, 8), act2 or copy.deepcopy(act)
        self.fc = nn.Linear(8, CLASSES)

    def forward(self, x):
        return self.fc(self.act2(self.mid(self.act(self.lin(x)))))


class ConvPReLU(nn.Module):
    """conv -> PReLU with a weight per channel -> mean -> linear -> PReLU with one weight"""

    def __init__(self):
        super().__init__()
        self.conv, self.act, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.PReLU(4, init=0.2), nn.Linear(4, 8)
        self.act2, self.out = nn.PReLU(init=0.1), nn.Linear(8, CLASSES)

    def forward(self, x):
        return self.out(self.act2(self.fc(self.act(self.conv(x)).mean((2, 3)))))


class Rotary(nn.Module):
    """Rotary position embedding (Llama's rotate_half form): cos and sin of position * inverse
    frequency computed in forward, applied to projected features."""

    def __init__(self, dim: int = 8, length: int = 5):
        super().__init__()
        self.lin, self.fc = nn.Linear(6, dim), nn.Linear(dim * length, CLASSES)
        self.register_buffer("inv_freq", 1.0 / ROPE_BASE ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))

    def forward(self, x):  # x: (B, L, 6)
        h = self.lin(x)
        pos = torch.arange(x.shape[1], dtype=h.dtype)
        freqs = pos[:, None] * self.inv_freq.to(h.dtype)[None, :]
        emb = torch.cat([freqs, freqs], -1)
        half = h.shape[-1] // 2
        rot = torch.cat([-h[..., half:], h[..., :half]], -1)
        return self.fc((h * emb.cos() + rot * emb.sin()).flatten(1))


class Functions(nn.Module):
    """sin, cos, abs and log1p of activations"""

    def __init__(self):
        super().__init__()
        self.lin, self.fc = nn.Linear(6, 8), nn.Linear(8, CLASSES)

    def forward(self, x):
        h = self.lin(x)
        return self.fc(torch.sin(h) + torch.cos(2.0 * h) * torch.log1p(h.abs()))


NEEDS_WHERE = {"celu", "prelu", "softplus", "mish"}
MODELS = {
    "elu": (lambda: Act(nn.ELU(0.7)), (3, 6)),
    "selu": (lambda: Act(nn.SELU()), (3, 6)),
    # (torch's CELU backward rounds 1 / alpha to float32: an alpha whose inverse is exact)
    "celu": (lambda: Act(nn.CELU(0.5)), (3, 6)),
    "leaky_relu": (lambda: Act(nn.LeakyReLU(0.1), nn.LeakyReLU(-0.3)), (3, 6)),
    "prelu": (ConvPReLU, (2, 3, 5, 5)),
    "softplus": (lambda: Act(nn.Softplus(2.0, 1.5), nn.Softplus()), (3, 6)),
    "mish": (lambda: Act(nn.Mish()), (3, 6)),
    "rotary": (Rotary, (2, 5, 6)),
    "functions": (Functions, (3, 6)),
}


def _needs(name: str):
    missing = "where" not in OPS and name in NEEDS_WHERE
    return pytest.mark.skipif(missing, reason="exports through torch.where: not an op yet (ops/select.py)")


def _cases(names):
    return [pytest.param(n, marks=_needs(n)) for n in names]


def _model_and_input(name: str):
    make, shape = MODELS[name]
    torch.manual_seed(0)
    model = make()
    with torch.no_grad():  # weights away from their initial ones (PReLU's slopes too)
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval(), 1.5 * torch.randn(shape)


def _labels(x) -> torch.Tensor:
    return torch.arange(x.shape[0]) % CLASSES


def _rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-3))


@pytest.mark.parametrize("name", _cases(sorted(MODELS)))
def test_float64_gradients_equal_autograd(name):
    model, x = _model_and_input(name)
    float64_gradients_equal_autograd(model, x, _labels(x), tol=FLOAT64_TOL)


def test_each_activation_lowers_to_its_op():
    def ops(name):
        model, x = _model_and_input(name)
        return {n.op for n in et.frontend.capture(model, (x,)).graph.nodes}

    assert "elu" in ops("elu") and "elu" in ops("selu") and "leaky_relu" in ops("leaky_relu")
    assert {"sin", "cos", "abs", "log1p"} <= ops("functions")


@pytest.mark.parametrize("name", _cases(["elu", "leaky_relu", "prelu", "softplus", "functions"]))
def test_c_backend_gradients_equal_the_reference(name):
    model, x = _model_and_input(name)
    xs, ys = x.numpy(), _labels(x).numpy()
    ref = et.compile(model, (x,), update=et.Full()).gradients(xs, ys)
    got = et.compile(model, (x,), update=et.Full(), backend="c").gradients(xs, ys)
    assert set(got) == set(ref)
    for n in ref:
        assert _rel(got[n], ref[n]) <= C_TOL, n


# --- torch.compile: the unchanged training loop gives eager's losses ------------------------------
#: ops the compiled forward of each model computes
COMPILED_OPS = {"elu": {"elu"}, "selu": {"elu"}, "celu": {"elu"}, "leaky_relu": {"leaky_relu"},
                "prelu": {"where"}, "softplus": {"softplus"}, "mish": {"softplus", "tanh"},
                "rotary": {"sin", "cos"}, "functions": {"sin", "cos", "abs", "log1p"}}


def _loop(model, fn, shape):
    batches = [(torch.randn(shape, generator=torch.Generator().manual_seed(k), dtype=torch.float64),
                torch.arange(shape[0]) % CLASSES) for k in range(3)]
    return train_loop(model, fn, batches, lr=0.05)


@pytest.mark.parametrize("name", _cases(sorted(MODELS)))  # (AOTAutograd hands softplus, mish, celu, prelu whole)
def test_torch_compile_training_loop_gives_eager_losses(name):
    model, x = _model_and_input(name)
    model = model.double().train()
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    le, ge = _loop(eager, eager, x.shape)
    lc, gc = _loop(model, torch.compile(model, backend="edgetrain"), x.shape)
    assert max(abs(a - b) / abs(a) for a, b in zip(le, lc)) < LOOP_TOL, (le, lc)
    ran = {n.op for n in last_programs()[-1].forward.nodes}
    assert COMPILED_OPS[name] <= ran, ran  # (edgetrain ran it, not a fallback to eager)
    for a, b in zip(ge, gc):
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=1e-9, atol=1e-12), k


# --- the float kernels on a Cortex-M4 (QEMU): the firmware's losses are the host build's ----------
class _M4Net(nn.Module):
    """elu, leaky_relu, sin, cos, abs and log1p, forward and backward"""

    def __init__(self):
        super().__init__()
        self.conv, self.fc, self.fc2 = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(64, 12), nn.Linear(12, 10)

    def forward(self, x):
        h = F.elu(self.conv(x), 0.8)
        h = F.max_pool2d(h, 2).flatten(1)
        h = F.leaky_relu(self.fc(h), 0.05)
        return self.fc2(torch.sin(h) + torch.cos(h) * torch.log1p(h.abs()))


def test_pointwise_kernels_on_cortex_m_print_the_host_builds_losses(tmp_path):
    from edgetrain.backends.c import cortexm

    if cortexm.missing_tools() or shutil.which("make") is None:
        pytest.skip(f"missing {', '.join(cortexm.missing_tools()) or 'make'}")
    torch.manual_seed(0)
    shape = (1, 1, 8, 8)
    prog = et.compile(_M4Net(), (torch.zeros(shape),), optimizer=et.SGD(lr=0.05))
    want_ops = {"elu", "elu_grad", "leaky_relu", "leaky_relu_grad", "sin", "cos", "abs", "abs_grad", "log1p"}
    assert want_ops <= {n.op for n in prog.train_graph.nodes}
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal(shape).astype(np.float32), np.array([i % 10])) for i in range(3)]
    fw = firmware_prints_host_steps(prog, data, tmp_path)
    np.testing.assert_allclose(fw.run.losses, [prog.step(x, y) for x, y in data], rtol=1e-5)
