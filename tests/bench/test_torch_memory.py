"""The PyTorch memory meter of bench/memory_vs_pytorch.py, on cases small enough to count
by hand: every expected peak below is the sum of the tensors that must be alive at the
worst moment, listed term by term (float32 = 4 bytes, int64 labels = 8 bytes)."""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from torch_memory import StorageMeter, measure_torch_step, storage_bytes  # noqa: E402

F32, I64 = 4, 8
#: the loss and nll_loss's total_weight (saved for its backward): two float32 scalars,
#: both alive from the forward to the end of the backward
SCALARS = 2 * F32


def test_meter_counts_live_storage_only():
    """Plain tensor code: allocations count while alive; views and in-place results add
    nothing; a tensor freed early is not at the peak; a storage kept by a view stays."""
    with StorageMeter(trace=True) as m:
        a = torch.ones(1000)            # 4000 live
        b = a * 2                       # 8000: the peak (a and b)
        v = b[10:]                      # view of b: +0
        b.add_(1)                       # in place: +0
        del a                           # 4000
        c = torch.ones(500)             # 6000
        del b                           # v keeps b's storage alive: still 6000
        d = torch.zeros(250)            # 7000 < 8000
        assert m.live == 7000
        del v, c, d                     # 0
    assert m.peak == 8000
    assert m.peak_op == "aten.mul.Tensor"
    assert m.live == 0
    assert [n for op, n, _ in m.events if op != "(freed)"] == [4000, 4000, 0, 0, 2000, 1000]


def test_meter_reused_addresses_and_freed_early():
    """Freed tensors leave the count at once, even when the allocator hands the same
    address to the next tensor: ten sequential temporaries peak at one (plus the kept sum)."""
    with StorageMeter() as m:
        total = torch.zeros(256)        # 1024, kept
        for _ in range(10):
            t = torch.ones(256) * 3     # ones (1024) and its product (1024) briefly together
            total += t
            del t
    assert m.peak == 1024 + 2 * 1024
    assert m.live == 1024
    del total


def test_meter_excludes_and_holds():
    """Excluded storages (weights) and their views and in-place updates are not counted;
    held tensors (input, labels) count from the start; new results of weights count."""
    w, x = torch.ones(100), torch.ones(50)
    with StorageMeter(exclude=[w], hold=[x, x[:10]]) as m:
        assert m.live == m.peak == 200  # x once, though held twice (a view of itself)
        w.view(10, 10).t()
        w.mul_(1.0)
        p = w * 1.0                     # +400
    assert m.peak == 600
    assert m.held == 200 and m.live == 600
    del p


def linear_peak(n, fin, fout, weight=True, bias=True):
    """Peak of one step of Linear(fin, fout) on a batch of n, by hand. Held throughout: the
    input (n*fin floats) and labels (n int64), and the two scalars. The candidate moments:
    - log-softmax backward: log-probabilities (saved), dlogp and dlogits (n*fout each);
    - weight gradients: dlogits, then dW (fout*fin) and db (fout) as they are made.
    (The forward holds logits and log-probabilities only: below the first.)"""
    held = n * fin * F32 + n * I64 + SCALARS
    act = n * fout * F32
    grads = act + (fout * fin * F32 if weight else 0) + (fout * F32 if bias else 0)
    return held + max(3 * act, grads)


@pytest.mark.parametrize("n,fin,fout", [(2, 8, 4), (16, 2, 8), (3, 33, 5)])
@pytest.mark.parametrize("train", ["all", "weight", "bias"])
def test_linear_step_by_hand(n, fin, fout, train):
    torch.manual_seed(0)
    model = nn.Linear(fin, fout)
    x, y = torch.randn(n, fin), torch.randint(0, fout, (n,))
    trained = None if train == "all" else {train}
    with torch.no_grad():
        expect_loss = float(F.cross_entropy(model(x), y))
    r = measure_torch_step(model, x, y, trained)
    assert r["activation_bytes"] == linear_peak(n, fin, fout, weight=train != "bias", bias=train != "weight")
    w_bytes, b_bytes = fout * fin * F32, fout * F32
    assert r["weights_bytes"] == w_bytes + b_bytes
    assert r["trained_weights_bytes"] == {"all": w_bytes + b_bytes, "weight": w_bytes, "bias": b_bytes}[train]
    assert r["peak_bytes"] == r["activation_bytes"] + r["trained_weights_bytes"]
    assert r["held_bytes"] == n * fin * F32 + n * I64
    assert r["leftover_bytes"] == 0  # everything made during the step was freed by its end
    assert r["first_loss"] == pytest.approx(expect_loss, rel=1e-6)
    assert r["step_ms"] > 0
    assert model.weight.requires_grad and model.bias.requires_grad  # flags restored


class FrozenTrunk(nn.Module):
    """A frozen wide layer whose output h is reduced at once (so not saved for backward),
    then a trained head."""

    def __init__(self, fin=8, hidden=1024, fout=1024):
        super().__init__()
        self.trunk, self.head = nn.Linear(fin, hidden), nn.Linear(8, fout)

    def forward(self, x):
        s = self.trunk(x).view(x.shape[0], -1, 8).mean(1)  # h = trunk(x) dies here
        return self.head(s)


def test_tensor_freed_early_is_not_at_the_peak():
    n, fin, hidden, fout = 2, 8, 1024, 1024
    torch.manual_seed(0)
    model = FrozenTrunk(fin, hidden, fout)
    x, y = torch.randn(n, fin), torch.randint(0, fout, (n,))
    r = measure_torch_step(model, x, y, {"head.weight", "head.bias"}, trace=True)
    held = n * fin * F32 + n * I64 + SCALARS
    h, s, logits = n * hidden * F32, n * 8 * F32, n * fout * F32
    dw, db = fout * 8 * F32, fout * F32
    # the forward peaks at the reduction (h and s) or the loss (s, logits, log-probs);
    # the backward at the head's gradients: s (saved for dW), dlogits, dW, db; h is gone
    forward = held - SCALARS + max(h + s, s + 2 * logits + SCALARS)
    backward = held + max(s + 3 * logits, s + logits + dw + db)
    assert backward > forward
    assert r["activation_bytes"] == backward
    assert r["peak_op"] == "aten.sum.dim_IntList"  # db, the last gradient made
    assert ("aten.addmm.default", h, held - SCALARS + h) in r["events"]  # h was counted while it lived
    assert all(op != "aten.addmm.default" for op, _ in r["peak_live"])  # but not at the peak
    assert r["trained_weights_bytes"] == dw + db
    assert r["weights_bytes"] == storage_bytes(list(model.parameters()))


def test_frozen_model_runs_forward_only():
    """Nothing trained: no backward, no optimizer; the peak is the forward's: logits and
    log-probabilities, then the two scalars (the logits are still referenced)."""
    n, fin, fout = 2, 8, 4
    model = nn.Linear(fin, fout)
    x, y = torch.randn(n, fin), torch.randint(0, fout, (n,))
    before = model.weight.detach().clone()
    r = measure_torch_step(model, x, y, set())
    assert r["activation_bytes"] == n * fin * F32 + n * I64 + 2 * n * fout * F32 + SCALARS
    assert r["trained_weights_bytes"] == 0
    assert torch.equal(model.weight, before)


def test_unknown_parameter_is_an_error():
    with pytest.raises(KeyError, match="nope"):
        measure_torch_step(nn.Linear(2, 2), torch.randn(1, 2), torch.tensor([0]), {"nope"})
