"""The pipeline (pipeline.py): compile runs exactly the declared steps whose condition holds,
in order, each verified, staged and printable; update="auto" compiles its candidates from
one front and gets the program compile(scheme) gives."""
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

import edgetrain as et
from edgetrain import pipeline
from edgetrain.interpreter import run_graph
from edgetrain.ir import Node, Role, TensorType, new_value
from edgetrain.ops import VerificationError, verify
from edgetrain.passes import apply_updates_early
from edgetrain.passes.fuse import fuse_pointwise_depthwise, fuse_weight_grad_update
from edgetrain.passes.reorder import reorder_for_memory
from edgetrain.passes.stream import stream_frozen_chains
from edgetrain.pipeline import PHASES, STEPS, Options, Step
from tests.sparse.nets import tiny_auto_case

warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)

X = torch.randn(2, 3, 8, 8)
KINDS = {"float": {}, "int8": {"quantize": "int8"}, "batchnorm_train": {"batchnorm": "train"}}


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()


@pytest.fixture(scope="module", params=list(KINDS))
def compiled(request):
    kw = KINDS[request.param]
    return kw, et.compile(_model(), (X,), optimizer=et.SGD(0.01, momentum=0.9), **kw)


def _declared(**kw) -> list[str]:
    o = Options(**kw)
    return [s.name for s in STEPS if s.when(o) and {"front", "train"} & set(s.phases)]  # compile's phases


def test_the_list_is_ordered_by_phase_and_names_each_step_once():
    assert len({s.name for s in STEPS}) == len(STEPS)
    assert all(s.phases and set(s.phases) <= set(PHASES) for s in STEPS)
    front = [i for i, s in enumerate(STEPS) if "front" in s.phases]
    assert front == list(range(len(front)))  # the front comes first
    assert [s.name for s in pipeline.steps("vjp", Options())] == ["backward", "gradient_outputs", "pruned",
                                                                  "fused_bn_backward"]
    names = [s.name for s in STEPS]
    # the stage names tests and users read keep their order
    old = ["captured", "folded", "quantized", "batch_statistics", "with_loss", "backward", "pruned", "updates",
           "batch_stat_updates", "reordered"]
    assert [n for n in names if n in old] == old


def test_compile_stages_exactly_the_declared_steps_in_order(compiled):
    kw, prog = compiled
    assert list(prog.stages) == _declared(**kw)
    o = Options(**kw)
    assert list(prog.stages) == [s.name for p in ("front", "train") for s in pipeline.steps(p, o)]
    assert prog.stages[list(prog.stages)[-1]] is prog.train_graph  # the last step's graph is the one that runs
    assert list(prog.stages)[-1] == ("widened_scratch" if kw.get("quantize") == "int8" else "reordered")


def test_every_stage_verifies_and_prints(compiled):
    _, prog = compiled
    for name, g in prog.stages.items():
        verify(g)
        assert str(g).startswith("graph(") and str(g).rstrip().endswith("}"), name


def test_a_step_whose_condition_fails_does_not_appear(compiled):
    kw, prog = compiled
    int8_only = {"folded", "converted", "quantized", "fused_pointwise_depthwise", "streamed", "widened_scratch"}
    if kw.get("quantize") == "int8":
        assert int8_only <= set(prog.stages) and "batch_statistics" not in prog.stages
    else:
        assert not int8_only & set(prog.stages)
    assert ("batch_statistics" in prog.stages) == ("batch_stat_updates" in prog.stages) == \
           (kw.get("batchnorm") == "train")
    assert "updates_early" in prog.stages and "fused_grad_updates" in prog.stages  # float and int8 alike


def test_each_stage_is_its_pass_applied_to_the_stage_before(compiled):
    """The formerly unstaged passes: each stage is that pass's result (same printed graph)."""
    kw, prog = compiled
    st, names = prog.stages, list(prog.stages)

    def before(name):
        return st[names[names.index(name) - 1]]

    assert str(st["updates_early"]) == str(apply_updates_early(before("updates_early")))
    ram = set(prog.graph_inputs) | {"label", "step"}
    assert str(st["reordered"]) == str(reorder_for_memory(before("reordered"), ram))
    assert str(st["fused_grad_updates"]) == str(fuse_weight_grad_update(before("fused_grad_updates")))
    if kw.get("quantize") == "int8":
        assert str(st["fused_grad_updates"]) != str(before("fused_grad_updates"))  # the fusion applies on this model
        assert str(st["fused_pointwise_depthwise"]) == str(fuse_pointwise_depthwise(before("fused_pointwise_depthwise")))
        assert str(st["streamed"]) == str(stream_frozen_chains(before("streamed"), prog.graph_inputs))


def test_the_runner_verifies_and_stages_every_step():
    b = pipeline.front(_model(), (X,), Options())
    n = b.graph.nodes[0]
    broken = Node(n.op, n.inputs[:1], n.outputs, n.attrs)  # a conv without its weight
    bad = Step("broken", "train", lambda b, o: replace(b, graph=b.graph.replace(nodes=(broken,) + b.graph.nodes[1:])))
    with pytest.raises(VerificationError):
        pipeline.run_steps(b, Options(), [bad])
    seen = []
    ok = Step("noted", "train", lambda b, o: seen.append(o) or b)
    out = pipeline.run_steps(b, Options(), [ok])
    assert list(out.stages) == ["captured", "noted"] and out.stages["noted"] is b.graph and len(seen) == 1
    with pytest.raises(ValueError, match="phases"):
        pipeline.steps("plan", Options())


def test_vjp_phase_is_the_backward_from_cotangents():
    """torch.compile's backward (torch_backend/) runs the "vjp" phase: torch autograd's VJP."""
    model = _model().double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    b = pipeline.front(model, (x,), Options())
    out = b.forward.outputs[0]
    t = new_value(TensorType(out.shape, out.dtype), "tangent:0")
    wrt = {n: None for n in b.params}
    v = pipeline.vjp(b.forward, wrt, {b.forward.output_names[0]: t})
    assert list(v.stages) == ["backward", "gradient_outputs", "pruned", "fused_bn_backward"]
    assert v.graph.output_names == tuple(f"grad:{n}" for n in wrt)
    assert v.graph.roles[v.graph.inputs.index(v.graph.input("tangent:0"))] == Role.TANGENT
    ct = torch.randn(out.shape, dtype=torch.float64)
    got = run_graph(v.graph, {**b.state, "input:0": x.numpy(), "tangent:0": ct.numpy()})[0]
    y = model(x)
    want = torch.autograd.grad(y, list(model.parameters()), ct)
    for (n, _), w in zip(model.named_parameters(), want):
        np.testing.assert_allclose(got[f"grad:{n}"], w.numpy(), rtol=1e-9, atol=1e-12)


def test_front_does_not_read_the_update_scheme():
    model = _model()
    a = pipeline.front(model, (X,), Options(update=et.Full()))
    b = pipeline.front(model, (X,), Options(update=et.BiasOnly(), optimizer=et.SGD(0.5, momentum=0.9)))
    assert list(a.stages) == list(b.stages) == ["captured"]
    assert str(a.forward) == str(b.forward) and [ly.weight for ly in a.layers] == [ly.weight for ly in b.layers]


@pytest.fixture(scope="module")
def tiny():
    return tiny_auto_case()


def test_auto_search_compiles_its_candidates_from_one_front(tiny, monkeypatch):
    model, x, table, base = tiny
    captures = []
    real = pipeline.capture
    monkeypatch.setattr(pipeline, "capture", lambda *a: captures.append(1) or real(*a))
    prog = et.compile(model, (x,), update="auto", budget=et.Budget(sram=base + (1 << 20)), quantize="int8",
                      contributions=table)
    assert prog.search.compiles > 1 and len(captures) == 1
    again = et.compile(model, (x,), update=prog.search.scheme, quantize="int8")
    assert prog.scheme == again.scheme == prog.search.scheme != et.Sparse()
    assert list(prog.stages) == list(again.stages)
    assert {k: str(g) for k, g in prog.stages.items()} == {k: str(g) for k, g in again.stages.items()}
    assert str(prog.train_graph) == str(again.train_graph) and str(prog.grad_graph) == str(again.grad_graph)
    assert prog.memory.peak_bytes == again.memory.peak_bytes and dict(prog.trainable) == dict(again.trainable)
