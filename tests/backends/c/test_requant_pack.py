"""kernels/int8_params.py's packed requantization: a layer whose multipliers all lie in [2^30, 2^31)
stores a word a channel (the multiplier's low 30 bits and, in the top two, the shift less the layer's
shift0, or 3 for a channel whose shift is in an escape word before the first channel's) where that takes
fewer bytes than the two arrays, and the C (et_rq_mult_at / et_rq_shift_at, runtime/et_int8_core.h)
reads back every channel's multiplier and shift; other layers keep their two arrays."""
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
    """a layer's multipliers and shifts: most within 3 of each other, a few anywhere (escapes)"""
    n = draw(st.integers(1, 40))
    low = draw(st.integers(-31, 27))
    outliers = draw(st.integers(0, max(0, (n - 1) // 5)))
    shift = [draw(st.integers(low, low + 2)) for _ in range(n - outliers)]
    shift += [draw(st.integers(-31, 30)) for _ in range(outliers)]
    return [draw(MULTS) for _ in range(n)], draw(st.permutations(shift))


@settings(max_examples=200, deadline=None)
@given(layers())
def test_packing_keeps_every_multiplier_and_shift(layer):
    mult, shift = layer
    assert packable(mult, shift)
    words, shift0, escapes = pack_requant(mult, shift)
    assert len(words) == len(mult) + escapes and 4 * len(words) < 5 * len(mult)
    assert all(-2 ** 31 <= w < 2 ** 31 for w in words)
    assert escapes == sum(not shift0 <= v <= shift0 + 2 for v in shift)
    assert unpack_requant(words, shift0, escapes) == (mult, shift)


def test_shift0_covers_the_most_channels():
    mult = [1 << 30] * 9
    words, shift0, escapes = pack_requant(mult, [-20, -9, -8, -8, -7, -7, -6, -6, -6])
    assert (shift0, escapes) == (-8, 2)  # -8..-6 hold 7 channels; -20 and -9 escape
    assert words[:2] == [(1 << 8) | (-9 & 0xFF), (0 << 8) | (-20 & 0xFF)]  # last escaped channel first
    assert pack_requant(mult[:5], [-9, -8, -7, -6, -8])[1:] == (-9, 1)  # a tie: the lowest window


def test_what_does_not_pack():
    assert not packable([1 << 30, 1 << 30], [-7, -3])  # one escape a channel: 16 bytes against 10
    assert not packable([1 << 30] * 8, [-9] * 6 + [-1, -20])  # 2 escapes in 8: 40 bytes against 40
    assert packable([1 << 30] * 9, [-9] * 7 + [-1, -20])  # 2 in 9: 44 bytes against 45
    assert not packable([(1 << 30) - 1], [-7])  # a multiplier below 2^30
    assert not packable([0], [0]) and not packable([-(1 << 30)], [-7])
    assert not packable([1 << 31], [-7])  # 2^31: not an int32 multiplier in range
    assert not packable([], [])
    decls, fields, shift0 = requant_decls("P", [1 << 30, 5 << 28], [-7, -12])
    assert [d.split("[")[0] for d in decls] == ["static const int32_t P_m", "static const int8_t P_s"]
    assert fields == "P_m, P_s" and shift0 == 0
    decls, fields, shift0 = requant_decls("P", [1 << 30, 5 << 28], [-7, -9])
    assert len(decls) == 1 and fields == "P_m, 0" and shift0 == -9
    decls, fields, shift0 = requant_decls("P", [1 << 30] * 9, [-9] * 7 + [-1, -20])
    assert decls[0].startswith("static const int32_t P_m[11] = ") and fields == "P_m + 2, 0" and shift0 == -9


def test_c_reads_back_the_multipliers_and_shifts(tmp_path):
    rng = np.random.default_rng(0)
    escaped = [int(v) for v in rng.integers(-12, -9, 300)]
    for c, v in ((0, -31), (7, 30), (150, -1), (298, -13), (299, -9)):  # escapes: the ends, the middle
        escaped[c] = v
    cases = [([int(v) for v in rng.integers(1 << 30, 1 << 31, 33)], [int(v) for v in rng.integers(-20, -17, 33)]),
             ([1 << 30, (1 << 31) - 1, 3 << 29], [0, 2, 1]),
             ([int(v) for v in rng.integers(1 << 30, 1 << 31, 6)], [-31, -29, -30, -28, -31, -31]),
             ([int(v) for v in rng.integers(1 << 30, 1 << 31, 300)], escaped)]
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
