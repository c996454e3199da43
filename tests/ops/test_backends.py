"""Every float op of the op table through the C backend against torch: forward values and VJPs
(the backward graphs built as in test_ops.py), float32, within test_ops.py's float32
tolerances. One C library per op: hypothesis draws CASES_PER_OP cases of the op, which go side
by side into one graph (each case's forward outputs and gradients), compiled once
(backends/c/graph_lib.py). Also: the float64 instances of kernels/float32_nn.py node by node
against the numpy reference, and inputs where a naive kernel loses precision (softmax of large
logits, layer norm of rows with a large mean, activations far into their tails).

Not driven here (see `skipped`): the int8 ops (q*, quantize, dequantize), whose C kernels are
checked bit for bit against the reference by tests/backends/c/test_int8.py, and page_in /
page_out, which move tensors to a program's page store (tests/ops/test_page_ops.py, the paging
tests of the C backend)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.backends.c.graph_lib import build_graph_library
from edgetrain.backends.c.kernels import KERNELS, float32_nn
from edgetrain.ir import Graph, Node, new_value
from edgetrain.ops import OPS
from tests.backends.c.firmware_agreement import firmware_prints_host_steps
from tests.ops.cases import CASES, Arg, dim_of, make_inputs, pairs, real
from tests.ops.test_integer_backward_ops import INTEGER_BACKWARD_OPS_TESTED
from tests.ops.test_ops import (DIFFERENTIABLE, FORWARD_TOL, GRAD_TOL, backward_graph, draw_case, forward_graph,
                                rel_err, to_torch, wrt_of)

DTYPE = "float32"
#: cases of one op compiled into one library (more cases per build: fewer builds)
CASES_PER_OP = 24
SETTINGS = settings(deadline=None, derandomize=True, database=None)
#: ops with C kernels not driven by this file, and why
NOT_FLOAT = {"quantize": "int8 operands: test_int8.py (bit-exact against the reference)",
             "dequantize": "int8 operands: test_int8.py (bit-exact against the reference)",
             "page_in": "reads a program's page store: test_page_ops.py and the C paging tests",
             "page_out": "writes a program's page store: test_page_ops.py and the C paging tests"}


def skipped(op: str) -> str:
    """Why `op` is not driven here ('' when it is)."""
    if op in NOT_FLOAT:
        return NOT_FLOAT[op]
    if op.startswith("q"):
        return "quantized (int8) op: test_int8.py (bit-exact against the reference)"
    if op in INTEGER_BACKWARD_OPS_TESTED:
        return "integer-only backward op: tests/quantize/test_integer_backward.py (C bit-exact against the reference)"
    return ""


def known_gap(op: str, arrays: list, attrs: dict) -> tuple[str, str]:
    """(part, reason): a case the other kernels of the C backend (kernels/float32.py,
    kernels/int8.py) do not handle yet; part "all" leaves the case out, "grad" keeps its
    forward values only, "" none."""
    if op == "cast" and attrs["dtype"] != DTYPE:
        return "grad", "the VJP multiplies in float64: kernels/float32.py's mul and float32_reduce.py's sum are float32 only"
    if op == "cross_entropy" and arrays[1].dtype != np.int64:
        return "all", "kernels/float32.py's cross_entropy takes int64 labels only"
    return "", ""


def _rebind(g: Graph, inputs: dict) -> tuple:
    """g's nodes with its inputs replaced by inputs[name]."""
    sub = {v: inputs[v.name] for v in g.inputs}
    return tuple(Node(n.op, tuple(sub.get(v, v) for v in n.inputs), n.outputs, n.attrs) for n in g.nodes)


class Side:
    """Cases of one op side by side in one graph: inputs c{k}:a{i} (and c{k}:ct), outputs
    c{k}:out{j} (forward) and c{k}:grad:a{i}."""

    def __init__(self):
        self.inputs, self.nodes, self.outputs, self.names, self.feeds = [], [], [], [], []

    def add(self, k: int, op: str, arrays: list, attrs: dict, ct: np.ndarray = None):
        fwd = forward_graph(op, arrays, attrs)
        bwd = backward_graph(op, arrays, attrs) if ct is not None else None
        mine = {}
        for v in fwd.inputs + ((bwd.input("ct"),) if bwd is not None else ()):
            mine[v.name] = new_value(v.type, f"c{k}:{v.name}")
            self.inputs.append(mine[v.name])
        self.feeds += list(arrays) + ([ct] if ct is not None else [])
        self.nodes += _rebind(fwd, mine)
        self.outputs += fwd.outputs
        self.names += [f"c{k}:{n}" for n in fwd.output_names]
        if bwd is not None:
            self.nodes += _rebind(bwd, mine)
            grads = [(n, v) for n, v in zip(bwd.output_names, bwd.outputs) if n.startswith("grad:")]
            self.outputs += [v for _, v in grads]
            self.names += [f"c{k}:{n}" for n, _ in grads]

    def run(self) -> dict:
        g = Graph(tuple(self.inputs), tuple(self.nodes), tuple(self.outputs), tuple(self.names))
        return dict(zip(self.names, build_graph_library(g)(self.feeds)))


@st.composite
def _larger_pool2d(draw, avg: bool):
    """Pooling beyond cases.py's small windows: kernels to 5, strides to 3, batch and channels to 3."""
    k = draw(pairs(1, 5))
    stride = draw(pairs(1, 3))
    pad = tuple(draw(st.integers(0, ki // 2)) for ki in k)
    dil = (1, 1) if avg else draw(pairs(1, 2))
    lo = [max(1, dil[i] * (k[i] - 1) + 1 - (2 * pad[i] if avg else 0)) for i in range(2)]
    hw = [draw(st.integers(lo[i], lo[i] + 7)) for i in range(2)]
    attrs = {"kernel": k, "stride": stride, "padding": pad}
    if avg:
        attrs.update(count_include_pad=draw(st.booleans()), divisor_override=draw(st.sampled_from([0, 0, 5])))
    else:
        attrs["dilation"] = dil
    return [real(draw(st.integers(1, 3)), draw(st.integers(1, 3)), *hw)], attrs


@st.composite
def _long_rows(draw):
    """softmax / log-softmax along a dim of up to 40, with dims before and after it"""
    shape = draw(st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple))
    return [real(*shape)], {"dim": draw(dim_of(shape))}


@st.composite
def _wide_layer_norm(draw):
    shape = draw(st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple))
    k = shape[len(shape) - draw(st.integers(1, len(shape))):]
    affine = [real(*k) for _ in range(draw(st.integers(0, 2)))]
    return [real(*shape)] + affine, {"normalized_shape": k, "eps": 1e-5}


#: strategies drawn besides cases.py's (one of the two each draw) for the kernels of this
#: backend: larger windows and rows than the op table's small shapes
C_SPECS = {"avg_pool2d": _larger_pool2d(avg=True), "max_pool2d": _larger_pool2d(avg=False),
           "softmax": _long_rows(), "log_softmax": _long_rows(), "layer_norm": _wide_layer_norm()}


def draw_cases(op: str, dtype: str = DTYPE) -> list:
    """CASES_PER_OP cases of `op`: (arrays, attrs, ct seed), drawn by hypothesis (derandomized).
    They are collected, not checked, inside the examples (one example drawing them all would be
    hypothesis' simplest example: every case a scalar), and run by the caller in one library."""
    drawn = []

    @settings(SETTINGS, max_examples=CASES_PER_OP)
    @given(data=st.data())
    def collect(data):
        if op in C_SPECS:
            args, attrs = data.draw(CASES[op].spec | C_SPECS[op], label="operands and attrs")
            arrays = make_inputs(args, data.draw(st.integers(0, 2**32 - 1), label="seed"), dtype)
        else:
            arrays, attrs = draw_case(data, op, dtype)
        drawn.append((arrays, attrs, data.draw(st.integers(0, 2**32 - 1), label="ct seed")))

    collect()
    return drawn


@pytest.mark.parametrize("op", sorted(CASES))
def test_c_backend_matches_torch(op):
    side, checks = Side(), []
    for k, (arrays, attrs, seed) in enumerate(draw_cases(op)):
        gap, _ = known_gap(op, arrays, attrs)
        if gap == "all":
            continue
        want = CASES[op].torch_fn(to_torch(arrays), attrs)
        want = want if isinstance(want, tuple) else (want,)
        what = f"{op} case {k}: operands {[f'{a.dtype}{list(a.shape)}' for a in arrays]}, attrs {attrs}"
        checks += [(f"c{k}:out{j}", w, FORWARD_TOL[DTYPE], what) for j, w in enumerate(want)]
        ct = None
        wrt = wrt_of(op, arrays)
        if op in DIFFERENTIABLE and wrt and gap != "grad":
            (ct,) = make_inputs([Arg(tuple(want[0].shape))], seed, DTYPE)
            tensors = to_torch(arrays, wrt)
            (CASES[op].torch_fn(tensors, attrs) * torch.from_numpy(ct)).sum().backward()
            checks += [(f"c{k}:grad:a{i}", tensors[i].grad, GRAD_TOL[DTYPE], what) for i in wrt]
        side.add(k, op, arrays, attrs, ct)
    got = side.run()
    for name, want, tol, what in checks:
        assert rel_err(got[name], want) <= tol, f"{name} of {what}"


def test_every_float_op_is_driven_and_has_a_kernel():
    """Each op of OPS not skipped (int8, paging) is a case or emitted by the backward graph
    of a drawn case, so test_c_backend_matches_torch runs its C kernel; and every such op has one."""
    driven = set(CASES)
    for op in DIFFERENTIABLE:
        for arrays, attrs, _ in draw_cases(op):
            if wrt_of(op, arrays):
                driven.update(n.op for n in backward_graph(op, arrays, attrs).nodes)
    float_ops = {op for op in OPS if not skipped(op)}
    assert float_ops - driven == set()
    in_float64 = {n.op for op in CASES for arrays, attrs, _ in draw_cases(op, "float64")
                  for n, _, _ in _nn_nodes(op, arrays, attrs)}
    assert set(NN_OPS) - in_float64 == set(), "float32_nn kernels test_float64_kernels_match_the_reference misses"
    assert float_ops - set(KERNELS) == set(), "float ops without a C kernel"


# --- the float64 instances of kernels/float32_nn.py, node by node against the numpy reference ------
NN_OPS = sorted(op for op, k in KERNELS.items() if k.fn.__module__ == float32_nn.__name__)
#: max |C - reference| / max(|reference|, 1) of a float64 kernel
FLOAT64_TOL = 1e-10


def _nn_nodes(op: str, arrays: list, attrs: dict):
    """(node, its operands, the reference's results) for each node of the op's float64 forward
    and backward graphs that kernels/float32_nn.py computes, the operands from the reference."""
    g = backward_graph(op, arrays, attrs) if op in DIFFERENTIABLE and wrt_of(op, arrays) else \
        forward_graph(op, arrays, attrs)
    rng = np.random.default_rng(len(g.nodes))
    env = {v: arrays[int(v.name[1:])] if v.name != "ct" else rng.normal(size=v.shape).astype(v.dtype)
           for v in g.inputs}
    out = []
    for n in g.nodes:
        results = OPS[n.op].ref([env[v] for v in n.inputs], n.attrs)
        env.update(zip(n.outputs, results))
        if n.op in NN_OPS:
            out.append((n, [env[v] for v in n.inputs], results))
    return out


@pytest.mark.parametrize("op", sorted(CASES))
def test_float64_kernels_match_the_reference(op):
    inputs, nodes, feeds, want = [], [], [], []
    for k, (arrays, attrs, _) in enumerate(draw_cases(op, "float64")):
        for j, (n, operands, results) in enumerate(_nn_nodes(op, arrays, attrs)):
            ins = tuple(new_value(v.type, f"c{k}n{j}:{i}") for i, v in enumerate(n.inputs))
            inputs += ins
            feeds += operands
            nodes.append(Node(n.op, ins, n.outputs, n.attrs))
            want += [(f"{n.op} of case {k} ({attrs})", r) for r in results]
    if not nodes:
        pytest.skip(f"no node of {op}'s graphs is a kernel of float32_nn.py")
    outs = tuple(v for n in nodes for v in n.outputs)
    g = Graph(tuple(inputs), tuple(nodes), outs, tuple(f"y{i}" for i in range(len(outs))))
    for got, (what, ref) in zip(build_graph_library(g)(feeds), want):
        assert got.dtype == ref.dtype and got.shape == ref.shape, what
        err = float(np.abs(got - ref).max(initial=0) / max(np.abs(ref).max(initial=0), 1.0))
        assert err <= FLOAT64_TOL, what


# --- inputs where a naive kernel loses precision or overflows, float32 against torch in float64 ----
def _hard_cases():
    rng = np.random.default_rng(7)
    f32 = np.float32
    big = (rng.normal(size=(4, 9)) * 1000).astype(f32)  # exp overflows without the max subtracted
    offset = (1000 + 0.01 * rng.normal(size=(3, 16))).astype(f32)  # one-pass float variance cancels
    wide = np.linspace(-60, 60, 97, dtype=f32)
    return [("softmax", [big], {"dim": -1}), ("log_softmax", [big], {"dim": 0}),
            ("layer_norm", [offset, rng.normal(size=16).astype(f32)], {"normalized_shape": (16,), "eps": 1e-5}),
            ("sigmoid", [wide], {}), ("tanh", [wide], {}), ("gelu", [wide], {"approximate": "none"}),
            ("gelu", [wide], {"approximate": "tanh"}), ("exp", [np.linspace(-100, 88, 64, dtype=f32)], {}),
            ("log", [np.geomspace(1e-30, 1e30, 64).astype(f32)], {}),
            ("pow", [np.geomspace(1e-3, 1e3, 32).astype(f32)], {"exponent": -1.5}),
            ("rsqrt", [np.geomspace(1e-12, 1e12, 64).astype(f32)], {})]  # (its VJP cubes the output)


@pytest.mark.parametrize("op, arrays, attrs", _hard_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_numerically_hard_inputs(op, arrays, attrs):
    side = Side()
    ct = np.random.default_rng(1).normal(size=CASES[op].torch_fn(to_torch(arrays), attrs).shape).astype(DTYPE)
    side.add(0, op, arrays, attrs, ct)
    got = side.run()
    wrt = wrt_of(op, arrays)
    t64 = [torch.tensor(a, dtype=torch.float64, requires_grad=i in wrt) for i, a in enumerate(arrays)]
    y = CASES[op].torch_fn(t64, attrs)
    (y * torch.from_numpy(ct.astype(np.float64))).sum().backward()
    assert rel_err(got["c0:out0"], y.detach().float()) <= FORWARD_TOL[DTYPE]
    for i in wrt:
        assert rel_err(got[f"c0:grad:a{i}"], t64[i].grad.float()) <= GRAD_TOL[DTYPE], f"a{i}"


def test_index_select_grad_sums_repeated_indices():
    g = np.arange(1.0, 4.0, dtype=np.float32).reshape(3, 1)
    graph = forward_graph("index_select_grad", [g], {"input_shape": (2, 1), "dim": 0, "index": (1, 1, 0)})
    (got,) = build_graph_library(graph)([g])
    np.testing.assert_array_equal(got, [[3.0], [3.0]])


def test_graph_library_of_a_graph_without_nodes_copies_its_input():
    x = new_value(forward_graph("neg", [np.zeros(3, np.float32)], {}).inputs[0].type, "x")
    (got,) = build_graph_library(Graph((x,), (), (x,), ("y",)))([np.arange(3, dtype=np.float32)])
    np.testing.assert_array_equal(got, [0, 1, 2])


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_embedding_index_out_of_range_reads_a_zero_row(dtype):
    """(the reference raises IndexError; the C kernel reports through ET_ERROR_HOOK and reads zeros)"""
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    idx = np.array([0, 2, 3, -1], dtype=dtype)
    (got,) = build_graph_library(forward_graph("embedding", [w, idx], {"padding_idx": -1}))([w, idx])
    np.testing.assert_array_equal(got, [[0, 1], [4, 5], [0, 0], [0, 0]])


# --- the same kernels on a Cortex-M (QEMU): the firmware's losses are the host build's, as text ----------
class _NNModel(torch.nn.Module):
    """tanh, max and average pooling, layer norm, gelu, sigmoid, slice, cat, exp, pow,
    softmax and log-softmax: every forward op of kernels/float32_nn.py and its gradient"""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc, self.ln, self.fc2 = torch.nn.Linear(16, 12), torch.nn.LayerNorm(12), torch.nn.Linear(12, 10)

    def forward(self, x):
        h = torch.tanh(self.conv(x))
        h = torch.nn.functional.max_pool2d(h, 3, 2, 1)
        h = torch.nn.functional.avg_pool2d(h, 2, 2, count_include_pad=False).flatten(1)
        h = torch.nn.functional.gelu(self.ln(self.fc(h)))
        h = torch.sigmoid(h) * h
        h = torch.cat([h[:, :6], torch.exp(-h[:, 6:] ** 2)], 1)
        return torch.log_softmax(self.fc2(h), -1) + torch.softmax(h, -1)[:, :1]


def test_nn_kernels_on_cortex_m_print_the_host_builds_losses(tmp_path):
    import shutil

    import edgetrain as et
    from edgetrain.backends.c import cortexm

    if cortexm.missing_tools() or shutil.which("make") is None:
        pytest.skip(f"missing {', '.join(cortexm.missing_tools()) or 'make'}")
    torch.manual_seed(0)
    shape = (1, 1, 8, 8)
    prog = et.compile(_NNModel(), (torch.zeros(shape),), optimizer=et.SGD(lr=0.05))
    # ops/pointwise.py's activations reuse float32_nn's elementwise emitter: their own firmware
    # test is tests/frontend/test_pointwise_models.py
    own = {op for op in NN_OPS if OPS[op].ref.__module__ != "edgetrain.ops.pointwise"}
    assert own - {"cast", "rsqrt", "sqrt", "log", "embedding", "embedding_grad"} <= \
        {n.op for n in prog.train_graph.nodes}
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal(shape).astype(np.float32), np.array([i % 10])) for i in range(3)]
    fw = firmware_prints_host_steps(prog, data, tmp_path)
    # every float kernel's stack buffers are fixed once its shapes are: a static bound exists
    assert fw.size.stack_bound is not None and fw.run.stack_high_water <= fw.size.stack_bound
    np.testing.assert_allclose(fw.run.losses, [prog.step(x, y) for x, y in data], rtol=1e-5)
