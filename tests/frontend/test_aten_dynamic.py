"""The converters of data-dependent shapes (frontend/aten_dynamic.py) and of writes into a slice
(aten.copy / aten.slice_scatter, frontend/aten_select.py) against torch, through capture and the
reference runtime (gradients through et.compile against torch.autograd): x[mask].view(G, -1, D)[:, i]
for every i and any True counts torch accepts, the errors where torch raises (RunTimeCheckError from
the `check` ops on the output, ops/check.py: the model's own message when its source has one, on the
reference and the C backend, whose training step then keeps its weights), BART's unique_consecutive
check enforced at run time, and the refusals, named with the model line."""
from __future__ import annotations

import re
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import edgetrain as et
from edgetrain.interpreter import run_graph
from edgetrain.frontend import capture
from edgetrain.frontend.capture import UnsupportedOpError
from edgetrain.ops.check import RunTimeCheckError

B, T, D = 2, 6, 3
EOS = 2


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, D, dtype=torch.float64))

    def forward(self, x, ids):
        return self.fn(x * self.w, ids)


def _x(seed=0):
    return torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _ids(*eos_at):
    """(B, T) tokens above EOS, with EOS at the (row, position) pairs given."""
    ids = torch.arange(B * T).reshape(B, T) % 5 + EOS + 1
    for r, p in eos_at:
        ids[r, p] = EOS
    return ids


def reference(model, x, ids):
    cap = capture(model, (x, ids))
    feeds = {**cap.buffers, **cap.params}
    return lambda x2, ids2: run_graph(cap.graph, {**feeds, "input:0": x2.numpy(), "input:1": ids2.numpy()})[0]["output"]


def pick(i):
    return lambda x, ids: x[ids.eq(EOS), :].view(x.size(0), -1, x.size(-1))[:, i, :]


EXAMPLE = _ids((0, 5), (1, 5), (0, 2), (1, 0))  # two per row
OTHERS = {  # other masks through the graph captured on EXAMPLE, torch accepts each
    "two per row": _ids((0, 1), (0, 3), (1, 4), (1, 5)),
    "three per row": _ids((0, 0), (0, 1), (0, 4), (1, 2), (1, 3), (1, 5)),
    "one and three": _ids((0, 3), (1, 0), (1, 1), (1, 5)),  # view's groups mix the rows, as torch's
}


@pytest.mark.parametrize("i", [-1, 0, 1, -2])
def test_masked_rows_picked_per_group_match_torch(i):
    model = Fn(pick(i))
    run = reference(model, _x(), EXAMPLE)
    np.testing.assert_array_equal(run(_x(), EXAMPLE), model(_x(), EXAMPLE).detach().numpy())
    for ids in OTHERS.values():
        np.testing.assert_array_equal(run(_x(1), ids), model(_x(1), ids).detach().numpy())


def _gradients_match_torch(model, x, ids, y):
    prog = et.compile(model, (x, ids), loss="mse", update=et.Full())
    ours = prog.gradients((x.numpy(), ids.numpy()), y.numpy())
    model.zero_grad()
    F.mse_loss(model(x, ids), y).backward()
    np.testing.assert_allclose(ours["w"], model.w.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_masked_rows_gradient_matches_torch():
    model = Fn(pick(-1))
    _gradients_match_torch(model, _x(), EXAMPLE, torch.ones(B, D, dtype=torch.float64))


@pytest.mark.parametrize("ids", [_ids((0, 1), (1, 1), (1, 4)), _ids(), _ids((0, 1), (1, 2))],
                         ids=["odd count: view fails", "no eos: view of nothing", "one per row: no row 1"])
def test_masked_rows_torch_refuses_stop_the_reference(ids):
    model = Fn(pick(1))
    with pytest.raises((RuntimeError, IndexError)):
        model(_x(), ids)
    with pytest.raises(RunTimeCheckError, match=r"view\(2, -1, 3\)\[:, 1\]: .*torch's view or select refuses it"):
        reference(model, _x(), EXAMPLE)(_x(), ids)


def same_eos_count(eos_mask):
    """transformers' torch_compilable_check as it runs under torch.export: torch._check"""
    torch._check(torch.unique_consecutive(eos_mask.sum(1)).numel() == 1,
                 lambda: "All examples must have the same number of <eos> tokens.")


def bart_check(x, ids):
    """BartForSequenceClassification's head: every row as many eos tokens, the last one read."""
    eos_mask = ids.eq(EOS)
    same_eos_count(eos_mask)
    selected = x[eos_mask, :]
    torch._check(selected.shape[0] // x.shape[0] >= 1, lambda: "Each example must contain at least one <eos> token.")
    return selected.view(x.size(0), -1, x.size(-1))[:, -1, :]


def only_check(x, ids):
    """the check alone: x[:, 0] when every row has as many eos tokens"""
    same_eos_count(ids.eq(EOS))
    return x[:, 0]


@pytest.mark.parametrize("fn", [bart_check, only_check], ids=["with the head", "alone"])
def test_unique_consecutive_check_raises_at_run_time_as_torch(fn):
    model = Fn(fn)
    run = reference(model, _x(), EXAMPLE)
    for ids in (OTHERS["two per row"], OTHERS["three per row"]):
        np.testing.assert_array_equal(run(_x(1), ids), model(_x(1), ids).detach().numpy())
    bad = OTHERS["one and three"]  # torch's view accepts it: only the check refuses
    with pytest.raises(RuntimeError, match="same number"):
        model(_x(), bad)
    # the check's message is not in the graph nor on its line (self.fn(...)): torch.export's assert
    with pytest.raises(RunTimeCheckError, match=r"expression Eq\(u0, 1\) .*test_aten_dynamic\.py:\d+: return self\.fn"):
        run(_x(), bad)
    _gradients_match_torch(model, _x(), EXAMPLE, torch.ones(B, D, dtype=torch.float64))


class SameEosCount(nn.Module):
    """a check in the forward itself, its message a lambda (torch.export keeps its condition only)"""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, D))

    def forward(self, x, ids):
        torch._check(torch.unique_consecutive(ids.eq(EOS).sum(1)).numel() == 1,
                     lambda: "All examples must have the same number of <eos> tokens.")
        return x[:, 0] * self.w


#: the message the compiled program gives: the model's, its condition as torch.export asserts it, its line
OWN_MESSAGE = (r"^All examples must have the same number of <eos> tokens\. \(run-time check Eq\(u0, 1\) at "
               r".*test_aten_dynamic\.py:\d+: torch\._check\(torch\.unique_consecutive")


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_a_failed_check_raises_the_models_message_and_keeps_the_weights(backend):
    model = SameEosCount()
    x, y = _x().float(), np.ones((B, D), np.float32)
    prog = et.compile(model, (x, EXAMPLE), loss="mse", update=et.Full(), backend=backend)
    good, bad = OTHERS["three per row"], OTHERS["one and three"]
    with torch.no_grad():
        np.testing.assert_allclose(prog.predict((x.numpy(), good.numpy())), model(x, good).numpy(), rtol=1e-6)
    with pytest.raises(RuntimeError, match="same number"):
        model(x, bad)
    before = {k: np.array(v) for k, v in prog.state.items()}
    for call in (lambda: prog.predict((x.numpy(), bad.numpy())), lambda: prog.step((x.numpy(), bad.numpy()), y),
                 lambda: prog.gradients((x.numpy(), bad.numpy()), y)):
        with pytest.raises(RunTimeCheckError, match=OWN_MESSAGE):
            call()
    assert all(np.array_equal(prog.state[k], v) for k, v in before.items())  # the failed step changed nothing
    assert np.isfinite(prog.step((x.numpy(), good.numpy()), y))
    assert not np.array_equal(prog.state["w"], before["w"])


class OneHot(nn.Module):
    """F.one_hot of class ids given at run time: torch.export keeps its two range checks as
    aten._assert_async of a bool computed from the ids"""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, ids):
        return self.fc(F.one_hot(ids, 4).to(self.fc.weight.dtype))


@pytest.mark.parametrize("backend", ["reference", "c"])
@pytest.mark.parametrize("ids, message", [([0, 3, 1], None), ([0, 4, 1], "smaller than num_classes"),
                                          ([2, -1, 1], "non-negative")])
def test_one_hot_checks_its_classes_at_run_time_as_torch(backend, ids, message):
    model = OneHot().eval()
    example = torch.tensor([1, 2, 3])
    prog = et.compile(model, (example,), update=et.Full(), backend=backend)
    assert sum(n.op == "check" for n in prog.forward_graph.nodes) == 2
    ids = torch.tensor(ids)
    if message is None:
        with torch.no_grad():
            np.testing.assert_allclose(prog.predict(ids.numpy()), model(ids).numpy(), rtol=1e-6)
        return
    with pytest.raises(RuntimeError, match=message):
        model(ids)
    want = rf"^one_hot: Class values must be {message}\. \(at .*test_aten_dynamic"
    with pytest.raises(RunTimeCheckError, match=want):
        prog.predict(ids.numpy())


def shift_tokens_right(x, ids):
    """modeling_bart.shift_tokens_right: writes into slices of a new tensor (aten.copy)"""
    shifted = ids.new_zeros(ids.shape)
    shifted[:, 1:] = ids[:, :-1].clone()
    shifted[:, 0] = 7
    shifted.masked_fill_(shifted == -100, 1)
    return x * shifted[..., None]


def float_slice_write(x, ids):
    y = x.new_zeros(x.shape)
    y[:, 1:4] = x[:, :3] * 2
    return y + x


@pytest.mark.parametrize("fn", [shift_tokens_right, float_slice_write], ids=["shift_tokens_right", "float"])
def test_writes_into_slices_match_torch(fn):
    model = Fn(fn)
    run = reference(model, _x(), EXAMPLE)
    for ids in (EXAMPLE, OTHERS["three per row"]):
        np.testing.assert_array_equal(run(_x(1), ids), model(_x(1), ids).detach().numpy())
    _gradients_match_torch(model, _x(), EXAMPLE, torch.ones(B, T, D, dtype=torch.float64))


def test_bool_sum_counts_as_torch():
    model = Fn(lambda x, ids: x * ids.eq(EOS).sum(1)[:, None, None])
    got = reference(model, _x(), EXAMPLE)(_x(), OTHERS["three per row"])
    np.testing.assert_array_equal(got, model(_x(), OTHERS["three per row"]).detach().numpy())


REFUSED = {
    "a reduction of x[mask]": (lambda x, ids: x[ids.eq(EOS)].sum(0), "aten.sum.dim_IntList of x[mask]"),
    "another view": (lambda x, ids: x[ids.eq(EOS)].view(-1, D, 1)[:, 0, 0], "aten.view of x[mask]"),
    "x[mask] of an inner dim": (lambda x, ids: x[:, ids[0].eq(EOS)].view(B, -1)[:, -1], "leading dims"),
}


@pytest.mark.parametrize("fn,message", REFUSED.values(), ids=list(REFUSED))
def test_data_dependent_shapes_it_cannot_express_are_named(fn, message):
    with pytest.raises(UnsupportedOpError, match=re.escape(message)) as err:
        capture(Fn(fn), (_x(), EXAMPLE))
    assert "test_aten_dynamic.py" in str(err.value)


CHECK_SOURCE = '''import torch
def f(x, n):
    torch._check(n == 1, lambda: "from a lambda")
    torch_compilable_check(
        n == 1,
        "spread over lines",
    )
    torch._check_with(ValueError, n == 1, "with its error type")
    torch._check(n == 1, msg="a keyword")
    torch._check(n == 1, lambda: f"an f-string {n}")
    return x * n
'''


def test_a_checks_message_is_read_from_its_call_in_the_source(tmp_path):
    from edgetrain.frontend.check_source import check_text

    path = tmp_path / "model.py"
    path.write_text(CHECK_SOURCE)
    got = [check_text(str(path), line) for line in range(1, 12)]
    assert got == [None, None, "from a lambda", "spread over lines", "spread over lines", "spread over lines",
                   "spread over lines", "with its error type", "a keyword", None, None]
    assert check_text(str(tmp_path / "missing.py"), 3) is None
