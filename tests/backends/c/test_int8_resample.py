"""int8 nearest upsampling, adaptive and 3-D max pooling (ops/qresample.py): they stay int8 in the
int8 graph on their input's scale, their C kernels (runtime/et_int8_resample.h) equal the
reference bit for bit (op by op, and a whole int8 program's predictions, gradients and steps),
and the program trains in Cortex-M4 firmware under QEMU printing the host build's losses."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import edgetrain as et
from edgetrain.backends.c.graph_lib import build_graph_library
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import Emitter

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")

#: (input shape, upsample attrs, adaptive output size) of the op-by-op cases
OP_CASES = [
    ((2, 3, 4, 5), dict(mode="nearest", size=(9, 7), scales=(0.0, 0.0), align_corners=False), (3, 2)),
    ((1, 2, 5, 5), dict(mode="nearest", size=(7, 7), scales=(1.5, 1.5), align_corners=False), (4, 3)),
    ((1, 2, 4, 6), dict(mode="nearest_exact", size=(6, 9), scales=(1.5, 1.5), align_corners=False), (5, 5)),
    ((2, 2, 7), dict(mode="nearest", size=(17,), scales=(2.5,), align_corners=False), (2, 3)),
]


@pytest.mark.parametrize("shape, up, out", OP_CASES)
def test_kernels_equal_the_reference_bit_for_bit(shape, up, out):
    rng = np.random.default_rng(len(shape) + out[0])
    x = rng.integers(-128, 128, shape).astype(np.int8)
    x.reshape(-1, *shape[-2:])[0, :2] = 7  # ties: the first maximum takes the gradient
    up_shape = shape[:len(shape) - len(up["size"])] + up["size"]
    feeds = {"x": x, "gu": rng.standard_normal(up_shape).astype(np.float32),
             "gp": rng.standard_normal(shape[:-2] + out).astype(np.float32)}
    ins = {k: new_value(TensorType(a.shape, str(a.dtype)), k) for k, a in feeds.items()}
    e = Emitter()
    outs = (e.emit("qupsample", ins["x"], **up), e.emit("qupsample_grad", ins["gu"], input_shape=shape, **up),
            e.emit("qadaptive_max_pool2d", ins["x"], output_size=out),
            e.emit("qadaptive_max_pool2d_grad", ins["gp"], ins["x"], output_size=out))
    names = tuple(f"y{i}" for i in range(len(outs)))
    g = Graph(tuple(ins.values()), tuple(e.nodes), outs, names)
    want, _ = run_graph(g, feeds)
    got = build_graph_library(g)([feeds[k] for k in ins])
    for name, c in zip(names, got):
        assert c.dtype == want[name].dtype and np.array_equal(c, want[name]), name


#: (input shape, 3-D max pool attrs) of the op-by-op cases
POOL3_CASES = [
    ((1, 2, 4, 5, 5), dict(kernel=(2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), dilation=(1, 1, 2))),
    ((2, 1, 3, 4, 4), dict(kernel=(2, 2, 2), stride=(2, 2, 2), padding=(0, 0, 0), dilation=(1, 1, 1))),
]


@pytest.mark.parametrize("shape, attrs", POOL3_CASES)
def test_max_pool3d_kernels_equal_the_reference_bit_for_bit(shape, attrs):
    rng = np.random.default_rng(shape[0])
    x = rng.integers(-128, 128, shape).astype(np.int8)
    x[0, 0, :2] = -5  # ties: the first maximum takes the gradient
    xv = new_value(TensorType(shape, "int8"), "x")
    e = Emitter()
    y = e.emit("qmax_pool3d", xv, **attrs)
    g = rng.standard_normal(y.shape).astype(np.float32)
    gv = new_value(TensorType(y.shape, "float32"), "g")
    gx = e.emit("qmax_pool3d_grad", gv, xv, **attrs)
    graph = Graph((xv, gv), tuple(e.nodes), (y, gx), ("y", "gx"))
    want, _ = run_graph(graph, {"x": x, "g": g})
    got = build_graph_library(graph)([x, g])
    for name, c in zip(("y", "gx"), got):
        assert c.dtype == want[name].dtype and np.array_equal(c, want[name]), name


class UpPoolNet(torch.nn.Module):
    """conv -> ReLU -> nearest upsampling -> conv -> 3-D max pooling (channels as depth) ->
    adaptive max pooling (overlapping windows) -> linear"""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.Conv2d(4, 6, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(8 * 2 * 2, 10)

    def forward(self, x):
        n = x.shape[0]
        h = F.interpolate(F.relu(self.c1(x)), scale_factor=1.5, mode="nearest")  # n, 4, 9, 9
        h = F.relu(self.c2(h)).reshape(n, 2, 3, 5, 5)
        h = F.max_pool3d(h, 2, stride=(1, 2, 2), padding=1).reshape(n, 8, 3, 3)
        h = F.adaptive_max_pool2d(h, (2, 2))
        return self.fc(h.flatten(1))


SHAPE = (2, 1, 6, 6)


def _program():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    calib = rng.standard_normal((8,) + SHAPE[1:]).astype(np.float32)
    prog = et.compile(UpPoolNet(), (torch.zeros(SHAPE),), quantize="int8", optimizer=et.SGD(lr=0.05),
                      calibration=[calib])
    ops = {n.op for n in prog.train_graph.nodes}
    assert {"qupsample", "qupsample_grad", "qadaptive_max_pool2d", "qadaptive_max_pool2d_grad", "qmax_pool3d",
            "qmax_pool3d_grad"} <= ops
    assert not {"upsample", "adaptive_max_pool2d", "max_pool3d"} & ops  # no float layer left in the int8 graph
    return prog


def _batches(n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(SHAPE).astype(np.float32), rng.integers(0, 10, SHAPE[0])) for _ in range(n)]


def test_int8_program_is_bit_exact_between_reference_and_c():
    from tests.backends.c.int8_harness import assert_c_trains_as_reference

    (one,) = _batches(1, 1)
    assert_c_trains_as_reference(_program(), one, _batches(3, 2))


def test_int8_program_on_cortex_m4_prints_the_host_builds_losses(tmp_path):
    from edgetrain.backends.c import cortexm

    from .test_cortexm import _host_step_lines

    if cortexm.missing_tools():
        pytest.skip(f"missing {', '.join(cortexm.missing_tools())}")
    prog = _program()
    data = _batches(3, 3)
    host = _host_step_lines(prog, data, tmp_path / "host")
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", data)
    assert fw.run.exit_code == 0, fw.run.lines
    assert len(host) == len(data) and list(fw.run.step_lines) == host
