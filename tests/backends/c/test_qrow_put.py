"""runtime/et_int8_core.h et_qrow_put_n: a row's requantization in one loop without branches on a host CPU
(x86, aarch64), which the compiler vectorizes. It must store what et_qrow_put stores, element by element:
the bias added with saturation, the rounding right shift (ties away from zero), the output zero point, the
clamp; rows with float outputs or a left shift take et_qrow_put's loop. Checked here on random rows built to
reach every edge (saturating sums, ties of either sign, every right shift 0..31, clamps), against
et_qrow_put and against the same arithmetic in Python."""
from __future__ import annotations

import platform
import subprocess

import numpy as np
import pytest

from edgetrain.backends.c.emit import RUNTIME_DIR
from edgetrain.backends.c.host import find_cc

ROWS, COLS = 400, 37  # 37: a vector loop and its remainder
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1

HARNESS = r"""
#include <stdio.h>
#include "et_int8_core.h"
int main(void) {
    int32_t head[6], acc[COLS];
    int8_t a[COLS], b[COLS];
    float fa[COLS], fb[COLS];
    while (scanf("%d %d %d %d %d %d", &head[0], &head[1], &head[2], &head[3], &head[4], &head[5]) == 6) {
        for (int i = 0; i < COLS; i++) scanf("%d", &acc[i]);
        et_qrow r = {a, 0, head[0], head[1], head[2], head[3], head[4], head[5], 0, 0, 0, 0.0f};
        r.right = r.shift > 0 ? 0 : -r.shift;
        r.mask = (int32_t)((1u << r.right) - 1u);
        r.half = r.mask >> 1;
        if (head[2] == 99) { /* a float row */
            r.shift = 0; r.right = 0; r.mask = 0; r.half = 0;
            r.y = 0; r.yf = fa; r.scale = 0.125f;
            for (int q = 0; q < COLS; q++) et_qrow_put(&r, q, acc[q]);
            r.yf = fb;
            et_qrow_put_n(&r, 0, acc, COLS);
            for (int q = 0; q < COLS; q++) printf("%.9g %.9g ", fa[q], fb[q]);
        } else {
            for (int q = 0; q < COLS; q++) et_qrow_put(&r, q, acc[q]);
            r.y = b; /* in two calls: columns 2.. from acc + 2, then columns 0 and 1 */
            et_qrow_put_n(&r, 2, acc + 2, COLS - 2);
            et_qrow_put_n(&r, 0, acc, 2);
            for (int q = 0; q < COLS; q++) printf("%d %d ", a[q], b[q]);
        }
        printf("\n");
    }
    return 0;
}
"""


def _python_put(acc: int, bias: int, mult: int, shift: int, yz: int, lo: int, hi: int) -> int:
    """et_qrow_put's arithmetic for a right shift (shift <= 0), in Python integers"""
    s = min(max(acc + bias, I32_MIN), I32_MAX)
    h = (s * mult + (1 << 30)) >> 31
    right = -shift
    mask = (1 << right) - 1
    v = (h >> right) + (1 if (h & mask) > (mask >> 1) + (1 if h < 0 else 0) else 0)
    return min(max(v + yz, lo), hi)


def _rows(rng):
    """(bias, mult, shift, y_zero, qmin, qmax) and COLS accumulators a row, every edge drawn often"""
    rows = []
    for i in range(ROWS):
        shift = -(i % 32) if i % 10 else int(rng.integers(1, 6))  # every right shift; a left one each 10th
        if i % 50 == 7:
            shift = 99  # the harness's float row
        mult = int(rng.integers(1 << 30, 1 << 31))
        if i % 3 == 0:
            mult = 1 << 30  # h = s / 2, exactly: ties at every odd s when right is 1, and so on
        bias = int(rng.choice([0, int(rng.integers(-1000, 1000)), I32_MAX - 5, I32_MIN + 5,
                               int(rng.integers(I32_MIN, I32_MAX))]))
        yz = int(rng.integers(-128, 128))
        lo, hi = [(-128, 127), (yz, 127), (yz, min(127, yz + 6))][i % 3]
        scale = 1 << min(31, max(0, -shift if shift <= 0 else 0) + 8)
        acc = rng.integers(-scale, scale, COLS, dtype=np.int64)
        acc[:4] = [I32_MAX, I32_MIN, I32_MAX - 1, -1]  # saturating sums with either sign of bias
        acc[4:12] = np.arange(-4, 4) << max(0, -shift - 1) if shift <= 0 else 0  # ties of both signs
        rows.append((bias, mult, shift, yz, lo, hi, acc.clip(I32_MIN, I32_MAX).astype(np.int64)))
    return rows


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64", "i686"),
                    reason="et_qrow_put_n's loop without branches is compiled on x86 and aarch64 only")
def test_the_row_loop_stores_what_et_qrow_put_stores(tmp_path):
    (tmp_path / "t.c").write_text(HARNESS)
    # the host library's optimization (-O3, the CPU's vectors): the loop is vectorized as in the library
    subprocess.run([find_cc(), "-std=gnu11", "-O3", "-march=native", "-Wall", "-Werror", "-Wno-unused-function",
                    f"-DCOLS={COLS}", f"-I{RUNTIME_DIR}", "-fopt-info-vec-optimized=vec.txt", "-o", "t", "t.c"],
                   cwd=tmp_path, check=True, capture_output=True, text=True)
    core_lines = [ln for ln in (tmp_path / "vec.txt").read_text().splitlines() if "et_int8_core.h" in ln]
    assert core_lines, "et_qrow_put_n's loop was not vectorized"
    rows = _rows(np.random.default_rng(0))
    text = "".join(f"{b} {m} {s} {z} {lo} {hi} " + " ".join(str(int(v)) for v in acc) + "\n"
                   for b, m, s, z, lo, hi, acc in rows)
    out = subprocess.run([str(tmp_path / "t")], input=text, capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    assert len(lines) == ROWS
    checked = ties = saturated = 0
    for (bias, mult, shift, yz, lo, hi, acc), line in zip(rows, lines):
        vals = line.split()
        put, put_n = vals[0::2], vals[1::2]
        assert put_n == put, (bias, mult, shift)
        if shift > 0:
            continue  # left shifts and float rows: et_qrow_put's own loop (the comparison above)
        for a, got in zip(acc, put):
            assert int(got) == _python_put(int(a), bias, mult, shift, yz, lo, hi), (int(a), bias, mult, shift)
            s = int(a) + bias
            saturated += not I32_MIN <= s <= I32_MAX
            h = (min(max(s, I32_MIN), I32_MAX) * mult + (1 << 30)) >> 31
            ties += shift < 0 and (h & ((1 << -shift) - 1)) == (1 << (-shift - 1))
            checked += 1
    assert checked > 10000 and ties > 200 and saturated > 100, (checked, ties, saturated)
