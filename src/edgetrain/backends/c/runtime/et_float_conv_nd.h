/* edgetrain C runtime: float kernels of conv_nd (see kernels/float32_conv_nd.py). Header-only.
 *
 * - conv_transpose2d: the input gradient of the conv2d whose input has its output's shape
 *   (et_conv2d_grad_input of et_float_gemm.h, or et_conv_grad_input of et_float.h when output
 *   padding reaches past that conv2d's last window), then the bias per output channel.
 * - conv3d, its input gradient and its weight gradient: direct loops over NCDHW activations and
 *   [O][C/G][KD][KH][KW] weights, each output summed in a fixed order (taps in row-major order,
 *   then batch and positions for the weight gradient), so every build computes the same values.
 *
 * Geometry arguments of the conv3d kernels, in order: N, C, D, H, W (input), O, DO, HO, WO
 * (output), KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, G. */
#ifndef ET_FLOAT_CONV_ND_H
#define ET_FLOAT_CONV_ND_H
#include "et_common.h"
#include "et_float.h"
#include "et_float_gemm.h"

/* Y[n][o][...] += B[o] over P positions per channel */
ET_INLINE void et_add_channel_bias(float *ET_RESTRICT Y, const float *ET_RESTRICT B, int N, int O, int P) {
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < O; ++o) {
            float *y = Y + ((size_t)n * O + o) * P;
            for (int i = 0; i < P; ++i) y[i] += B[o];
        }
}

/* conv_transpose2d of X (N, CI, H, W) by W (CI, CO/G, KH, KW) into Y (N, CO, HO, WO): the input
 * gradient of conv2d (CO -> CI channels) at input shape (HO, WO); `exact` when that conv2d's
 * output is exactly (H, W) (output padding below the stride), else the bounded direct kernel */
ET_INLINE void et_conv_transpose2d(const float *ET_RESTRICT X, const float *ET_RESTRICT W,
                                   const float *ET_RESTRICT B, float *ET_RESTRICT Y, int N, int CI, int H, int Wd,
                                   int CO, int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                                   int DW, int G, int exact) {
    if (exact)
        et_conv2d_grad_input(X, W, Y, N, CO, HO, WO, CI, H, Wd, KH, KW, SH, SW, PH, PW, DH, DW, G);
    else
        et_conv_grad_input(X, W, Y, N, CO, HO, WO, CI, H, Wd, KH, KW, SH, SW, PH, PW, DH, DW, G);
    if (B) et_add_channel_bias(Y, B, N, CO, HO * WO);
}

/* et_lo / et_hi (et_float.h) bound each tap's output positions to those reading inside the input */
ET_INLINE void et_conv3d(const float *ET_RESTRICT X, const float *ET_RESTRICT Wt, const float *ET_RESTRICT B,
                         float *ET_RESTRICT Y, int N, int C, int D, int H, int Wd, int O, int DO, int HO, int WO,
                         int KD, int KH, int KW, int SD, int SH, int SW, int PD, int PH, int PW, int DD, int DH,
                         int DW, int G) {
    const int cg = C / G, og = O / G;
    const size_t P = (size_t)DO * HO * WO, Q = (size_t)D * H * Wd;
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < O; ++o) {
            float *y = Y + ((size_t)n * O + o) * P;
            const int g = o / og;
            for (size_t i = 0; i < P; ++i) y[i] = B ? B[o] : 0.f;
            for (int ci = 0; ci < cg; ++ci) {
                const float *x = X + ((size_t)n * C + g * cg + ci) * Q;
                const float *w = Wt + ((size_t)o * cg + ci) * KD * KH * KW;
                for (int kd = 0; kd < KD; ++kd) {
                    const int d0 = et_lo(PD, kd, DD, SD), d1 = et_hi(D, PD, kd, DD, SD, DO);
                    for (int kh = 0; kh < KH; ++kh) {
                        const int h0 = et_lo(PH, kh, DH, SH), h1 = et_hi(H, PH, kh, DH, SH, HO);
                        for (int kw = 0; kw < KW; ++kw) {
                            const int w0 = et_lo(PW, kw, DW, SW), w1 = et_hi(Wd, PW, kw, DW, SW, WO);
                            const float wv = w[(kd * KH + kh) * KW + kw];
                            for (int od = d0; od < d1; ++od)
                                for (int oh = h0; oh < h1; ++oh) {
                                    const float *xr = x + ((size_t)(od * SD - PD + kd * DD) * H +
                                                           (oh * SH - PH + kh * DH)) * Wd - PW + kw * DW;
                                    float *yr = y + ((size_t)od * HO + oh) * WO;
                                    for (int ow = w0; ow < w1; ++ow) yr[ow] += wv * xr[ow * SW];
                                }
                        }
                    }
                }
            }
        }
}

ET_INLINE void et_conv3d_grad_input(const float *ET_RESTRICT GY, const float *ET_RESTRICT Wt, float *ET_RESTRICT GX,
                                    int N, int C, int D, int H, int Wd, int O, int DO, int HO, int WO, int KD, int KH,
                                    int KW, int SD, int SH, int SW, int PD, int PH, int PW, int DD, int DH, int DW,
                                    int G) {
    const int cg = C / G, og = O / G;
    const size_t P = (size_t)DO * HO * WO, Q = (size_t)D * H * Wd;
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            float *gx = GX + ((size_t)n * C + c) * Q;
            const int g = c / cg, ci = c % cg;
            for (size_t i = 0; i < Q; ++i) gx[i] = 0.f;
            for (int oo = 0; oo < og; ++oo) {
                const int o = g * og + oo;
                const float *gy = GY + ((size_t)n * O + o) * P;
                const float *w = Wt + ((size_t)o * cg + ci) * KD * KH * KW;
                for (int kd = 0; kd < KD; ++kd) {
                    const int d0 = et_lo(PD, kd, DD, SD), d1 = et_hi(D, PD, kd, DD, SD, DO);
                    for (int kh = 0; kh < KH; ++kh) {
                        const int h0 = et_lo(PH, kh, DH, SH), h1 = et_hi(H, PH, kh, DH, SH, HO);
                        for (int kw = 0; kw < KW; ++kw) {
                            const int w0 = et_lo(PW, kw, DW, SW), w1 = et_hi(Wd, PW, kw, DW, SW, WO);
                            const float wv = w[(kd * KH + kh) * KW + kw];
                            for (int od = d0; od < d1; ++od)
                                for (int oh = h0; oh < h1; ++oh) {
                                    float *xr = gx + ((size_t)(od * SD - PD + kd * DD) * H +
                                                      (oh * SH - PH + kh * DH)) * Wd - PW + kw * DW;
                                    const float *gr = gy + ((size_t)od * HO + oh) * WO;
                                    for (int ow = w0; ow < w1; ++ow) xr[ow * SW] += wv * gr[ow];
                                }
                        }
                    }
                }
            }
        }
}

ET_INLINE void et_conv3d_grad_weight(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *ET_RESTRICT GW,
                                     int N, int C, int D, int H, int Wd, int O, int DO, int HO, int WO, int KD, int KH,
                                     int KW, int SD, int SH, int SW, int PD, int PH, int PW, int DD, int DH, int DW,
                                     int G) {
    const int cg = C / G, og = O / G;
    const size_t P = (size_t)DO * HO * WO, Q = (size_t)D * H * Wd;
    for (int o = 0; o < O; ++o) {
        const int g = o / og;
        for (int ci = 0; ci < cg; ++ci)
            for (int kd = 0; kd < KD; ++kd) {
                const int d0 = et_lo(PD, kd, DD, SD), d1 = et_hi(D, PD, kd, DD, SD, DO);
                for (int kh = 0; kh < KH; ++kh) {
                    const int h0 = et_lo(PH, kh, DH, SH), h1 = et_hi(H, PH, kh, DH, SH, HO);
                    for (int kw = 0; kw < KW; ++kw) {
                        const int w0 = et_lo(PW, kw, DW, SW), w1 = et_hi(Wd, PW, kw, DW, SW, WO);
                        float acc = 0.f;
                        for (int n = 0; n < N; ++n) {
                            const float *x = X + ((size_t)n * C + g * cg + ci) * Q;
                            const float *gy = GY + ((size_t)n * O + o) * P;
                            for (int od = d0; od < d1; ++od)
                                for (int oh = h0; oh < h1; ++oh) {
                                    const float *xr = x + ((size_t)(od * SD - PD + kd * DD) * H +
                                                           (oh * SH - PH + kh * DH)) * Wd - PW + kw * DW;
                                    const float *gr = gy + ((size_t)od * HO + oh) * WO;
                                    for (int ow = w0; ow < w1; ++ow) acc += xr[ow * SW] * gr[ow];
                                }
                        }
                        GW[(((size_t)o * cg + ci) * KD + kd) * KH * KW + kh * KW + kw] = acc;
                    }
                }
            }
    }
}

#endif
