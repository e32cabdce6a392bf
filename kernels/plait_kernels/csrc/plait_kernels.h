/* What the CPU kernels of this folder share: attribute macros, exp for non-positive floats,
 * and the types through which one kernel calls another (the Python side hands a kernel the
 * addresses of the others, so each is compiled once, in its own file, and defined once).
 *
 * plait.kernels._native hashes this header with every source, so editing it rebuilds them. */
#ifndef PLAIT_KERNELS_H
#define PLAIT_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* With GCC 12+ on x86-64 an entry point is cloned for AVX-512, AVX2 and the baseline ISA (the
 * inlined helpers compile into each clone) and the loader picks one at run time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define PLAIT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PLAIT_CLONES
#endif
#if defined(__GNUC__)
#define PLAIT_INLINE static inline __attribute__((always_inline))
#else
#define PLAIT_INLINE static inline
#endif

/* ---- thread_pool.c: plait_pool_run(fn, ctx, parts, threads) ------------------------------ */
typedef void (*plait_part_fn)(void *ctx, int part, int parts);
typedef int (*plait_pool_fn)(plait_part_fn fn, void *ctx, int parts, int threads);

/* ---- quant_matmul_cpu.c: plait_qmm_f32 and the packed weight it reads --------------------- */
/* A quantized [n, k] weight in the kernels' native layout (csrc/qmm_tile.h documents it): rows
 * in blocks of 16, k in groups of 32; one or more parts stacked along n (q, k, v or gate, up of
 * different kinds), each in its own form. Built once per weight by plait.kernels.native_weight. */
typedef struct {
    const uint8_t *codes;   /* [blocks, k / 32, group bytes of the code planes] */
    const void *scales;     /* [blocks, k / sub, 16]: fp16, fp32 or int8 (K forms) */
    const void *mins;       /* like scales, or NULL */
    const uint16_t *d;      /* K forms: fp16 [blocks, k / 256, 16] super-block scales */
    const uint16_t *dmin;   /* K forms with mins: the same for the mins, else NULL */
    int32_t planes, scale_form, zero, sub; /* QMM_P*, QMM_S*, code offset, 16 or 32 */
    int64_t n;              /* rows of this part */
} plait_qpart_t;

#define PLAIT_QMM_MAX_PARTS 4
/* x_bits: 16, x quantized to two bytes a value (hi + lo / 256), or 8, one (lo = 0; faster,
 * within dx / 2 where two bytes are within dx / 256). */
typedef struct {
    int64_t n, k, nparts, x_bits;
    plait_qpart_t part[PLAIT_QMM_MAX_PARTS];
} plait_weight_t;

/* Code planes (bytes per group of 32 x 16 rows) and scale forms. */
enum { QMM_P4 = 0, QMM_P8 = 1, QMM_P4H1 = 2, QMM_P4H2 = 3, QMM_P2 = 4, QMM_P2H1 = 5, QMM_IQ4 = 6 };
enum { QMM_SF16 = 0, QMM_SF32 = 1, QMM_SK = 2 };

/* out[m, n] = x[m, k] (row stride ldx) @ W^T (+ bias); returns threads used (>= 1) or < 0. */
typedef int (*plait_qmm_fn)(int isa, int threads, plait_pool_fn pool, const float *x, int64_t ldx,
                            int64_t m, const plait_weight_t *w, const float *bias, float *out);

/* ---- decode_attention_cpu.c: plait_decode_f32, kv heads [kv_lo, kv_hi) of each request ----
 * scores are scale * q.k, then softcap * tanh(score / softcap) unless softcap is 0. */
typedef int (*plait_decode_f32_fn)(const float *q, const float *k, const float *v,
                                   const int32_t *table, const int64_t *rows, const int64_t *start,
                                   const int64_t *seq, int64_t table_stride, int64_t num_slots,
                                   int64_t batch, int64_t hq, int64_t hkv, int64_t d,
                                   int64_t kv_lo, int64_t kv_hi, float scale, float softcap,
                                   float *out, float *lse);

/* exp(x) for x <= 0 in float: 2^n * e^r with |r| <= ln2/2, degree-7 Taylor (within 1e-7
 * relative, an ulp of expf); branch-free so loops over it vectorize (AVX2 and up, with
 * -fno-trapping-math: the clamp becomes a select). x <= -87 gives 1.6e-38 rather than 0. */
PLAIT_INLINE float exp_nonpos(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = floorf(x * 1.44269504f + 0.5f);
    float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* tanh(x) in float, branch-free (loops over it vectorize): an odd Taylor polynomial to x^7
 * for |x| < 0.125 (the next term is 2e-9 of x there), else (1 - e) / (1 + e) with
 * e = exp(-2|x|) (within a few 1e-8 absolute), the sign restored. */
PLAIT_INLINE float tanh_f32(float x) {
    float a = fabsf(x), x2 = x * x;
    float small = x * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f + x2 * (-17.0f / 315.0f))));
    float e = exp_nonpos(-2.0f * a), big = (1.0f - e) / (1.0f + e);
    big = x < 0.0f ? -big : big;
    return a < 0.125f ? small : big;
}

/* IEEE half (fp16 bits) to float, exactly: infinities and NaNs kept, subnormals scaled. */
PLAIT_INLINE float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: value man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

#endif
