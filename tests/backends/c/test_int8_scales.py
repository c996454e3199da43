"""kernels/int8_scales.py: a layer's float32 weight scales, gradient and QAS factors stored as a
fit to its forward's requantization multipliers (or its weight scales) plus packed ulp fixes
(et_fscale); the C's et_fscale_at gives every channel's value bit for bit."""
import subprocess

import numpy as np
import pytest

from edgetrain.backends.c.emit import RUNTIME_DIR
from edgetrain.backends.c.host import find_cc
from edgetrain.backends.c.kernels.context import EmitContext
from edgetrain.backends.c.kernels.int8_scales import MAX_FIX, Base, fit, fix_bits, fscale_decls, layer_bases
from edgetrain.ir import Graph, Node, TensorType, new_value
from edgetrain.ops.fixed_point import quantize_multiplier


class _Ctx:
    c_float = staticmethod(EmitContext.c_float)


def _layer(seed: int, o: int = 96):
    """A layer's attributes as quantize/convert.py writes them (float32 weight scales, a
    float64 activation scale, the requantization multipliers of x_scale * w_scale / y_scale)
    and the four factor tables the compiler derives from them in float64 (the input
    gradient's weight scales, ops/qconv.out_scales, quantize.qas_scales), each rounded to
    float32 once."""
    rng = np.random.default_rng(seed)
    ws = (rng.uniform(0.5, 2.0, o) * 10.0 ** rng.uniform(-4, -1, o)).astype(np.float32)
    xs, ys = float(rng.uniform(0.005, 0.05)), float(rng.uniform(0.01, 0.1))  # float64, not float32 values
    ms = [quantize_multiplier(xs * float(w) / ys) for w in ws]
    attrs = {"w_scales": tuple(float(w) for w in ws), "x_scale": xs, "mult": tuple(m for m, _ in ms),
             "shift": tuple(sh for _, sh in ms)}
    ws64 = ws.astype(np.float64)
    return attrs, {"w_scales": ws, "out": (xs * ws64).astype(np.float32), "qas_weight": (ws64 ** -2).astype(np.float32),
                   "qas_bias": ((ws64 * xs) ** -2).astype(np.float32)}


def _graph(*layers):
    """A graph of one qconv2d node per attribute dict (only its nodes' attributes matter here)."""
    x = new_value(TensorType((1, 4, 2, 2), "int8"), "x")
    nodes = [Node("qconv2d", (x,), (new_value(TensorType((1, 4, 2, 2), "int8"), f"y{i}"),), a)
             for i, a in enumerate(layers)]
    return Graph((x,), tuple(nodes), (nodes[-1].out,), ("y",))


def _scales_base(ws) -> Base:
    return Base(np.asarray(ws, dtype=np.float32), scales=tuple(float(w) for w in ws))


def _c_values(tmp_path, decls: list[str], n: int) -> np.ndarray:
    """et_fscale_at(&S, c) for c < n, as a C build computes it (float32 bit patterns)."""
    src = "\n".join(['#include <stdio.h>', '#include "et_int8.h"', *decls,
                     "int main(void) {",
                     f"    for (int32_t c = 0; c < {n}; c++) {{",
                     "        union { float f; uint32_t u; } v = {et_fscale_at(&S, c)};",
                     '        printf("%u\\n", v.u);', "    }", "    return 0;", "}"])
    (tmp_path / "t.c").write_text(src)
    subprocess.run([find_cc(), "-std=gnu11", "-O2", "-ffp-contract=off", "-Wall", "-Werror", f"-I{RUNTIME_DIR}",
                    "-o", str(tmp_path / "t"), str(tmp_path / "t.c")], check=True)
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True).stdout.split()
    return np.array([int(u) for u in out], dtype=np.uint32).view(np.float32)


@pytest.mark.parametrize("kind", ["w_scales", "out", "qas_weight", "qas_bias"])
def test_a_factor_table_is_fitted_to_the_requantization_multipliers_and_c_rebuilds_it(tmp_path, kind):
    attrs, tables = _layer(seed=3)
    v = tables[kind]
    bases = layer_bases(_graph(attrs))
    assert bases[0].mult == attrs["mult"]  # the forward's multipliers first, then the weight scales
    k, inv_sq, fix = fit(v, bases[0].values)
    assert inv_sq == kind.startswith("qas") and np.abs(fix).max() <= MAX_FIX
    decls = fscale_decls(_Ctx(), "S", v, bases)
    assert decls[0] == f"static const int32_t S_m[96] = {{{', '.join(str(m) for m in attrs['mult'])}}};"  # conv_params'
    assert np.array_equal(_c_values(tmp_path, decls, len(v)).view(np.uint32), v.view(np.uint32))


def test_a_float_output_layer_fits_to_its_weight_scales(tmp_path):
    attrs, tables = _layer(seed=4)
    attrs = {"w_scales": attrs["w_scales"], "x_scale": attrs["x_scale"], "float_out": True,
             "mult": (0,) * 96, "shift": (0,) * 96}
    bases = layer_bases(_graph(attrs))
    assert len(bases) == 1 and bases[0].mult is None
    decls = fscale_decls(_Ctx(), "S", tables["out"], bases)
    assert decls[0].startswith("static const float S_b[96]")
    assert np.array_equal(_c_values(tmp_path, decls, 96).view(np.uint32), tables["out"].view(np.uint32))


@pytest.mark.parametrize("spread, bits", [(1, 2), (6, 4), (100, 8)])
def test_fixes_are_packed_in_the_narrowest_field_and_c_unpacks_them(tmp_path, spread, bits):
    """Tables k * base moved by random fixes of +-spread ulps: 2-, 4- or 8-bit fields."""
    ws = _layer(seed=11, o=37)[1]["w_scales"]  # an odd count: the last byte holds a part of its fields
    fix = np.random.default_rng(spread).integers(-spread, spread + 1, ws.size)
    fix[:2] = (-spread, spread)
    v = ((np.float32(0.75) * ws).view(np.int32) + fix.astype(np.int32)).view(np.float32)
    width = fix_bits(fit(v, ws)[2])
    assert 0 < width <= bits
    decls = fscale_decls(_Ctx(), "S", v, [_scales_base(ws)])
    packed = [d for d in decls if d.startswith("static const uint8_t S_f[")]
    assert len(packed) == 1 and f"[{(37 * width + 7) // 8}]" in packed[0]
    assert np.array_equal(_c_values(tmp_path, decls, ws.size).view(np.uint32), v.view(np.uint32))


def test_no_fix_is_stored_when_none_is_needed():
    ws = _layer(seed=5)[1]["w_scales"]
    exact = (np.float32(0.25) * ws).astype(np.float32)  # exactly k * base: nothing to fix
    decls = fscale_decls(_Ctx(), "S", exact, [_scales_base(ws)])
    assert decls[-1] == "static const et_fscale S = {S_b, 0, 0, 0, 0.25f, 0, 0, 0};" and len(decls) == 2


def test_a_table_no_base_fits_is_stored_whole_and_read_unchanged(tmp_path):
    ws = _layer(seed=7, o=8)[1]["w_scales"]
    other = np.random.default_rng(8).uniform(1e-3, 1.0, 8).astype(np.float32)  # unrelated to ws
    assert fit(other, ws) is None
    assert fit(np.r_[other[:7], 0.0].astype(np.float32), np.ones(8, np.float32)) is None  # a zero
    decls = fscale_decls(_Ctx(), "S", other, [_scales_base(ws), _scales_base((1.0,) * 5)])
    assert decls[-1] == "static const et_fscale S = {S_t, 0, 0, 0, 1.0f, 0, 0};"
    assert np.array_equal(_c_values(tmp_path, decls, 8).view(np.uint32), other.view(np.uint32))


def test_the_bases_are_every_layers_multipliers_then_weight_scales_once():
    a, _ = _layer(seed=1, o=4)
    x = new_value(TensorType((1, 4, 2, 2), "int8"), "x")
    y1, y2 = (new_value(TensorType((1, 4, 2, 2), "int8"), n) for n in ("y1", "y2"))
    fused = {"pw_w_scales": (1.0,) * 4, "pw_mult": (1 << 30,) * 4, "pw_shift": (-3,) * 4,
             "dw_w_scales": (2.0,) * 4, "dw_mult": (1 << 30,) * 4, "dw_shift": (-2,) * 4}
    body = Graph((x,), (Node("qadd", (x, x), (y1,), {"a_zero": 0}),), (y1,), ("y",))  # a row-streamed qadd: no scales
    g = Graph((x,), (Node("qconv2d", (x,), (y1,), a), Node("qconv2d_grad_input", (y1,), (y2,), a),
                     Node("qconv2d_pw_dw", (x,), (y2,), fused), Node("qstream", (x,), (y2,), {"body": body})),
              (y2,), ("y",))
    bases = layer_bases(g)
    assert [(b.mult, b.shift, b.scales) for b in bases] == [
        (a["mult"], a["shift"], None), ((1 << 30,) * 4, (-3,) * 4, None), ((1 << 30,) * 4, (-2,) * 4, None),
        (None, None, a["w_scales"]), (None, None, (1.0,) * 4), (None, None, (2.0,) * 4)]
    assert np.array_equal(bases[1].values, np.full(4, 2.0 ** 27, np.float32))  # 2^30 * 2^-3
