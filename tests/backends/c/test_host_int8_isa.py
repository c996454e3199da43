"""The host's int8 kernels (runtime/et_int8.h and et_int8_grad.h under ET_INT8_HOST_PW) built for each
x86 instruction set they have a branch for, bit for bit against the reference.

The op harness (int8_harness.CFLAGS) builds for the compiler's default x86-64 target, where the
widenings take their portable form (`__builtin_convertvector`); the host library
(host.DEFAULT_CFLAGS, -march=native) takes the AVX-512 or AVX2 intrinsics where this CPU has them.
So that each branch runs somewhere whatever the CPU of the machine, these cases are built three
times: the harness's flags, -march=x86-64-v3 (AVX2) and -march=x86-64-v4 (AVX-512), the last two
where this CPU can run them. (aarch64's NEON branch runs in test_aarch64.py under qemu.)

The cases straddle the kernels' limits: the weight gradient of flat 1x1 layers with input channels
in whole and partial blocks of 16 and planes of whole and partial groups of 16 pixels; of kxk layers
(depthwise, dense in blocks of 1-4 rows) with kernels 3, 5, 7, 1x3 and 3x1, strides 1 and 2,
paddings 0-3, dilation (the tap loops' path), and padded planes at and just above 32768 floats
(et_gw_kx_host's stack plane: above it the tap loops take the layer); the forward of stride-2 kxk
layers whose phase rows end in whole and partial groups of 16; and the mask gradient of counts
around multiples of 16.
"""
from __future__ import annotations

import platform

import numpy as np
import pytest

from edgetrain.autodiff import ChannelSelect
from edgetrain.ops.qgradupdate import fuse_attrs as fuse_grad_update

from . import int8_harness
from .test_int8 import _conv_attrs, _f32, _i8, _update_attrs, check


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


X86 = platform.machine().lower() in ("x86_64", "amd64")
FLAGS = _cpu_flags()
ISAS = {"default": [], "avx2": ["-march=x86-64-v3"], "avx512": ["-march=x86-64-v4"]}
NEEDS = {"default": set(), "avx2": {"avx2", "fma", "bmi2"}, "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}


@pytest.fixture(params=list(ISAS))
def isa(request, monkeypatch):
    name = request.param
    if name != "default" and not (X86 and NEEDS[name] <= FLAGS):
        pytest.skip(f"this CPU cannot run {name} code")
    monkeypatch.setattr(int8_harness, "CFLAGS", int8_harness.CFLAGS + ISAS[name])
    return name


# (c, o, h, w, k (kh, kw), stride, padding, dilation, groups, rows, n)
GRAD_WEIGHT = [
    (5, 3, 4, 4, (1, 1), 1, 0, 1, 1, 1, 2),        # flat: one partial channel block, 16 pixels
    (16, 4, 5, 7, (1, 1), 1, 0, 1, 1, 4, 1),       # flat: a whole block, 35 pixels (a tail of 3)
    (19, 7, 6, 6, (1, 1), 1, 0, 1, 1, 4, 2),       # flat: a whole and a partial block, 4 + 3 rows
    (40, 6, 3, 3, (1, 1), 1, 0, 1, 1, 2, 1),       # flat: 9 pixels, all in the tail
    (3, 8, 9, 9, (3, 3), 2, 1, 1, 1, 4, 2),        # dense 3x3 stride 2 in blocks of 4 rows (the stem's form)
    (3, 6, 8, 8, (3, 3), 1, 1, 1, 1, 2, 1),        # dense 3x3 in blocks of 2
    (2, 3, 7, 7, (5, 5), 1, 2, 1, 1, 4, 1),        # dense 5x5: a block of 3 rows (the 4-row form)
    (6, 6, 9, 9, (3, 3), 1, 1, 1, 6, 1, 2),        # depthwise 3x3
    (6, 6, 11, 10, (5, 5), 2, 2, 1, 6, 1, 1),      # depthwise 5x5 stride 2
    (4, 4, 12, 12, (7, 7), 1, 3, 1, 4, 1, 1),      # depthwise 7x7
    (3, 5, 7, 9, (1, 3), 1, (0, 1), 1, 1, 4, 1),   # dense 1x3 (not flat), a block of 4 rows
    (4, 4, 9, 6, (3, 1), 2, (1, 0), 1, 4, 1, 1),   # depthwise 3x1 stride 2
    (4, 4, 9, 9, (3, 3), 1, 2, 2, 4, 1, 1),        # dilated: the tap loops
    (1, 1, 126, 254, (3, 3), 1, 1, 1, 1, 1, 1),    # padded plane 128 x 256 = 32768 floats: the plane path
    (1, 1, 126, 255, (3, 3), 1, 1, 1, 1, 1, 1),    # 128 x 257 floats: the tap loops
]


@pytest.mark.parametrize("case", GRAD_WEIGHT, ids=lambda c: f"c{c[0]}o{c[1]}_{c[2]}x{c[3]}_k{c[4]}s{c[5]}g{c[8]}r{c[9]}")
def test_grad_weight_update_on_each_isa(isa, case):
    c, o, h, w, k, s, p, d, groups, rows, n = case
    rng = np.random.default_rng(abs(hash(case)) % 2 ** 32)
    pad = p if isinstance(p, tuple) else (p, p)
    ho = (h + 2 * pad[0] - d * (k[0] - 1) - 1) // s + 1
    wo = (w + 2 * pad[1] - d * (k[1] - 1) - 1) // s + 1
    wt = _i8(rng, (o, c // groups) + k)
    x, g = _i8(rng, (n, c, h, w)), _f32(rng, (n, o, ho, wo))
    g[:, o // 2] = 0.0  # a row of zeros: skipped by the driver, the block made of the others
    geo = dict(stride=(s, s), padding=pad, dilation=(d, d), groups=groups)
    gw = dict(geo, weight_shape=wt.shape, x_zero=int(rng.integers(-20, 20)),
              scales=tuple(float(v) for v in rng.uniform(0.001, 0.01, o)))
    up = _update_attrs(rng, o, momentum=0.9, lr=1.0)
    feeds = {"x": x, "g": g, "step": np.array(0, np.int32)}
    state = {"w": wt, "m": np.zeros(wt.shape, np.float32)}
    check(lambda e, v: list(e.emit_multi("qconv2d_grad_weight_update", v["x"], v["g"], v["w"], v["step"], v["m"],
                                         **fuse_grad_update(gw, up), rows=rows)[:2]), feeds, state, steps=2)


# (c, o, hw, k, s, p, groups, n): stride-2 phase rows of 16k + r columns (r = 0, 1, 15) and fewer than 16
FORWARD = [(3, 8, 64, 3, 2, 1, 1, 1), (4, 4, 66, 3, 2, 1, 4, 2), (2, 2, 94, 5, 2, 2, 2, 1),
           (3, 5, 13, 3, 2, 0, 1, 2), (8, 8, 33, 7, 2, 3, 8, 1), (6, 6, 20, 3, 1, 1, 6, 1)]


@pytest.mark.parametrize("case", FORWARD, ids=lambda c: f"c{c[0]}o{c[1]}_{c[2]}_k{c[3]}s{c[4]}g{c[6]}")
def test_kxk_forward_on_each_isa(isa, case):
    c, o, hw, k, s, p, groups, n = case
    rng = np.random.default_rng(abs(hash(case)) % 2 ** 32)
    a = _conv_attrs(rng, o, k, s, p, groups)
    feeds = {"x": _i8(rng, (n, c, hw, hw))}
    state = {"w": _i8(rng, (o, c // groups, k, k)), "b": rng.integers(-3000, 3000, o).astype(np.int32)}
    check(lambda e, v: e.emit("qconv2d", v["x"], v["w"], v["b"], **a), feeds, state)


@pytest.mark.parametrize("count", [15, 16, 17, 48, 250])
def test_mask_gradient_on_each_isa(isa, count):
    rng = np.random.default_rng(count)
    y = _i8(rng, (count,))
    g = _f32(rng, (count,))
    g[::7] = -g[::7] * 0.0  # signed zeros through the mask

    def build(e, v):
        mask = e.emit("qmask_pack", v["y"], lo=-40, hi=60)
        return [mask, e.emit("qmask_grad", v["g"], mask)]
    check(build, {"y": y, "g": g}, bits=True)


def test_selected_input_channels_on_each_isa(isa):
    """A dense 1x1 weight split by input channel, 17 of its 20 trained (a whole and a partial block of 16
    lanes over the selected channels' inputs)."""
    rng = np.random.default_rng(9)
    c, o, hw = 20, 6, 6
    index = tuple(i for i in range(c) if i % 7 != 3)
    wt = _i8(rng, (o, c, 1, 1))
    x, g = _i8(rng, (1, c, hw, hw)), _f32(rng, (1, o, hw, hw))
    gw = dict(stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, weight_shape=(o, len(index), 1, 1),
              x_zero=5, scales=tuple(float(v) for v in rng.uniform(0.001, 0.01, o)))
    up = _update_attrs(rng, o, index, 1, momentum=0.9, lr=1.0)
    feeds = {"x": x[:, list(index)], "g": g, "step": np.array(0, np.int32)}
    state = {"w": wt, "m": np.zeros((o, len(index), 1, 1), np.float32)}
    check(lambda e, v: list(e.emit_multi("qconv2d_grad_weight_update", v["x"], v["g"], v["w"], v["step"], v["m"],
                                         **fuse_grad_update(gw, up), rows=4)[:2]), feeds, state,
          {"w": ChannelSelect(1, index)}, steps=2)
