"""Every op of the OpDef table against torch: forward, shape rule, and VJP through the
real autodiff (build_backward + DCE + verifier + reference runtime)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.autodiff import build_backward
from edgetrain.backends.reference import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import OPS, Emitter, get_op, verify
from edgetrain.passes import eliminate_dead_code
from tests.ops.cases import CASES

FLOATS = {np.float64: torch.float64, np.float32: torch.float32}
TOL = {np.float64: 1e-8, np.float32: 1e-4}
GRAD_TOL = {np.float64: 1e-6, np.float32: 1e-3}
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True)
emitted_by_backward: set[str] = set()


def _inputs(case, data, dtype):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    arrays, attrs = case.make(data.draw, rng)
    arrays = [np.asarray(a).astype(dtype) if np.issubdtype(np.asarray(a).dtype, np.floating) else np.asarray(a, np.int64)
              for a in arrays]
    return arrays, attrs


def _graph(op, arrays, attrs):
    ins = [new_value(TensorType(a.shape, str(a.dtype)), f"a{i}") for i, a in enumerate(arrays)]
    e = Emitter()
    out = e.emit(op, *ins, **attrs)
    return ins, e, out


def _close(ours, ref, tol):
    ref = ref.detach().numpy()
    assert ours.shape == ref.shape and str(ours.dtype) == str(ref.dtype)
    assert np.abs(ours - ref).max(initial=0) <= tol * max(np.abs(ref).max(initial=0), 1.0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("op", sorted(CASES))
@SETTINGS
@given(data=st.data())
def test_forward_and_shape_rule(op, dtype, data):
    case = CASES[op]
    arrays, attrs = _inputs(case, data, dtype)
    ins, e, out = _graph(op, arrays, attrs)
    g = verify(Graph(tuple(ins), tuple(e.nodes), (out,), ("out",)))
    res, _ = run_graph(g, {v.name: a for v, a in zip(ins, arrays)})
    want = case.torch_fn([torch.from_numpy(a) for a in arrays], attrs)
    _close(res["out"], want, TOL[dtype])
    assert get_op(op).infer([v.type for v in ins], attrs) == [TensorType(tuple(want.shape), str(res["out"].dtype))]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("op", sorted(o for o in CASES if o != "const"))
@SETTINGS
@given(data=st.data())
def test_vjp_matches_autograd(op, dtype, data):
    case = CASES[op]
    arrays, attrs = _inputs(case, data, dtype)
    floats = [i for i, a in enumerate(arrays) if np.issubdtype(a.dtype, np.floating)]
    diff = [i for i in (case.diff if case.diff is not None else floats) if i < len(arrays)]
    if not diff:
        return
    ins, e, out = _graph(op, arrays, attrs)
    ct = new_value(out.type, "ct")
    loss = e.emit("sum", e.emit("mul", out, ct), dims=None)
    g = verify(Graph(tuple(ins) + (ct,), tuple(e.nodes), (loss,), ("loss",)))
    bw = verify(eliminate_dead_code(verify(build_backward(g, "loss", {f"a{i}": None for i in diff}))))
    emitted_by_backward.update(n.op for n in bw.nodes[len(g.nodes):])
    cot = np.random.default_rng(7).normal(size=out.shape).astype(out.dtype)
    res, _ = run_graph(bw, {**{v.name: a for v, a in zip(ins, arrays)}, "ct": cot})
    ts = [torch.tensor(a, requires_grad=i in diff) for i, a in enumerate(arrays)]
    (case.torch_fn(ts, attrs) * torch.from_numpy(cot)).sum().backward()
    for i in diff:
        _close(res[f"grad:a{i}"], ts[i].grad, GRAD_TOL[dtype])


def test_sgd_update_matches_torch_optim():
    rng = np.random.default_rng(0)
    w, g, m = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    attrs = dict(lr=0.1, momentum=0.9, weight_decay=0.01, dim=0, index=None)
    new_w, new_m = get_op("sgd_update").ref([w, g, m], attrs)
    d = g + 0.01 * w
    assert np.allclose(new_m, 0.9 * m + d) and np.allclose(new_w, w - 0.1 * (0.9 * m + d))
    part = dict(attrs, momentum=0.0, index=(1, 3))
    (pw,) = get_op("sgd_update").ref([w, g[[1, 3]]], part)
    assert np.allclose(pw[[0, 2]], w[[0, 2]]) and np.allclose(pw[[1, 3]], w[[1, 3]] - 0.1 * (g[[1, 3]] + 0.01 * w[[1, 3]]))


def test_every_op_is_covered():
    """Run last in this module: each op is a forward case or emitted by some VJP above
    (the optimizer update is covered by its own test)."""
    missing = set(OPS) - set(CASES) - emitted_by_backward - {"sgd_update"}
    assert not missing, f"ops without a test: {sorted(missing)}"
