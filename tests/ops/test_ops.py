"""Every forward op of OPS (the cases of tests/ops/cases.py) against torch: forward values,
each node's shape rule against its numpy reference, and the VJP through the real machinery
(build_backward, dead code elimination, the verifier, the reference runtime)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.autodiff import build_backward
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import OPS, Emitter, verify
from edgetrain.passes import eliminate_dead_code
from .test_page_ops import PAGE_OPS_TESTED
from .test_integer_backward_ops import INTEGER_BACKWARD_OPS_TESTED
from .test_quantized_ops import QUANTIZED_OPS_TESTED
from tests.ops.cases import CASES, Arg, make_inputs

#: max |ours - torch| / max(|torch|, 1), for forward values and for gradients
FORWARD_TOL = {"float64": 1e-10, "float32": 1e-5}
GRAD_TOL = {"float64": 1e-6, "float32": 1e-3}
SETTINGS = settings(max_examples=20, deadline=None, derandomize=True, database=None)
DIFFERENTIABLE = sorted(op for op in CASES if OPS[op].vjp is not None)


def draw_case(data, op, dtype):
    args, attrs = data.draw(CASES[op].spec, label="operands and attrs")
    return make_inputs(args, data.draw(st.integers(0, 2**32 - 1), label="seed"), dtype), attrs


def feeds(arrays):
    return {f"a{i}": a for i, a in enumerate(arrays)}


def forward_graph(op, arrays, attrs):
    """Graph inputs a0, a1, ... -> op -> outputs out0, out1, ..."""
    ins = tuple(new_value(TensorType(a.shape, str(a.dtype)), name) for name, a in feeds(arrays).items())
    e = Emitter()
    outs = e.emit_multi(op, *ins, **attrs)
    return verify(Graph(ins, tuple(e.nodes), outs, tuple(f"out{i}" for i in range(len(outs)))))


def wrt_of(op, arrays):
    """The operands torch differentiates: the case's `diff`, or every float operand."""
    floats = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]
    diff = CASES[op].diff
    return floats if diff is None else [i for i in diff if i < len(arrays)]


def backward_graph(op, arrays, attrs):
    """loss = sum(op(a0, ...) * ct) with its reverse sweep toward `wrt_of` and DCE, each stage verified."""
    fwd = forward_graph(op, arrays, attrs)
    (out,) = fwd.outputs
    ct = new_value(out.type, "ct")
    e = Emitter()
    loss = e.emit("sum", e.emit("mul", out, ct), dims=None)
    g = verify(Graph(fwd.inputs + (ct,), fwd.nodes + tuple(e.nodes), (loss,), ("loss",)))
    bw = verify(build_backward(g, "loss", {f"a{i}": None for i in wrt_of(op, arrays)}))
    return verify(eliminate_dead_code(bw))


def to_torch(arrays, wrt=()):
    return [torch.tensor(a, requires_grad=i in wrt) for i, a in enumerate(arrays)]


def rel_err(ours: np.ndarray, ref: torch.Tensor) -> float:
    ref = ref.detach().numpy()
    assert (ours.shape, ours.dtype) == (ref.shape, ref.dtype)
    if ours.dtype == bool:  # a comparison's result: exact, 1 when any element differs
        return float((ours != ref).any())
    return float(np.abs(ours - ref).max(initial=0) / max(np.abs(ref).max(initial=0), 1.0))


def all_cases(test):
    return pytest.mark.parametrize("dtype", ["float64", "float32"])(
        pytest.mark.parametrize("op", sorted(CASES))(SETTINGS(given(data=st.data())(test))))


@all_cases
def test_forward_matches_torch(op, dtype, data):
    arrays, attrs = draw_case(data, op, dtype)
    want = CASES[op].torch_fn(to_torch(arrays), attrs)  # first: sgd_update overwrites its operands
    want = want if isinstance(want, tuple) else (want,)
    g = forward_graph(op, arrays, attrs)
    got, _ = run_graph(g, feeds(arrays))
    assert len(want) == len(g.outputs)
    for name, w in zip(g.output_names, want):
        assert rel_err(got[name], w) <= FORWARD_TOL[dtype], name


@all_cases
def test_shape_rules_match_reference(op, dtype, data):
    """Each node's numpy reference returns exactly the shape and dtype of its shape rule,
    for the op and for every node of its backward graph (run_graph would cast silently)."""
    arrays, attrs = draw_case(data, op, dtype)
    g = backward_graph(op, arrays, attrs) if op in DIFFERENTIABLE else forward_graph(op, arrays, attrs)
    env = {v: feeds(arrays).get(v.name, np.zeros(v.shape, v.dtype)) for v in g.inputs}  # ct: zeros
    for n in g.nodes:
        results = OPS[n.op].ref([env[v] for v in n.inputs], n.attrs)
        got = [TensorType(np.shape(r), str(np.asarray(r).dtype)) for r in results]
        assert got == OPS[n.op].infer([v.type for v in n.inputs], n.attrs), n.op
        env.update(zip(n.outputs, results))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("op", DIFFERENTIABLE)
@SETTINGS
@given(data=st.data())
def test_vjp_matches_autograd(op, dtype, data):
    arrays, attrs = draw_case(data, op, dtype)
    if not wrt_of(op, arrays):  # integer operands only (index arithmetic): no gradient to check
        return
    g = backward_graph(op, arrays, attrs)
    ct_type = g.input("ct").type
    (ct,) = make_inputs([Arg(ct_type.shape)], data.draw(st.integers(0, 2**32 - 1), label="ct seed"), ct_type.dtype)
    got, _ = run_graph(g, {**feeds(arrays), "ct": ct})
    wrt = wrt_of(op, arrays)
    tensors = to_torch(arrays, wrt)
    (CASES[op].torch_fn(tensors, attrs) * torch.from_numpy(ct)).sum().backward()
    for i in wrt:
        assert rel_err(got[f"grad:a{i}"], tensors[i].grad) <= GRAD_TOL[dtype], f"a{i}"


def test_sgd_update_overwrites_weight_and_buffer_in_place():
    w, grad, m = (np.full((3, 2), v) for v in (1.0, 0.5, 0.25))
    g = forward_graph("sgd_update", [w, grad, m], dict(lr=0.1, momentum=0.9, weight_decay=0.0, dim=0, index=None))
    got, _ = run_graph(g, feeds([w, grad, m]))
    assert got["out0"] is w and got["out1"] is m
    np.testing.assert_allclose(m, 0.9 * 0.25 + 0.5)
    np.testing.assert_allclose(w, 1.0 - 0.1 * m)


def test_every_op_is_tested():
    """Each op of OPS is a case of the table or is emitted by some case's backward graph,
    so an op added without a test fails here."""
    emitted = set()

    @SETTINGS
    @given(data=st.data())
    def collect(data):
        for op in DIFFERENTIABLE:
            emitted.update(n.op for n in backward_graph(op, *draw_case(data, op, "float64")).nodes)

    collect()
    assert set(CASES) <= set(OPS)
    assert set(OPS) - set(CASES) - emitted - QUANTIZED_OPS_TESTED - PAGE_OPS_TESTED - INTEGER_BACKWARD_OPS_TESTED == set()
