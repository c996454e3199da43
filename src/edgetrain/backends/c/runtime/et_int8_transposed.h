/* edgetrain C runtime: int8 transposed convolution (ops/qconv_transpose.py, TFLite's int8
 * TRANSPOSE_CONV) and its float32 backward, bit-exact with the references:
 * - forward: exact int32 accumulation of (x - x_zero) * w over the input taps that reach an
 *   output element, the bias added saturating, then et_mbqm (et_int8.h) and the clamp, or with
 *   float outputs (float)acc * OS[c];
 * - input gradient: w_real * g added in (j, ky, kx) order from 0, w_real = (float)w * WS[c];
 * - weight gradient: g * (x - x_zero) added over (n, iy, ix) in that order from 0, then times
 *   SC[c]. Taps outside the output are skipped (the references add exact zeros there, which
 *   change no sum that starts at +0). Compile with -ffp-contract=off.
 * The weight is torch's (C_in, C_out / groups, kH, kW); output channel c = group * OG + j.
 * Geometry and quantization come as one int32 table P indexed by ET_T_*. Header-only. */
#ifndef ET_INT8_TRANSPOSED_H
#define ET_INT8_TRANSPOSED_H
#include <stdint.h>
#include "et_int8.h"

enum {
    ET_T_N, ET_T_C, ET_T_H, ET_T_W, ET_T_O, ET_T_OG, ET_T_KH, ET_T_KW, ET_T_HO, ET_T_WO,
    ET_T_SH, ET_T_SW, ET_T_PH, ET_T_PW, ET_T_DH, ET_T_DW, ET_T_G, ET_T_XZ, ET_T_YZ, ET_T_QMIN, ET_T_QMAX, ET_T_LEN
};

/* the input position that output position o meets through kernel tap k, or -1 */
static inline int32_t et_t_in(int32_t o, int32_t k, int32_t s, int32_t p, int32_t d, int32_t n) {
    const int32_t t = o + p - k * d;
    if (t < 0 || t % s) return -1;
    return t / s < n ? t / s : -1;
}

/* the output position that input position i meets through kernel tap k, or -1 */
static inline int32_t et_t_out(int32_t i, int32_t k, int32_t s, int32_t p, int32_t d, int32_t n) {
    const int32_t o = i * s - p + k * d;
    return o >= 0 && o < n ? o : -1;
}

/* Y (int8, with M / S the requantization) or YF (float32, with OS the output scales) */
static inline void et_qconv_transpose(const int32_t *P, const int8_t *X, const int8_t *Wt, const int32_t *B,
                                      const int32_t *M, const int8_t *S, const float *OS, int8_t *Y, float *YF) {
    const int32_t C = P[ET_T_C], H = P[ET_T_H], W = P[ET_T_W], O = P[ET_T_O], OG = P[ET_T_OG];
    const int32_t KH = P[ET_T_KH], KW = P[ET_T_KW], HO = P[ET_T_HO], WO = P[ET_T_WO];
    const int32_t CG = C / P[ET_T_G], XZ = P[ET_T_XZ];
    for (int32_t n = 0; n < P[ET_T_N]; n++)
        for (int32_t oc = 0; oc < O; oc++) {
            const int32_t grp = oc / OG, j = oc % OG;
            for (int32_t oy = 0; oy < HO; oy++)
                for (int32_t ox = 0; ox < WO; ox++) {
                    int32_t acc = 0;
                    for (int32_t i = 0; i < CG; i++) {
                        const int32_t ci = grp * CG + i;
                        const int8_t *x = X + ((size_t)n * C + ci) * H * W;
                        const int8_t *w = Wt + ((size_t)ci * OG + j) * KH * KW;
                        for (int32_t ky = 0; ky < KH; ky++) {
                            const int32_t iy = et_t_in(oy, ky, P[ET_T_SH], P[ET_T_PH], P[ET_T_DH], H);
                            if (iy < 0) continue;
                            for (int32_t kx = 0; kx < KW; kx++) {
                                const int32_t ix = et_t_in(ox, kx, P[ET_T_SW], P[ET_T_PW], P[ET_T_DW], W);
                                if (ix >= 0) acc += ((int32_t)x[iy * W + ix] - XZ) * w[ky * KW + kx];
                            }
                        }
                    }
                    acc = et_addsat32(acc, B[oc]);
                    const size_t at = (((size_t)n * O + oc) * HO + oy) * WO + ox;
                    if (YF) YF[at] = (float)acc * OS[oc];
                    else Y[at] = (int8_t)et_clampi(et_mbqm(acc, M[oc], S[oc]) + P[ET_T_YZ], P[ET_T_QMIN], P[ET_T_QMAX]);
                }
        }
}

/* GX (float32, the input's shape) from the output gradient G and the weight's real values */
static inline void et_qconv_transpose_grad_input(const int32_t *P, const float *G, const int8_t *Wt, const float *WS,
                                                 float *GX) {
    const int32_t C = P[ET_T_C], H = P[ET_T_H], W = P[ET_T_W], O = P[ET_T_O], OG = P[ET_T_OG];
    const int32_t KH = P[ET_T_KH], KW = P[ET_T_KW], HO = P[ET_T_HO], WO = P[ET_T_WO], CG = C / P[ET_T_G];
    for (int32_t n = 0; n < P[ET_T_N]; n++)
        for (int32_t ci = 0; ci < C; ci++) {
            const int32_t grp = ci / CG;
            for (int32_t iy = 0; iy < H; iy++)
                for (int32_t ix = 0; ix < W; ix++) {
                    float s = 0.0f;
                    for (int32_t j = 0; j < OG; j++) {
                        const int32_t oc = grp * OG + j;
                        const float ws = WS[oc];
                        const float *g = G + ((size_t)n * O + oc) * HO * WO;
                        const int8_t *w = Wt + ((size_t)ci * OG + j) * KH * KW;
                        for (int32_t ky = 0; ky < KH; ky++) {
                            const int32_t oy = et_t_out(iy, ky, P[ET_T_SH], P[ET_T_PH], P[ET_T_DH], HO);
                            if (oy < 0) continue;
                            for (int32_t kx = 0; kx < KW; kx++) {
                                const int32_t ox = et_t_out(ix, kx, P[ET_T_SW], P[ET_T_PW], P[ET_T_DW], WO);
                                if (ox < 0) continue;
                                const float wr = (float)w[ky * KW + kx] * ws;
                                s += wr * g[oy * WO + ox];
                            }
                        }
                    }
                    GX[(((size_t)n * C + ci) * H + iy) * W + ix] = s;
                }
        }
}

/* GW (float32, the weight's shape): d loss / d w_int from the input X and output gradient G */
static inline void et_qconv_transpose_grad_weight(const int32_t *P, const int8_t *X, const float *G, const float *SC,
                                                  float *GW) {
    const int32_t C = P[ET_T_C], H = P[ET_T_H], W = P[ET_T_W], O = P[ET_T_O], OG = P[ET_T_OG];
    const int32_t KH = P[ET_T_KH], KW = P[ET_T_KW], HO = P[ET_T_HO], WO = P[ET_T_WO], CG = C / P[ET_T_G];
    const float xz = (float)P[ET_T_XZ];
    for (int32_t ci = 0; ci < C; ci++)
        for (int32_t j = 0; j < OG; j++) {
            const int32_t oc = (ci / CG) * OG + j;
            for (int32_t ky = 0; ky < KH; ky++)
                for (int32_t kx = 0; kx < KW; kx++) {
                    float s = 0.0f;
                    for (int32_t n = 0; n < P[ET_T_N]; n++) {
                        const int8_t *x = X + ((size_t)n * C + ci) * H * W;
                        const float *g = G + ((size_t)n * O + oc) * HO * WO;
                        for (int32_t iy = 0; iy < H; iy++) {
                            const int32_t oy = et_t_out(iy, ky, P[ET_T_SH], P[ET_T_PH], P[ET_T_DH], HO);
                            if (oy < 0) continue;
                            for (int32_t ix = 0; ix < W; ix++) {
                                const int32_t ox = et_t_out(ix, kx, P[ET_T_SW], P[ET_T_PW], P[ET_T_DW], WO);
                                if (ox >= 0) s += g[oy * WO + ox] * ((float)x[iy * W + ix] - xz);
                            }
                        }
                    }
                    GW[(((size_t)ci * OG + j) * KH + ky) * KW + kx] = s * SC[oc];
                }
        }
}

#endif /* ET_INT8_TRANSPOSED_H */
