"""exp and log in float64 exactly as the C runtime computes them (backends/c/runtime/et_common.h:
et_exp, et_log), operation for operation. numpy's exp (SIMD, platform-dependent) and a C libm
differ in the last bit; a reference whose float result feeds integer stochastic rounding
(the loss gradient of an int8 program) must be reproducible bit for bit by the generated C
on the host and on a Cortex-M, so both use this one algorithm: x = k ln2 + r (Cody-Waite
split of ln2), exp(r) by its Taylor polynomial to r^13 in Horner form, times 2^k.
IEEE float64 +, -, *, / are exact-rounded alike in numpy and in C compiled with
-ffp-contract=off."""
from __future__ import annotations

import numpy as np

LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10  # ln2 = HI + LO, HI with 32 bits
INV_LN2 = 1.44269504088896338700e+00
TAYLOR_DEGREE = 13  # |r| <= ln2/2: the r^14 term is below 2^-60 of the sum
UNDERFLOW = -745.2  # exp(x) below the smallest float64 subnormal
OVERFLOW = 709.7
SUBNORMAL_K = -1022  # 2^k is no longer a normal float64 below this
SUBNORMAL_SHIFT = 600


def exp_like_c(x) -> np.ndarray:
    """float64 exp(x), bit-identical to et_exp of et_common.h."""
    x = np.asarray(x, np.float64)
    # NaN and |x| beyond the float64 range are answered below (as et_exp returns early for
    # them): clip so that the integer conversion stays defined
    kf = np.clip(np.nan_to_num(x, nan=0.0), UNDERFLOW - 1, OVERFLOW + 1) * INV_LN2
    k = np.where(kf < 0, kf - 0.5, kf + 0.5).astype(np.int64)  # C's (int) truncates toward zero
    kd = k.astype(np.float64)
    r = (x - kd * LN2_HI) - kd * LN2_LO
    p = 1.0 + r / float(TAYLOR_DEGREE)
    for i in range(TAYLOR_DEGREE - 1, 0, -1):
        p = 1.0 + r / float(i) * p
    small = k < SUBNORMAL_K
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.where(small, np.ldexp(np.ldexp(p, np.where(small, k + SUBNORMAL_SHIFT, 0)),
                                       -SUBNORMAL_SHIFT * small), np.ldexp(p, np.clip(k, -1100, 1100)))
        out = np.where(x > OVERFLOW, np.inf, out)
    out = np.where(x < UNDERFLOW, 0.0, out)
    return np.where(np.isnan(x), x, out)


LOG_SERIES_DEGREE = 23  # log m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172: the s^25 term is below 2^-60
SQRT2 = 1.4142135623730951


def log_like_c(x) -> np.ndarray:
    """float64 log(x), bit-identical to et_log of et_common.h: x = 2^e m with m in
    [sqrt(1/2), sqrt(2)), log m by the odd series of 2 atanh((m-1)/(m+1)) in Horner form."""
    x = np.asarray(x, np.float64)
    fm, fe = np.frexp(np.where(np.isfinite(x) & (x > 0), x, 1.0))  # x = fm 2^fe, fm in [0.5, 1): exact
    m, e = fm * 2.0, fe.astype(np.int64) - 1  # C's mantissa in [1, 2)
    big = m > SQRT2
    m = np.where(big, m * 0.5, m)
    e = e + big
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    t = np.full_like(s, 1.0 / float(LOG_SERIES_DEGREE))
    for i in range(LOG_SERIES_DEGREE - 2, 0, -2):
        t = 1.0 / float(i) + s2 * t
    ed = e.astype(np.float64)
    out = ed * LN2_HI + (2.0 * s * t + ed * LN2_LO)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(x == 0, -np.inf, out)
        out = np.where(np.isnan(x) | (x < 0), np.nan, out)
        out = np.where(x > 1.79e308, x, out)
    return out
