"""int8 transposed convolution (ops/qconv_transpose.py) in int8 programs: a ConvTranspose2d stays
int8 in the int8 graph (the ReLU after it fused as its output clamp), its C kernels
(runtime/et_int8_transposed.h) equal the reference bit for bit (op by op, and a whole int8
program's predictions, gradients and steps), its integer weights train, and a small int8
conv-autoencoder runs in Cortex-M4 firmware under QEMU printing the host build's losses."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.backends.c.graph_lib import build_graph_library
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import Emitter
from edgetrain.ops.qconv_transpose import qconv_transpose2d_ref
from edgetrain.quantize.convert import quantize_transposed_weight
from tests.ops.test_qconv_transpose import GEOMETRIES, case

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")

#: the int8 ops of a trained transposed convolution
TRANSPOSED_OPS = {"qconv_transpose2d", "qconv_transpose2d_grad_input", "qconv_transpose2d_grad_weight"}


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_kernels_equal_the_reference_bit_for_bit(geometry):
    rng = np.random.default_rng(len(GEOMETRIES) + geometry[1])
    x, w, b, a = case(geometry, rng)
    y = qconv_transpose2d_ref(x, w, b, a)
    g = rng.standard_normal(y.shape).astype(np.float32)
    feeds = {"x": x, "w": w, "b": b, "g": g}
    ins = {k: new_value(TensorType(v.shape, str(v.dtype)), k) for k, v in feeds.items()}
    e = Emitter()
    geo = {k: a[k] for k in ("stride", "padding", "output_padding", "dilation", "groups")}
    scales = tuple(float(v) for v in np.float32(a["x_scale"]) * np.asarray(a["w_scales"], np.float32))
    outs = (e.emit("qconv_transpose2d", ins["x"], ins["w"], ins["b"], **a),
            e.emit("qconv_transpose2d", ins["x"], ins["w"], ins["b"], **{**a, "float_out": True}),
            e.emit("qconv_transpose2d_grad_input", ins["g"], ins["w"], input_shape=x.shape, w_scales=a["w_scales"],
                   **geo),
            e.emit("qconv_transpose2d_grad_weight", ins["x"], ins["g"], weight_shape=w.shape, scales=scales,
                   x_zero=a["x_zero"], **geo))
    names = ("y", "yf", "gx", "gw")
    graph = Graph(tuple(ins.values()), tuple(e.nodes), outs, names)
    want, _ = run_graph(graph, feeds)
    got = build_graph_library(graph)([feeds[k] for k in ins])
    for name, c in zip(names, got):
        assert c.dtype == want[name].dtype and np.array_equal(c, want[name]), name
    assert np.abs(want["gx"]).max() > 0 and np.abs(want["gw"]).max() > 0


class UpNet(torch.nn.Module):
    """Conv2d -> ConvTranspose2d -> ReLU -> Conv2d (the issue's model)."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 4, 3, stride=2, padding=1)
        self.up = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.c2 = torch.nn.Conv2d(6, 1, 3, padding=1)

    def forward(self, x):
        return self.c2(torch.relu(self.up(torch.relu(self.c1(x)))))


class TinyAE(torch.nn.Module):
    """An int8 conv-autoencoder whose decoder is transposed convolutions (the last one grouped,
    its float output the reconstruction)."""

    def __init__(self):
        super().__init__()
        self.enc = torch.nn.Conv2d(1, 4, 3, stride=2, padding=1)
        self.dec1 = torch.nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.dec2 = torch.nn.ConvTranspose2d(4, 1, (1, 3), padding=(0, 1))

    def forward(self, x):
        return self.dec2(torch.relu(self.dec1(torch.relu(self.enc(x)))))


SHAPE = (2, 1, 8, 8)


def _program(model, lr=0.05):
    torch.manual_seed(0)
    calib = np.random.default_rng(0).standard_normal((8,) + SHAPE[1:]).astype(np.float32)
    prog = et.compile(model, (torch.zeros(SHAPE),), loss="mse", quantize="int8", optimizer=et.SGD(lr=lr),
                      calibration=[calib])
    ops = {n.op for n in prog.train_graph.nodes}
    assert TRANSPOSED_OPS <= ops and "conv_transpose2d" not in ops
    assert "dequantize" not in {n.op for n in prog.forward_graph.nodes}  # int8 from the input to the output
    return prog


def _batches(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        out.append((x, x.copy()))
    return out


def test_the_relu_after_a_transposed_convolution_is_its_output_clamp():
    prog = _program(UpNet())
    (layer,) = [n for n in prog.forward_graph.nodes if n.op == "qconv_transpose2d"]
    assert layer.out.dtype == "int8" and not layer.attrs["float_out"]
    assert "qclamp" not in {n.op for n in prog.forward_graph.nodes}  # the ReLU is the clamp's lower bound
    assert layer.attrs["qmin"] == layer.attrs["y_zero"]


@pytest.mark.parametrize("model", [UpNet, TinyAE])
def test_int8_program_is_bit_exact_between_reference_and_c(model):
    from tests.backends.c.int8_harness import assert_c_trains_as_reference

    (one,) = _batches(1, 1)
    assert_c_trains_as_reference(_program(model()), one, _batches(3, 2))


class Up1d(torch.nn.Module):
    """A ConvTranspose1d: the frontend runs it as a 2-D one on a (C_in, C_out, 1, K) view of its weight."""

    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv1d(2, 4, 3, stride=2, padding=1)
        self.t = torch.nn.ConvTranspose1d(4, 3, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return self.t(torch.relu(self.c(x)))


def test_a_conv_transpose1d_is_int8_and_bit_exact_between_reference_and_c():
    from edgetrain.backends.c.host import to_c_program

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 2, 12)).astype(np.float32), rng.standard_normal((2, 3, 12)).astype(np.float32)
    prog = et.compile(Up1d(), (torch.zeros(x.shape),), loss="mse", quantize="int8", calibration=[x])
    assert "qconv_transpose2d" in {n.op for n in prog.forward_graph.nodes}
    cprog = to_c_program(prog)
    np.testing.assert_array_equal(cprog.predict(x), prog.predict(x))
    want, got = prog.gradients(x, y), cprog.gradients(x, y)
    assert want["t.weight"].shape == (4, 3, 3)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert prog.step(x, y) == cprog.step(x, y)
    for k in prog.state:
        np.testing.assert_array_equal(cprog.state[k], prog.state[k], err_msg=k)


def test_the_transposed_layers_integer_weights_train_and_the_loss_falls():
    prog = _program(TinyAE(), lr=0.2)
    before = {k: np.array(v, copy=True) for k, v in prog.state.items()}
    assert before["dec1.weight"].dtype == np.int8 and before["dec1.bias"].dtype == np.int32
    (x, y), = _batches(1, 4)
    losses = [prog.step(x, y) for _ in range(40)]
    for k in ("dec1.weight", "dec1.bias", "dec2.weight"):
        assert np.any(prog.state[k] != before[k]), k
    assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses
    # the trained integers go back to the float model on their row scales (one per group of dec1)
    layer = prog.compiled.quant_layers["dec1.weight"]
    rows = np.asarray(layer.row_scales, dtype=np.float32)
    assert len(rows) == 4 and len(layer.w_scales) == 4 and rows[0] == rows[1] == layer.w_scales[0]
    state = prog.state_dict()
    np.testing.assert_array_equal(np.asarray(state["dec1.weight"]),
                                  prog.state["dec1.weight"].astype(np.float32) * rows[:, None, None, None])
    TinyAE().load_state_dict(state)


def test_transposed_weights_take_one_scale_per_group_which_the_update_reads_per_row():
    w = np.random.default_rng(2).normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    w[2:] *= 5  # group 1 has the wider range
    w_int, scales, rows = quantize_transposed_weight(w, 2)
    assert scales.shape == (6,) and rows.shape == (4,)
    np.testing.assert_array_equal(scales, np.repeat(rows[::2], 3))  # output channels of a group share one
    assert np.abs(w_int[:2]).max() == np.abs(w_int[2:]).max() == 127 and rows[2] > 4 * rows[0]
    assert np.abs(w_int * rows[:, None, None, None] - w).max() <= rows.max() / 2 + 1e-7
    prog = _program(TinyAE())
    (layer,) = [n for n in prog.forward_graph.nodes if n.op == "qconv_transpose2d" and not n.attrs["float_out"]]
    updates = {n.outputs[0].name: n for n in prog.train_graph.nodes if n.op == "qsgd_update"}
    s_w = np.asarray(layer.attrs["w_scales"], dtype=np.float64)  # (4,): groups of 2 output channels
    qas_rows = np.repeat(s_w[::2] ** -2, 2)  # QAS: w_scale^-2 for each weight row (2 input channels a group)
    np.testing.assert_allclose(updates["dec1.weight"].attrs["scale"], qas_rows, rtol=1e-12)
    np.testing.assert_allclose(updates["dec1.bias"].attrs["scale"], (s_w * layer.attrs["x_scale"]) ** -2, rtol=1e-12)


def test_torch_compile_int8_runs_the_transposed_layers_and_reaches_their_parameters():
    torch.manual_seed(0)
    model, x = TinyAE(), torch.randn(SHAPE)
    y = torch.compile(model, backend="edgetrain", options={"quantize": "int8"})(x)
    with torch.no_grad():
        ref = model(x)
    assert float((y.detach() - ref).abs().max()) < 0.05 * float(ref.abs().max())
    torch.nn.functional.mse_loss(y, x).backward()
    for name in ("dec1.weight", "dec1.bias", "dec2.weight"):
        assert float(dict(model.named_parameters())[name].grad.abs().max()) > 0, name


def test_the_conv_autoencoder_family_keeps_its_transposed_convolutions_int8():
    from tests.realmodels.families import conv_autoencoder

    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((2, 1, 16, 16)).astype(np.float32)
    prog = et.compile(conv_autoencoder(), (torch.zeros(x.shape),), loss="mse", quantize="int8",
                      optimizer=et.SGD(lr=0.01), calibration=[x])
    fwd = [n.op for n in prog.forward_graph.nodes]
    assert fwd.count("qconv_transpose2d") == 2 and "conv_transpose2d" not in fwd
    assert TRANSPOSED_OPS <= {n.op for n in prog.train_graph.nodes}
    assert np.isfinite(prog.step(x, x))


def test_int8_autoencoder_on_cortex_m4_prints_the_host_builds_losses(tmp_path):
    from edgetrain.backends.c import cortexm

    from .test_cortexm import _host_step_lines

    if cortexm.missing_tools():
        pytest.skip(f"missing {', '.join(cortexm.missing_tools())}")
    prog = _program(TinyAE())
    data = _batches(3, 3)
    host = _host_step_lines(prog, data, tmp_path / "host")
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", data)
    assert fw.run.exit_code == 0, fw.run.lines
    assert len(host) == len(data) and list(fw.run.step_lines) == host
