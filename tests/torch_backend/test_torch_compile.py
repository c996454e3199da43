"""torch.compile(model, backend="edgetrain"): an unchanged PyTorch training loop runs through
edgetrain's graphs and runtime with eager PyTorch's losses and gradients (float32)."""
import copy
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import edgetrain as et
from tests.torch_backend.loops import train_loop
from edgetrain.ops import verify
from edgetrain.torch_backend import last_programs

RTOL, ATOL = 1e-4, 1e-6  # float32: our numpy kernels sum in another order than torch's


class ResidualNet(nn.Module):
    """conv + batch norm (eval) + relu, a residual block, max pooling, a linear head."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.head = nn.Linear(8 * 4 * 4, classes)

    def forward(self, x):
        h = F.relu(self.bn(self.stem(x)))
        h = F.relu(h + self.bn2(self.conv(h)))
        h = F.max_pool2d(h, 2)
        return self.head(h.flatten(1))


class NormMLP(nn.Module):
    """linear + layer norm + GELU, a tanh gate, a linear head."""

    def __init__(self, classes=5):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.norm = nn.LayerNorm(32)
        self.gate = nn.Linear(32, 32)
        self.fc2 = nn.Linear(32, classes)

    def forward(self, x):
        h = F.gelu(self.norm(self.fc1(x)))
        return self.fc2(h * torch.tanh(self.gate(h)))


def _batches(model, steps, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, 3, 8, 8) if isinstance(model, ResidualNet) else (batch, 12)
    return [(torch.randn(*shape, generator=g), torch.randint(0, 5, (batch,), generator=g)) for _ in range(steps)]


def _pair(cls, seed=0):
    torch.manual_seed(seed)
    model = cls().eval()
    with torch.no_grad():  # batch norm with non-trivial running statistics
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model, copy.deepcopy(model)


@pytest.mark.parametrize("cls", [ResidualNet, NormMLP])
def test_training_loop_matches_eager(cls):
    model, ref = _pair(cls)
    batches = _batches(model, steps=3)
    losses, grads = train_loop(model, torch.compile(model, backend="edgetrain"), batches)
    ref_losses, ref_grads = train_loop(ref, ref, batches)
    assert losses == pytest.approx(ref_losses, rel=RTOL)
    for ours, theirs in zip(grads, ref_grads):
        assert set(ours) == set(theirs)
        for name in theirs:
            torch.testing.assert_close(ours[name], theirs[name], rtol=RTOL, atol=ATOL, msg=name)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=name)

    rec = last_programs()[-1]  # our graphs and memory plan for this model's graph
    verify(rec.step)
    assert rec.runs == {"forward": 3, "backward": 3}
    assert set(rec.trainable) == {n for n, _ in model.named_parameters()}
    assert rec.memory.peak_bytes == rec.memory.arena_bytes + rec.memory.trainable_bytes > 0
    assert "conv2d_grad_weight" in rec.memory.ops or "linear_grad_weight" in rec.memory.ops


def test_new_batch_size_and_inference():
    """A new batch size compiles a new static plan (Dynamo marks the dim dynamic; we
    specialize); no_grad runs the forward graph only."""
    model, ref = _pair(ResidualNet)
    cmodel = torch.compile(model, backend="edgetrain")
    for batch in (2, 3, 1):
        (x, y), = _batches(model, 1, batch=batch, seed=batch)
        model.zero_grad()
        ref.zero_grad()
        F.cross_entropy(cmodel(x), y).backward()
        F.cross_entropy(ref(x), y).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL)
    with torch.no_grad():
        torch.testing.assert_close(cmodel(x), ref(x), rtol=RTOL, atol=ATOL)
    assert last_programs()[-1].step is None


@pytest.mark.parametrize("update", ["bias", et.BiasOnly()])
def test_bias_only_trains_only_biases(update):
    model, ref = _pair(ResidualNet)
    # a conv's bias is its batch norm's scale and shift (trainable/schemes.py)
    biases = {"stem.bias", "bn.weight", "bn.bias", "bn2.weight", "bn2.bias", "head.bias"}
    for n, p in ref.named_parameters():  # eager PyTorch training the biases
        p.requires_grad_(n in biases)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batches = _batches(model, steps=2)
    _, grads = train_loop(model, torch.compile(model, backend="edgetrain", options={"update": update}), batches)
    _, ref_grads = train_loop(ref, ref, batches)
    for ours, theirs in zip(grads, ref_grads):
        assert {n for n, g in ours.items() if g is not None} == biases
        for n in biases:
            torch.testing.assert_close(ours[n], theirs[n], rtol=RTOL, atol=ATOL, msg=n)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == (n not in biases), n
    rec = last_programs()[-1]
    assert "conv2d_grad_weight" not in rec.memory.ops  # pruned: no weight gradient computed


def test_sparse_update_selected_channels():
    """Sparse: the first conv's weight trained on half its input channels; torch gets a
    whole-tensor gradient, zero outside them."""
    model, ref = _pair(ResidualNet)
    scheme = et.Sparse(bias_last=0, weights={1: 0.5})
    (x, y), = _batches(model, 1)
    F.cross_entropy(torch.compile(model, backend="edgetrain", options={"update": scheme})(x), y).backward()
    F.cross_entropy(ref(x), y).backward()
    sel = last_programs()[-1].trainable["conv.weight"]
    assert sel.dim == 1 and len(sel.index) == 4
    mask = torch.zeros(8, dtype=torch.bool)
    mask[list(sel.index)] = True
    torch.testing.assert_close(model.conv.weight.grad[:, mask], ref.conv.weight.grad[:, mask], rtol=RTOL, atol=ATOL)
    assert not model.conv.weight.grad[:, ~mask].any()
    torch.testing.assert_close(model.head.weight.grad, ref.head.weight.grad, rtol=RTOL, atol=ATOL)
    assert model.stem.weight.grad is None and model.bn.weight.grad is None


def test_compiled_training_step_with_the_loss_inside():
    """torch.compile of a function computing the loss: cross entropy becomes our
    cross_entropy / cross_entropy_grad ops (labels checked: in range, or torch's ignore_index -100)."""
    model, ref = _pair(NormMLP)

    def loss_of(m, x, y):
        return F.cross_entropy(m(x), y)

    batches = _batches(model, steps=2)
    step = torch.compile(loss_of, backend="edgetrain")
    for x, y in batches:
        for m, fn in ((model, step), (ref, loss_of)):
            m.zero_grad()
            fn(m, x, y).backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=RTOL, atol=ATOL)
    assert "cross_entropy_grad" in last_programs()[-1].memory.ops
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 5\)"):
        step(model, x, torch.full_like(y, 7))


def test_budget():
    model, _ = _pair(NormMLP)
    (x, y), = _batches(model, 1)
    with pytest.raises(et.BudgetError, match="smallest budget that fits this update scheme is ([0-9,]+) B"):
        torch.compile(model, backend="edgetrain", options={"budget": "1KB"})(x)
    peak = None
    for budget in ("64KB", {"sram": 65536}, et.Budget(sram="64KB", flash="1MB")):
        cmodel = torch.compile(model, backend="edgetrain", options={"budget": budget})
        F.cross_entropy(cmodel(x), y).backward()
        peak = last_programs()[-1].memory.peak_bytes
    assert 1024 < peak <= 65536


class Cumulative(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 5)

    def forward(self, x):
        return torch.cummax(self.fc(x), dim=1).values


def test_unsupported_op_names_op_and_line():
    with pytest.raises(et.UnsupportedOpError, match=r"aten\.cummax.*test_torch_compile\.py:\d+: return torch\.cummax"):
        torch.compile(Cumulative(), backend="edgetrain")(torch.randn(2, 12))


def test_train_mode_dropout_and_options_are_explained():
    model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5))  # left in training mode: int8 folds no dropout
    with pytest.raises(et.UnsupportedOpError, match=r"model\.eval\(\)"):
        torch.compile(model, backend="edgetrain", options={"quantize": "int8"})(torch.randn(2, 3))
    lin = nn.Linear(3, 2)
    with pytest.raises(ValueError, match=r"quantize'\]='int4': use None \(float32\) or 'int8'"):
        torch.compile(lin, backend="edgetrain", options={"quantize": "int4"})(torch.randn(1, 3))
    with pytest.raises(ValueError, match=r"calibration'\] sets int8 scales; it needs"):
        torch.compile(lin, backend="edgetrain", options={"calibration": torch.randn(1, 3)})(torch.randn(1, 3))
    with pytest.raises(ValueError, match="unknown options"):
        torch.compile(lin, backend="edgetrain", options={"lr": 0.1})(torch.randn(1, 3))


def _python(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _output(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out.strip()


CHECK_GRADS = textwrap.dedent("""
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    ref = copy.deepcopy(m)
    x, y = torch.randn(5, 4), torch.tensor([0, 2, 1, 1, 0])
    F.cross_entropy(torch.compile(m, backend="edgetrain")(x), y).backward()
    F.cross_entropy(ref(x), y).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
""")

# Without `import edgetrain`: Dynamo finds the backend through the package's entry point.
ENTRY_POINT = textwrap.dedent("""
    import copy, sys, torch, torch.nn.functional as F
    assert "edgetrain" not in sys.modules
""") + CHECK_GRADS + "print('edgetrain' in sys.modules)\n"

# `import edgetrain` does not import TorchDynamo (seconds) and registers the backend when
# Dynamo loads, even where no entry point is installed (a source checkout).
IMPORT_HOOK = textwrap.dedent("""
    import copy, sys, importlib.metadata as md
    real = md.entry_points
    md.entry_points = lambda **kw: md.EntryPoints([]) if kw.get("group") == "torch_dynamo_backends" else real(**kw)
    import edgetrain
    print("torch._dynamo" in sys.modules)
    import torch, torch.nn.functional as F
""") + CHECK_GRADS


def test_backend_registration():
    installed = "edgetrain" in entry_points(group="torch_dynamo_backends").names
    procs = [_python(IMPORT_HOOK)] + ([_python(ENTRY_POINT)] if installed else [])  # in parallel
    assert _output(procs[0]) == "False"
    if not installed:
        pytest.skip("edgetrain is not pip-installed here: no torch_dynamo_backends entry point to test")
    assert _output(procs[1]) == "True"  # Dynamo imported edgetrain through the entry point
