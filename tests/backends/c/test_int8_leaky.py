"""Leaky ReLU on int8 data (ops/qpointwise.py): the reference against the real function, its C
kernels (runtime/et_int8_pointwise.h) bit for bit against the reference, an int8 program whose
leaky ReLU runs as qleaky_relu (forward and backward) trained bit-exactly by the host C build,
and the same program in Cortex-M4 firmware under QEMU printing the host build's losses."""
from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest
import torch

import edgetrain as et
from edgetrain.ops import OPS, WHOLE
from edgetrain.ops.qpointwise import MASK_NO_UPPER, qleaky_relu_ref, slope_multiplier

from .int8_harness import RUNTIME, graph_of, run_c, run_ref
from .test_int8 import _same, train_both

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler")
SLOPES = (0.01, 0.1, 0.2, 1 / 3, 0.5, 0.99)


def _all_levels():
    return np.arange(-128, 128, dtype=np.int8)


@pytest.mark.parametrize("slope", SLOPES)
@pytest.mark.parametrize("zero", [-128, -37, 0, 5, 127])
def test_reference_is_the_real_leaky_relu_within_half_a_level(slope, zero):
    """(x - zero) slope rounded to a level: half a level, plus the first rounding of TFLite's two
    (the high multiply's, to 2^shift of a level, before the rounding shift)."""
    _, shift = slope_multiplier(slope)
    x = _all_levels()
    got = qleaky_relu_ref(x, dict(zero=zero, negative_slope=slope)).astype(np.int64) - zero
    d = x.astype(np.int64) - zero
    want = np.where(d > 0, d, d * slope)
    assert np.abs(got - want).max() <= 0.5 + 0.5 * 2.0**shift + 1e-6
    assert np.array_equal(got > 0, d > 0)  # the sign the backward's mask reads


@pytest.mark.parametrize("slope", [0.0, 1.0, -0.2, 1.5])
def test_a_slope_outside_zero_one_is_refused(slope):
    with pytest.raises(ValueError, match="negative slope"):
        slope_multiplier(slope)


def test_the_backward_passes_the_gradient_above_the_zero_point_and_scales_it_below():
    """torch's leaky_relu backward on the real values: g where x > 0, g * slope elsewhere (at 0 too)."""
    rng = np.random.default_rng(5)
    zero, slope = -20, 0.2
    feeds = {"x": _all_levels(), "g": rng.standard_normal(256).astype(np.float32)}

    def build(e, v):
        e.emit("qleaky_relu", v["x"], zero=zero, negative_slope=slope)
        (gx,) = OPS["qleaky_relu"].vjp(e, e.nodes[-1], [v["g"]], [WHOLE])
        return [gx]

    got, _ = run_ref(graph_of(build, feeds), feeds, {})
    want = np.where(feeds["x"].astype(np.int64) > zero, feeds["g"], feeds["g"] * np.float32(slope))
    np.testing.assert_array_equal(got["out0"], want)


def _with_my_header(monkeypatch):
    """The harness's C build with et_int8_pointwise.h included (its text in the cache key)."""
    from . import int8_harness

    build = int8_harness.build
    header = RUNTIME / "et_int8_pointwise.h"
    prefix = f"/* {hashlib.sha256(header.read_bytes()).hexdigest()} */\n#include \"{header.name}\"\n"
    monkeypatch.setattr(int8_harness, "build", lambda source, extra_flags=(): build(prefix + source, extra_flags))


@pytest.mark.parametrize("slope, zero", [(0.01, 0), (0.1, -37), (1 / 3, 5), (0.99, 120), (0.2, -128)])
def test_c_kernels_equal_the_reference_bit_for_bit(slope, zero, monkeypatch):
    _with_my_header(monkeypatch)
    rng = np.random.default_rng(int(slope * 1000) + zero)
    x = np.concatenate([_all_levels(), rng.integers(-128, 128, 101).astype(np.int8)]).reshape(3, 7, 17)
    feeds = {"x": x, "g": rng.standard_normal(x.shape).astype(np.float32)}

    def build(e, v):
        y = e.emit("qleaky_relu", v["x"], zero=zero, negative_slope=slope)
        mask = e.emit("qmask_pack", y, lo=zero, hi=MASK_NO_UPPER)
        return [y, mask, e.emit("qleaky_relu_grad", v["g"], mask, negative_slope=slope)]

    g = graph_of(build, feeds)
    got, _ = run_c(g, feeds, {})
    want, _ = run_ref(g, feeds, {})
    _same(got, want)


class _LeakyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.act = torch.nn.LeakyReLU(0.1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, stride=2)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        h = self.act(self.conv(x))
        h = torch.nn.functional.leaky_relu(self.conv2(h), 0.2)
        return self.fc(h.mean((2, 3)))


SHAPE = (2, 3, 8, 8)


def _int8_program():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    calib = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2)]
    prog = et.compile(_LeakyNet(), (torch.zeros(SHAPE),), quantize="int8", calibration=calib,
                      optimizer=et.SGD(lr=0.05))
    data = [(rng.standard_normal(SHAPE).astype(np.float32), rng.integers(0, 10, SHAPE[0])) for _ in range(3)]
    return prog, data


def test_int8_program_runs_leaky_relu_on_int8_and_trains_bit_exact_in_c():
    prog, data = _int8_program()
    ops = [n.op for n in prog.train_graph.nodes]
    assert ops.count("qleaky_relu") == 2 and "leaky_relu" not in ops
    assert "qleaky_relu_grad" in ops  # the backward reaches through both activations
    train_both(prog, data)


def test_int8_leaky_relu_in_cortex_m4_firmware_prints_the_host_builds_losses(tmp_path):
    from edgetrain.backends.c import cortexm

    from .test_cortexm import _host_step_lines

    if cortexm.missing_tools() or shutil.which("make") is None:
        pytest.skip(f"missing {', '.join(cortexm.missing_tools()) or 'make'}")
    prog, data = _int8_program()
    host = _host_step_lines(prog, data, tmp_path / "host")
    fw = cortexm.run_firmware(prog, tmp_path / "m4", "cortex-m4", data)
    assert fw.run.exit_code == 0, fw.run.lines
    assert len(host) == len(data) and list(fw.run.step_lines) == host
    np.testing.assert_allclose(fw.run.losses, [prog.step(x, y) for x, y in data], rtol=1e-5)

