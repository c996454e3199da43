"""runtime/et_int8.h et_qconv_host_kx: a kxk convolution (depthwise, dense or grouped) on a host CPU (x86,
aarch64) through phase planes, one long loop a (channel, tap, output channel). It must store what the reference
stores (ops/qconv.py qconv2d_ref) on every geometry it takes (kernels 1x1 to 7x7, not square too, strides 1 and
2, any padding up to the kernel, planes of one row or column, up to 8 input channels a group) and in every way
et_qconv_rows is called: a few output rows at a time from rings of input rows and into rings of output rows that
wrap within a call, a range of the output channels with the input and output buffers holding only the channels
that range reads and writes (xc_off, yo_off), int8 and float32 outputs. The harness streams each layer through
rings and checks the whole output against qconv2d_ref."""
from __future__ import annotations

import platform
import subprocess

import numpy as np
import pytest

from edgetrain.backends.c.emit import RUNTIME_DIR
from edgetrain.backends.c.host import find_cc
from edgetrain.ops.fixed_point import quantize_multiplier
from edgetrain.ops.qconv import qconv2d_ref

CASES = 240

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "et_int8.h"
static int rd(void) { int v; if (scanf("%d", &v) != 1) exit(3); return v; }
int main(void) {
    int cases = rd(), taken = 0;
    for (int k = 0; k < cases; k++) {
        const int n = rd(), c = rd(), h = rd(), w = rd(), o = rd(), groups = rd(), kh = rd(), kw = rd(), s = rd();
        const int ph = rd(), pw = rd(), ho = rd(), wo = rd(), xz = rd(), yz = rd(), fo = rd(), r = rd(), xcap = rd();
        const int ycap = rd(), o0 = rd(), o1 = rd(), cg = c / groups, opg = o / groups, nc = o1 - o0;
        /* the input channels the output range reads: its groups' */
        const int xa = (o0 / opg) * cg, xb = ((o1 - 1) / opg + 1) * cg, nx = xb - xa;
        int8_t *wt = malloc(o * cg * kh * kw), *x = malloc(n * c * h * w), *shift = malloc(o);
        int32_t *bias = malloc(4 * o), *mult = malloc(4 * o);
        float *osc = malloc(4 * o);
        for (int i = 0; i < o * cg * kh * kw; i++) wt[i] = (int8_t)rd();
        for (int i = 0; i < o; i++) { bias[i] = rd(); mult[i] = rd(); shift[i] = (int8_t)rd(); osc[i] = rd() / 65536.0f; }
        for (int i = 0; i < n * c * h * w; i++) x[i] = (int8_t)rd();
        et_qconv_p P = {n, c, h, w, o, cg, kh, kw, ho, wo, s, s, ph, pw, 1, 1, groups, xz, yz, -128, 127, 0, mult, shift, osc};
        taken += et_qconv_host_kx_ok(&P);
        const et_w8 W = {wt, 0, 0, 0, 0, 0, 0};
        /* rings: xcap input rows of nx channels, ycap output rows of nc channels */
        int8_t *xr = calloc(n * nx * xcap * w, 1), *yr = calloc(n * nc * ycap * wo, 1);
        float *yfr = calloc(n * nc * ycap * wo, 4);
        et_rows8 X = {xr, nx * xcap * w, xcap * w, xcap}, Y = {yr, nc * ycap * wo, ycap * wo, ycap};
        for (int r0 = 0, have = 0; r0 < ho; r0 += r) {
            const int r1 = r0 + r < ho ? r0 + r : ho;
            int need = (r1 - 1) * s - ph + kh;
            if (need > h) need = h;
            for (; have < need; have++) /* input row `have` into its ring slot */
                for (int b = 0; b < n; b++)
                    for (int q = 0; q < nx; q++)
                        memcpy(xr + b * X.nstride + q * X.cstride + (have % xcap) * w, x + ((b * c + xa + q) * h + have) * w, w);
            et_qconv_rows(&P, X, xa, &W, bias, Y, fo ? yfr : 0, o0, r0, r1, o0, o1);
            for (int b = 0; b < n; b++)
                for (int q = 0; q < nc; q++)
                    for (int t = r0; t < r1; t++)
                        for (int u = 0; u < wo; u++) {
                            const int at = b * Y.nstride + q * Y.cstride + (t % ycap) * wo + u;
                            if (fo) printf("%.9g ", yfr[at]); else printf("%d ", yr[at]);
                        }
        }
        printf("\n");
        free(wt); free(x); free(shift); free(bias); free(mult); free(osc); free(xr); free(yr); free(yfr);
    }
    fprintf(stderr, "host_kx %d\n", taken);
    return 0;
}
"""


def _case(rng, kind):
    kh, kw = (int(v) for v in rng.integers(1, 8, 2)) if rng.random() < 0.3 else (int(rng.choice([3, 3, 5, 7])),) * 2
    s = int(rng.integers(1, 3))
    ph, pw = int(rng.integers(0, kh)), int(rng.integers(0, kw))
    h = int(rng.integers(max(1, kh - 2 * ph), 40))
    w = int(rng.integers(max(1, kw - 2 * pw), 40)) if rng.random() < 0.8 else max(1, kw - 2 * pw)  # one column
    n = int(rng.integers(1, 3))
    if kind == "depthwise":
        c = o = groups = int(rng.integers(1, 7))
    elif kind == "dense":
        c, o, groups = int(rng.integers(1, 5)), int(rng.integers(1, 10)), 1
    else:  # grouped: 2 or 3 groups of up to 3 input and 4 output channels
        groups = int(rng.integers(2, 4))
        c, o = groups * int(rng.integers(1, 4)), groups * int(rng.integers(1, 5))
    ho, wo = (h + 2 * ph - kh) // s + 1, (w + 2 * pw - kw) // s + 1
    o0 = int(rng.integers(0, o))
    o1 = int(rng.integers(o0 + 1, o + 1))
    r = int(rng.integers(1, 5)) if rng.random() < 0.7 else ho  # a few rows a call, or all
    xcap = min(h, (r - 1) * s + kh + int(rng.integers(0, 3)))
    ycap = r + int(rng.integers(0, 3))
    ws = rng.uniform(0.002, 0.02, o)
    ms = [quantize_multiplier(float(0.05 * v / 0.08)) for v in ws]
    a = dict(stride=(s, s), padding=(ph, pw), dilation=(1, 1), groups=groups, x_zero=int(rng.integers(-20, 20)),
             x_scale=0.05, w_scales=tuple(float(v) for v in ws), y_zero=int(rng.integers(-10, 10)), qmin=-128,
             qmax=127, mult=tuple(m for m, _ in ms), shift=tuple(sh for _, sh in ms))
    if rng.random() < 0.2:
        a["float_out"] = True
    wt = rng.integers(-128, 128, (o, c // groups, kh, kw)).astype(np.int8)
    wt[rng.random(wt.shape) < 0.1] = 0  # zero taps, which the loops skip
    x = rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    return dict(a=a, w=wt, x=x, b=bias, geo=(n, c, h, w, o, groups, kh, kw, s, ph, pw, ho, wo), r=r, xcap=xcap,
                ycap=ycap, o=(o0, o1))


def _text(case) -> str:
    a = case["a"]
    o = case["geo"][4]
    head = [*case["geo"], a["x_zero"], a["y_zero"], int("float_out" in a), case["r"], case["xcap"], case["ycap"],
            *case["o"]]
    # the output scales (x_scale * w_scales, for float outputs) in steps of 1/65536 with x_scale 1: the text
    # gives the C exactly the float32 values the reference multiplies by
    steps = np.maximum(1, np.rint(np.asarray(a["w_scales"]) * 0.05 * 65536)).astype(np.int64)
    a["x_scale"], a["w_scales"] = 1.0, tuple(float(v) / 65536 for v in steps)
    rows = [case["w"].ravel(), *(np.array([case["b"][i], a["mult"][i], a["shift"][i], steps[i]]) for i in range(o)),
            case["x"].ravel()]
    return " ".join(str(int(v)) for v in head) + " " + " ".join(" ".join(str(int(v)) for v in r) for r in rows)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64", "i686"),
                    reason="et_qconv_host_kx is compiled on x86 and aarch64 only")
def test_host_kxk_convolution_stores_what_the_reference_stores(tmp_path):
    (tmp_path / "t.c").write_text(HARNESS)
    subprocess.run([find_cc(), "-std=gnu11", "-O3", "-march=native", "-Wall", "-Wno-unused-function",
                    "-Wno-unused-variable", f"-I{RUNTIME_DIR}", "-o", "t", "t.c"],
                   cwd=tmp_path, check=True, capture_output=True, text=True)
    rng = np.random.default_rng(0)
    cases = [_case(rng, ("depthwise", "dense", "grouped")[i % 3]) for i in range(CASES)]
    text = f"{CASES}\n" + "\n".join(_text(k) for k in cases) + "\n"
    run = subprocess.run([str(tmp_path / "t")], input=text, capture_output=True, text=True, check=True)
    lines = run.stdout.splitlines()
    assert len(lines) == CASES
    taken = int(run.stderr.split()[-1])
    assert taken >= CASES * 9 // 10, taken  # nearly every case takes the host path (the rest: planes too wide)
    wrapped = 0
    for case, line in zip(cases, lines):
        o0, o1 = case["o"]
        want = qconv2d_ref(case["x"], case["w"], case["b"], case["a"])[:, o0:o1]
        ho, r = case["geo"][11], case["r"]
        got_rows = np.array(line.split(), dtype=np.float64 if "float_out" in case["a"] else np.int64)
        parts, at = [], 0
        for r0 in range(0, ho, r):  # the harness prints each call's rows: image, channel, row, column
            r1 = min(r0 + r, ho)
            size = want.shape[0] * want.shape[1] * (r1 - r0) * want.shape[3]
            parts.append(got_rows[at:at + size].reshape(want.shape[0], want.shape[1], r1 - r0, want.shape[3]))
            at += size
            wrapped += r1 - r0 > 1 and (r0 % case["ycap"]) + (r1 - r0) > case["ycap"]
        got = np.concatenate(parts, axis=2)
        if "float_out" in case["a"]:
            np.testing.assert_array_equal(got.astype(np.float32), want, err_msg=str(case["geo"]))
        else:
            np.testing.assert_array_equal(got, want.astype(np.int64), err_msg=str(case["geo"]))
    assert wrapped >= 10, wrapped  # calls whose output rows wrap in the ring
