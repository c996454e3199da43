"""torch.compile(backend="edgetrain") builds its backward with edgetrain's one autodiff
(build_backward) from the forward graph AOTAutograd hands over: ops that train under
et.compile train under torch.compile (hardswish, hardsigmoid: no aten *_backward op is
translated), and train-mode batch norm works in an unchanged loop with model.train()."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import edgetrain as et
from edgetrain.ops import verify
from edgetrain.torch_backend import last_programs
from tests.torch_backend.loops import train_loop

#: float64 against eager float64: torch's own hardsigmoid_backward multiplies by a float32
#: 1/6 (0.1666666716337204) even for float64 tensors, where build_backward's hardsigmoid VJP
#: uses the float64 1/6: a relative difference of 3e-8 in every gradient through it
HARDSIGMOID_TOL = 1e-6


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # Dynamo falls back to eager after 8 recompiles of one forward


class MobileBlock(nn.Module):
    """A MobileNetV3-style block: conv + batch norm (eval) + hardswish, a depthwise conv,
    squeeze-excite (mean, linear, relu, linear, hardsigmoid gate), a linear head."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.se_reduce = nn.Linear(8, 4)
        self.se_expand = nn.Linear(4, 8)
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        h = F.hardswish(self.bn(self.stem(x)))
        h = F.hardswish(self.dw(h))
        s = F.hardsigmoid(self.se_expand(F.relu(self.se_reduce(h.mean((2, 3))))))
        h = h * s[:, :, None, None]
        return self.head(h.mean((2, 3)))


def _mobile(dtype):
    torch.manual_seed(0)
    model = MobileBlock().to(dtype).eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.se_expand.bias.uniform_(-1.0, 1.0)  # the gate's input spans hardsigmoid's slope and its flats
    return model


def _rel(a, b) -> float:
    return float((a - b).abs().max() / max(b.abs().max(), 1e-12))


def _batches(shape, steps=3, classes=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g).to(dtype), torch.randint(0, classes, (shape[0],), generator=g))
            for _ in range(steps)]


def test_hardswish_hardsigmoid_block_trains_with_eagers_gradients():
    model = _mobile(torch.float64)
    ref = copy.deepcopy(model)
    batches = _batches((4, 3, 6, 6))
    losses, grads = train_loop(model, torch.compile(model, backend="edgetrain"), batches)
    ref_losses, ref_grads = train_loop(ref, ref, batches)
    worst = 0.0
    for loss, want in zip(losses, ref_losses):
        worst = max(worst, abs(loss - want) / abs(want))
    for ours, theirs in zip(grads, ref_grads):
        assert set(ours) == set(theirs)
        for name in theirs:
            worst = max(worst, _rel(ours[name], theirs[name]))
    assert worst <= HARDSIGMOID_TOL, worst
    assert worst > 0.0  # our backward is not torch's (the float32 1/6 above)
    rec = last_programs()[-1]
    verify(rec.step)
    assert rec.runs == {"forward": 3, "backward": 3}
    ops = {n.op for n in rec.step.nodes}
    assert {"clamp_grad", "conv2d_grad_weight"} <= ops  # hardswish and hardsigmoid are x * clamp(...) / 6
    assert set(rec.trainable) == {n for n, _ in model.named_parameters()}


def test_graph_break_passes_gradients_between_graphs():
    """An activation entering a later graph gets its gradient from build_backward too."""

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(6, 8)
            self.b = nn.Linear(8, 3)

        def forward(self, x):
            h = F.hardswish(self.a(x))
            torch._dynamo.graph_break()
            return self.b(F.hardsigmoid(h) * h)

    torch.manual_seed(1)
    model = Broken().double()
    ref = copy.deepcopy(model)
    batches = _batches((5, 6), classes=3)
    losses, grads = train_loop(model, torch.compile(model, backend="edgetrain"), batches)
    ref_losses, ref_grads = train_loop(ref, ref, batches)
    assert losses == pytest.approx(ref_losses, rel=HARDSIGMOID_TOL)
    for ours, theirs in zip(grads, ref_grads):
        for name in theirs:
            assert _rel(ours[name], theirs[name]) <= HARDSIGMOID_TOL, name
    assert len({id(r) for r in last_programs()[-2:]}) == 2


class TrainBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6, momentum=0.2)
        self.fc = nn.Linear(6, 8)
        self.bn1 = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = F.hardswish(self.bn(self.conv(x))).mean((2, 3))
        return self.head(F.relu(self.bn1(self.fc(h))))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_train_mode_batch_norm_in_an_unchanged_loop(dtype, tol):
    torch.manual_seed(2)
    model = TrainBN().to(dtype).train()
    ref = copy.deepcopy(model)
    batches = _batches((4, 3, 6, 6), classes=4, dtype=dtype)
    losses, grads = train_loop(model, torch.compile(model, backend="edgetrain"), batches)
    ref_losses, ref_grads = train_loop(ref, ref, batches)
    def err(a, b):  # relative to max(|torch|, 1), as tests/ops: the conv's bias has a zero gradient in
        return float((a - b).abs().max() / max(b.abs().max(), 1.0))  # exact arithmetic, rounding noise in both

    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    for ours, theirs in zip(grads, ref_grads):
        for name in theirs:
            worst = max(worst, err(ours[name], theirs[name]))
    ours_sd, ref_sd = model.state_dict(), ref.state_dict()
    for k, want in ref_sd.items():  # parameters after 3 SGD steps, running statistics
        if k.endswith("num_batches_tracked"):
            assert int(ours_sd[k]) == int(want) == 3, k
        else:
            worst = max(worst, err(ours_sd[k], want))
    assert worst <= tol, worst
    assert not torch.equal(ref_sd["bn.running_var"], torch.ones(6, dtype=dtype))
    rec = last_programs()[-1]
    ops = [n.op for n in rec.forward.nodes]
    assert ops.count("batch_norm_train") == 2 and ops.count("batch_norm_update_stats") == 2
    # each update counts its batch (num_batches_tracked + 1 folded in: no int64 add left)
    assert all(len(n.inputs) == 4 for n in rec.forward.nodes if n.op == "batch_norm_update_stats")
    assert not any(v.dtype == "int64" for n in rec.forward.nodes if n.op != "batch_norm_update_stats"
                   for v in n.outputs)
    assert "batch_norm_update_stats" not in {n.op for n in rec.step.nodes}  # the step's forward leaves them out
    # the same model in eval mode runs on the running statistics that training moved
    model.eval()
    ref.eval()
    x = batches[0][0]
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="edgetrain")(x), ref(x), rtol=tol, atol=tol)


def test_int8_refuses_train_mode_batch_norm():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    with pytest.raises(et.CaptureError, match=r"model\.eval\(\)"):
        torch.compile(model, backend="edgetrain", options={"quantize": "int8"})(torch.randn(2, 3, 8, 8))


class Attention(nn.Module):
    """Two-head self-attention through F.scaled_dot_product_attention, mean over tokens, a head."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (m(x).view(b, n, 2, 4).transpose(1, 2) for m in (self.q, self.k, self.v))
        h = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(h.transpose(1, 2).reshape(b, n, 8).mean(1))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_trains_under_torch_compile(causal):
    """sdpa (AOTAutograd's CPU flash-attention op) trains with build_backward's gradient."""
    torch.manual_seed(3)
    model = Attention(causal).double()
    ref = copy.deepcopy(model)
    batches = _batches((2, 5, 8), classes=3)
    losses, grads = train_loop(model, torch.compile(model, backend="edgetrain"), batches)
    ref_losses, ref_grads = train_loop(ref, ref, batches)
    assert losses == pytest.approx(ref_losses, rel=1e-10)
    for ours, theirs in zip(grads, ref_grads):
        for name in theirs:  # relative to max(|torch|, 1): k.bias has a zero gradient (softmax ignores a
            err = float((ours[name] - theirs[name]).abs().max() / max(theirs[name].abs().max(), 1.0))
            assert err <= 1e-10, name  # shift shared by all keys), rounding noise in both
