/* edgetrain C runtime: float32 kernels. Every function is always-inline and called with
 * compile-time constant shapes, so the compiler specialises (unrolls, vectorises) each
 * call site. Layout: NCHW, row-major, no padding. Header-only. */
#ifndef ET_FLOAT_H
#define ET_FLOAT_H
#include "et_common.h"
#include "et_float_bn.h" /* batch norm on running statistics (with the training-mode kernels) */

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi" /* notes on passing 32-byte vectors (inline functions only) */
#endif

/* ---- 8-lane float vectors (GCC/Clang vector extensions; lowered to scalars where the
 * target has no SIMD) ----------------------------------------------------------------- */
typedef float et_v8 __attribute__((vector_size(32)));
ET_INLINE et_v8 et_ld8(const float *p) { et_v8 v; memcpy(&v, p, sizeof v); return v; }
ET_INLINE void et_st8(float *p, et_v8 v) { memcpy(p, &v, sizeof v); }
ET_INLINE et_v8 et_splat8(float x) { et_v8 v = {x, x, x, x, x, x, x, x}; return v; }
/* acc + a * b: a fused multiply-add where the build asks for it (-DET_FLOAT_FMA on an FMA
 * machine: float32 kernels only; float programs are checked within 1e-5, not bit for bit),
 * else a multiply and an add (no contraction: -ffp-contract=off) */
#if defined(ET_FLOAT_FMA) && defined(__FMA__) && defined(__AVX__)
#include <immintrin.h>
ET_INLINE et_v8 et_mac8(et_v8 acc, et_v8 a, et_v8 b) {
    return (et_v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
}
#elif defined(ET_FLOAT_FMA) && defined(__ARM_NEON) && defined(__aarch64__)
/* aarch64 (backends/c/cross.py with fma=True): two NEON fused multiply-adds (FMLA), the
 * AVX block's contract: float32 kernels only, within 1e-5 of the reference */
#include <arm_neon.h>
ET_INLINE et_v8 et_mac8(et_v8 acc, et_v8 a, et_v8 b) {
    float32x4x2_t c, x, y;
    memcpy(&c, &acc, sizeof c), memcpy(&x, &a, sizeof x), memcpy(&y, &b, sizeof y);
    c.val[0] = vfmaq_f32(c.val[0], x.val[0], y.val[0]);
    c.val[1] = vfmaq_f32(c.val[1], x.val[1], y.val[1]);
    memcpy(&acc, &c, sizeof acc);
    return acc;
}
#else
ET_INLINE et_v8 et_mac8(et_v8 acc, et_v8 a, et_v8 b) { return acc + a * b; }
#endif
ET_INLINE float et_hsum8(et_v8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* the output index range [lo, hi) whose input index o*s - p + k*d lies in [0, n) */
ET_INLINE int et_lo(int p, int k, int d, int s) {
    int t = p - k * d;
    return t <= 0 ? 0 : (t + s - 1) / s;
}
ET_INLINE int et_hi(int n, int p, int k, int d, int s, int nout) {
    int t = n - 1 + p - k * d;
    if (t < 0) return 0;
    t = t / s + 1;
    return t < nout ? t : nout;
}

/* ---- pointwise (1x1, stride 1, one group) convolution as a GEMM ----------------------
 * Y[o][p] = bias[o] + sum_c W[o*wso + c*wsc] X[c][p], o < O, c < C, p < P.
 * (wso, wsc) = (C, 1): the forward conv; (1, Corig): the input gradient (W transposed).
 * Register block: 4 rows x 16 columns (8 vector accumulators). */
ET_INLINE void et_gemm_wx(const float *ET_RESTRICT W, const float *ET_RESTRICT X,
                          const float *ET_RESTRICT bias, float *ET_RESTRICT Y,
                          int O, int C, int P, int wso, int wsc) {
    int o = 0;
    for (; o + 4 <= O; o += 4) {
        const float *w0 = W + (size_t)o * wso, *w1 = w0 + wso, *w2 = w1 + wso, *w3 = w2 + wso;
        float b0 = bias ? bias[o] : 0.f, b1 = bias ? bias[o + 1] : 0.f;
        float b2 = bias ? bias[o + 2] : 0.f, b3 = bias ? bias[o + 3] : 0.f;
        float *y0 = Y + (size_t)o * P, *y1 = y0 + P, *y2 = y1 + P, *y3 = y2 + P;
        int p = 0;
        for (; p + 16 <= P; p += 16) {
            et_v8 a00 = et_splat8(b0), a01 = a00, a10 = et_splat8(b1), a11 = a10;
            et_v8 a20 = et_splat8(b2), a21 = a20, a30 = et_splat8(b3), a31 = a30;
            const float *x = X + p;
            for (int c = 0; c < C; ++c, x += P) {
                et_v8 x0 = et_ld8(x), x1 = et_ld8(x + 8), w;
                w = et_splat8(w0[c * wsc]); a00 = et_mac8(a00, w, x0); a01 = et_mac8(a01, w, x1);
                w = et_splat8(w1[c * wsc]); a10 = et_mac8(a10, w, x0); a11 = et_mac8(a11, w, x1);
                w = et_splat8(w2[c * wsc]); a20 = et_mac8(a20, w, x0); a21 = et_mac8(a21, w, x1);
                w = et_splat8(w3[c * wsc]); a30 = et_mac8(a30, w, x0); a31 = et_mac8(a31, w, x1);
            }
            et_st8(y0 + p, a00); et_st8(y0 + p + 8, a01);
            et_st8(y1 + p, a10); et_st8(y1 + p + 8, a11);
            et_st8(y2 + p, a20); et_st8(y2 + p + 8, a21);
            et_st8(y3 + p, a30); et_st8(y3 + p + 8, a31);
        }
        for (; p + 8 <= P; p += 8) {
            et_v8 a0 = et_splat8(b0), a1 = et_splat8(b1), a2 = et_splat8(b2), a3 = et_splat8(b3);
            const float *x = X + p;
            for (int c = 0; c < C; ++c, x += P) {
                et_v8 x0 = et_ld8(x);
                a0 = et_mac8(a0, et_splat8(w0[c * wsc]), x0); a1 = et_mac8(a1, et_splat8(w1[c * wsc]), x0);
                a2 = et_mac8(a2, et_splat8(w2[c * wsc]), x0); a3 = et_mac8(a3, et_splat8(w3[c * wsc]), x0);
            }
            et_st8(y0 + p, a0); et_st8(y1 + p, a1); et_st8(y2 + p, a2); et_st8(y3 + p, a3);
        }
        for (; p < P; ++p) {
            float s0 = b0, s1 = b1, s2 = b2, s3 = b3;
            for (int c = 0; c < C; ++c) {
                float xv = X[c * P + p];
                s0 += w0[c * wsc] * xv; s1 += w1[c * wsc] * xv; s2 += w2[c * wsc] * xv; s3 += w3[c * wsc] * xv;
            }
            y0[p] = s0; y1[p] = s1; y2[p] = s2; y3[p] = s3;
        }
    }
    for (; o < O; ++o) {
        const float *w0 = W + (size_t)o * wso;
        float b0 = bias ? bias[o] : 0.f, *y0 = Y + (size_t)o * P;
        int p = 0;
        for (; p + 8 <= P; p += 8) {
            et_v8 a0 = et_splat8(b0);
            const float *x = X + p;
            for (int c = 0; c < C; ++c, x += P) a0 = et_mac8(a0, et_splat8(w0[c * wsc]), et_ld8(x));
            et_st8(y0 + p, a0);
        }
        for (; p < P; ++p) {
            float s0 = b0;
            for (int c = 0; c < C; ++c) s0 += w0[c * wsc] * X[c * P + p];
            y0[p] = s0;
        }
    }
}

/* the largest X (C x P floats) et_gemm_abt transposes on the stack for a short P */
#define ET_ABT_TRANSPOSE_MAX 8192
/* P at most this: GW = GY X^T as a GEMM over the transposed X (few horizontal sums) */
#define ET_ABT_SHORT_P 64

/* GW[o][c] (+)= sum_p GY[o][p] X[c][p]: the pointwise weight gradient; 2x4 register block */
ET_INLINE void et_gemm_abt(const float *ET_RESTRICT GY, const float *ET_RESTRICT X, float *ET_RESTRICT GW,
                           int O, int C, int P, int accumulate) {
    if (!accumulate && P <= ET_ABT_SHORT_P && C * P <= ET_ABT_TRANSPOSE_MAX) {
        float XT[P * C];
        for (int c = 0; c < C; ++c)
            for (int p = 0; p < P; ++p) XT[p * C + c] = X[c * P + p];
        et_gemm_wx(GY, XT, (const float *)0, GW, O, P, C, P, 1);
        return;
    }
    for (int o = 0; o < O; o += 2) {
        int two = o + 1 < O;
        const float *g0 = GY + o * P, *g1 = two ? g0 + P : g0;
        for (int c = 0; c < C; c += 4) {
            int nc = C - c < 4 ? C - c : 4;
            const float *x0 = X + c * P, *x1 = nc > 1 ? x0 + P : x0, *x2 = nc > 2 ? x0 + 2 * P : x0,
                        *x3 = nc > 3 ? x0 + 3 * P : x0;
            et_v8 z = et_splat8(0.f);
            et_v8 a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
            int p = 0;
            for (; p + 8 <= P; p += 8) {
                et_v8 u0 = et_ld8(g0 + p), u1 = et_ld8(g1 + p);
                et_v8 v0 = et_ld8(x0 + p), v1 = et_ld8(x1 + p), v2 = et_ld8(x2 + p), v3 = et_ld8(x3 + p);
                a00 = et_mac8(a00, u0, v0); a01 = et_mac8(a01, u0, v1); a02 = et_mac8(a02, u0, v2); a03 = et_mac8(a03, u0, v3);
                a10 = et_mac8(a10, u1, v0); a11 = et_mac8(a11, u1, v1); a12 = et_mac8(a12, u1, v2); a13 = et_mac8(a13, u1, v3);
            }
            float s[2][4] = {{et_hsum8(a00), et_hsum8(a01), et_hsum8(a02), et_hsum8(a03)},
                             {et_hsum8(a10), et_hsum8(a11), et_hsum8(a12), et_hsum8(a13)}};
            for (; p < P; ++p) {
                s[0][0] += g0[p] * x0[p]; s[0][1] += g0[p] * x1[p]; s[0][2] += g0[p] * x2[p]; s[0][3] += g0[p] * x3[p];
                s[1][0] += g1[p] * x0[p]; s[1][1] += g1[p] * x1[p]; s[1][2] += g1[p] * x2[p]; s[1][3] += g1[p] * x3[p];
            }
            for (int i = 0; i < 1 + two; ++i)
                for (int j = 0; j < nc; ++j) {
                    float *dst = GW + (o + i) * C + c + j;
                    *dst = accumulate ? *dst + s[i][j] : s[i][j];
                }
        }
    }
}

/* ---- direct convolution (any kernel, stride, padding, dilation, groups) ------------------
 * Each output row is computed from KH "padded rows" of the input: row ki holds input row
 * oh*SH - PH + ki*DH with the padding as zeros, split into SW phases so that every tap reads
 * a contiguous run: x at tap (ki, kj), output column ow = R[ki][(kj*DW) % SW][ow + (kj*DW) / SW].
 * The rows are small stack arrays (KH * SW * L floats). */
#define ET_ROW_LEN(WO, KW, SW, DW) ((WO) + ((KW) - 1) * (DW) / (SW) + 1)

ET_INLINE void et_padded_rows(float *ET_RESTRICT R, const float *ET_RESTRICT x, int H, int Wd, int ih0, int KH,
                              int DH, int SW, int PW, int L) {
    /* No branch or select in the loop bodies: the rows [k0, k1) and the columns [j0, j1) that
     * read the input are computed first, and zeros fill the padding around them. (The per-row
     * test `ih < 0 || ih >= H` and the per-column select this replaces were if-converted by
     * GCC 12 at -O3 with AVX (the default host flags) into masked vector code that, in the
     * constant-shape copies, zeroed rows that lie in the input: MCUNet's and ProxylessNAS's
     * 7x7 stride-2 depthwise convolutions (8x8 -> 4x4) computed wrong outputs and NaN
     * gradients. tests/backends/c/test_regressions.py) */
    const int lo = et_lo(-ih0, 0, 1, DH), k0 = lo < KH ? lo : KH, k1 = et_hi(H, -ih0, 0, 1, DH, KH), row = SW * L;
    for (int j = 0; j < k0 * row; ++j) R[j] = 0.f;
    for (int ki = k0; ki < k1; ++ki) {
        const float *xr = x + (size_t)(ih0 + ki * DH) * Wd;
        for (int ph = 0; ph < SW; ++ph) {
            /* padded column j reads input column j*SW + ph - PW */
            const int j0l = et_lo(PW, ph, 1, SW), j0 = j0l < L ? j0l : L, j1 = et_hi(Wd, PW, ph, 1, SW, L);
            float *rp = R + ki * row + ph * L;
            for (int j = 0; j < j0; ++j) rp[j] = 0.f;
            for (int j = j0; j < j1; ++j) rp[j] = xr[j * SW + ph - PW];
            for (int j = j1; j < L; ++j) rp[j] = 0.f;
        }
    }
    for (int j = (k1 > k0 ? k1 : k0) * row; j < KH * row; ++j) R[j] = 0.f;
}

ET_INLINE float et_dot(const float *ET_RESTRICT a, const float *ET_RESTRICT b, int n) {
    et_v8 a0 = et_splat8(0.f), a1 = a0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = et_mac8(a0, et_ld8(a + i), et_ld8(b + i));
        a1 = et_mac8(a1, et_ld8(a + i + 8), et_ld8(b + i + 8));
    }
    for (; i + 8 <= n; i += 8) a0 = et_mac8(a0, et_ld8(a + i), et_ld8(b + i));
    float s = et_hsum8(a0 + a1);
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

/* the most taps of one kernel row that et_row_taps keeps in vector registers */
#define ET_MAX_ROW_TAPS 7
/* acc[kj] += sum_ow g[ow] * x(tap kj, ow) for the KW taps of one padded row (phases of SW) */
ET_INLINE void et_row_taps(const float *ET_RESTRICT g, const float *ET_RESTRICT rk, float *ET_RESTRICT acc,
                           int WO, int KW, int SW, int DW, int L) {
    et_v8 v[ET_MAX_ROW_TAPS];
    for (int kj = 0; kj < KW; ++kj) v[kj] = et_splat8(0.f);
    int ow = 0;
    for (; ow + 8 <= WO; ow += 8) {
        const et_v8 gv = et_ld8(g + ow);
        for (int kj = 0; kj < KW; ++kj) v[kj] = et_mac8(v[kj], gv, et_ld8(rk + ((kj * DW) % SW) * L + (kj * DW) / SW + ow));
    }
    for (int kj = 0; kj < KW; ++kj) {
        const float *r = rk + ((kj * DW) % SW) * L + (kj * DW) / SW;
        float s = et_hsum8(v[kj]);
        for (int t = ow; t < WO; ++t) s += g[t] * r[t];
        acc[kj] += s;
    }
}

ET_INLINE void et_conv_fwd(const float *ET_RESTRICT X, const float *ET_RESTRICT W, const float *ET_RESTRICT B,
                           float *ET_RESTRICT Y, int N, int C, int H, int Wd, int O, int HO, int WO,
                           int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, int G) {
    const int cg = C / G, og = O / G, L = ET_ROW_LEN(WO, KW, SW, DW), T = KH * KW;
    float R[KH * SW * L];
    for (int n = 0; n < N; ++n)
        for (int g = 0; g < G; ++g)
            for (int oh = 0; oh < HO; ++oh)
                for (int ci = 0; ci < cg; ++ci) {
                    et_padded_rows(R, X + ((size_t)n * C + g * cg + ci) * H * Wd, H, Wd, oh * SH - PH, KH, DH, SW,
                                   PW, L);
                    for (int oo = 0; oo < og; ++oo) {
                        const int o = g * og + oo;
                        float *ET_RESTRICT yr = Y + (((size_t)n * O + o) * HO + oh) * WO;
                        const float *w = W + ((size_t)o * cg + ci) * T;
                        if (ci == 0) {
                            const float b = B ? B[o] : 0.f;
                            for (int ow = 0; ow < WO; ++ow) yr[ow] = b;
                        }
                        for (int ki = 0; ki < KH; ++ki)
                            for (int kj = 0; kj < KW; ++kj) {
                                const float wv = w[ki * KW + kj];
                                const float *ET_RESTRICT r = R + (ki * SW + (kj * DW) % SW) * L + (kj * DW) / SW;
                                for (int ow = 0; ow < WO; ++ow) yr[ow] += wv * r[ow];
                            }
                    }
                }
}

/* GW = d loss / d W of et_conv_fwd, summed over the batch (the same padded rows) */
ET_INLINE void et_conv_grad_weight(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *ET_RESTRICT GW,
                                   int N, int C, int H, int Wd, int O, int HO, int WO, int KH, int KW,
                                   int SH, int SW, int PH, int PW, int DH, int DW, int G) {
    const int cg = C / G, og = O / G, L = ET_ROW_LEN(WO, KW, SW, DW), T = KH * KW;
    float R[KH * SW * L];
    for (int i = 0; i < O * cg * T; ++i) GW[i] = 0.f;
    for (int n = 0; n < N; ++n)
        for (int g = 0; g < G; ++g)
            for (int oh = 0; oh < HO; ++oh)
                for (int ci = 0; ci < cg; ++ci) {
                    et_padded_rows(R, X + ((size_t)n * C + g * cg + ci) * H * Wd, H, Wd, oh * SH - PH, KH, DH, SW,
                                   PW, L);
                    for (int oo = 0; oo < og; ++oo) {
                        const int o = g * og + oo;
                        const float *ET_RESTRICT gr = GY + (((size_t)n * O + o) * HO + oh) * WO;
                        float *gw = GW + ((size_t)o * cg + ci) * T;
                        for (int ki = 0; ki < KH; ++ki) {
                            const float *rk = R + ki * SW * L;
                            if (KW <= ET_MAX_ROW_TAPS) {
                                et_row_taps(gr, rk, gw + ki * KW, WO, KW, SW, DW, L);
                            } else {
                                for (int kj = 0; kj < KW; ++kj)
                                    gw[ki * KW + kj] += et_dot(gr, rk + ((kj * DW) % SW) * L + (kj * DW) / SW, WO);
                            }
                        }
                    }
                }
}

/* GX of a stride-1 conv: the correlation of GY (padded by (K-1)*D - P) with the flipped kernel */
ET_INLINE void et_conv_grad_input_s1(const float *ET_RESTRICT GY, const float *ET_RESTRICT W, float *ET_RESTRICT GX,
                                     int N, int C, int H, int Wd, int O, int HO, int WO, int KH, int KW,
                                     int PH, int PW, int DH, int DW, int G) {
    const int cg = C / G, og = O / G, L = ET_ROW_LEN(Wd, KW, 1, DW), T = KH * KW;
    const int QH = (KH - 1) * DH - PH, QW = (KW - 1) * DW - PW;
    float R[KH * L];
    for (int n = 0; n < N; ++n)
        for (int g = 0; g < G; ++g)
            for (int ih = 0; ih < H; ++ih)
                for (int oo = 0; oo < og; ++oo) {
                    const int o = g * og + oo;
                    /* rows oh = ih - QH + ki*DH, i.e. padded-row ki holds gy row for kernel row KH-1-ki */
                    et_padded_rows(R, GY + ((size_t)n * O + o) * HO * WO, HO, WO, ih - QH, KH, DH, 1, QW, L);
                    for (int ci = 0; ci < cg; ++ci) {
                        float *ET_RESTRICT xr = GX + (((size_t)n * C + g * cg + ci) * H + ih) * Wd;
                        const float *w = W + ((size_t)o * cg + ci) * T;
                        if (oo == 0)
                            for (int iw = 0; iw < Wd; ++iw) xr[iw] = 0.f;
                        for (int ki = 0; ki < KH; ++ki)
                            for (int kj = 0; kj < KW; ++kj) {
                                const float wv = w[(KH - 1 - ki) * KW + (KW - 1 - kj)];
                                const float *ET_RESTRICT r = R + ki * L + kj * DW;
                                for (int iw = 0; iw < Wd; ++iw) xr[iw] += wv * r[iw];
                            }
                    }
                }
}

/* GX = d loss / d X of et_conv_fwd (any stride: scatter form) */
ET_INLINE void et_conv_grad_input(const float *ET_RESTRICT GY, const float *ET_RESTRICT W, float *ET_RESTRICT GX,
                                  int N, int C, int H, int Wd, int O, int HO, int WO, int KH, int KW,
                                  int SH, int SW, int PH, int PW, int DH, int DW, int G) {
    const int cg = C / G, og = O / G;
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            float *gx = GX + ((size_t)n * C + c) * H * Wd;
            for (int i = 0; i < H * Wd; ++i) gx[i] = 0.f;
            const int g = c / cg, ci = c % cg;
            for (int oo = 0; oo < og; ++oo) {
                const int o = g * og + oo;
                const float *gy = GY + ((size_t)n * O + o) * HO * WO;
                const float *w = W + ((size_t)o * cg + ci) * KH * KW;
                for (int ki = 0; ki < KH; ++ki) {
                    const int oh0 = et_lo(PH, ki, DH, SH), oh1 = et_hi(H, PH, ki, DH, SH, HO);
                    for (int kj = 0; kj < KW; ++kj) {
                        const int ow0 = et_lo(PW, kj, DW, SW), ow1 = et_hi(Wd, PW, kj, DW, SW, WO);
                        const float wv = w[ki * KW + kj];
                        for (int oh = oh0; oh < oh1; ++oh) {
                            const float *gr = gy + oh * WO;
                            float *xr = gx + (oh * SH - PH + ki * DH) * Wd - PW + kj * DW;
                            for (int ow = ow0; ow < ow1; ++ow) xr[ow * SW] += wv * gr[ow];
                        }
                    }
                }
            }
        }
}

/* ---- dense layers --------------------------------------------------------------------- */
/* Y[n][o] = B[o] + sum_k X[n][k] W[o][k] */
ET_INLINE void et_linear(const float *ET_RESTRICT X, const float *ET_RESTRICT W, const float *ET_RESTRICT B,
                         float *ET_RESTRICT Y, int N, int K, int O) {
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < O; ++o) {
            const float *x = X + (size_t)n * K, *w = W + (size_t)o * K;
            float s = 0.f;
            ET_SIMD_SUM(s)
            for (int k = 0; k < K; ++k) s += x[k] * w[k];
            Y[(size_t)n * O + o] = B ? s + B[o] : s;
        }
}

/* GW[o][k] = sum_n GY[n][o] X[n][k] */
ET_INLINE void et_linear_grad_weight(const float *ET_RESTRICT X, const float *ET_RESTRICT GY,
                                     float *ET_RESTRICT GW, int N, int K, int O) {
    for (int o = 0; o < O; ++o) {
        float *gw = GW + (size_t)o * K;
        for (int k = 0; k < K; ++k) gw[k] = 0.f;
        for (int n = 0; n < N; ++n) {
            const float g = GY[(size_t)n * O + o];
            const float *x = X + (size_t)n * K;
            for (int k = 0; k < K; ++k) gw[k] += g * x[k];
        }
    }
}

/* C[i][j] = sum_k A[i][k] B[k][j] */
ET_INLINE void et_matmul(const float *ET_RESTRICT A, const float *ET_RESTRICT B, float *ET_RESTRICT Cm,
                         int M, int K, int N) {
    for (int i = 0; i < M; ++i) {
        float *c = Cm + (size_t)i * N;
        for (int j = 0; j < N; ++j) c[j] = 0.f;
        for (int k = 0; k < K; ++k) {
            const float a = A[(size_t)i * K + k];
            const float *b = B + (size_t)k * N;
            for (int j = 0; j < N; ++j) c[j] += a * b[j];
        }
    }
}

/* ---- losses (a mean over the positions that count; float64 with et_exp / et_log, sums in
 * memory order: ops/loss.py computes exactly this) ------------------------------------------ */
/* cross entropy over the class dim of logits seen as (A, C, S): element (a, c, s) at
 * (a * C + c) * S + s, label (a, s) at a * S + s; a label equal to `ignore` counts neither in
 * the sum nor in the divisor (no counted position: 0 / 0 = nan, torch's answer); any other label
 * outside [0, C) is never used as an index: it is reported (ET_ERROR_HOOK) and the loss is nan
 * (0 / 0), which the checked step refuses (the callers check labels first: Python's label_feed,
 * the standalone driver's et_samples_open) */
ET_INLINE float et_cross_entropy(const float *ET_RESTRICT logits, const int64_t *ET_RESTRICT labels, int A, int C,
                                 int S, int64_t ignore) {
    double total = 0.0;
    int count = 0;
    for (int a = 0; a < A; ++a)
        for (int s = 0; s < S; ++s) {
            const int64_t y = labels[(size_t)a * S + s];
            if (y == ignore) continue;
            if (y < 0 || y >= C) {
                ET_ERROR_HOOK("cross_entropy: label out of range");
                const double zero = 0.0;
                return (float)(zero / zero); /* nan */
            }
            const float *l = logits + (size_t)a * C * S + s;
            float m = l[0];
            for (int c = 1; c < C; ++c) m = l[(size_t)c * S] > m ? l[(size_t)c * S] : m;
            double sum = 0.0;
            for (int c = 0; c < C; ++c) sum += et_exp((double)l[(size_t)c * S] - m);
            total += (double)m + et_log(sum) - (double)l[(size_t)y * S];
            ++count;
        }
    return (float)(total / (double)count);
}

/* (softmax - one_hot) * g / count at the counted positions, 0 at the ignored ones */
ET_INLINE void et_cross_entropy_grad(float g, const float *ET_RESTRICT logits, const int64_t *ET_RESTRICT labels,
                                     float *ET_RESTRICT out, int A, int C, int S, int64_t ignore) {
    int count = 0;
    for (int i = 0; i < A * S; ++i) count += labels[i] != ignore;
    const double k = count ? (double)g / count : 0.0;
    for (int a = 0; a < A; ++a)
        for (int s = 0; s < S; ++s) {
            const int64_t y = labels[(size_t)a * S + s];
            const float *l = logits + (size_t)a * C * S + s;
            float *o = out + (size_t)a * C * S + s;
            if (y == ignore) {
                for (int c = 0; c < C; ++c) o[(size_t)c * S] = 0.0f;
                continue;
            }
            float m = l[0];
            for (int c = 1; c < C; ++c) m = l[(size_t)c * S] > m ? l[(size_t)c * S] : m;
            double sum = 0.0;
            for (int c = 0; c < C; ++c) sum += et_exp((double)l[(size_t)c * S] - m);
            for (int c = 0; c < C; ++c) {
                double p = et_exp((double)l[(size_t)c * S] - m) / sum - (c == y ? 1.0 : 0.0);
                o[(size_t)c * S] = (float)(p * k);
            }
        }
}

ET_INLINE float et_mse(const float *ET_RESTRICT a, const float *ET_RESTRICT b, int n) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) { double d = (double)a[i] - b[i]; s += d * d; }
    return (float)(s / n);
}

ET_INLINE float et_l1(const float *ET_RESTRICT a, const float *ET_RESTRICT b, int n) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) { double d = (double)a[i] - b[i]; s += d < 0 ? -d : d; }
    return (float)(s / n);
}

/* sign(a - b) * (g / n), sign(0) = 0 as torch */
ET_INLINE void et_l1_grad(float g, const float *ET_RESTRICT a, const float *ET_RESTRICT b, float *ET_RESTRICT out,
                          int n) {
    const float k = g / (float)n;
    for (int i = 0; i < n; ++i) {
        const float d = a[i] - b[i];
        out[i] = d > 0 ? k : (d < 0 ? -k : 0.0f * k);
    }
}

/* mean of max(x, 0) - x t + log(1 + exp(-|x|)): the stable form, in double */
ET_INLINE float et_bce_with_logits(const float *ET_RESTRICT x, const float *ET_RESTRICT t, int n) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) {
        const double v = x[i], e = et_exp(v < 0 ? v : -v);
        s += ((v > 0 ? v : 0.0) - v * (double)t[i]) + et_log(1.0 + e);
    }
    return (float)(s / n);
}

/* (sigmoid(x) - t) * g / n, sigmoid from e = exp(-|x|) on the side that does not overflow */
ET_INLINE void et_bce_with_logits_grad(float g, const float *ET_RESTRICT x, const float *ET_RESTRICT t,
                                       float *ET_RESTRICT out, int n) {
    const double k = (double)g / n;
    for (int i = 0; i < n; ++i) {
        const double v = x[i], e = et_exp(v < 0 ? v : -v);
        const double sig = v >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
        out[i] = (float)((sig - (double)t[i]) * k);
    }
}

#endif /* ET_FLOAT_H */
