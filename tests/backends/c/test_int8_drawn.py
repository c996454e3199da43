"""The int8 convolution kernels on hypothesis-drawn geometries: kernel sizes 1-7, strides 1-2,
padding 0-3, dilation 1-2, dense, grouped and depthwise, batch 1-3, odd and even sizes. The
forward (int8 out and float out) and every backward op (input gradient, depthwise input
gradient, weight gradient, bias gradient) of each drawn case are side by side in one graph,
built once as C (int8_harness.py) and compared bit for bit with the reference interpreter."""
from __future__ import annotations

import platform
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .int8_harness import CC, CFLAGS, RUNTIME, graph_of, run_c, run_ref
from .test_int8 import _conv_attrs, _f32, _i8, _same

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler")

#: cases per library (one C build holds them all)
CASES = 32


@st.composite
def geometry(draw):
    kind = draw(st.sampled_from(["dense", "grouped", "depthwise"]))
    groups = {"dense": 1, "grouped": draw(st.integers(2, 3)), "depthwise": draw(st.integers(2, 8))}[kind]
    cin = 1 if kind == "depthwise" else draw(st.integers(1, 3))  # per group
    cout = 1 if kind == "depthwise" else draw(st.integers(1, 3))  # per group
    k, s, p, d = draw(st.integers(1, 7)), draw(st.integers(1, 2)), draw(st.integers(0, 3)), draw(st.integers(1, 2))
    lo = max(1, d * (k - 1) + 1 - 2 * p)
    hw = draw(st.integers(lo, lo + 8))
    n = draw(st.integers(1, 3))
    return dict(c=groups * cin, o=groups * cout, hw=hw, k=k, s=s, p=p, groups=groups, d=d, n=n,
                float_out=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 31)))


def _case_nodes(e, v, i, g):
    """qconv2d and its backward ops of case i, reading inputs x{i}, w{i}, b{i}, g{i}."""
    rng = np.random.default_rng(g["seed"])
    a = _conv_attrs(rng, g["o"], g["k"], g["s"], g["p"], g["groups"], g["d"], g["float_out"])
    geo = dict(stride=a["stride"], padding=a["padding"], dilation=a["dilation"], groups=g["groups"])
    scales = tuple(float(np.float32(0.05 * w)) for w in a["w_scales"])
    x, w, b, gy = v[f"x{i}"], v[f"w{i}"], v[f"b{i}"], v[f"g{i}"]
    outs = [e.emit("qconv2d", x, w, b, **a)]
    shape = (g["n"], g["c"], g["hw"], g["hw"])
    outs.append(e.emit_multi("qconv2d_grad_input", gy, w, input_shape=shape, w_scales=a["w_scales"], **geo)[0])
    if g["groups"] == g["c"] == g["o"]:
        outs.append(e.emit_multi("qconv2d_dw_grad_input", gy, w, input_shape=shape, w_scales=a["w_scales"], **geo)[0])
    outs.append(e.emit("qconv2d_grad_weight", x, gy, weight_shape=tuple(w.shape), scales=scales, x_zero=a["x_zero"],
                       **geo))
    outs.append(e.emit("qconv2d_grad_bias", gy, scales=scales))
    return outs


def _arrays(i, g):
    rng = np.random.default_rng(g["seed"] + 1)
    ho = (g["hw"] + 2 * g["p"] - g["d"] * (g["k"] - 1) - 1) // g["s"] + 1
    feeds = {f"x{i}": _i8(rng, (g["n"], g["c"], g["hw"], g["hw"])), f"g{i}": _f32(rng, (g["n"], g["o"], ho, ho))}
    state = {f"w{i}": _i8(rng, (g["o"], g["c"] // g["groups"], g["k"], g["k"])),
             f"b{i}": rng.integers(-3000, 3000, g["o"]).astype(np.int32)}
    return feeds, state


def drawn_geometries() -> list[dict]:
    """CASES geometries drawn by hypothesis (derandomized: the same ones on every run)."""
    out = []

    @settings(max_examples=CASES, deadline=None, derandomize=True, database=None)
    @given(geometry())
    def collect(g):
        out.append(g)

    collect()
    return out


def _bit_exact(geos: list[dict]) -> None:
    """Every case of `geos` side by side in one C build: its outputs and state equal the reference's."""
    feeds, state = {}, {}
    for i, g in enumerate(geos):
        f, s = _arrays(i, g)
        feeds.update(f)
        state.update(s)

    def build(e, v):
        return [o for i, g in enumerate(geos) for o in _case_nodes(e, v, i, g)]

    graph = graph_of(build, {**feeds, **state})
    got_out, got_state = run_c(graph, feeds, state, {})
    want_out, want_state = run_ref(graph, feeds, state)
    _same(got_out, {k: v for k, v in want_out.items() if k in got_out})
    _same(got_state, want_state)


def test_drawn_conv_geometries_bit_exact():
    geos = drawn_geometries()
    kinds = {("depthwise" if g["groups"] == g["c"] == g["o"] else "grouped" if g["groups"] > 1 else "dense")
             for g in geos}
    assert len(kinds) >= 2 and len({g["k"] for g in geos}) >= 3  # the draw spans geometries
    _bit_exact(geos)


#: dense 1x1 layers at stride 1 without padding: on an x86 or aarch64 host, runtime/et_int8.h's
#: et_qconv_host_pw takes their rows (ET_HOST_OB = 4 output channels at a time, up to ET_HOST_PLANE = 256
#: outputs a channel in whole rows): blocks of 4 with a remainder (5, 9, 6 channels) and without (4),
#: one chunk of rows (16x16: exactly 256) and several with a shorter last one (23x23: 11 + 11 + 1 rows;
#: 40x40: 6 rows a chunk), batches of 1-3, int8 and float outputs
HOST_POINTWISE = [dict(c=3, o=5, hw=23, n=2, float_out=False), dict(c=7, o=9, hw=17, n=1, float_out=True),
                  dict(c=2, o=4, hw=16, n=3, float_out=False), dict(c=5, o=6, hw=40, n=1, float_out=False),
                  dict(c=4, o=8, hw=3, n=2, float_out=True)]


def test_pointwise_rows_of_the_host_path_bit_exact():
    if platform.machine().lower() in ("x86_64", "amd64", "aarch64", "arm64"):  # the build below takes the path
        r = subprocess.run([CC, *CFLAGS, f"-I{RUNTIME}", "-dM", "-E", "-x", "c", "-"], input='#include "et_int8.h"\n',
                           capture_output=True, text=True, check=True)
        assert "#define ET_INT8_HOST_PW 1" in r.stdout.splitlines()
    _bit_exact([dict(g, k=1, s=1, p=0, d=1, groups=1, seed=100 + i) for i, g in enumerate(HOST_POINTWISE)])
