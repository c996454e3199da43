"""The losses model families train with (passes/loss.py, ops/loss.py): per-pixel and
sequence cross entropy with ignore_index, binary cross entropy with logits, l1 and mse,
against torch on the reference (float64) and C (float32) backends, int8 reference against C
bit for bit, small models of each family training, and the label checks at the boundary."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import edgetrain as et
from edgetrain.runtime.runner import NonFiniteLossError

IGNORE = -100
#: relative error of a float64 reference program's loss and gradients against torch
REF_TOL = 1e-12
#: relative error of a float32 C program's loss and gradients against torch in float64
C_TOL = 1e-5


class SegNet(nn.Module):
    """Per-pixel classes: (N, 3, H, W) -> (N, 4, H, W) logits."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 4, 1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x)))


class TinyLM(nn.Module):
    """A language model: token ids (N, T) -> (N, T, V) logits."""

    def __init__(self, vocab=11, dim=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(torch.tanh(self.mix(self.emb(ids))))


class ChannelsNL(nn.Module):
    """(N, L, 5) features -> (N, 3, L) logits: the classes in dim 1 of a 3-d output."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        return self.fc(x).transpose(1, 2)


def rel_err(got, want) -> float:
    return float(np.abs(np.asarray(got) - want).max() / max(np.abs(want).max(), 1e-12))


def autoencoder():
    return nn.Sequential(nn.Linear(6, 3), nn.Tanh(), nn.Linear(3, 6))


def _seg(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 5, generator=g, dtype=dtype)
    y = torch.randint(0, 4, (2, 5, 5), generator=g)
    y[0, 1, :3] = IGNORE
    return SegNet().to(dtype), x, y, "cross_entropy", lambda o, t: F.cross_entropy(o, t)


def _nl(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 4, 5, generator=g, dtype=dtype)
    y = torch.randint(0, 3, (3, 4), generator=g)
    y[1, 2] = IGNORE
    return ChannelsNL().to(dtype), x, y, "cross_entropy", lambda o, t: F.cross_entropy(o, t)


def _lm(dtype):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 11, (2, 6), generator=g)
    y = torch.randint(0, 11, (2, 6), generator=g)
    y[:, -2:] = IGNORE  # padding
    return TinyLM().to(dtype), ids, y, "sequence_cross_entropy", \
        lambda o, t: F.cross_entropy(o.reshape(-1, o.shape[-1]), t.reshape(-1))


def _bce(dtype):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 6, generator=g, dtype=dtype) * 3
    t = (torch.rand(4, 6, generator=g) > 0.5).to(dtype)
    return autoencoder().to(dtype), x, t, "bce_with_logits", F.binary_cross_entropy_with_logits


def _ae(loss, fn):
    def make(dtype):
        g = torch.Generator().manual_seed(5)
        x = torch.randn(4, 6, generator=g, dtype=dtype)
        return autoencoder().to(dtype), x, x.clone(), loss, fn
    return make


FAMILIES = {"per_pixel_ce": _seg, "ce_n_c_l": _nl, "sequence_ce": _lm, "bce_with_logits": _bce,
            "l1": _ae("l1", F.l1_loss), "mse": _ae("mse", F.mse_loss)}


def _torch_loss_and_grads(model, x, y, fn):
    model.zero_grad()
    loss = fn(model(x), y)
    loss.backward()
    return loss.item(), {k: p.grad.detach().numpy().copy() for k, p in model.named_parameters()}


def _check_against_torch(family, dtype, backend, tol):
    torch.manual_seed(0)
    model, x, y, loss, fn = FAMILIES[family](dtype)
    prog = et.compile(model, (x,), loss=loss, backend=backend, optimizer=et.SGD(lr=0.0))
    want_loss, want = _torch_loss_and_grads(model, x, y, fn)
    got = prog.gradients(x, y)
    assert set(got) == set(want)
    for k in want:
        assert rel_err(got[k], want[k]) <= tol, f"{k}: {rel_err(got[k], want[k]):.2e}"
    got_loss = prog.step(x, y)  # lr 0: the loss of these weights
    assert abs(got_loss - want_loss) <= tol * max(1.0, abs(want_loss)), (got_loss, want_loss)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_loss_and_gradients_match_torch_on_the_reference_in_float64(family):
    _check_against_torch(family, torch.float64, "reference", REF_TOL)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_loss_and_gradients_match_torch_in_c_float32(family):
    _check_against_torch(family, torch.float32, "c", C_TOL)


def test_cross_entropy_on_n_c_logits_is_unchanged():
    """The string "cross_entropy" on (N, C) logits and (N,) labels, as always."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7)).double()
    x, y = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 6, 3, 3])
    prog = et.compile(model, (x,))
    want_loss, want = _torch_loss_and_grads(model, x, y, F.cross_entropy)
    got = prog.gradients(x, y)
    assert all(rel_err(got[k], want[k]) <= REF_TOL for k in want)


# --- int8: each loss on the dequantized output, the reference and C bit for bit --------------------
class Int8Seg(nn.Module):
    def __init__(self, out=4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, out, 1)

    def forward(self, x):
        return self.conv2(torch.relu(self.bn(self.conv1(x))))


def _int8_batches(loss, rng, n=3):
    out = []
    for _ in range(n):
        x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
        if loss == "cross_entropy":
            y = rng.integers(0, 4, (2, 6, 6))
            y[0, 0, :2] = IGNORE
        elif loss == "bce_with_logits":
            y = (rng.random((2, 4, 6, 6)) > 0.5).astype(np.float32)
        else:
            y = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
        out.append((x, y))
    return out


@pytest.mark.parametrize("loss", ["cross_entropy", "bce_with_logits", pytest.param("l1", marks=pytest.mark.slow),
                                  pytest.param("mse", marks=pytest.mark.slow)])
def test_int8_reference_and_c_train_bit_exact(loss):
    from tests.backends.c.test_int8 import train_both

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    batches = _int8_batches(loss, rng)
    calib = [b[0] for b in batches]
    prog = et.compile(Int8Seg().eval(), (torch.zeros(2, 3, 6, 6),), loss=loss, quantize="int8",
                      calibration=calib, optimizer=et.SGD(lr=0.05))
    # the loss and its gradient act on the float output of the int8 layers (QAS scales only the
    # weight and bias gradients that flow back from it)
    (node,) = [n for n in prog.train_graph.nodes if n.op == loss]
    (grad,) = [n for n in prog.train_graph.nodes if n.op == f"{loss}_grad"]
    assert node.inputs[0].dtype == grad.out.dtype == "float32"
    before = {k: v.copy() for k, v in prog.state.items()}
    train_both(prog, batches)
    assert any(not np.array_equal(before[k], prog.state[k]) for k in prog.trainable)


# --- model families training -----------------------------------------------------------------
def _trains(prog, x, y, steps=25):
    first = prog.step(x, y)
    for _ in range(steps):
        last = prog.step(x, y)
    assert last < 0.8 * first, (first, last)


def test_segmentation_model_trains_with_per_pixel_cross_entropy():
    torch.manual_seed(0)
    model, x, y, loss, _ = _seg(torch.float32)
    _trains(et.compile(model, (x,), loss=loss, optimizer=et.SGD(lr=0.5)), x, y)


def test_tiny_language_model_trains_with_sequence_cross_entropy():
    torch.manual_seed(0)
    model, ids, y, loss, _ = _lm(torch.float32)
    prog = et.compile(model, (ids,), loss=loss, optimizer=et.SGD(lr=1.0))
    _trains(prog, ids, y)
    assert prog.predict(ids).shape == (2, 6, 11)


@pytest.mark.parametrize("loss", ["l1", "mse"])
def test_autoencoder_trains(loss):
    torch.manual_seed(0)
    model, x, y, _, _ = _ae(loss, None)(torch.float32)
    _trains(et.compile(model, (x,), loss=loss, optimizer=et.SGD(lr=0.5, momentum=0.9)), x, y, steps=40)


def test_multi_label_model_trains_with_bce_with_logits():
    torch.manual_seed(0)
    model, x, t, loss, _ = _bce(torch.float32)
    _trains(et.compile(model, (x,), loss=loss, optimizer=et.SGD(lr=0.5)), x, t)


# --- the boundary ------------------------------------------------------------------------------
def _seg_prog():
    torch.manual_seed(0)
    model, x, y, loss, _ = _seg(torch.float32)
    return et.compile(model, (x,), loss=loss), x, y


@pytest.mark.parametrize("bad, message", [
    (lambda y: y + 4, r"labels must lie in \[0, 4\) or equal the ignore_index -100"),
    (lambda y: y - 2, r"labels must lie in \[0, 4\)"),
    (lambda y: y[:, :, :4], r"labels: expected shape \(2, 5, 5\)"),
    (lambda y: y.float() + 0.5, r"labels: expected integers"),
])
def test_labels_are_checked_at_the_boundary(bad, message):
    prog, x, y = _seg_prog()
    with pytest.raises(ValueError, match=message):
        prog.step(x, bad(y))


def test_a_batch_with_every_label_ignored_stops_with_a_nan_loss():
    """torch's answer is nan (a mean over no position): the step refuses it, weights kept."""
    prog, x, y = _seg_prog()
    before = {k: v.copy() for k, v in prog.state.items()}
    assert np.isnan(F.cross_entropy(torch.zeros(1, 4, 2), torch.full((1, 2), IGNORE)).item())
    with pytest.raises(NonFiniteLossError, match="loss is nan"):
        prog.step(x, torch.full_like(y, IGNORE))
    assert all(np.array_equal(before[k], prog.state[k]) for k in before)


def test_targets_of_another_shape_are_refused():
    model, x, t, loss, _ = _bce(torch.float32)
    prog = et.compile(model, (x,), loss=loss)
    with pytest.raises(ValueError, match=r"targets: expected shape \(4, 6\)"):
        prog.step(x, t[:, :5])


def test_unknown_loss_and_wrong_output_rank_are_refused():
    model, x, _, _, _ = _bce(torch.float32)
    with pytest.raises(ValueError, match="loss must be one of"):
        et.compile(model, (x,), loss="hinge")
    with pytest.raises(ValueError, match="sequence_cross_entropy needs model outputs"):
        et.compile(nn.Sequential(nn.Linear(6, 1), nn.Flatten(0)), (x,), loss="sequence_cross_entropy")


# --- the torch.compile path: the user's loop calls the torch loss ---------------------------------
@pytest.mark.parametrize("fn, target", [
    (F.cross_entropy, lambda g: torch.randint(0, 4, (2, 5, 5), generator=g).index_fill_(2, torch.tensor([0]), IGNORE)),
    (F.binary_cross_entropy_with_logits, lambda g: torch.rand(2, 4, 5, 5, generator=g, dtype=torch.float64)),
    (F.l1_loss, lambda g: torch.randn(2, 4, 5, 5, generator=g, dtype=torch.float64)),
], ids=["per_pixel_ce", "bce_with_logits", "l1"])
def test_torch_compile_of_a_step_with_the_loss_matches_eager(fn, target):
    import copy

    torch.manual_seed(0)
    model = SegNet().double()
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(2, 3, 5, 5, generator=g, dtype=torch.float64), target(g)
    results = []
    for m, compiled in ((copy.deepcopy(model), False), (model, True)):
        torch._dynamo.reset()
        step = (lambda m_: lambda a, b: fn(m_(a), b))(m)
        results.append(_torch_loss_and_grads(m, x, y, lambda o, t: fn(o, t)) if not compiled else
                       _compiled_loss_and_grads(m, torch.compile(step, backend="edgetrain"), x, y))
    (le, ge), (lc, gc) = results
    assert abs(le - lc) <= REF_TOL * max(1.0, abs(le))
    assert all(rel_err(gc[k], ge[k]) <= REF_TOL for k in ge)


def _compiled_loss_and_grads(model, step, x, y):
    model.zero_grad()
    loss = step(x, y)
    loss.backward()
    return loss.item(), {k: p.grad.detach().numpy().copy() for k, p in model.named_parameters()}


# --- Cortex-M: a firmware trained with per-pixel cross entropy prints the host build's losses ----------
@pytest.mark.slow
def test_per_pixel_cross_entropy_on_cortex_m_prints_the_host_builds_losses(tmp_path):
    import shutil
    import subprocess

    from edgetrain.backends.c import cortexm
    from edgetrain.backends.c.export import emit_c

    if cortexm.missing_tools() or shutil.which("make") is None:
        pytest.skip(f"missing {', '.join(cortexm.missing_tools()) or 'make'}")
    torch.manual_seed(0)
    prog = et.compile(SegNet(), (torch.zeros(1, 3, 5, 5),), loss="cross_entropy", optimizer=et.SGD(lr=0.1))
    rng = np.random.default_rng(0)
    data = []
    for _ in range(3):
        y = rng.integers(0, 4, (1, 5, 5))
        y[0, 0, :2] = IGNORE
        data.append((rng.standard_normal((1, 3, 5, 5)).astype(np.float32), y))
    emit_c(prog, tmp_path / "host", "host", data)
    r = subprocess.run(["make", "-s", "main"], cwd=tmp_path / "host", capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(["./main"], cwd=tmp_path / "host", capture_output=True, text=True, timeout=300)
    host = [line for line in r.stdout.splitlines() if line.startswith("step ")]
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", data)
    assert len(host) == len(data) and list(fw.run.step_lines) == host
    np.testing.assert_allclose(fw.run.losses, [prog.step(x, y) for x, y in data], rtol=1e-5)


def test_the_clis_loss_choices_are_the_compilers_losses():
    from edgetrain.app.cli_program import LOSS_CHOICES
    from edgetrain.passes.loss import LOSSES

    assert sorted(LOSS_CHOICES) == sorted(LOSSES)


SEG_MODEL_FILE = '''
import torch
from torch import nn


class Seg(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 4, 1)

    def forward(self, x):
        return self.conv2(torch.relu(self.conv1(x)))


def build():
    return Seg()
'''


def test_the_cli_compiles_a_per_pixel_model_with_bce_with_logits(tmp_path):
    """`edgetrain compile --loss bce_with_logits`: float targets of the output's shape in the
    samples, the loss in the checkpoint's config."""
    from edgetrain.app.checkpoint import load_checkpoint
    from edgetrain.app.cli import main

    (tmp_path / "seg.py").write_text(SEG_MODEL_FILE)
    out = tmp_path / "out"
    assert main(["compile", f"{tmp_path / 'seg.py'}:build", "--input", "1x3x6x6", "--target", "host",
                 "--loss", "bce_with_logits", "-o", str(out)]) == 0
    assert load_checkpoint(out / "program.ckpt").config.loss == "bce_with_logits"
    assert "bce_with_logits_grad" in (out / "model.c").read_text()


def test_losses_stay_exact_for_large_logits():
    """The stable forms: bce's max(x, 0) - x t + log(1 + exp(-|x|)) and cross entropy's max
    subtracted before exp, at logits where a naive form overflows, against torch in float64."""
    from edgetrain.ops import get_op

    x = np.linspace(-300.0, 300.0, 61).reshape(1, 61)
    t = (np.arange(61) % 2).astype(np.float64).reshape(1, 61)
    got = get_op("bce_with_logits").ref([x, t], {})[0]
    want = F.binary_cross_entropy_with_logits(torch.from_numpy(x), torch.from_numpy(t)).item()
    assert abs(float(got) - want) <= REF_TOL * abs(want)
    g = get_op("bce_with_logits_grad").ref([np.float64(1.0), x, t], {})[0]
    xt = torch.from_numpy(x).requires_grad_()
    F.binary_cross_entropy_with_logits(xt, torch.from_numpy(t)).backward()
    assert rel_err(g, xt.grad.numpy()) <= REF_TOL
    logits = np.array([[1000.0, -1000.0, 999.0], [-500.0, 0.0, 500.0]])
    labels = np.array([2, 0])
    got = get_op("cross_entropy").ref([logits, labels], {"class_dim": 1, "ignore_index": IGNORE})[0]
    want = F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels)).item()
    assert abs(float(got) - want) <= REF_TOL * abs(want)
