"""The float kernels of 3-D and adaptive pooling and upsampling (runtime/et_float_resample.h) in
a small model that trains in Cortex-M4 firmware under QEMU, printing the host build's losses
(and the reference runtime's, to float32 rounding); and their float64 instances against the
numpy reference, node by node. And a small int8 segmenter whose bilinear upsampling stays int8
(qupsample, ops/qresample_linear.py): bit-exact between the reference and the C build, and its
Cortex-M4 firmware prints the host build's losses."""
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import edgetrain as et
from edgetrain.backends.c import cortexm
from edgetrain.backends.c.graph_lib import build_graph_library
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import OPS, Emitter
from tests.backends.c.firmware_agreement import firmware_prints_host_steps

#: every op of et_float_resample.h (forward and backward)
RESAMPLE_OPS = {"max_pool3d", "max_pool3d_grad", "avg_pool3d", "avg_pool3d_grad", "adaptive_max_pool2d",
                "adaptive_max_pool2d_grad", "adaptive_avg_pool2d", "adaptive_avg_pool2d_grad", "upsample",
                "upsample_grad"}
#: max |C - reference| / max(|reference|, 1) of a float64 kernel
FLOAT64_TOL = 1e-12


class ResampleModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 5 * 3 + 4 * 3 * 4 + 2 * 3 * 4 * 4 + 4 * 4 * 4, 10)

    def forward(self, x):
        h = torch.tanh(self.conv(x))  # 1, 4, 8, 8
        a = F.adaptive_max_pool2d(F.interpolate(h, scale_factor=1.5, mode="bilinear"), (5, 3))
        b = F.adaptive_avg_pool2d(F.interpolate(h, size=(10, 9), mode="nearest"), (3, 4))
        v = h.reshape(1, 2, 2, 8, 8)
        c = F.max_pool3d(v, 2, stride=(1, 2, 2), padding=(1, 0, 0))
        d = F.avg_pool3d(v, 2, stride=(2, 2, 2), padding=1, count_include_pad=False)
        d = F.interpolate(d.reshape(1, 4, 5, 5), size=(4, 4), mode="bilinear", align_corners=True)
        return self.fc(torch.cat([t.flatten(1) for t in (a, b, c, d)], 1))


def test_resample_kernels_on_cortex_m_print_the_host_builds_losses(tmp_path):
    if cortexm.missing_tools() or shutil.which("make") is None:
        pytest.skip(f"missing {', '.join(cortexm.missing_tools()) or 'make'}")
    torch.manual_seed(0)
    shape = (1, 1, 8, 8)
    prog = et.compile(ResampleModel(), (torch.zeros(shape),), optimizer=et.SGD(lr=0.05))
    assert RESAMPLE_OPS <= {n.op for n in prog.train_graph.nodes}
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal(shape).astype(np.float32), np.array([i % 10])) for i in range(3)]
    fw = firmware_prints_host_steps(prog, data, tmp_path)
    # the kernels' stack use is fixed once their shapes are: a static bound exists and holds
    assert fw.size.stack_bound is not None and fw.run.stack_high_water <= fw.size.stack_bound
    np.testing.assert_allclose(fw.run.losses, [prog.step(x, y) for x, y in data], rtol=1e-5)


class Int8Segmenter(torch.nn.Module):
    """conv -> ReLU -> conv stride 2 -> bilinear upsampling x2 -> 1x1 conv: per-pixel logits,
    averaged over the pixels (a segmenter's loss as tests/realmodels/families.py's PixelMean)."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Conv2d(4, 6, 3, stride=2, padding=1)
        self.head = torch.nn.Conv2d(6, classes, 1)

    def forward(self, x):
        h = self.c2(F.relu(self.c1(x)))  # n, 6, 4, 4
        h = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)  # n, 6, 8, 8
        return self.head(h).mean((2, 3))


SEG_SHAPE = (2, 1, 8, 8)


def _int8_segmenter():
    torch.manual_seed(0)
    calib = np.random.default_rng(0).standard_normal((8,) + SEG_SHAPE[1:]).astype(np.float32)
    prog = et.compile(Int8Segmenter(), (torch.zeros(SEG_SHAPE),), quantize="int8", optimizer=et.SGD(lr=0.05),
                      calibration=[calib])
    nodes = prog.train_graph.nodes
    assert [n.attrs["mode"] for n in nodes if n.op == "qupsample"] == ["linear"]
    assert "qupsample_grad" in {n.op for n in nodes} and not [n for n in nodes if n.op == "upsample"]
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal(SEG_SHAPE).astype(np.float32), rng.integers(0, 4, SEG_SHAPE[0])) for _ in range(3)]
    return prog, data


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_int8_bilinear_segmenter_is_bit_exact_between_reference_and_c():
    from edgetrain.backends.c.host import to_c_program

    prog, data = _int8_segmenter()
    cprog = to_c_program(prog)
    x, y = data[0]
    np.testing.assert_array_equal(cprog.predict(x), prog.predict(x))
    want, got = prog.gradients(x, y), cprog.gradients(x, y)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_int8_bilinear_segmenter_on_cortex_m_prints_the_host_builds_losses(tmp_path):
    if cortexm.missing_tools() or shutil.which("make") is None:
        pytest.skip(f"missing {', '.join(cortexm.missing_tools()) or 'make'}")
    prog, data = _int8_segmenter()
    fw = firmware_prints_host_steps(prog, data, tmp_path)
    assert fw.run.exit_code == 0, fw.run.lines


def _node_graph(op: str, arrays: list, attrs: dict) -> Graph:
    ins = tuple(new_value(TensorType(a.shape, str(a.dtype)), f"a{i}") for i, a in enumerate(arrays))
    e = Emitter()
    out = e.emit(op, *ins, **attrs)
    return Graph(ins, tuple(e.nodes), (out,), ("y",))


def _float64_nodes():
    rng = np.random.default_rng(3)
    x5, x4 = rng.normal(size=(1, 2, 4, 5, 5)), rng.normal(size=(2, 3, 7, 6))
    pool3 = dict(kernel=(2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0))
    avg3 = dict(pool3, count_include_pad=False, divisor_override=0)
    adapt = dict(output_size=(3, 4))
    up = dict(mode="linear", size=(10, 9), scales=(1.5, 1.5), align_corners=False)
    near = dict(mode="nearest", size=(9, 13), scales=(0.0, 0.0), align_corners=False)
    y3 = OPS["max_pool3d"].ref([x5], dict(pool3, dilation=(1, 1, 1)))[0]
    ya = OPS["adaptive_max_pool2d"].ref([x4], adapt)[0]
    return [("max_pool3d", [x5], dict(pool3, dilation=(1, 1, 1))),
            ("max_pool3d_grad", [rng.normal(size=y3.shape), x5], dict(pool3, dilation=(1, 1, 1))),
            ("avg_pool3d", [x5], avg3),
            ("avg_pool3d_grad", [rng.normal(size=y3.shape)], dict(avg3, input_shape=x5.shape)),
            ("adaptive_avg_pool2d", [x4], adapt), ("adaptive_max_pool2d", [x4], adapt),
            ("adaptive_avg_pool2d_grad", [rng.normal(size=ya.shape)], dict(adapt, input_shape=x4.shape)),
            ("adaptive_max_pool2d_grad", [rng.normal(size=ya.shape), x4], adapt),
            ("upsample", [x4], up), ("upsample", [x4], near),
            ("upsample_grad", [rng.normal(size=(2, 3, 10, 9))], dict(up, input_shape=x4.shape)),
            ("upsample_grad", [rng.normal(size=(2, 3, 9, 13))], dict(near, input_shape=x4.shape))]


@pytest.mark.parametrize("op, arrays, attrs", _float64_nodes(), ids=lambda x: x if isinstance(x, str) else "")
def test_float64_instances_match_the_reference(op, arrays, attrs):
    (got,) = build_graph_library(_node_graph(op, arrays, attrs))(arrays)
    (want,) = OPS[op].ref(arrays, attrs)
    assert got.dtype == want.dtype == np.float64 and got.shape == want.shape
    assert float(np.abs(got - want).max() / max(np.abs(want).max(), 1.0)) <= FLOAT64_TOL
