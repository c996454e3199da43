"""The Cortex-M DSP paths of et_qconv_rows (runtime/et_int8_dsp.h: the column GEMM of pointwise
and dense convs and the 32-bit requantization; et_int8_dw.h: the padded-row depthwise kernel; built where
__ARM_FEATURE_DSP is defined) against the reference qconv2d, bit for bit, under QEMU on the
Cortex-M4 and M7.

A firmware whose model.c runs et_qconv_rows on embedded cases and prints each output's bytes
as hex lines; the cases have odd channel and pixel counts (the 2-channel x 2-pixel block's and
the 4-input group's remainders), padded edges, 5x5 and 7x7 taps (two words per tap row),
strides, channel and row sub-ranges (the fused and streamed callers), weights split by output
or input channel, a float output and accumulators that saturate with the bias (the general
requantization path). The same firmware runs et_qadd on its 32-bit path (each input shifted or
not) and on the general one, and et_qmask_pack four levels a word."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgetrain.backends.c import cortexm
from edgetrain.backends.c.kernels.int8_params import pack_requant, packable
from edgetrain.ops.fixed_point import quantize_multiplier
from edgetrain.ops.qelementwise import qadd_attrs, qadd_ref
from edgetrain.ops.qconv import qconv2d_ref

RUNTIME = Path(__file__).resolve().parents[3] / "src" / "edgetrain" / "backends" / "c" / "runtime"
FIXTURE = Path(__file__).parent / "cortexm_fixture"

pytestmark = pytest.mark.skipif(bool(cortexm.missing_tools()),
                                reason=f"missing {', '.join(cortexm.missing_tools())}")

# (name, n, c, h, w, o, k, stride, pad, groups, float_out, how the kernel is called)
# "whole": one call (et_qconv_whole); "per_channel": one output channel per call (qconv2d_pw_dw);
# "per_row": one output row per call (qstream); "split0"/"split1": the weight split in two
# arrays by output / input channel; "narrow": an output range narrower than int8 (the general
# requantization path); "saturate": a bias at the ends of int32 and a left shift (the same);
# "pow2": channel 0's multiplier 2^30 (a power-of-two scale: the general path) and channel 1's
# 2^30 + 1 (the least the fast path takes, its sign correction read from the sum)
CASES = [
    ("pw_k8_rows", 1, 8, 3, 6, 10, 1, 1, 0, 1, False, "whole"),
    ("pw_k16_rows", 2, 16, 2, 5, 8, 1, 1, 0, 1, False, "per_row"),
    ("pw_k24_odd_out", 1, 24, 3, 5, 7, 1, 1, 0, 1, False, "whole"),
    ("pw_k32_per_channel", 1, 32, 2, 3, 4, 1, 1, 0, 1, False, "per_channel"),
    ("pw_k44_two_chunks", 1, 44, 2, 3, 40, 1, 1, 0, 1, False, "whole"),
    ("pw_k320_widest", 1, 320, 1, 3, 4, 1, 1, 0, 1, False, "whole"),
    ("pw_mult_pow2", 1, 8, 3, 4, 6, 1, 1, 0, 1, False, "pow2"),
    ("dw3_mult_pow2", 1, 3, 5, 6, 3, 3, 1, 1, 3, False, "pow2"),
    ("pw_odd", 1, 7, 5, 7, 5, 1, 1, 0, 1, False, "whole"),
    ("pw_rem", 1, 9, 3, 9, 3, 1, 1, 0, 1, False, "whole"),
    ("pw_one_px", 1, 13, 1, 1, 3, 1, 1, 0, 1, False, "whole"),
    ("pw_wide", 2, 16, 4, 6, 6, 1, 1, 0, 1, False, "whole"),
    ("pw_per_channel", 1, 11, 3, 5, 5, 1, 1, 0, 1, False, "per_channel"),
    ("pw_per_row", 1, 6, 5, 3, 4, 1, 1, 0, 1, False, "per_row"),
    ("pw_row_stride", 1, 5, 7, 5, 3, 1, 2, 0, 1, False, "whole"),
    ("pw_split_out", 1, 10, 3, 3, 7, 1, 1, 0, 1, False, "split0"),
    ("pw_split_in", 1, 10, 3, 3, 7, 1, 1, 0, 1, False, "split1"),
    ("pw_float_out", 1, 9, 3, 3, 5, 1, 1, 0, 1, True, "whole"),
    ("pw_saturating", 1, 8, 2, 3, 3, 1, 1, 0, 1, False, "saturate"),
    ("dw3_odd", 1, 5, 7, 9, 5, 3, 1, 1, 5, False, "whole"),
    ("dw3_s2", 2, 3, 9, 7, 3, 3, 2, 1, 3, False, "whole"),
    ("dw3_nopad", 1, 3, 6, 5, 3, 3, 1, 0, 3, False, "whole"),
    ("dw3_tiny", 1, 4, 1, 2, 4, 3, 1, 1, 4, False, "whole"),
    ("dw5", 1, 3, 9, 11, 3, 5, 1, 2, 3, False, "whole"),
    ("dw5_s2", 1, 3, 9, 9, 3, 5, 2, 2, 3, False, "whole"),
    ("dw7", 1, 2, 9, 13, 2, 7, 1, 3, 2, False, "whole"),
    ("dw7_s2", 1, 3, 11, 10, 3, 7, 2, 3, 3, False, "whole"),
    ("dw3_per_channel", 1, 5, 5, 7, 5, 3, 1, 1, 5, False, "per_channel"),
    ("dw3_per_row", 1, 3, 5, 5, 3, 3, 2, 1, 3, False, "per_row"),
    ("dw3_split", 1, 6, 5, 5, 6, 3, 1, 1, 6, False, "split0"),
    ("dw3_float_out", 1, 3, 5, 5, 3, 3, 1, 1, 3, True, "whole"),
    ("conv3_generic", 1, 3, 7, 7, 4, 3, 2, 1, 1, False, "whole"),
    ("pw_split_in_odd", 1, 11, 3, 4, 5, 1, 1, 0, 1, False, "split1"),
    ("pw_past_the_column", 1, 700, 2, 2, 3, 1, 1, 0, 1, False, "whole"),
    ("pw_narrow_range", 1, 9, 3, 4, 4, 1, 1, 0, 1, False, "narrow"),
    ("conv1_padded", 1, 5, 4, 4, 3, 1, 1, 1, 1, False, "whole"),
    ("conv3_s2_per_row", 1, 3, 10, 12, 16, 3, 2, 1, 1, False, "per_row"),
    ("conv5_dense", 1, 3, 6, 7, 5, 5, 1, 2, 1, False, "whole"),
    ("conv3_grouped", 1, 4, 5, 5, 4, 3, 1, 1, 2, False, "whole"),
    ("dw3_multiplier2", 1, 3, 5, 5, 6, 3, 1, 1, 3, False, "whole"),
    ("dw3_wider_than_the_ring", 1, 1, 3, 300, 1, 3, 1, 1, 1, False, "whole"),
    ("dw5_tiny", 1, 2, 3, 3, 2, 5, 1, 2, 2, False, "whole"),
    ("dw7_per_row", 1, 2, 8, 8, 2, 7, 1, 3, 2, False, "per_row"),
    ("dw3_narrow_range", 1, 3, 5, 6, 3, 3, 1, 1, 3, False, "narrow"),
    # rows wide enough for the Helium rows' groups of 16 (3x3) and 8 (5x5, 7x7) pixels at stride 2
    ("dw3_s2_wide", 1, 2, 4, 40, 2, 3, 2, 1, 2, False, "whole"),
    ("dw5_s2_wide", 1, 2, 5, 19, 2, 5, 2, 2, 2, False, "whole"),
    ("dw7_s2_wide", 1, 2, 7, 21, 2, 7, 2, 3, 2, False, "whole"),
    ("dw5_s2_float_out", 1, 2, 5, 9, 2, 5, 2, 2, 2, True, "whole"),
    # "constant": channels whose level is one value for every input (a bias at an end of int32, a
    # right shift of 25 to 29, as in the paper's mcunet-5fps and proxyless-w0.3): the fast path
    # takes them (et_rq_constant), so the wide and windowed paths run the whole layer
    ("pw_constant_channels", 1, 8, 3, 6, 6, 1, 1, 0, 1, False, "constant"),
    ("pw_constant_narrow", 1, 16, 2, 5, 6, 1, 1, 0, 1, False, "constant_narrow"),
    ("dw3_constant_channels", 1, 4, 5, 6, 4, 3, 1, 1, 4, False, "constant"),
    ("conv3_s2_constant_channels", 1, 3, 9, 8, 6, 3, 2, 1, 1, False, "constant"),
]


# qadd: (name, count, a_scale, a_zero, b_scale, b_zero, y_scale, y_zero, qmin, qmax, overrides)
# of qadd_attrs (TFLite's multipliers: the larger input's is 2^30 with shift 0); the overrides
# shift both inputs; a narrow range and y's multiplier at 2^30 take the general path
QADD_CASES = [
    ("qadd_b_larger", 37, 0.05, 3, 0.08, -7, 0.1, 5, -128, 127, {}),
    ("qadd_equal_scales", 64, 0.05, -20, 0.05, 20, 0.07, -3, -128, 127, {}),
    ("qadd_a_larger", 33, 0.2, -128, 0.01, 127, 0.15, 0, -128, 127, {}),
    ("qadd_both_shifted", 40, 0.05, 9, 0.06, -9, 0.09, 1, -128, 127,
     {"a_mult": 1500000000, "a_shift": -2, "b_mult": 1300000000, "b_shift": -3}),
    ("qadd_narrow", 16, 0.05, 0, 0.06, 0, 0.08, 0, -100, 90, {}),
    # small multipliers and y's shift 1: every rounding of the inputs shows in y
    ("qadd_rounding_a", 96, 0.05, 7, 0.06, -5, 0.08, 3, -128, 127,
     {"a_mult": 3 << 10, "a_shift": -1, "b_mult": 5 << 9, "b_shift": 0, "y_mult": (1 << 31) - 1, "y_shift": -1}),
    ("qadd_rounding_both", 96, 0.05, -7, 0.06, 5, 0.08, -3, -128, 127,
     {"a_mult": 3 << 10, "a_shift": -1, "b_mult": 5 << 9, "b_shift": -2, "y_mult": (1 << 31) - 1, "y_shift": -1}),
    ("qadd_y_mult_2_30", 16, 0.05, 4, 0.06, 0, 0.08, -2, -128, 127, {"y_mult": 1 << 30}),
]


def _qadd_c(i, case, rng):
    """`run{i}`: et_qadd of two random int8 vectors (the ends of int8 first), and the reference."""
    name, count, sa, za, sb, zb, sy, zy, lo, hi, over = case
    at = {**qadd_attrs(sa, za, sb, zb, sy, zy, lo, hi), **over}
    a, b = rng.integers(-128, 128, (2, count)).astype(np.int8)
    a[:2], b[:2] = (-128, 127), (127, -128)
    keys = ("a_zero", "b_zero", "y_zero", "a_mult", "a_shift", "b_mult", "b_shift", "y_mult", "y_shift", "qmin", "qmax")
    lines = [_c_array("int8_t", f"qa{i}", [str(int(v)) for v in a]), _c_array("int8_t", f"qb{i}", [str(int(v)) for v in b]),
             f"static const et_qadd_p QP{i} = {{{', '.join(str(int(at[k])) for k in keys)}}};",
             f"static int8_t qy{i}[{count}];",
             f"static void run{i}(void) {{ et_qadd(&QP{i}, qa{i}, qb{i}, qy{i}, {count}); "
             f"dump({i}, (const uint8_t *)qy{i}, sizeof qy{i}); }}"]
    return lines, qadd_ref(a, b, at).tobytes()


# qmask_pack: (name, count, lo, hi): whole bytes on the DSP path, the rest and a bound that is no
# int8 neighbour (lo = 127) on the portable loop
MASK_CASES = [("mask_int8_range", 61, -128, 127), ("mask_inner", 40, -20, 60), ("mask_lo_127", 19, 127, 127),
              ("mask_empty_inside", 16, 5, 6)]


def _mask_c(i, case, rng):
    """`run{i}`: et_qmask_pack of random levels (each bound and its neighbours among them)."""
    name, count, lo, hi = case
    y = rng.integers(-128, 128, count).astype(np.int8)
    edges = [v for v in (lo - 1, lo, lo + 1, hi - 1, hi, hi + 1) if -128 <= v <= 127]
    y[:len(edges)] = edges
    nb = (count + 7) // 8
    lines = [_c_array("int8_t", f"my{i}", [str(int(v)) for v in y]), f"static uint8_t mm{i}[{nb}];",
             f"static void run{i}(void) {{ et_qmask_pack(my{i}, mm{i}, {count}, {lo}, {hi}); "
             f"dump({i}, mm{i}, sizeof mm{i}); }}"]
    return lines, np.packbits((y > lo) & (y < hi), bitorder="little").tobytes()


def drawn_cases(count: int, seed: int) -> list[tuple]:
    """Random shapes for the same checks: kernel 1/3/5/7, stride 1/2, padding 0..k//2, pointwise
    or dense (groups 1) or depthwise (groups = channels, multiplier 1 or 2), odd channel counts
    and spatial sizes down to 1, each called whole, per output channel, per output row or with
    the weight split by output or input channel."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        k = int(rng.choice([1, 3, 5, 7]))
        s, p = int(rng.integers(1, 3)), int(rng.integers(0, k // 2 + 1))
        depthwise = k > 1 and rng.random() < 0.6
        c = int(rng.integers(1, 8 if depthwise else 24))
        groups = c if depthwise else 1
        o = c * int(rng.integers(1, 3)) if depthwise else int(rng.integers(1, 12))
        h, w = int(rng.integers(max(1, k - 2 * p), 12)), int(rng.integers(max(1, k - 2 * p), 12))
        how = str(rng.choice(["whole", "per_channel", "per_row", "split0", "split1" if not depthwise else "whole"]))
        if how == "split1" and c < 2 or how == "split0" and o < 2:
            how = "whole"
        out.append((f"drawn{len(out)}", int(rng.integers(1, 3)), c, h, w, o, k, s, p, groups, False, how))
    return out


CASES += drawn_cases(40, seed=2026)


def _case_arrays(rng, case):
    name, n, c, h, w, o, k, s, p, groups, float_out, how = case
    x = rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    wt = rng.integers(-128, 128, (o, c // groups, k, k)).astype(np.int8)
    b = rng.integers(-3000, 3000, o).astype(np.int32)
    if how == "saturate":  # the bias at the ends of int32: acc + bias saturates
        b = np.array([2 ** 31 - 5, -2 ** 31 + 5, 7][:o], dtype=np.int32)
    ws = rng.uniform(0.002, 0.02, o)
    a = dict(stride=(s, s), padding=(p, p), dilation=(1, 1), groups=groups, x_zero=int(rng.integers(-20, 20)),
             x_scale=0.05, w_scales=tuple(float(v) for v in ws), y_zero=int(rng.integers(-10, 10)),
             qmin=-100 if how in ("narrow", "constant_narrow") else -128,
             qmax=90 if how in ("narrow", "constant_narrow") else 127)
    ms = [quantize_multiplier(float(0.05 * v / 0.08)) for v in ws]
    a["mult"], a["shift"] = tuple(m for m, _ in ms), tuple(sh for _, sh in ms)
    if how == "saturate":
        a["shift"] = (3, -2, 0)[:o]  # a saturating left shift, too
    if how == "pow2":
        a["mult"] = (1 << 30, (1 << 30) + 1) + a["mult"][2:]
    if how.startswith("constant"):  # levels fixed by the bias and the shift; the rest ordinary
        b[:3] = np.array([-2 ** 31, 2 ** 31 - 1, 5], dtype=np.int32)
        a["shift"] = (-25, -29, -28) + a["shift"][3:]
    if float_out:
        a["float_out"] = True
    return x, wt, b, a


def _c_array(ctype, name, values):
    return f"static const {ctype} {name}[{max(len(values), 1)}] = {{{', '.join(values) or '0'}}};"


def _c_int(v):
    return "(-2147483647-1)" if int(v) == -2 ** 31 else str(int(v))


def _weight_decl(i, wt, how):
    """`et_w8 W{i}`: whole, or split in two arrays along dim 0 or 1 (even indices selected)."""
    flat = lambda arr: [str(int(v)) for v in arr.reshape(-1)]  # noqa: E731
    if how not in ("split0", "split1"):
        return [_c_array("int8_t", f"w{i}", flat(wt)), f"static const et_w8 W{i} = {{w{i}, 0, 0, 0, 0, 0, 0}};"]
    dim = 0 if how == "split0" else 1
    size = wt.shape[dim]
    sel = [c for c in range(size) if c % 2 == 0]
    rest = [c for c in range(size) if c % 2 == 1]
    cmap = [sel.index(c) if c in sel else -rest.index(c) - 1 for c in range(size)]
    return [_c_array("int8_t", f"ws{i}", flat(np.take(wt, sel, axis=dim))),
            _c_array("int8_t", f"wr{i}", flat(np.take(wt, rest, axis=dim))),
            _c_array("int16_t", f"wm{i}", [str(v) for v in cmap]),
            f"static const et_w8 W{i} = {{0, ws{i}, wr{i}, wm{i}, {dim}, {len(sel)}, {len(rest)}}};"]


def _case_c(i, case, x, wt, b, a, ho, wo):
    name, n, c, h, w, o, k, s, p, groups, float_out, how = case
    size = n * o * ho * wo
    # the even cases whose requantization packs take it packed (shift 0: et_rq_mult_at), the odd ones as arrays
    packed = i % 2 == 0 and packable(a["mult"], a["shift"])
    mult, shift0, escapes = pack_requant(a["mult"], a["shift"]) if packed else (a["mult"], 0, 0)
    lines = [_c_array("int8_t", f"x{i}", [str(int(v)) for v in x.reshape(-1)]),
             _c_array("int32_t", f"b{i}", [_c_int(v) for v in b]),
             _c_array("int32_t", f"m{i}", [_c_int(v) for v in mult]),
             _c_array("int8_t", f"s{i}", [_c_int(v) for v in a["shift"]])]
    scales = (np.float64(a["x_scale"]) * np.asarray(a["w_scales"])).astype(np.float32)
    lines.append(_c_array("float", f"os{i}", [f"{float(v).hex()}f".replace("0x", "0x") for v in scales]))
    lines += _weight_decl(i, wt, how)
    q = f"0, 0, 0, os{i}" if float_out else f"{shift0}, m{i} + {escapes}, 0, 0" if packed else f"0, m{i}, s{i}, 0"
    lines.append(f"static const et_qconv_p P{i} = {{{n}, {c}, {h}, {w}, {o}, {c // groups}, {k}, {k}, {ho}, {wo}, "
                 f"{s}, {s}, {p}, {p}, 1, 1, {groups}, {a['x_zero']}, {a['y_zero']}, {a['qmin']}, {a['qmax']}, {q}}};")
    elem = "float" if float_out else "int8_t"
    lines.append(f"static {elem} y{i}[{size}];")
    y_rows = f"et_whole8({'0' if float_out else f'y{i}'}, {o}, {ho}, {wo})"
    yf = f"y{i}" if float_out else "0"
    call = lambda r0, r1, o0, o1: (f"et_qconv_rows(&P{i}, et_whole8(x{i}, {c}, {h}, {w}), 0, &W{i}, b{i}, "  # noqa: E731
                                   f"{y_rows}, {yf}, 0, {r0}, {r1}, {o0}, {o1});")
    if how == "per_channel":
        body = f"for (int32_t o = 0; o < {o}; o++) {call(0, ho, 'o', 'o + 1')}"
    elif how == "per_row":
        body = f"for (int32_t r = 0; r < {ho}; r++) {call('r', 'r + 1', 0, o)}"
    else:  # every row and channel: the graphs' call (et_qconv_whole, emitted by kernels/int8.py's qconv2d)
        body = f"et_qconv_whole(&P{i}, x{i}, &W{i}, b{i}, {'0' if float_out else f'y{i}'}, {yf});"
    lines.append(f"static void run{i}(void) {{ {body} dump({i}, (const uint8_t *)y{i}, sizeof y{i}); }}")
    return lines


MODEL_HEAD = r"""#include <stdio.h>
#include "model.h"
#include "board.h"
#include "et_int8.h"

static int32_t step;
/* `case <i> <offset> <hex bytes>` lines, 32 bytes each */
static void dump(int i, const uint8_t *p, unsigned len) {
    char line[96];
    for (unsigned at = 0; at < len; at += 32) {
        int k = snprintf(line, sizeof line, "case %d %u ", i, at);
        for (unsigned e = at; e < len && e < at + 32; e++) k += snprintf(line + k, sizeof line - k, "%02x", p[e]);
        snprintf(line + k, sizeof line - k, "\n");
        et_console_puts(line);
    }
}
"""

MODEL_TAIL = r"""
void et_init(void) {}
float et_train_step(const void *input, const void *label) {
    (void)input; (void)label;
    if (step == 0) run_all();
    ++step;
    return 0.0f;
}
void et_predict(const void *input, float *out) { (void)input; out[0] = 0.0f; }
int32_t et_get_step(void) { return step; }
int et_check_guards(void) { return 0; }
"""


def _firmware_cases(d: Path, head: str = ""):
    rng = np.random.default_rng(20)
    parts, want = [head + MODEL_HEAD], {}
    for i, case in enumerate(CASES):
        x, wt, b, a = _case_arrays(rng, case)
        ref = qconv2d_ref(x, wt, b, a)
        want[i] = np.ascontiguousarray(ref).tobytes()
        parts += _case_c(i, case, x, wt, b, a, ref.shape[2], ref.shape[3])
    for j, case in enumerate(QADD_CASES):
        lines, want[len(CASES) + j] = _qadd_c(len(CASES) + j, case, rng)
        parts += lines
    for j, case in enumerate(MASK_CASES):
        at = len(CASES) + len(QADD_CASES) + j
        lines, want[at] = _mask_c(at, case, rng)
        parts += lines
    parts.append("static void run_all(void) {\n" + "\n".join(f"    run{i}();" for i in range(len(want))) + "\n}")
    parts.append(MODEL_TAIL)
    shutil.copy(FIXTURE / "model.h", d / "model.h")
    for header in RUNTIME.glob("et_*.h"):  # et_int8.h and what it includes (et_int8_mve.h on the M55)
        shutil.copy(header, d / header.name)
    (d / "model.c").write_text("\n".join(parts))
    return want


def _got(lines):
    out = {}
    for line in lines:
        if line.startswith("case "):
            _, i, at, hexes = line.split()
            buf = out.setdefault(int(i), bytearray())
            assert len(buf) == int(at)
            buf += bytes.fromhex(hexes)
    return out


def _assert_cases(run, want):
    """The firmware exited cleanly and printed every case's expected bytes."""
    assert run.exit_code == 0, run.lines
    got = _got(run.lines)
    for i, case in enumerate(CASES + QADD_CASES + MASK_CASES):
        assert bytes(got.get(i, b"")) == want[i], f"case {case[0]}"


@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m7", "cortex-m55", "rv32imafc", "rv32imc", "rv32imafcv"])
def test_dsp_qconv_kernels_equal_the_reference(tmp_path, target):
    if cortexm.missing_tools(target):
        pytest.skip(f"missing {', '.join(cortexm.missing_tools(target))}")
    d = tmp_path / target
    d.mkdir()
    want = _firmware_cases(d)
    x = np.zeros((1, 1, 2), np.float32)
    cortexm.write_project(d, target, (x, np.zeros((1, 1), np.float32)))
    elf = cortexm.build(d)
    if target == "rv32imafcv":
        # the vector extension: the pointwise and depthwise rows in vectors (et_int8_rvv.h: widening
        # multiply-accumulates of int8 pixels by a weight) and their requantization (vsmul)
        rvv = cortexm_disassembly(elf)
        for kernel, insns in ((b"et_rvv_pw_rows", (b"vwmacc.vx", b"vsext.vf2")),
                              (b"et_rvv_dw_rows", (b"vwmacc.vx", b"vlse8.v")), (b"et_rvv_qput", (b"vsmul.vx",))):
            body = re.search(rb"<" + kernel + rb"[^>]*>:\n(.*?)\n\n", rvv, re.S)  # the function's body
            assert body, f"no {kernel.decode()} in the rv32imafcv firmware"
            assert all(i in body.group(1) for i in insns), kernel
    elif target.startswith("rv32"):
        # RV32 without SIMD: the pointwise rows in registers (et_int8_rv32.h), the rest portable
        assert b"<et_qconv_pw_rows" in cortexm_disassembly(elf)  # (or a clone: .constprop, .isra)
    else:
        # the DSP paths are the ones built: the firmware calls __smlad (SIMD multiply-accumulate)
        assert b"smlad" in cortexm_disassembly(elf)
    # and on the Cortex-M55 the Helium pointwise rows (et_int8_mve.h: VMLADAVA.S8 over 16 inputs)
    # (gcc writes VMLADAVA.S8 as its alias vmlava.s8; objdump decodes Helium with -m armv8.1-m.main)
    # and its Helium depthwise rows (et_int8_mve.h: VMLA.S32 of widened int8 inputs by a tap)
    if target == "cortex-m55":
        helium = cortexm_disassembly(elf, "armv8.1-m.main")
        assert b"vmlava.s8" in helium
        dw = re.search(rb"<et_mve_dw_row[^>]*>:\n(.*?)\n\n", helium, re.S)  # the function's body
        assert dw, "no et_mve_dw_row in the M55 firmware"
        dw = dw.group(1)
        assert b"vldrb.s32" in dw and b"vmla.s32" in dw and b"vqrdmulh.s32" in dw
    _assert_cases(cortexm.run_qemu(d, target), want)


@pytest.mark.parametrize("head, built, left_out", [
    # ET_DW_K3: mbv2-w0.35's; the 5x5 and 7x7 cases general
    ("#define ET_DW_KERNELS 1", [b"et_dw3_plane_s1", b"et_dw3_plane_s2"], [b"et_dw5_plane_s1", b"et_dw7_plane_s2"]),
    # ET_DW_K5 | ET_DW_K7: the 3x3 cases general
    ("#define ET_DW_KERNELS 6", [b"et_dw5_plane_s1", b"et_dw7_plane_s2"], [b"et_dw3_plane_s1", b"et_dw3_plane_s2"]),
    # ET_DW_PLANES: 3x3 at stride 1 and 5x5 at stride 2 (proxyless-w0.3 has no 3x3 at stride 2, mcunet-5fps
    # no 5x5 at stride 2); the other cases' planes take the rows
    ("#define ET_DW_PLANES (ET_DW_P3S1 | ET_DW_P5S2)", [b"et_dw3_plane_s1", b"et_dw5_plane_s2"],
     [b"et_dw3_plane_s2", b"et_dw5_plane_s1", b"et_dw7_plane_s1", b"et_dw7_plane_s2"]),
    # ET_GEMM_WINDOWS_WIDE 0: the dense cases other than the 3x3 over 3 channels in quads take the general path
    ("#define ET_GEMM_WINDOWS_WIDE 0", [b"et_gemm_windows_quads"], [b"et_gemm_windows_wide"]),
])
def test_dsp_qconv_kernels_of_a_program_s_depthwise_shapes(tmp_path, head, built, left_out):
    """model.c's ET_DW_KERNELS, ET_DW_PLANES and ET_GEMM_WINDOWS_WIDE (backends/c/kernel_select.py) leave the
    paths of other shapes out of the build; a layer of another shape takes a general path, with the same bytes."""
    if cortexm.missing_tools("cortex-m7"):
        pytest.skip(f"missing {', '.join(cortexm.missing_tools('cortex-m7'))}")
    want = _firmware_cases(tmp_path, head + "\n")
    cortexm.write_project(tmp_path, "cortex-m7", (np.zeros((1, 1, 2), np.float32), np.zeros((1, 1), np.float32)))
    symbols = cortexm_disassembly(cortexm.build(tmp_path))
    assert all(b"<" + name + b">:" in symbols for name in built)
    assert not any(b"<" + name + b">:" in symbols for name in left_out)
    _assert_cases(cortexm.run_qemu(tmp_path, "cortex-m7"), want)


def cortexm_disassembly(elf: Path, arch: str = "") -> bytes:
    import subprocess

    from edgetrain.backends.c.cortexm_target import elf_toolchain

    objdump = shutil.which(elf_toolchain(elf).tool("objdump"))  # the ELF's own binutils (Arm or RISC-V)
    if objdump is None:
        pytest.skip("no objdump for this ELF")
    return subprocess.run([objdump, "-d", *(("-m", arch) if arch else ()), str(elf)], capture_output=True,
                          check=True).stdout
