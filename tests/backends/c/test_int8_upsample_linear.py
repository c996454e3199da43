"""int8 linear (1-D) and bilinear (2-D) upsampling (qupsample in mode "linear",
ops/qresample_linear.py): the integer reference within one level of torch's float bilinear on
the dequantized input, its C kernel (runtime/et_int8_resample.h) equal to it bit for bit on
drawn cases of the op table and on hand-picked ones (align_corners both ways, scale factors and
sizes, odd sizes, rounding ties), the straight-through gradient against torch.autograd, and the
int8 program of a segmenter with bilinear upsampling keeping it int8."""
from __future__ import annotations

import shutil
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.backends.c.graph_lib import build_graph_library
from edgetrain.interpreter import run_graph
from edgetrain.ir import Graph, TensorType, new_value
from edgetrain.ops import OPS, Emitter
from edgetrain.ops.qresample_linear import ONE, WEIGHT_BITS, exact_scale, fixed_axis_map
import tests.ops.cases  # noqa: F401  (it merges cases_resample's table: imported first)
from tests.ops.cases_resample import torch_upsample, upsample_case

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)
LINEAR = upsample_case(modes=("linear",), largest=7)
#: cases drawn into one C library (one build)
DRAWN_CASES = 40
#: |level of the int8 output - torch's float bilinear on the dequantized input, in levels|:
#: the output's rounding (0.5) plus the weights' (2^-(F+1) x 255 levels per dim)
LEVEL_TOL = 0.5 + 2 * 255 / 2 ** (WEIGHT_BITS + 1)
#: the gradient against torch.autograd, relative to its largest magnitude
GRAD_RTOL = 1e-6

#: hand-picked (input shape, attrs): both align_corners, scale factors and sizes, 1-D and 2-D,
#: odd sizes, downsampling, out == in, out == 1
HAND_CASES = [
    ((2, 3, 5, 7), dict(size=(9, 13), scales=(0.0, 0.0), align_corners=False)),
    ((2, 3, 5, 7), dict(size=(9, 13), scales=(0.0, 0.0), align_corners=True)),
    ((1, 2, 5, 5), dict(size=(7, 8), scales=(1.5, 1.7), align_corners=False)),
    ((1, 2, 3, 4), dict(size=(6, 8), scales=(2.0, 2.0), align_corners=False)),
    ((1, 2, 3, 4), dict(size=(6, 8), scales=(2.0, 2.0), align_corners=True)),
    ((1, 1, 7, 6), dict(size=(5, 6), scales=(0.0, 0.0), align_corners=False)),
    ((1, 1, 7, 6), dict(size=(1, 3), scales=(0.0, 0.0), align_corners=True)),
    ((2, 2, 7), dict(size=(17,), scales=(2.5,), align_corners=False)),
    ((2, 3, 5), dict(size=(11,), scales=(0.0,), align_corners=True)),
    ((1, 1, 9), dict(size=(4,), scales=(0.0,), align_corners=False)),
]


def _levels(rng, shape):
    x = rng.integers(-128, 128, shape).astype(np.int8)
    flat = x.reshape(-1)
    flat[:4] = (-128, 127, -128, 127)[:flat.size]  # the extremes side by side: the largest steps
    return x


@SETTINGS
@given(case=LINEAR, seed=st.integers(0, 2 ** 16), scale=st.floats(1e-3, 1.0), zero=st.integers(-128, 127))
def test_reference_is_within_one_level_of_torchs_float_bilinear(case, seed, scale, zero):
    (arg,), attrs = case
    attrs = dict(attrs, mode="linear")
    x = _levels(np.random.default_rng(seed), arg.shape)
    (y,) = OPS["qupsample"].ref([x], attrs)
    real = torch.from_numpy((np.float32(scale) * (x.astype(np.float32) - np.float32(zero))))
    want = torch_upsample([real], attrs).numpy() / np.float32(scale) + zero  # in levels, the same zero point
    assert y.dtype == np.int8 and y.shape == want.shape
    assert float(np.abs(y - want.astype(np.float64)).max()) <= LEVEL_TOL


@SETTINGS
@given(size_in=st.integers(1, 12), size_out=st.integers(1, 25), align=st.booleans(),
       scale=st.sampled_from([0.0, 0.5, 0.75, 1.5, 1.7, 2.0, 2.5, 3.0]))
def test_weights_are_the_exact_coordinates_rounded(size_in, size_out, align, scale):
    """l1 = round(frac * 2^F) of the exact source coordinate, l0 + l1 = 2^F, indices in range."""
    m = fixed_axis_map(size_in, size_out, scale, align)
    assert np.all(m.l0 + m.l1 == ONE) and np.all(m.l0 >= 0) and np.all(m.l1 >= 0)
    assert np.all((0 <= m.i0) & (m.i0 <= m.i1) & (m.i1 < size_in)) and np.all(m.i1 - m.i0 <= 1)
    if size_out == size_in:
        return
    s = exact_scale(size_in, size_out, scale, align)
    for dst in range(size_out):
        real = s * dst if align else max(s * (dst + Fraction(1, 2)) - Fraction(1, 2), Fraction(0))
        real = min(real, Fraction(size_in - 1))  # past the last pixel: the last pixel
        got = Fraction(int(m.i0[dst]) * ONE + int(m.l1[dst]) * (m.i1[dst] - m.i0[dst]), ONE)
        assert abs(got - real) <= Fraction(1, 2 * ONE), (dst, got, real)


def test_rounding_is_half_away_from_zero():
    """Ties: in 2, out 3, align_corners -> the middle output weighs both taps 1/2."""
    x = np.array([[[0, 1], [0, -1], [-128, 127], [126, 127], [-3, -2]]], np.int8)
    (y,) = OPS["qupsample"].ref([x], dict(mode="linear", size=(3,), scales=(0.0,), align_corners=True))
    np.testing.assert_array_equal(y[..., 1], [[1, -1, -1, 127, -3]])  # 0.5, -0.5, -0.5, 126.5, -2.5


def _graph_of(cases, rng):
    """Each case's qupsample and qupsample_grad side by side in one graph: (graph, feeds)."""
    e, ins, outs, feeds = Emitter(), [], [], {}
    for i, (shape, attrs) in enumerate(cases):
        x = _levels(rng, shape)
        up_shape = shape[:len(shape) - len(attrs["size"])] + tuple(attrs["size"])
        g = rng.standard_normal(up_shape).astype(np.float32)
        xv, gv = new_value(TensorType(shape, "int8"), f"x{i}"), new_value(TensorType(up_shape, "float32"), f"g{i}")
        outs += [e.emit("qupsample", xv, **attrs), e.emit("qupsample_grad", gv, input_shape=shape, **attrs)]
        ins += [xv, gv]
        feeds.update({f"x{i}": x, f"g{i}": g})
    names = tuple(f"y{j}" for j in range(len(outs)))
    return Graph(tuple(ins), tuple(e.nodes), tuple(outs), names), feeds


def _drawn_cases() -> list:
    cases = []

    @settings(max_examples=DRAWN_CASES, deadline=None, derandomize=True, database=None)
    @given(LINEAR)
    def collect(case):
        (arg,), attrs = case
        cases.append((arg.shape, dict(attrs, mode="linear")))

    collect()
    return cases


def _assert_c_equals_reference(cases, seed):
    graph, feeds = _graph_of(cases, np.random.default_rng(seed))
    want, _ = run_graph(graph, feeds)
    got = build_graph_library(graph)([feeds[v.name] for v in graph.inputs])
    for name, c in zip(graph.output_names, got):
        assert c.dtype == want[name].dtype and np.array_equal(c, want[name]), name


@needs_cc
def test_kernel_equals_the_reference_on_hand_picked_cases():
    _assert_c_equals_reference([(s, dict(a, mode="linear")) for s, a in HAND_CASES], 0)


@needs_cc
def test_kernel_equals_the_reference_on_drawn_op_table_cases():
    _assert_c_equals_reference(_drawn_cases(), 1)


@pytest.mark.parametrize("shape, attrs", HAND_CASES)
def test_gradient_matches_torch_autograd(shape, attrs):
    """qupsample's VJP (qupsample_grad: torch's float32 weights, the straight-through estimator)
    against torch.autograd of F.interpolate on the dequantized input."""
    attrs = dict(attrs, mode="linear")
    rng = np.random.default_rng(len(shape))
    x = _levels(rng, shape)
    xv = new_value(TensorType(shape, "int8"), "x")
    e = Emitter()
    y = e.emit("qupsample", xv, **attrs)
    g = rng.standard_normal(y.shape).astype(np.float32)
    gv = new_value(TensorType(y.shape, "float32"), "g")
    (gx,) = OPS["qupsample"].vjp(e, e.nodes[-1], [gv], [True])
    assert e.nodes[-1].op == "qupsample_grad"
    graph = Graph((xv, gv), tuple(e.nodes), (gx,), ("gx",))
    got = run_graph(graph, {"x": x, "g": g})[0]["gx"]
    t = torch.tensor(0.05 * (x.astype(np.float32) - 3), requires_grad=True)
    torch_upsample([t], attrs).backward(torch.from_numpy(g))
    want = t.grad.numpy()
    assert got.dtype == np.float32 and got.shape == want.shape
    assert float(np.abs(got - want).max()) <= GRAD_RTOL * max(float(np.abs(want).max()), 1e-30)


def test_the_int8_unet_keeps_its_bilinear_upsampling_int8():
    """tests/realmodels/families.py's seg.unet (nn.Upsample bilinear between int8 layers)."""
    import edgetrain as et
    from tests.realmodels.families import FAMILIES, SEG_IMAGE

    torch.manual_seed(0)
    fam = FAMILIES["seg.unet"]
    model = fam.make().float()
    calib = np.random.default_rng(0).standard_normal(SEG_IMAGE).astype(np.float32)
    prog = et.compile(model, (torch.zeros(SEG_IMAGE),), quantize="int8", optimizer=et.SGD(lr=0.01),
                      calibration=[calib])
    nodes = prog.train_graph.nodes
    linear = [n for n in nodes if n.op == "qupsample" and n.attrs["mode"] == "linear"]
    assert len(linear) == 1 and linear[0].inputs[0].dtype == "int8"
    assert not [n for n in nodes if n.op == "upsample"]
