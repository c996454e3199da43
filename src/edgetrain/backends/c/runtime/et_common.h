/* edgetrain C runtime: types, attributes, guard words, deterministic exp/log (no libm:
 * the host and a Cortex-M print equal losses), the error hook. Header-only. */
#ifndef ET_COMMON_H
#define ET_COMMON_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define ET_RESTRICT __restrict__
#define ET_INLINE static inline __attribute__((always_inline))
#define ET_NOINLINE __attribute__((noinline))
#define ET_UNUSED __attribute__((unused))
#define ET_ALIGNED(n) __attribute__((aligned(n)))
#define ET_SQRTF(x) __builtin_sqrtf(x)
#define ET_SQRT(x) __builtin_sqrt(x)
#else
#define ET_RESTRICT
#define ET_INLINE static inline
#define ET_NOINLINE
#define ET_UNUSED
#define ET_ALIGNED(n)
#define ET_SQRTF(x) sqrtf(x)
#define ET_SQRT(x) sqrt(x)
#endif

/* one copy of n bytes, kept a call: the state accessors and the step guard (emit.py, step_guard.py) copy
 * each state tensor in a case of their own, hundreds of constant-size memcpys that GCC at -O3 would
 * expand one by one, slow to compile; memcpy does the copy either way */
static ET_NOINLINE ET_UNUSED void *et_copy(void *dst, const void *src, size_t n) { return memcpy(dst, src, n); }

/* attributes of a graph's chunk functions (emit_graphs.py), and of model.c's other call sequences: the state
 * accessors' and et_gradients' per-tensor switches and copies, the checked step and its guard (emit.py,
 * step_guard.py). None by default; the Cortex-M firmware optimises the chunks for size (runtime/cortexm/Makefile):
 * they run once per step and mostly call the kernels. The host library (host.py DEFAULT_CFLAGS: ET_GRAPH_O1, GCC)
 * compiles them at -O1 with -O3's loop vectorizer: -O3 took about half of a large model.c's compile for what is
 * mostly call sequences, and their loops (elementwise ops, sums, the SGD updates) vectorize as at -O3
 * (tests/backends/c/test_graph_opt.py) */
#ifndef ET_GRAPH_ATTR
#if defined(ET_GRAPH_O1) && defined(__GNUC__) && !defined(__clang__)
#define ET_GRAPH_ATTR __attribute__((optimize("O1", "tree-loop-vectorize")))
#else
#define ET_GRAPH_ATTR
#endif
#endif

/* arena guard: ET_GUARD_WORDS words of ET_GUARD_VALUE before and after the arena. The host builds take 16
 * (host.py DEFAULT_CFLAGS): the arena then starts on a 64-byte boundary (its array's), a cache line, where 4
 * words put it 16 bytes past one (docs/benchmarks.md, "The host step, fifth look"); 4 keep a device's SRAM */
#define ET_GUARD_VALUE 0xE7A5C0DEu
#ifndef ET_GUARD_WORDS
#define ET_GUARD_WORDS 4
#endif
/* byte alignment of the arena and of every tensor in it (memory/arena.py ALIGNMENT) */
#define ET_ARENA_ALIGN 16

/* loop vectorisation hints without fast-math: ET_SIMD_SUM(v): the sum v may be reordered; ET_SIMD: the
 * iterations are independent (an elementwise op written in place over its input); (float32 programs
 * are checked within 1e-5 relative, any summation order) */
/* -fopenmp-simd defines no macro: builds that pass it also define ET_OMP_SIMD */
#if defined(_OPENMP) || defined(ET_OMP_SIMD)
#define ET_PRAGMA(x) _Pragma(#x)
#define ET_SIMD_SUM(v) ET_PRAGMA(omp simd reduction(+:v))
#define ET_SIMD ET_PRAGMA(omp simd)
#define ET_SIMD_SUM2(a, b) ET_PRAGMA(omp simd reduction(+:a, b))
#else
#define ET_SIMD_SUM2(a, b)
#define ET_SIMD_SUM(v)
#define ET_SIMD
#endif

/* host threads (the ctypes host library is built with -fopenmp: backends/c/host.py): ET_PARALLEL_FOR(work) before
 * a loop over independent outputs (channels, rows, images) runs its iterations on et_threads threads, statically
 * split, when et_threads > 1 and `work` (about the loop's element operations) reaches ET_PARALLEL_MIN_WORK;
 * ET_PARALLEL_FOR2 collapses the two loops that follow. An iteration is the same sequence of operations on any
 * thread and no sum is split across iterations: the results do not depend on the thread count (float32 bit for
 * bit). et_threads (one per library: weak, shared by the kernels' object and model.c) is set by the host runner
 * (CRunner's threads=) and gives the BLAS its thread count too. Without OpenMP (the firmware, emitted projects,
 * the cross builds) every loop is serial and the macros are empty. */
#ifdef _OPENMP
#include <omp.h>
__attribute__((weak)) int et_threads = 1;
#ifndef ET_PARALLEL_MIN_WORK
#define ET_PARALLEL_MIN_WORK 32768
#endif
#define ET_PARALLEL_FOR(work) \
    ET_PRAGMA(omp parallel for schedule(static) num_threads(et_threads) if (ET_PARALLEL_WORTH(work)))
#define ET_PARALLEL_FOR2(work) \
    ET_PRAGMA(omp parallel for collapse(2) schedule(static) num_threads(et_threads) if (ET_PARALLEL_WORTH(work)))
#define ET_PARALLEL_FOR_SIMD(work) \
    ET_PRAGMA(omp parallel for simd schedule(static) num_threads(et_threads) if (ET_PARALLEL_WORTH(work)))
/* ... one iteration at a time to the next free thread (a few large, uneven iterations: GEMM tiles) */
#define ET_PARALLEL_FOR_TILES(work) \
    ET_PRAGMA(omp parallel for schedule(dynamic, 1) num_threads(et_threads) if (ET_PARALLEL_WORTH(work)))
/* ... with the iterations' flags ORed into the int `v` */
#define ET_PARALLEL_FOR_OR(work, v) \
    ET_PRAGMA(omp parallel for schedule(static) reduction(|:v) num_threads(et_threads) if (ET_PARALLEL_WORTH(work)))
/* more than one thread, enough work, and not already inside a parallel loop (a kernel called from one) */
#define ET_PARALLEL_WORTH(work) (et_threads > 1 && (double)(work) >= ET_PARALLEL_MIN_WORK && !omp_in_parallel())
/* `name`: a row of n T for one iteration of a loop that may run split: the thread's own (on its stack) inside a
 * parallel loop, else `shared` (the planned scratch) */
#define ET_THREAD_ROW(T, name, n, shared) \
    T name##_own[n];                      \
    T *name = omp_in_parallel() ? name##_own : (shared);
#else
#define ET_THREAD_ROW(T, name, n, shared) T *name = (shared);
#define ET_PARALLEL_FOR(work)
#define ET_PARALLEL_FOR2(work)
#define ET_PARALLEL_FOR_SIMD(work) ET_SIMD
#define ET_PARALLEL_FOR_TILES(work)
#define ET_PARALLEL_FOR_OR(work, v)
#endif

typedef union { double d; uint64_t u; } et_bits64;

ET_INLINE double et_pow2i(int k) { /* 2^k for k in [-1022, 1023] */
    et_bits64 b;
    b.u = (uint64_t)(k + 1023) << 52;
    return b.d;
}

/* exp(x) in double: x = k ln2 + r, |r| <= ln2/2, Taylor series of degree 13 (error < 1e-17
 * relative), then the exponent set directly; same bits on every IEEE-754 machine that
 * does not contract a*b+c (build with -ffp-contract=off) */
static inline double et_exp(double x) {
    const double LN2_HI = 6.93147180369123816490e-01, LN2_LO = 1.90821492927058770002e-10;
    const double INV_LN2 = 1.44269504088896338700e+00;
    if (x != x) return x;
    if (x > 709.7) return 1.0 / 0.0;
    if (x < -745.2) return 0.0;
    double kf = x * INV_LN2;
    int k = (int)(kf < 0 ? kf - 0.5 : kf + 0.5);
    double r = (x - k * LN2_HI) - k * LN2_LO;
    double p = 1.0 + r / 13.0;
    for (int i = 12; i >= 1; --i) p = 1.0 + r / i * p;
    if (k < -1022) return p * et_pow2i(k + 600) * et_pow2i(-600);
    if (k > 1023) return p * et_pow2i(k - 1) * 2.0;
    return p * et_pow2i(k);
}

/* log(x) in double: x = 2^e m, m in [sqrt(1/2), sqrt(2)), log m = 2 atanh((m-1)/(m+1))
 * by its series to s^23 (error < 1e-17) */
static inline double et_log(double x) {
    const double LN2_HI = 6.93147180369123816490e-01, LN2_LO = 1.90821492927058770002e-10;
    if (x != x || x < 0) return 0.0 / 0.0;
    if (x == 0) return -1.0 / 0.0;
    if (x > 1.79e308) return x;
    int e = 0;
    if (x < 2.2250738585072014e-308) { x *= 18014398509481984.0; e = -54; } /* subnormal: * 2^54 */
    et_bits64 b;
    b.d = x;
    e += (int)((b.u >> 52) & 0x7ff) - 1023;
    b.u = (b.u & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL;
    double m = b.d;
    if (m > 1.4142135623730951) { m *= 0.5; e += 1; }
    double s = (m - 1.0) / (m + 1.0), s2 = s * s, t = 1.0 / 23.0;
    for (int i = 21; i >= 1; i -= 2) t = 1.0 / i + s2 * t;
    return e * LN2_HI + (2.0 * s * t + e * LN2_LO);
}

ET_INLINE float et_expf(float x) { return (float)et_exp((double)x); }
ET_INLINE float et_logf(float x) { return (float)et_log((double)x); }

/* error hook: a program calls et_error on an impossible state (a bad argument); the
 * default does nothing, a target may define ET_ERROR_HOOK to its own handler */
#ifndef ET_ERROR_HOOK
#define ET_ERROR_HOOK(msg) ((void)(msg))
#endif

#endif /* ET_COMMON_H */
