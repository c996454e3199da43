"""kernels/int8_scales.py: a layer's float32 gradient and QAS factors stored as a fit to its
weight scales (et_fscale); the C's et_fscale_at gives every channel's value bit for bit."""
import subprocess

import numpy as np
import pytest

from edgetrain.backends.c.emit import RUNTIME_DIR
from edgetrain.backends.c.host import find_cc
from edgetrain.backends.c.kernels.context import EmitContext
from edgetrain.backends.c.kernels.int8_scales import MAX_FIX, fit, fix_bits, fscale_decls, weight_scale_tables
from edgetrain.ir import Graph, Node, TensorType, new_value


class _Ctx:
    c_float = staticmethod(EmitContext.c_float)


def _layer(seed: int, o: int = 96):
    """Weight scales and the three factor tables the compiler derives from them in float64
    (ops/qconv.out_scales, quantize.qas_scales), each rounded to float32 once."""
    rng = np.random.default_rng(seed)
    ws = (rng.uniform(0.5, 2.0, o) * 10.0 ** rng.uniform(-4, -1, o)).astype(np.float32)
    xs = float(rng.uniform(0.005, 0.05))  # a float64 activation scale, not a float32 one
    ws64 = ws.astype(np.float64)
    return ws, {"out": (xs * ws64).astype(np.float32), "qas_weight": (ws64 ** -2).astype(np.float32),
                "qas_bias": ((ws64 * xs) ** -2).astype(np.float32)}


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


@pytest.mark.parametrize("kind", ["out", "qas_weight", "qas_bias"])
def test_a_factor_table_is_fitted_to_the_weight_scales_and_c_rebuilds_it_bit_for_bit(tmp_path, kind):
    ws, tables = _layer(seed=3)
    v = tables[kind]
    got = fit(v, ws)
    assert got is not None
    k, inv_sq, fix = got
    assert inv_sq == (kind != "out") and np.abs(fix).max() <= MAX_FIX
    decls = fscale_decls(_Ctx(), "S", v, [tuple(float(s) for s in ws)])
    assert "S_t" not in " ".join(decls)  # fitted, not stored whole
    assert np.array_equal(_c_values(tmp_path, decls, len(v)).view(np.uint32), v.view(np.uint32))


@pytest.mark.parametrize("spread, bits", [(1, 2), (6, 4), (100, 8)])
def test_fixes_are_packed_in_the_narrowest_field_and_c_unpacks_them(tmp_path, spread, bits):
    """Tables k * base moved by random fixes of +-spread ulps: 2-, 4- or 8-bit fields."""
    ws, _ = _layer(seed=11, o=37)  # an odd count: the last byte holds a part of its fields
    fix = np.random.default_rng(spread).integers(-spread, spread + 1, ws.size)
    fix[:2] = (-spread, spread)
    v = ((np.float32(0.75) * ws).view(np.int32) + fix.astype(np.int32)).view(np.float32)
    assert 0 < fix_bits(fit(v, ws)[2]) <= bits
    decls = fscale_decls(_Ctx(), "S", v, [tuple(float(s) for s in ws)])
    packed = [d for d in decls if d.startswith("static const uint8_t S_f[")]
    assert len(packed) == 1 and f"[{(37 * fix_bits(fit(v, ws)[2]) + 7) // 8}]" in packed[0]
    assert np.array_equal(_c_values(tmp_path, decls, ws.size).view(np.uint32), v.view(np.uint32))


def test_no_fix_is_stored_when_none_is_needed():
    ws, _ = _layer(seed=5)
    exact = (np.float32(0.25) * ws).astype(np.float32)  # exactly k * base: nothing to fix
    decls = fscale_decls(_Ctx(), "S", exact, [tuple(float(s) for s in ws)])
    assert decls[-1] == "static const et_fscale S = {S_b, 0, 0.25f, 0, 0};" and len(decls) == 2


def test_a_table_no_base_fits_is_stored_whole_and_read_unchanged(tmp_path):
    ws, _ = _layer(seed=7, o=8)
    other = np.random.default_rng(8).uniform(1e-3, 1.0, 8).astype(np.float32)  # unrelated to ws
    assert fit(other, ws) is None
    assert fit(np.r_[other[:7], 0.0].astype(np.float32), np.ones(8, np.float32)) is None  # a zero
    decls = fscale_decls(_Ctx(), "S", other, [tuple(float(s) for s in ws), (1.0,) * 5])  # no base of its length fits
    assert decls[-1] == "static const et_fscale S = {S_t, 0, 1.0f, 0, 0};"
    assert np.array_equal(_c_values(tmp_path, decls, 8).view(np.uint32), other.view(np.uint32))


def test_the_bases_are_the_weight_scales_of_every_layer_once():
    x = new_value(TensorType((1, 4, 2, 2), "int8"), "x")
    y1, y2 = (new_value(TensorType((1, 4, 2, 2), "int8"), n) for n in ("y1", "y2"))
    a = {"w_scales": (0.5, 0.25, 0.125, 1.0)}
    g = Graph((x,), (Node("qconv2d", (x,), (y1,), a), Node("qconv2d_grad_input", (y1,), (y2,), a),
                     Node("qconv2d_pw_dw", (x,), (y2,), {"pw_w_scales": (1.0,) * 4, "dw_w_scales": (2.0,) * 4})),
              (y2,), ("y",))
    assert weight_scale_tables(g) == [a["w_scales"], (1.0,) * 4, (2.0,) * 4]
