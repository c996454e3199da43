"""Max pooling, average pooling and concatenation stay int8 in quantized programs
(ops/qpool.py, quantize/convert.py): the graph holds qmax_pool2d / qavg_pool2d / qcat and
no dequantize -> float op -> quantize; each agrees with the float op on the dequantized
values (max exactly, average and requantized concatenation within one level, copied
concatenation exactly); gradients and steps run, the C backend matches the reference
bit for bit, and training lowers the loss. The C kernels are also checked op by op over
geometries the models do not reach (padding, overlapping windows, dilation, divisors)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import edgetrain as et
from edgetrain.interpreter import run_graph
from edgetrain.ops.qelementwise import dequantize_ref, quantize_ref
from edgetrain.ops.qpool import is_copy, qcat_attrs

from ..backends.c.int8_harness import graph_of, run_c, run_ref

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler")

BATCH = 2
HW = 8
EPOCHS = 5
#: the dense block's new features span a wider range than the pooled ones they join, so
#: the concatenation's scale differs from the pooled tensor's
GROW_GAIN = 3.0
CLASSES = 4
FLOAT_POOL_OPS = {"max_pool2d", "avg_pool2d", "cat", "max_pool2d_grad", "avg_pool2d_grad", "slice"}


class TwoBranch(nn.Module):
    """conv+ReLU -> max pool -> two conv branches concatenated -> average pool -> linear:
    the cat's inputs feed nothing else, so calibration gives them the cat's scale."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.a = nn.Conv2d(8, 4, 3, padding=1)
        self.b = nn.Conv2d(8, 6, 1)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(10 * 2 * 2, CLASSES)

    def forward(self, x):
        h = self.pool(torch.relu(self.stem(x)))
        h = torch.cat([torch.relu(self.a(h)), self.b(h)], 1)
        return self.fc(torch.flatten(self.avg(h), 1))


class DenseBlock(nn.Module):
    """Overlapping padded max pool, a dense concatenation of the pooled tensor (which keeps
    its own scale: requantized by qcat) with a conv of it, a padded average pool that
    excludes padding, and an adaptive average pool."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.grow = nn.Conv2d(6, 5, 3, padding=1)
        with torch.no_grad():
            self.grow.weight.mul_(GROW_GAIN)
        self.avg = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.adapt = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(11 * 2 * 2, CLASSES)

    def forward(self, x):
        h = self.pool(torch.relu(self.stem(x)))
        h = torch.cat([h, torch.relu(self.grow(h))], 1)
        return self.fc(torch.flatten(self.adapt(self.avg(h)), 1))


class NestedCat(nn.Module):
    """A cat of a cat: the outer cat's parameters reach the inner cat's inputs."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 3, 3, padding=1), nn.Conv2d(3, 4, 1)
        with torch.no_grad():
            self.c.weight.mul_(GROW_GAIN)
        self.fc = nn.Linear(9 * 4 * 4, CLASSES)

    def forward(self, x):
        h = torch.cat([torch.cat([self.a(x), self.b(x)], 1), self.c(x)], 1)
        return self.fc(torch.flatten(F.max_pool2d(h, 2), 1))


MODELS = {"two_branch": TwoBranch, "dense": DenseBlock}


def _data(seed, n):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, HW, HW)).astype(np.float32), rng.integers(0, CLASSES, n)


def _compile(name, lr=0.05, seed=0):
    torch.manual_seed(seed)
    x, _ = _data(100 + seed, 32)
    return et.compile(MODELS[name](), (torch.zeros(BATCH, 3, HW, HW),), quantize="int8",
                      optimizer=et.SGD(lr=lr), calibration=[x])


@pytest.fixture(scope="module", params=sorted(MODELS))
def named(request):
    return request.param, _compile(request.param)


@pytest.fixture
def prog(named):
    return named[1]


# --- (a) the graph -------------------------------------------------------------------------
def test_pool_and_cat_stay_int8_in_the_graph(prog):
    q = prog.stages["quantized"]
    ops = [n.op for n in q.nodes]
    assert {"qmax_pool2d", "qavg_pool2d", "qcat"} <= set(ops), ops
    assert not FLOAT_POOL_OPS & set(ops)
    assert "dequantize" not in ops and ops.count("quantize") == 0  # int8 from the input to the logits
    for n in q.nodes:
        if n.op in ("qmax_pool2d", "qavg_pool2d", "qcat"):
            assert all(v.dtype == "int8" for v in n.inputs + n.outputs)
    backward_ops = {n.op for n in prog.train_graph.nodes}
    assert {"qmax_pool2d_grad", "qavg_pool2d_grad", "qcat_grad"} <= backward_ops
    assert not FLOAT_POOL_OPS & backward_ops


def test_cat_inputs_share_its_scale_unless_they_cannot():
    """Calibrated inputs read by the cat alone take its scale (copied); the dense block's
    pooled input keeps the max pool's scale (its consumers need it) and is requantized."""
    cats = {name: [n for n in _compile(name).stages["quantized"].nodes if n.op == "qcat"] for name in MODELS}
    (tb,), (dense,) = cats["two_branch"], cats["dense"]
    assert all(is_copy(tb.attrs, i) for i in range(2))
    assert not is_copy(dense.attrs, 0) and is_copy(dense.attrs, 1)
    torch.manual_seed(0)
    x, _ = _data(4, 8)
    nested = et.compile(NestedCat(), (torch.zeros(BATCH, 3, HW, HW),), quantize="int8", calibration=[x])
    inner, outer = [n for n in nested.stages["quantized"].nodes if n.op == "qcat"]
    assert inner.out in outer.inputs
    assert all(is_copy(n.attrs, i) for n in (inner, outer) for i in range(2))
    assert len({n.attrs["y_scale"] for n in (inner, outer)}) == 1


# --- (b) against the float ops on dequantized values -------------------------------------
def _qparams(g):
    """(scale, zero) of every int8 value of the quantized graph, from the ops that set them."""
    qp = {}
    for n in g.nodes:
        a = n.attrs
        if n.op == "qconv2d" and not a.get("float_out"):
            qp[n.out] = (a["y_scale"], a["y_zero"])
        elif n.op == "qcat":
            qp[n.out] = (a["y_scale"], a["y_zero"])
            qp.update({v: (s, z) for v, s, z in zip(n.inputs, a["x_scale"], a["x_zero"])})
        elif n.op in ("qmax_pool2d", "qavg_pool2d", "reshape") and n.inputs[0] in qp:
            qp[n.out] = qp[n.inputs[0]]
        if n.op == "qconv2d":
            qp.setdefault(n.inputs[0], (a["x_scale"], a["x_zero"]))
    return qp


def _run_all(prog, x):
    """Every value of the quantized forward graph on float input `x`."""
    g = prog.stages["quantized"]
    values = [v for n in g.nodes for v in n.outputs]
    probe = g.replace(outputs=tuple(values), output_names=tuple(f"v{i}" for i in range(len(values))))
    feeds = {**run_graph(prog.input_transform, {prog.inputs[0]: x})[0], **prog.state}
    out = run_graph(probe, feeds)[0]
    return {v: out[f"v{i}"] for i, v in enumerate(values)} | {v: feeds[v.name] for v in g.inputs}


def _fake_quant(real, scale, zero):
    return quantize_ref(real, dict(scale=scale, zero=zero, qmin=-128, qmax=127)).astype(np.int32)


def _real(q, scale, zero):
    return torch.from_numpy(dequantize_ref(q, dict(scale=scale, zero=zero)).astype(np.float64))


def test_int8_ops_agree_with_float_ops_on_dequantized_values(prog):
    x, _ = _data(1, BATCH)
    g = prog.stages["quantized"]
    qp = _qparams(g)
    val = _run_all(prog, x)
    seen = set()
    for n in g.nodes:
        if n.op not in ("qmax_pool2d", "qavg_pool2d", "qcat"):
            continue
        seen.add(n.op)
        a = n.attrs
        got = val[n.out].astype(np.int32)
        if n.op == "qcat":
            reals = [_real(val[v], *qp[v]) for v in n.inputs]
            want = _fake_quant(torch.cat(reals, a["dim"]).numpy(), a["y_scale"], a["y_zero"])
            assert np.abs(got - want).max() <= 1
            start = 0
            for i, v in enumerate(n.inputs):  # a copied input is exact
                end = start + v.shape[a["dim"]]
                if is_copy(a, i):
                    np.testing.assert_array_equal(got[:, start:end], val[v])
                start = end
            continue
        s, z = qp[n.inputs[0]]
        xr = _real(val[n.inputs[0]], s, z)
        if n.op == "qmax_pool2d":
            yr = F.max_pool2d(xr, a["kernel"], a["stride"], a["padding"], a["dilation"])
            np.testing.assert_array_equal(got, _fake_quant(yr.numpy(), s, z))  # exact
        else:
            yr = F.avg_pool2d(xr, a["kernel"], a["stride"], a["padding"], count_include_pad=a["count_include_pad"],
                              divisor_override=a["divisor_override"] or None)
            exact = yr.numpy() / s + z
            diff = np.abs(got - _fake_quant(yr.numpy(), s, z))
            assert diff.max() <= 1
            # only a tie (np.round halves to even, the kernel away from zero) may differ
            tie = np.isclose(np.abs(exact - np.floor(exact)), 0.5, atol=1e-6)
            assert not (diff > 0)[~tie].any()
    assert seen == {"qmax_pool2d", "qavg_pool2d", "qcat"}


def test_int8_predict_is_close_to_the_float_model(named):
    name, prog = named
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    x, _ = _data(2, 16)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    got = prog.predict(x)
    spread = ref.std()
    assert np.abs(got - ref).mean() < 0.05 * spread
    assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.9


# --- (c) gradients, steps, and the C backend bit for bit --------------------------------------
@needs_cc
@pytest.mark.parametrize("name", sorted(MODELS))
def test_c_backend_is_bit_exact_for_predict_gradients_and_steps(name):
    from edgetrain.backends.c.host import to_c_program

    prog = _compile(name)
    cprog = to_c_program(prog)
    x, y = _data(3, BATCH)
    np.testing.assert_array_equal(cprog.predict(x), prog.predict(x))
    want, got = prog.gradients(x, y), cprog.gradients(x, y)
    assert want.keys() == got.keys() == set(prog.trainable)
    for k in want:
        assert np.isfinite(want[k]).all() and np.abs(want[k]).max() > 0, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    before = {k: v.copy() for k, v in prog.state.items()}
    for i in range(3):
        xs, ys = _data(10 + i, BATCH)
        lw, lg = prog.step(xs, ys), cprog.step(xs, ys)
        assert np.isfinite(lw) and np.isclose(lg, lw, rtol=1e-6, atol=0), (i, lg, lw)  # float loss kernels
        for k in prog.state:
            np.testing.assert_array_equal(cprog.state[k], prog.state[k], err_msg=f"step {i}: {k}")
    assert sum(not np.array_equal(before[k], prog.state[k]) for k in prog.trainable) >= len(prog.trainable) // 2
    assert cprog.runner.check_guards()


@pytest.mark.skipif(not HAS_CC, reason="no C compiler")
def test_cortex_m_firmware_trains_as_the_host_build(tmp_path):
    """The dense block (overlapping max pool, requantizing qcat, padded average pools) as
    Cortex-M4 firmware under QEMU: its step losses are the host C build's, digit for digit."""
    from edgetrain.backends.c import cortexm

    from ..backends.c.test_cortexm import _host_step_lines

    if cortexm.missing_tools():
        pytest.skip(f"missing {', '.join(cortexm.missing_tools())}")
    prog = _compile("dense")
    data = [_data(20 + i, BATCH) for i in range(3)]
    host = _host_step_lines(prog, data, tmp_path / "host")
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", data)
    assert fw.run.exit_code == 0, fw.run.lines
    assert len(host) == len(data) and list(fw.run.step_lines) == host
    assert fw.size.stack_bound is not None and fw.run.stack_high_water <= fw.size.stack_bound


# --- (d) training still works ------------------------------------------------------------------
def _quadrant_task(seed, n):
    """Class = the quadrant holding a bright blob."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 0.3, (n, 3, HW, HW)).astype(np.float32)
    y = rng.integers(0, CLASSES, n)
    h = HW // 2
    for i, c in enumerate(y):
        r, col = divmod(int(c), 2)
        x[i, :, r * h:(r + 1) * h, col * h:(col + 1) * h] += 1.5
    return x, y


@pytest.mark.parametrize("name", sorted(MODELS))
def test_int8_training_lowers_the_loss(name):
    torch.manual_seed(0)
    x, y = _quadrant_task(0, 64)
    prog = et.compile(MODELS[name](), (torch.zeros(BATCH * 4, 3, HW, HW),), quantize="int8",
                      optimizer=et.SGD(lr=0.05, momentum=0.9), calibration=[x])

    losses = []
    for epoch in range(EPOCHS):
        losses.append(np.mean([prog.step(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]))
    assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], losses


# --- the C kernels op by op -----------------------------------------------------------------------
def _same(got, want):
    for k in got:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def _check(build, feeds):
    g = graph_of(build, feeds)
    got, _ = run_c(g, feeds, {})
    want, _ = run_ref(g, feeds, {})
    assert got.keys() == set(g.output_names)
    _same(got, {k: want[k] for k in got})
    return got


POOL_CASES = [  # (hw, kernel, stride, padding, dilation, count_include_pad, divisor_override)
    (8, 2, 2, 0, 1, True, 0),
    (9, 3, 2, 1, 1, True, 0),
    (9, 3, 2, 1, 1, False, 0),
    (7, 3, 1, 1, 1, False, 0),
    (6, 3, 1, 1, 2, True, 0),
    (8, 2, 1, 0, 1, True, 3),
    (5, 5, 1, 2, 1, False, 0),
]


@needs_cc
@pytest.mark.parametrize("case", POOL_CASES)
def test_c_pool_kernels_forward_and_backward(case):
    hw, k, s, p, d, cip, div = case
    rng = np.random.default_rng(hash(case) % 2 ** 32)
    x = rng.integers(-128, 128, (2, 3, hw, hw)).astype(np.int8)
    x[0, 0] = 5  # ties everywhere: the first maximum takes the gradient
    geo = dict(kernel=(k, k), stride=(s, s), padding=(p, p))
    ho = (hw + 2 * p - d * (k - 1) - 1) // s + 1
    feeds = {"x": x, "g": rng.standard_normal((2, 3, ho, ho)).astype(np.float32)}
    avg = dict(geo, count_include_pad=cip, divisor_override=div)
    zero = int(rng.integers(-20, 20))

    def build(e, v):
        mgeo = dict(geo, dilation=(d, d))
        outs = [e.emit("qmax_pool2d", v["x"], **mgeo), e.emit("qmax_pool2d_grad", v["g"], v["x"], **mgeo)]
        if d == 1:  # average pooling has no dilation
            outs += [e.emit("qavg_pool2d", v["x"], zero=zero, **avg),
                     e.emit("qavg_pool2d_grad", v["g"], input_shape=x.shape, **avg)]
        return outs
    _check(build, feeds)


@needs_cc
@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_c_qcat_kernels(dim):
    rng = np.random.default_rng(dim)
    shapes = [[2, 3, 4, 5] for _ in range(3)]
    for sh, extra in zip(shapes, (1, 2, 3)):
        sh[dim] = extra
    xs = {f"x{i}": rng.integers(-128, 128, sh).astype(np.int8) for i, sh in enumerate(shapes)}
    out_shape = list(shapes[0])
    out_shape[dim] = 6
    feeds = {**xs, "g": rng.standard_normal(out_shape).astype(np.float32)}
    # input 0 copied, 1 on a larger scale (saturates), 2 on a smaller one
    a = qcat_attrs(dim, (0.1, 0.35, 0.03), (4, -7, 20), 0.1, 4)
    assert is_copy(a, 0) and not is_copy(a, 1)

    def build(e, v):
        y = e.emit("qcat", v["x0"], v["x1"], v["x2"], **a)
        return [y] + [e.emit("qcat_grad", v["g"], dim=dim, start=lo, end=hi) for lo, hi in ((0, 1), (1, 3), (3, 6))]
    got = _check(build, feeds)
    y = got["out0"]
    assert (np.abs(y.astype(np.int32)) == np.int32(127)).any() or (y == -128).any()
