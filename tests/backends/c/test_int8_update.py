"""et_floor_level (runtime/et_int8_update.h), the rounding step of the qsgd update: the floor of
v + u clamped to [qmin, qmax] as an int32, as ops/qoptim.py's clip(floor(v + u), qmin, qmax).
Both of its forms, the portable truncate-and-correct one (host, Cortex-M4) and the FPv5 one
(Cortex-M7: -DET_FPV5, floorf, one VRINTM there), compiled here for the host and checked
against numpy on the edges: halves, negative zero, around 2^23 and 2^24, the int32 ends (qmax
= INT32_MAX rounds to 2^31 in float32 and must give INT32_MAX)."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from edgetrain.backends.c.cortexm import fpu_defines, get_target
from edgetrain.backends.c.emit import RUNTIME_DIR

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")

SOURCE = """
#include "et_int8_update.h"
int32_t level(float t, int32_t qmin, int32_t qmax) {
    const float lo = (float)qmin, hi = (float)qmax;
    if (t < lo) t = lo;
    if (t > hi) t = hi;
    return et_floor_level(t);
}
"""


def _library(tmp_path, defines):
    src = tmp_path / "level.c"
    src.write_text(SOURCE)
    lib = tmp_path / f"level{len(defines)}.so"
    subprocess.run([CC, "-O2", "-shared", "-fPIC", "-ffp-contract=off", *defines, f"-I{RUNTIME_DIR}", "-o",
                    str(lib), str(src), "-lm"], check=True)
    f = ctypes.CDLL(str(lib)).level
    f.argtypes, f.restype = [ctypes.c_float, ctypes.c_int32, ctypes.c_int32], ctypes.c_int32
    return f


def _expected(t: np.float32, qmin: int, qmax: int) -> int:
    r = np.clip(np.floor(np.float32(t)), np.float32(qmin), np.float32(qmax)).astype(np.float32)
    return 2 ** 31 - 1 if r >= np.float32(2.0 ** 31) else int(r)


def _values():
    rng = np.random.default_rng(0)
    edges = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 0.99999994, -0.99999994, 127.5, -128.5, 127.0, -128.0, 200.0, -300.0,
             2.0 ** 23 - 0.5, -(2.0 ** 23 - 0.5), 2.0 ** 23, 2.0 ** 24 + 2, -(2.0 ** 24) - 2, 2.0 ** 31, -(2.0 ** 31),
             2.0 ** 31 - 128, -(2.0 ** 31) + 128, 3e9, -3e9, np.inf, -np.inf]
    drawn = np.concatenate([rng.uniform(-300, 300, 400), rng.normal(0, 1e6, 200), rng.normal(0, 3e9, 200)])
    return np.concatenate([np.array(edges), drawn]).astype(np.float32)


@pytest.mark.parametrize("fpv5", [False, True])
def test_floor_level_matches_numpy(tmp_path, fpv5):
    level = _library(tmp_path, ["-DET_FPV5"] if fpv5 else [])
    for qmin, qmax in ((-128, 127), (-(2 ** 31), 2 ** 31 - 1)):
        for t in _values():
            assert level(float(t), qmin, qmax) == _expected(t, qmin, qmax), (float(t), qmin, qmax)


def test_only_the_fpv5_target_gets_the_define():
    assert fpu_defines(get_target("cortex-m7")) == ("-DET_FPV5",)
    assert fpu_defines(get_target("cortex-m4")) == ()
