"""kernels/int8_params.py's packed requantization: a layer whose multipliers all lie in [2^30, 2^31) and
whose shifts span at most 3 stores a word a channel (the multiplier's low 30 bits, the shift less the
layer's least in the top two), and the C (et_rq_mult_at / et_rq_shift_at, runtime/et_int8_core.h) reads
back every channel's multiplier and shift; other layers keep their two arrays."""
from __future__ import annotations

import subprocess

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edgetrain.backends.c.emit import RUNTIME_DIR
from edgetrain.backends.c.host import find_cc
from edgetrain.backends.c.kernels.int8_params import (pack_requant, packable, requant_decls,
                                                      unpack_requant)

MULTS = st.integers(1 << 30, (1 << 31) - 1)


@st.composite
def layers(draw):
    n = draw(st.integers(1, 40))
    low = draw(st.integers(-31, 27))
    return [draw(MULTS) for _ in range(n)], [draw(st.integers(low, low + 3)) for _ in range(n)]


@settings(max_examples=200, deadline=None)
@given(layers())
def test_packing_keeps_every_multiplier_and_shift(layer):
    mult, shift = layer
    assert packable(mult, shift)
    words, shift0 = pack_requant(mult, shift)
    assert shift0 == min(shift) and all(-2 ** 31 <= w < 2 ** 31 for w in words)
    assert unpack_requant(words, shift0) == (mult, shift)


def test_what_does_not_pack():
    assert not packable([1 << 30, 1 << 30], [-7, -3])  # shifts 4 apart
    assert not packable([(1 << 30) - 1], [-7])  # a multiplier below 2^30
    assert not packable([0], [0]) and not packable([-(1 << 30)], [-7])
    assert not packable([1 << 31], [-7])  # 2^31: not an int32 multiplier in range
    assert not packable([], [])
    decls, fields, shift0 = requant_decls("P", [1 << 30, 5 << 28], [-7, -12])
    assert [d.split("[")[0] for d in decls] == ["static const int32_t P_m", "static const int8_t P_s"]
    assert fields == "P_m, P_s" and shift0 == 0
    decls, fields, shift0 = requant_decls("P", [1 << 30, 5 << 28], [-7, -9])
    assert len(decls) == 1 and fields == "P_m, 0" and shift0 == -9


def test_c_reads_back_the_multipliers_and_shifts(tmp_path):
    rng = np.random.default_rng(0)
    cases = [([int(v) for v in rng.integers(1 << 30, 1 << 31, 33)], [int(v) for v in rng.integers(-20, -16, 33)]),
             ([1 << 30, (1 << 31) - 1, 3 << 29], [0, 3, 1]),
             ([int(v) for v in rng.integers(1 << 30, 1 << 31, 5)], [-31, -29, -30, -28, -31])]
    src = ['#include <stdio.h>', '#include "et_int8.h"']
    body = []
    for i, (mult, shift) in enumerate(cases):
        decls, fields, shift0 = requant_decls(f"P{i}", mult, shift)
        assert fields.endswith(", 0")  # packed
        src += decls
        src.append(f"static const et_qconv_p P{i} = {{1, 1, 1, 1, {len(mult)}, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, "
                   f"0, 0, -128, 127, {shift0}, {fields}, 0}};")
        body.append(f'    for (int32_t o = 0; o < {len(mult)}; o++) '
                    f'printf("%ld %ld\\n", (long)et_rq_mult(&P{i}, o), (long)et_rq_shift(&P{i}, o));')
    src += ["int main(void) {", *body, "    return 0;", "}"]
    (tmp_path / "t.c").write_text("\n".join(src))
    subprocess.run([find_cc(), "-std=gnu11", "-O2", "-Wall", "-Werror", "-Wno-unused-function", f"-I{RUNTIME_DIR}",
                    "-o", str(tmp_path / "t"), str(tmp_path / "t.c")], check=True)
    out = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True).stdout.split()
    got = [(int(out[k]), int(out[k + 1])) for k in range(0, len(out), 2)]
    assert got == [(m, s) for mult, shift in cases for m, s in zip(mult, shift)]
