/* edgetrain C runtime: the float32 convolutions (forward, input and weight gradients) and dense
 * layers (linear, its weight gradient, matmul) the emitted code calls, in one of two builds:
 *
 * - ET_BLAS defined (the host library when a BLAS is installed: backends/c/blas.py): every
 *   convolution with one group through the GEMM path of et_float_blas.h; depthwise convolutions
 *   on the padded-plane kernels below; other grouped ones keep the direct kernels of et_float.h.
 * - otherwise (Cortex-M, emitted projects, the sanitizer build): the dependency-free kernels of
 *   et_float.h, called exactly as before (pointwise as a per-image register-blocked GEMM, the
 *   rest as direct convolutions), always inlined with the call site's constant shapes.
 *
 * Layout: NCHW activations, weights [O][C/G][KH][KW], dense weights [O][K]. Header-only. */
#ifndef ET_FLOAT_GEMM_H
#define ET_FLOAT_GEMM_H
#include "et_float.h"
#include "et_float_blas.h"
#include "et_float_dnnl.h"
#include "et_float_wino.h"

#ifdef ET_BLAS
/* ---- depthwise convolutions (one input and one output channel per group) on the host:
 * each input plane is copied once, zero-padded and split into SW column phases, into a
 * scratch matrix XP[SW][HP][LP] (padded row r, padded column j*SW + ph), so that every tap
 * of every output row reads one contiguous run: tap (ki, kj) of output (oh, ow) is
 * XP[(kj*DW) % SW][oh*SH + ki*DH][(kj*DW) / SW + ow]. The output row is summed over the taps in
 * registers (the taps unrolled at the call site's constant kernel size). The input gradient
 * accumulates into a phase matrix of the same shape, which is then cropped into GX. */
ET_HOST_INLINE int et_dw_rows(int HO, int KH, int SH, int DH) { return (HO - 1) * SH + (KH - 1) * DH + 1; }

/* the columns [*j0, *j1) of phase ph (of SW) that the plane's Wd columns padded by PW fill */
ET_HOST_INLINE void et_dw_phase_cols(int Wd, int PW, int ph, int SW, int LP, int *j0, int *j1) {
    const int lo = et_lo(PW, ph, 1, SW), hi = et_hi(Wd, PW, ph, 1, SW, LP);
    *j0 = lo < LP ? lo : LP;
    *j1 = hi > *j0 ? hi : *j0;
}

/* XP (SW phases of HP x LP) from the plane x (H x Wd) padded by (PH, PW): phase ph's column j is
 * padded column j*SW + ph; the padding zero */
ET_HOST_INLINE void et_dw_phases(const float *ET_RESTRICT x, float *ET_RESTRICT XP, int H, int Wd, int PH, int PW,
                                 int SW, int HP, int LP) {
    const int r0 = PH < HP ? PH : HP, r1 = PH + H < HP ? PH + H : HP;
    for (int ph = 0; ph < SW; ++ph) {
        int j0, j1;
        et_dw_phase_cols(Wd, PW, ph, SW, LP, &j0, &j1);
        float *p = XP + (size_t)ph * HP * LP;
        memset(p, 0, (size_t)r0 * LP * sizeof(float));
        for (int r = r0; r < r1; ++r) {
            const float *xr = x + (size_t)(r - PH) * Wd + ph - PW;
            float *d = p + (size_t)r * LP;
            for (int j = 0; j < j0; ++j) d[j] = 0.f;
            if (SW != 2) /* stride 2: both phases at once, below */
                for (int j = j0; j < j1; ++j) d[j] = xr[(size_t)j * SW];
            for (int j = j1; j < LP; ++j) d[j] = 0.f;
        }
        if (r1 < HP) memset(p + (size_t)r1 * LP, 0, (size_t)(HP - r1) * LP * sizeof(float));
    }
    if (SW == 2) { /* each row's column pairs split into the two phases in one pass (vectorised) */
        /* input column 2m is padded column 2m + PW: phase PW & 1's column ja + m; 2m + 1 the
         * other's, jb + m (mb <= ma: the odd columns are no more than the even ones) */
        const int pa = PW & 1;
        int ja, ea, jb, eb;
        et_dw_phase_cols(Wd, PW, pa, 2, LP, &ja, &ea);
        et_dw_phase_cols(Wd, PW, 1 - pa, 2, LP, &jb, &eb);
        const int ma = ea - ja, mb = eb - jb;
        for (int r = r0; r < r1; ++r) {
            const float *ET_RESTRICT xr = x + (size_t)(r - PH) * Wd;
            float *ET_RESTRICT a = XP + ((size_t)pa * HP + r) * LP + ja;
            float *ET_RESTRICT b = XP + ((size_t)(1 - pa) * HP + r) * LP + jb;
            int m = 0;
            for (; m < mb; ++m) {
                a[m] = xr[2 * m];
                b[m] = xr[2 * m + 1];
            }
            for (; m < ma; ++m) a[m] = xr[2 * m];
        }
    }
}

/* the forward's item i: the plane of image i / C, channel i % C (ET_DW_EACH) */
ET_HOST_INLINE void et_dw_fwd(int i, const float *ET_RESTRICT X, const float *ET_RESTRICT W, const float *ET_RESTRICT B,
                              float *ET_RESTRICT Y, int C, int H, int Wd, int HO, int WO, int SH, int SW,
                              int PH, int PW, int DH, int DW, int KH, int KW) {
    const int HP = et_dw_rows(HO, KH, SH, DH), LP = ET_ROW_LEN(WO, KW, SW, DW), c = i % C;
    float *XP = et_scratch(0, (size_t)SW * HP * LP); /* this thread's */
    if (!XP) return;
    et_dw_phases(X + (size_t)i * H * Wd, XP, H, Wd, PH, PW, SW, HP, LP);
    const float *w = W + (size_t)c * KH * KW;
    const float b = B ? B[c] : 0.f;
    float *y = Y + (size_t)i * HO * WO;
    for (int oh = 0; oh < HO; ++oh, y += WO) {
        const float *rows = XP + (size_t)oh * SH * LP;
        ET_SIMD
        for (int ow = 0; ow < WO; ++ow) {
            float s = b;
            for (int ki = 0; ki < KH; ++ki)
                for (int kj = 0; kj < KW; ++kj)
                    s += w[ki * KW + kj] * rows[((size_t)((kj * DW) % SW) * HP + ki * DH) * LP + (kj * DW) / SW + ow];
            y[ow] = s;
        }
    }
}

/* columns [ow0, ow0 + L) of one image's et_dw_grad_weight partial sums: each tap's sums over the
 * output rows held in registers (KH*KW vectors of L lanes), added to ACC[tap][ow] once (L, the
 * shapes and strides are constants where it is inlined) */
ET_HOST_INLINE void et_dw_gw_chunk(const float *ET_RESTRICT g, const float *ET_RESTRICT XP, float *ET_RESTRICT ACC,
                                   int ow0, int L, int HO, int WO, int SH, int SW, int DH, int DW, int KH, int KW,
                                   int HP, int LP) {
    float acc[KH * KW][L];
    for (int t = 0; t < KH * KW; ++t)
        for (int j = 0; j < L; ++j) acc[t][j] = 0.f;
    g += ow0;
    for (int oh = 0; oh < HO; ++oh, g += WO)
        for (int ki = 0; ki < KH; ++ki)
            for (int kj = 0; kj < KW; ++kj) {
                const float *ET_RESTRICT r =
                    XP + ((size_t)((kj * DW) % SW) * HP + oh * SH + ki * DH) * LP + (kj * DW) / SW + ow0;
                ET_SIMD
                for (int j = 0; j < L; ++j) acc[ki * KW + kj][j] += g[j] * r[j];
            }
    for (int t = 0; t < KH * KW; ++t)
        for (int j = 0; j < L; ++j) ACC[(size_t)t * WO + ow0 + j] += acc[t][j];
}

/* the weight gradient's item c: channel c, its sums over the batch in one thread (ET_DW_EACH) */
ET_HOST_INLINE void et_dw_grad_weight(int c, const float *ET_RESTRICT X, const float *ET_RESTRICT GY,
                                      float *ET_RESTRICT GW, int N, int C, int H, int Wd, int HO, int WO, int SH,
                                      int SW, int PH, int PW, int DH, int DW, int KH, int KW) {
    /* per tap, a row of WO partial sums accumulated over the batch and the output rows (vector
     * multiply-adds, no horizontal sum per row; chunks of 16, 8 and 4 columns summed over an
     * image's rows in registers, et_dw_gw_chunk), summed once per channel */
    const int HP = et_dw_rows(HO, KH, SH, DH), LP = ET_ROW_LEN(WO, KW, SW, DW), T = KH * KW;
    float *XP = et_scratch(0, (size_t)SW * HP * LP), *ACC = et_scratch(1, (size_t)T * WO); /* this thread's */
    if (!XP || !ACC) return;
    memset(ACC, 0, (size_t)T * WO * sizeof(float));
    for (int n = 0; n < N; ++n) {
        et_dw_phases(X + ((size_t)n * C + c) * H * Wd, XP, H, Wd, PH, PW, SW, HP, LP);
        const float *g0 = GY + ((size_t)n * C + c) * HO * WO;
        int ow0 = 0;
        for (; ow0 + 16 <= WO; ow0 += 16) et_dw_gw_chunk(g0, XP, ACC, ow0, 16, HO, WO, SH, SW, DH, DW, KH, KW, HP, LP);
        for (; ow0 + 8 <= WO; ow0 += 8) et_dw_gw_chunk(g0, XP, ACC, ow0, 8, HO, WO, SH, SW, DH, DW, KH, KW, HP, LP);
        for (; ow0 + 4 <= WO; ow0 += 4) et_dw_gw_chunk(g0, XP, ACC, ow0, 4, HO, WO, SH, SW, DH, DW, KH, KW, HP, LP);
        if (ow0 == WO) continue;
        const float *g = g0;
        for (int oh = 0; oh < HO; ++oh, g += WO)
            for (int ki = 0; ki < KH; ++ki)
                for (int kj = 0; kj < KW; ++kj) {
                    const float *ET_RESTRICT r =
                        XP + ((size_t)((kj * DW) % SW) * HP + oh * SH + ki * DH) * LP + (kj * DW) / SW;
                    float *ET_RESTRICT a = ACC + (size_t)(ki * KW + kj) * WO;
                    ET_SIMD
                    for (int ow = ow0; ow < WO; ++ow) a[ow] += g[ow] * r[ow];
                }
    }
    for (int t = 0; t < T; ++t) {
        const float *a = ACC + (size_t)t * WO;
        float s = 0.f;
        ET_SIMD_SUM(s)
        for (int ow = 0; ow < WO; ++ow) s += a[ow];
        GW[(size_t)c * T + t] = s;
    }
}

/* the input gradient's item i: the plane of image i / C, channel i % C (ET_DW_EACH) */
ET_HOST_INLINE void et_dw_grad_input(int i, const float *ET_RESTRICT GY, const float *ET_RESTRICT W,
                                     float *ET_RESTRICT GX, int C, int H, int Wd, int HO, int WO, int SH, int SW,
                                     int PH, int PW, int DH, int DW, int KH, int KW) {
    const int HP = et_dw_rows(HO, KH, SH, DH), LP = ET_ROW_LEN(WO, KW, SW, DW), c = i % C;
    float *GP = et_scratch(0, (size_t)SW * HP * LP); /* this thread's */
    if (!GP) return;
    memset(GP, 0, (size_t)SW * HP * LP * sizeof(float));
    const float *w = W + (size_t)c * KH * KW, *g = GY + (size_t)i * HO * WO;
    for (int oh = 0; oh < HO; ++oh, g += WO)
        for (int ki = 0; ki < KH; ++ki)
            for (int kj = 0; kj < KW; ++kj) {
                float *ET_RESTRICT r = GP + ((size_t)((kj * DW) % SW) * HP + oh * SH + ki * DH) * LP +
                                       (kj * DW) / SW;
                const float wv = w[ki * KW + kj];
                ET_SIMD
                for (int ow = 0; ow < WO; ++ow) r[ow] += wv * g[ow];
            }
    /* the crop: input column iw is padded column iw + PW = j*SW + ph, row ih is padded row ih + PH */
    float *gx = GX + (size_t)i * H * Wd;
    for (int ih = 0; ih < H; ++ih) {
        float *gr = gx + (size_t)ih * Wd;
        if (ih + PH >= HP) {
            memset(gr, 0, (size_t)Wd * sizeof(float));
            continue;
        }
        for (int ph = 0; ph < SW; ++ph) {
            const float *src = GP + ((size_t)ph * HP + ih + PH) * LP;
            const int j0 = et_lo(PW, ph, 1, SW), j1 = et_hi(Wd, PW, ph, 1, SW, (Wd + PW) / SW + 1);
            for (int j = j0; j < j1; ++j) gr[j * SW + ph - PW] = j < LP ? src[j] : 0.f;
        }
    }
}

/* the input gradient's item i at stride 2, no dilation: each row of GX gathered from the rows of GY
 * it reads (input row ih takes kernel rows ki = ih + PH's parity, + 2, ..., from output row (ih + PH -
 * ki) / 2), its even and odd padded columns J = iw + PW as two rows E, O (E[m] at J = 2m takes the
 * even kernel columns kj, from output column m - kj / 2; O[m] the odd ones, from m - (kj - 1) / 2),
 * each summed over its taps in registers from GY's rows padded by L zeros each side (a missing row:
 * the zero row after them; this thread's scratch 0), then interleaved into GX: no phase planes to
 * clear, add into and crop */
ET_HOST_INLINE void et_dw_grad_input_s2(int i, const float *ET_RESTRICT GY, const float *ET_RESTRICT W,
                                        float *ET_RESTRICT GX, int C, int H, int Wd, int HO, int WO, int PH, int PW,
                                        int KH, int KW) {
    const int L = (KW - 1) / 2, M = (Wd + PW) / 2 + 1; /* E and O columns: J / 2 < M for every J */
    const int WP = (M > WO ? M : WO) + 2 * L + 1;        /* a padded row: column ow at ow + L */
    const int NR = (KH + 1) / 2;                         /* kernel rows per input row, at most */
    float *GP = et_scratch(0, (size_t)(HO + 1) * WP + (size_t)2 * M + (size_t)(KH + 1) * KW); /* this thread's */
    if (!GP) return;
    float *ET_RESTRICT E = GP + (size_t)(HO + 1) * WP, *ET_RESTRICT Od = E + M, *ET_RESTRICT wk = Od + M;
    const float *g = GY + (size_t)i * HO * WO;
    memcpy(wk, W + (size_t)(i % C) * KH * KW, (size_t)KH * KW * sizeof(float));
    memset(wk + KH * KW, 0, (size_t)KW * sizeof(float)); /* kernel row KH: zeros, for a missing row */
    for (int oh = 0; oh < HO; ++oh) {
        float *r = GP + (size_t)oh * WP;
        memset(r, 0, (size_t)L * sizeof(float));
        memcpy(r + L, g + (size_t)oh * WO, (size_t)WO * sizeof(float));
        memset(r + L + WO, 0, (size_t)(WP - L - WO) * sizeof(float));
    }
    memset(GP + (size_t)HO * WP, 0, (size_t)WP * sizeof(float)); /* the zero row */
    /* even input columns read E (PW even) or O at J / 2, odd ones the other */
    const float *a = ((PW & 1) ? Od : E) + PW / 2, *b = ((PW & 1) ? E : Od) + (PW + 1) / 2;
    float *gx = GX + (size_t)i * H * Wd;
    for (int ih = 0; ih < H; ++ih) {
        const float *rt[NR], *wt[NR];
        for (int t = 0; t < NR; ++t) {
            const int ki = ((ih + PH) & 1) + 2 * t, oh = (ih + PH - ki) / 2;
            const int ok = ki < KH && ih + PH - ki >= 0 && oh < HO;
            rt[t] = GP + (size_t)(ok ? oh : HO) * WP + L;
            wt[t] = wk + (size_t)(ok ? ki : KH) * KW;
        }
        ET_SIMD
        for (int m = 0; m < M; ++m) {
            float e = 0.f, o = 0.f;
            for (int t = 0; t < NR; ++t) {
                for (int kj = 0; kj < KW; kj += 2) e += wt[t][kj] * rt[t][m - kj / 2];
                for (int kj = 1; kj < KW; kj += 2) o += wt[t][kj] * rt[t][m - (kj - 1) / 2];
            }
            E[m] = e;
            Od[m] = o;
        }
        float *ET_RESTRICT gr = gx + (size_t)ih * Wd;
        int m = 0;
        for (; m < Wd / 2; ++m) {
            gr[2 * m] = a[m];
            gr[2 * m + 1] = b[m];
        }
        if (Wd & 1) gr[2 * m] = a[m];
    }
}

/* the taps of each channel's kernel reversed (this thread's scratch 1): the input gradient of a stride-1
 * depthwise convolution whose padding is at most its dilated kernel's reach ((K-1)*D >= P) is the forward
 * kernel on GY padded by (K-1)*D - P with these taps */
ET_HOST_INLINE float *et_dw_flipped(const float *ET_RESTRICT W, int C, int T) {
    float *WF = et_scratch(1, (size_t)C * T);
    if (WF)
        for (int c = 0; c < C; ++c)
            for (int t = 0; t < T; ++t) WF[(size_t)c * T + t] = W[(size_t)c * T + (T - 1 - t)];
    return WF;
}

/* fn(i, ...) for the items i in [0, ITEMS) (planes or channels, independent: each computed alike on any
 * thread), on the host's threads when WORK is worth it (et_common.h's ET_PARALLEL_FOR). The parallel loop
 * is written here, inside the specialising macros below, where the kernel size and strides are literals:
 * gcc outlines a parallel loop's body before it inlines the kernels, so a loop inside fn would see them as
 * run-time values again (the taps no longer unrolled: the threaded library 3x slower on mbv2) */
#define ET_DW_EACH(fn, ITEMS, WORK, ...)                                                                   \
    do {                                                                                                   \
        const int et_items_ = (ITEMS);                                                                     \
        ET_PARALLEL_FOR(WORK)                                                                              \
        for (int et_i_ = 0; et_i_ < et_items_; ++et_i_) fn(et_i_, __VA_ARGS__);                            \
    } while (0)
/* the depthwise kernels specialised for the common kernel sizes (3, 5, 7: the taps unrolled),
 * else with run-time sizes: the kernels may be compiled once, out of line (kernel_lib.py) */
#define ET_DW_SPECIALISE(fn, ITEMS, WORK, KH, KW, ...)                                                     \
    do {                                                                                                   \
        if ((KH) == 3 && (KW) == 3) ET_DW_EACH(fn, ITEMS, WORK, __VA_ARGS__, 3, 3);                        \
        else if ((KH) == 5 && (KW) == 5) ET_DW_EACH(fn, ITEMS, WORK, __VA_ARGS__, 5, 5);                   \
        else if ((KH) == 7 && (KW) == 7) ET_DW_EACH(fn, ITEMS, WORK, __VA_ARGS__, 7, 7);                   \
        else ET_DW_EACH(fn, ITEMS, WORK, __VA_ARGS__, KH, KW);                                             \
    } while (0)
/* and for strides 1 and 2 without dilation (the padded-plane offsets and phases then constants:
 * a division and a remainder per tap and output row less) */
#define ET_DW_STRIDED(fn, ITEMS, WORK, KH, KW, SH, SW, PH, PW, DH, DW, ...)                                 \
    do {                                                                                                   \
        if ((SH) == 1 && (SW) == 1 && (DH) == 1 && (DW) == 1)                                              \
            ET_DW_SPECIALISE(fn, ITEMS, WORK, KH, KW, __VA_ARGS__, 1, 1, PH, PW, 1, 1);                    \
        else if ((SH) == 2 && (SW) == 2 && (DH) == 1 && (DW) == 1)                                         \
            ET_DW_SPECIALISE(fn, ITEMS, WORK, KH, KW, __VA_ARGS__, 2, 2, PH, PW, 1, 1);                    \
        else                                                                                               \
            ET_DW_SPECIALISE(fn, ITEMS, WORK, KH, KW, __VA_ARGS__, SH, SW, PH, PW, DH, DW);                \
    } while (0)
#endif /* ET_BLAS */

/* ---- what the emitted code calls ------------------------------------------------------- */
ET_INLINE void et_conv2d(const float *ET_RESTRICT X, const float *ET_RESTRICT W, const float *ET_RESTRICT B,
                         float *ET_RESTRICT Y, int N, int C, int H, int Wd, int O, int HO, int WO, int KH, int KW,
                         int SH, int SW, int PH, int PW, int DH, int DW, int G) {
#ifdef ET_BLAS
    if (G == 1) {
        if (et_wino_forward(X, W, B, Y, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW)) return;
#ifdef ET_DNNL_ON
        if (et_dnnl_conv(B ? ET_DNNL_FWD_BIAS : ET_DNNL_FWD, X, W, Y, B, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW,
                         DH, DW))
            return;
#endif
        et_conv_fwd_blas(X, W, B, Y, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW);
        return;
    }
    if (G == C && G == O) {
        ET_DW_STRIDED(et_dw_fwd, N * C, (double)N * C * HO * WO * KH * KW, KH, KW, SH, SW, PH, PW, DH, DW, X, W, B, Y,
                      C, H, Wd, HO, WO);
        return;
    }
#endif
    if (et_conv_pointwise(KH, KW, SH, SW, PH, PW, G)) {
        for (int n = 0; n < N; ++n)
            et_gemm_wx(W, X + (size_t)n * C * H * Wd, B, Y + (size_t)n * O * H * Wd, O, C, H * Wd, C, 1);
        return;
    }
    et_conv_fwd(X, W, B, Y, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, G);
}

ET_INLINE void et_conv2d_grad_input(const float *ET_RESTRICT GY, const float *ET_RESTRICT W, float *ET_RESTRICT GX,
                                    int N, int C, int H, int Wd, int O, int HO, int WO, int KH, int KW, int SH, int SW,
                                    int PH, int PW, int DH, int DW, int G) {
#ifdef ET_BLAS
    if (G == 1) {
        if (et_wino_grad_input(GY, W, GX, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW)) return;
#ifdef ET_DNNL_ON
        if (et_dnnl_conv(ET_DNNL_DATA, GY, W, GX, 0, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW)) return;
#endif
        et_conv_grad_input_blas(GY, W, GX, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW);
        return;
    }
    if (G == C && G == O) {
        const double work = (double)N * C * HO * WO * KH * KW;
        if (SH == 1 && SW == 1 && (KH - 1) * DH >= PH && (KW - 1) * DW >= PW) { /* the forward, taps flipped */
            const float *WF = et_dw_flipped(W, C, KH * KW);
            if (WF)
                ET_DW_STRIDED(et_dw_fwd, N * C, work, KH, KW, 1, 1, (KH - 1) * DH - PH, (KW - 1) * DW - PW, DH, DW,
                              GY, WF, (const float *)0, GX, C, HO, WO, H, Wd);
        } else if (SH == 2 && SW == 2 && DH == 1 && DW == 1)
            ET_DW_SPECIALISE(et_dw_grad_input_s2, N * C, work, KH, KW, GY, W, GX, C, H, Wd, HO, WO, PH, PW);
        else
            ET_DW_STRIDED(et_dw_grad_input, N * C, work, KH, KW, SH, SW, PH, PW, DH, DW, GY, W, GX, C, H, Wd, HO, WO);
        return;
    }
#endif
    if (et_conv_pointwise(KH, KW, SH, SW, PH, PW, G)) {
        for (int n = 0; n < N; ++n)
            et_gemm_wx(W, GY + (size_t)n * O * H * Wd, (const float *)0, GX + (size_t)n * C * H * Wd, C, O, H * Wd, 1,
                       C);
        return;
    }
    if (SH == 1 && SW == 1) {
        et_conv_grad_input_s1(GY, W, GX, N, C, H, Wd, O, HO, WO, KH, KW, PH, PW, DH, DW, G);
        return;
    }
    et_conv_grad_input(GY, W, GX, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, G);
}

ET_INLINE void et_conv2d_grad_weight(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *ET_RESTRICT GW,
                                     int N, int C, int H, int Wd, int O, int HO, int WO, int KH, int KW, int SH, int SW,
                                     int PH, int PW, int DH, int DW, int G) {
#ifdef ET_BLAS
    if (G == 1) {
        if (et_wino_grad_weight(X, GY, GW, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW)) return;
#ifdef ET_DNNL_ON
        if (et_dnnl_conv(ET_DNNL_WEIGHTS, X, GY, GW, 0, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW)) return;
#endif
        et_conv_grad_weight_blas(X, GY, GW, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW);
        return;
    }
    if (G == C && G == O) {
        ET_DW_STRIDED(et_dw_grad_weight, C, (double)N * C * HO * WO * KH * KW, KH, KW, SH, SW, PH, PW, DH, DW, X, GY,
                      GW, N, C, H, Wd, HO, WO);
        return;
    }
#endif
    if (et_conv_pointwise(KH, KW, SH, SW, PH, PW, G)) {
        for (int n = 0; n < N; ++n)
            et_gemm_abt(GY + (size_t)n * O * H * Wd, X + (size_t)n * C * H * Wd, GW, O, C, H * Wd, n > 0);
        return;
    }
    et_conv_grad_weight(X, GY, GW, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, G);
}

ET_INLINE void et_dense(const float *ET_RESTRICT X, const float *ET_RESTRICT W, const float *ET_RESTRICT B,
                        float *ET_RESTRICT Y, int N, int K, int O) {
#ifdef ET_BLAS
    et_linear_blas(X, W, B, Y, N, K, O);
#else
    et_linear(X, W, B, Y, N, K, O);
#endif
}

ET_INLINE void et_dense_grad_weight(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *ET_RESTRICT GW,
                                    int N, int K, int O) {
#ifdef ET_BLAS
    et_linear_grad_weight_blas(X, GY, GW, N, K, O);
#else
    et_linear_grad_weight(X, GY, GW, N, K, O);
#endif
}

ET_INLINE void et_dense_matmul(const float *ET_RESTRICT A, const float *ET_RESTRICT B, float *ET_RESTRICT Cm, int M,
                               int K, int N) {
#ifdef ET_BLAS
    et_matmul_blas(A, B, Cm, M, K, N);
#else
    et_matmul(A, B, Cm, M, K, N);
#endif
}

#endif /* ET_FLOAT_GEMM_H */
