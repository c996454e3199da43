"""int8 training of a float model, end to end: the quantized forward against the float
model within quantization error, bit-exact determinism, QAS through the program against
its formula, and a small real-data run whose accuracy rises."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.data import DataError, load_mnist
from edgetrain.app.demo import normalise, pretrained_digitnet
from edgetrain.ops.qoptim import uniform_hash
from edgetrain.quantize import CalibrationError

BATCH = 16


@pytest.fixture(scope="module")
def digits():
    try:
        xtr, ytr = load_mnist("train", 1200)
        xte, yte = load_mnist("test", 512)
    except DataError as err:
        pytest.skip(str(err))
    return xtr, ytr, xte, yte


def compile_int8(model, x, qas=True, lr=0.005, momentum=0.0, seed=0, update=None):
    return et.compile(model, (torch.from_numpy(x[:BATCH]),), loss="cross_entropy", update=update or et.Full(),
                      quantize="int8", optimizer=et.SGD(lr=lr, momentum=momentum, qas=qas, seed=seed),
                      calibration=[x[:64]])


def torch_logits(model, x):
    with torch.no_grad():
        return model.eval()(torch.from_numpy(x)).numpy()


def test_int8_forward_matches_float_within_quantization_error(digits):
    xtr, _, xte, yte = digits
    model = pretrained_digitnet()
    prog = compile_int8(model, normalise(xtr))
    x = normalise(xte)
    ours, ref = prog.predict(x), torch_logits(model, x)
    spread = ref.std()
    assert np.abs(ours - ref).mean() < 0.05 * spread
    assert np.abs(ours - ref).max() < 0.5 * spread
    assert (ours.argmax(1) == ref.argmax(1)).mean() >= 0.97
    float_acc = (ref.argmax(1) == yte).mean()
    assert (ours.argmax(1) == yte).mean() >= float_acc - 0.02
    # the program holds integers only: int8 weights, int32 biases, nothing float for the layers
    kinds = {str(v.dtype) for v in prog.state.values()}
    assert kinds <= {"int8", "int32"}, kinds


def test_int8_training_is_deterministic_and_bit_exact(digits):
    xtr, ytr, _, _ = digits
    x = normalise(255 - xtr)
    runs = []
    for _ in range(2):
        prog = compile_int8(pretrained_digitnet(), x, momentum=0.9)
        losses = [prog.step(x[i:i + BATCH], ytr[i:i + BATCH]) for i in range(0, 6 * BATCH, BATCH)]
        runs.append((losses, {k: v.copy() for k, v in prog.state.items()}))
    (l0, s0), (l1, s1) = runs
    assert l0 == l1
    assert s0.keys() == s1.keys()
    for k in s0:
        assert s0[k].dtype == s1[k].dtype and np.array_equal(s0[k], s1[k]), k
    start = compile_int8(pretrained_digitnet(), x).state
    moved = [k for k in prog.trainable if not np.array_equal(start[k], s0[k])]
    assert len(moved) == len(prog.trainable)
    for k in prog.trainable:
        assert s0[k].dtype == start[k].dtype
        if s0[k].dtype == np.int8:
            assert s0[k].min() >= -127 and s0[k].max() <= 127
    # another rounding seed gives other (equally valid) integers
    other = compile_int8(pretrained_digitnet(), x, momentum=0.9, seed=1)
    for i in range(0, 6 * BATCH, BATCH):
        other.step(x[i:i + BATCH], ytr[i:i + BATCH])
    assert any(not np.array_equal(other.state[k], s0[k]) for k in prog.trainable)


def _layer_scales(prog):
    """weight name -> (w_scales, x_scale) read off the int8 forward graph's qconv2d nodes."""
    g = prog.forward_graph
    producer = {o: n for n in g.nodes for o in n.outputs}

    def source(v):  # a linear layer's weight reaches its 1x1 qconv2d through a reshape
        while v in producer:
            v = producer[v].inputs[0]
        return v.name

    out = {}
    for n in g.nodes:
        if n.op == "qconv2d":
            out[source(n.inputs[1])] = (np.asarray(n.attrs["w_scales"], np.float64), float(n.attrs["x_scale"]),
                                        source(n.inputs[2]))
    return out


@pytest.mark.parametrize("qas", [True, False])
def test_qas_scaling_through_the_program_matches_the_formula(digits, qas):
    xtr, ytr, _, _ = digits
    x, y = normalise(255 - xtr[:BATCH]), ytr[:BATCH]
    lr = 0.01
    prog = compile_int8(pretrained_digitnet(), normalise(255 - xtr), qas=qas, lr=lr)
    before = {k: prog.state[k].copy() for k in prog.trainable}
    grads = prog.gradients(x, y)  # d loss / d integer
    prog.step(x, y)
    factors = {}
    for weight, (s_w, s_x, bias) in _layer_scales(prog).items():
        factors[weight] = s_w ** -2 if qas else np.ones_like(s_w)
        factors[bias] = (s_w * s_x) ** -2 if qas else np.ones_like(s_w)
    assert set(factors) == set(prog.trainable)
    ids = {n.outputs[0].name: n.attrs.get("param_id", n.attrs.get("up_param_id")) for n in prog.train_graph.nodes
           if n.op in ("qsgd_update", "qconv2d_grad_weight_update")}
    checked = 0
    for p, w0 in before.items():
        scale = factors[p].reshape((-1,) + (1,) * (w0.ndim - 1))
        v = w0.astype(np.float64) - lr * scale * grads[p].astype(np.float64)
        u = uniform_hash(prog.optimizer.seed, ids[p], 0, np.arange(w0.size).reshape(w0.shape)).astype(np.float64)
        limit = 127 if w0.dtype == np.int8 else 2 ** 24
        want = np.clip(np.floor(v + u), -limit, limit)
        frac = np.abs((v + u) - np.round(v + u))
        clear = frac > 1e-3  # float32 in the program, float64 here: ties may round either way
        assert np.array_equal(prog.state[p][clear], want[clear]), p
        checked += clear.sum()
        if qas and w0.dtype == np.int8:
            # QAS makes the expected change of the real weight the float SGD step: -lr * dL/dw_real
            s_w = np.sqrt(1 / factors[p]).reshape(scale.shape)
            g_real = grads[p] / s_w
            np.testing.assert_allclose(s_w * (v - w0), -lr * g_real, rtol=1e-6, atol=1e-12)
    assert checked > 0.99 * sum(w.size for w in before.values())


def test_stochastic_rounding_keeps_updates_smaller_than_one_step(digits):
    """With a learning rate so small that every update is far below one integer step,
    nearest rounding would change nothing; stochastic rounding moves some weights, and on
    average by the right amount."""
    xtr, ytr, _, _ = digits
    x, y = normalise(255 - xtr[:BATCH]), ytr[:BATCH]
    probe = compile_int8(pretrained_digitnet(), normalise(255 - xtr))
    w = next(p for p in probe.trainable if probe.state[p].dtype == np.int8 and probe.state[p].size > 1000)
    s_w = _layer_scales(probe)[w][0].reshape(-1, 1, 1, 1)
    g = probe.gradients(x, y)[w]
    lr = 0.3 / np.abs(s_w ** -2 * g).max()  # the largest update is 0.3 of an integer step
    prog = compile_int8(pretrained_digitnet(), normalise(255 - xtr), lr=float(lr))
    w0 = prog.state[w].astype(np.float64)
    expected = -lr * s_w ** -2 * g
    assert np.abs(expected).max() < 0.5
    assert np.array_equal(np.round(w0 + expected), w0)  # nearest rounding would lose every update
    prog.step(x, y)
    delta = prog.state[w].astype(np.float64) - w0
    assert np.count_nonzero(delta) > 0
    assert abs(delta.sum() - expected.sum()) < 4 * np.sqrt(np.abs(expected).sum()) + 1


def test_int8_fine_tuning_on_inverted_digits_raises_accuracy(digits):
    xtr, ytr, xte, yte = digits
    model = pretrained_digitnet()
    x, xt = normalise(255 - xtr), normalise(255 - xte)
    prog = compile_int8(model, x, momentum=0.9)
    before = (prog.predict(xt).argmax(1) == yte).mean()
    rng = np.random.default_rng(0)
    for _ in range(2):
        order = rng.permutation(len(x))
        for i in range(0, len(x) - BATCH + 1, BATCH):
            idx = order[i:i + BATCH]
            prog.step(x[idx], ytr[idx])
    after = (prog.predict(xt).argmax(1) == yte).mean()
    assert after > before + 0.3, (before, after)
    # the trained integers, exported as float weights, run in PyTorch with the same accuracy
    model.load_state_dict(prog.state_dict())
    torch_acc = (torch_logits(model, xt).argmax(1) == yte).mean()
    assert abs(torch_acc - after) <= 0.02


def test_int8_compile_rejects_bad_calibration(digits):
    xtr = digits[0]
    model = pretrained_digitnet()
    want = r"calibration input .* expected \(N,1,28,28\), got \(16, 3, 28, 28\)"
    with pytest.raises(CalibrationError, match=want):
        et.compile(model, (torch.from_numpy(normalise(xtr[:BATCH])),), quantize="int8",
                   calibration=[np.zeros((BATCH, 3, 28, 28), np.float32)])


def test_int8_program_reads_int8_samples(digits):
    """The float prefix that quantizes the input runs as each sample is read in: the
    training program's data input is int8, and no float image is held in RAM."""
    xtr, ytr, _, _ = digits
    x = normalise(255 - xtr)
    prog = compile_int8(pretrained_digitnet(), x)
    (name,) = prog.graph_inputs
    assert name == prog.inputs[0] + ":int8"
    for g in (prog.forward_graph, prog.train_graph):
        assert g.input(name).dtype == "int8"
        assert all(v.name != prog.inputs[0] for v in g.inputs)
    assert prog.input_transform.output_names == (name,)
    ops = [n.op for n in prog.input_transform.nodes]
    assert ops[-1] == "quantize" and "qconv2d" not in ops
    # the float batch (16x1x28x28 float32 = 50 KB) would dominate; int8 is a quarter
    lts_inputs = [v for v in prog.train_graph.inputs if v.name == name]
    assert lts_inputs[0].type.nbytes == x[:BATCH].size
