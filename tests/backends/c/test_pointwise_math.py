"""The libm-free double functions of runtime/et_float_pointwise.h (et_sin, et_cos, et_log1p,
et_expm1) against the platform's libm (Python's math module: numpy's own vectorized sin and cos
lose precision for large arguments) over wide ranges, their tails and special values, numpy for
the special values: compiled alone with the host backend's flags and called through ctypes."""
from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import numpy as np
import pytest

from edgetrain.backends.c.emit import RUNTIME_DIR

FUNCS = ("sin", "cos", "log1p", "expm1")
#: |ours - numpy| / |numpy|: a few ulp of double (numpy's libm is itself within an ulp)
REL_TOL = 1e-15
#: where the result passes through zero (sin near n pi, cos near (n + 1/2) pi), the error is
#: bounded relative to the argument's reduction instead: a few ulp of pi/2
ABS_TOL = 1e-15
#: the largest |x| the trig test draws: the reduction is exact there (2^29 pi/2 ~ 8.4e8)
TRIG_EXACT = 2.0**29 * np.pi / 2

_SOURCE = "#include \"et_float_pointwise.h\"\n" + "\n".join(
    f"void v_{f}(const double *x, double *y, long n) {{ for (long i = 0; i < n; ++i) y[i] = et_{f}(x[i]); }}"
    for f in FUNCS)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc missing")
    d = tmp_path_factory.mktemp("pointwise_math")
    (d / "m.c").write_text(_SOURCE)
    r = subprocess.run(["gcc", "-O2", "-std=c99", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC",
                        f"-I{RUNTIME_DIR}", "m.c", "-o", "m.so"], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    so = ctypes.CDLL(str(d / "m.so"))

    def call(name: str, x) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float64)
        y = np.empty_like(x)
        getattr(so, f"v_{name}")(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p),
                                 ctypes.c_long(x.size))
        return y

    return call


def libm(name: str, x) -> np.ndarray:
    """math.<name> of each (finite, in-domain) element."""
    return np.frompyfunc(getattr(math, name), 1, 1)(np.asarray(x, dtype=np.float64)).astype(np.float64)


def _close(got, want, abs_tol=0.0):
    err = np.abs(got - want)
    ok = (err <= REL_TOL * np.abs(want)) | (err <= abs_tol) | (got == want)
    bad = np.flatnonzero(~ok)
    assert bad.size == 0, f"{bad.size} values off, e.g. at {got.flat[bad[0]]!r} vs {want.flat[bad[0]]!r}"


def _wide(rng, lo_exp, hi_exp, n):
    """Random magnitudes spread evenly over the exponents 10^lo_exp .. 10^hi_exp, both signs."""
    return rng.choice([-1.0, 1.0], n) * 10.0 ** rng.uniform(lo_exp, hi_exp, n)


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_trig_matches_numpy_over_a_wide_range(lib, name):
    rng = np.random.default_rng(0)
    x = np.concatenate([_wide(rng, -300, np.log10(TRIG_EXACT), 40000), rng.uniform(-10, 10, 20000),
                        np.arange(-2000, 2001) * (np.pi / 4)])  # the quadrant boundaries
    want = libm(name, x)
    _close(lib(name, x), want, abs_tol=ABS_TOL)


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_trig_near_the_zeros_keeps_relative_precision(lib, name):
    """The doubles nearest to multiples of pi/2 (up to 1e5 pi/2 and beyond): an inexact
    reduction loses every digit of the tiny result there."""
    k = np.concatenate([np.arange(1, 3000), np.unique(np.geomspace(3000, 5e8, 3000).astype(np.int64))])
    x = k * (np.pi / 2)
    x = np.concatenate([x, np.nextafter(x, 0), np.nextafter(x, np.inf), -x])
    _close(lib(name, x), libm(name, x))


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_trig_special_values(lib, name):
    x = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-310, -1e-310, 5e-324, 1e-9, np.pi / 4, -np.pi / 4])
    with np.errstate(invalid="ignore"):
        want = getattr(np, name)(x)
    got = lib(name, x)
    np.testing.assert_array_equal(got, want)
    num = ~np.isnan(want)  # (a NaN's sign bit is the platform's)
    np.testing.assert_array_equal(np.signbit(got[num]), np.signbit(want[num]))


#: |x| from which the reduction is refused: 2^53 pi/2, where n = round(x 2/pi) passes 2^53
TRIG_MAX = 2.0**53 * np.pi / 2
#: absolute error of the reduced argument between TRIG_EXACT and TRIG_MAX (the roundings of the
#: accumulated tail), with a margin
MID_ABS_TOL = 1e-20


def test_trig_between_the_exact_range_and_its_limit(lib):
    x = _wide(np.random.default_rng(2), np.log10(TRIG_EXACT), np.log10(TRIG_MAX) - 1e-9, 4000)
    for name in ("sin", "cos"):
        _close(lib(name, x), libm(name, x), abs_tol=MID_ABS_TOL)


def test_trig_beyond_its_limit_is_nan(lib):
    x = np.concatenate([_wide(np.random.default_rng(1), np.log10(TRIG_MAX), 308, 200), [TRIG_MAX, -TRIG_MAX]])
    for name in ("sin", "cos"):
        assert np.isnan(lib(name, x)).all()


def test_log1p_matches_numpy(lib):
    rng = np.random.default_rng(3)
    x = np.concatenate([_wide(rng, -320, -1, 20000), 10.0 ** rng.uniform(-1, 308, 20000),
                        rng.uniform(-1, 1, 20000), -1 + 10.0 ** rng.uniform(-16, -1, 2000)])
    x = x[x > -1]
    _close(lib("log1p", x), libm("log1p", x))


def test_log1p_special_values(lib):
    x = np.array([0.0, -0.0, -1.0, -1.5, np.nan, np.inf, -np.inf, 5e-324, -5e-324, 1e-300, np.finfo(float).max])
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.log1p(x)
    got = lib("log1p", x)
    np.testing.assert_array_equal(got, want)
    num = ~np.isnan(want)  # (a NaN's sign bit is the platform's)
    np.testing.assert_array_equal(np.signbit(got[num]), np.signbit(want[num]))


def test_expm1_matches_numpy(lib):
    rng = np.random.default_rng(4)
    x = np.concatenate([_wide(rng, -320, 2.8, 20000), rng.uniform(-1, 1, 20000), [0.0, -0.0, 709.0, -800.0]])
    _close(lib("expm1", x[x < 709.7]), libm("expm1", x[x < 709.7]))
    np.testing.assert_array_equal(np.signbit(lib("expm1", np.array([-0.0]))), [True])


# --- the kernels of kernels/float32_pointwise.py in float64, on wide ranges, against the reference ----
#: max |C - reference| / max(|reference|, 1) of a float64 kernel (as tests/ops/test_backends.py's)
FLOAT64_TOL = 1e-13
_WIDE = np.concatenate([np.linspace(-60, 60, 241), [-1e3, -30.0, 0.0, -0.0, 1e-12, -1e-12, 40.0, 1e3]])
#: the pointwise gradient op of each forward op (the others' VJPs are mul / div / exp / sin / cos)
GRAD_OPS = {"elu": "elu_grad", "leaky_relu": "leaky_relu_grad", "softplus": "softplus_grad", "abs": "abs_grad"}
KERNEL_CASES = [("elu", {"alpha": 1.0, "scale": 1.0, "input_scale": 1.0}),
                ("elu", {"alpha": 1.6732632423543772, "scale": 1.0507009873554805, "input_scale": 1.0}),
                ("elu", {"alpha": 0.5, "scale": 1.0, "input_scale": 2.0}),
                ("leaky_relu", {"negative_slope": 0.01}), ("leaky_relu", {"negative_slope": -0.5}),
                ("softplus", {"beta": 1.0, "threshold": 20.0}), ("softplus", {"beta": 3.0, "threshold": 500.0}),
                ("softplus", {"beta": 0.5, "threshold": 1.0}),
                ("log1p", {}), ("expm1", {}), ("sin", {}), ("cos", {}), ("abs", {})]


def test_float64_kernels_match_the_reference():
    """Each forward kernel and gradient op's, node by node (the VJPs' other ops are float32 only),
    side by side in one library."""
    from edgetrain.backends.c.graph_lib import build_graph_library
    from edgetrain.ir import Graph, Node, new_value
    from edgetrain.ops import OPS
    from tests.ops.test_ops import forward_graph

    inputs, nodes, feeds, want = [], [], [], []
    ct = np.random.default_rng(0).normal(size=_WIDE.shape)
    for k, (op, attrs) in enumerate(KERNEL_CASES):
        x = np.abs(_WIDE) - 0.999 if op == "log1p" else (_WIDE / 100 if op == "expm1" else _WIDE)
        for name, arrays in [(op, [x])] + ([(GRAD_OPS[op], [ct, x])] if op in GRAD_OPS else []):
            (n,) = forward_graph(name, arrays, attrs).nodes
            ins = tuple(new_value(v.type, f"c{k}{name}:{i}") for i, v in enumerate(n.inputs))
            inputs += ins
            feeds += arrays
            nodes.append(Node(n.op, ins, n.outputs, n.attrs))
            want.append((f"{name} {attrs}", OPS[name].ref(arrays, attrs)[0]))
    outs = tuple(n.out for n in nodes)
    g = Graph(tuple(inputs), tuple(nodes), outs, tuple(f"y{i}" for i in range(len(outs))))
    for got, (what, ref) in zip(build_graph_library(g)(feeds), want):
        err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1.0))
        assert err <= FLOAT64_TOL, what
