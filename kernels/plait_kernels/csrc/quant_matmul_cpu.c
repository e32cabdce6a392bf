/* Weight-only quantized matmul on the CPU: out[M, N] = x[M, K] @ W[N, K]^T (+ bias), where
 * W = scale * code + min per group of `group` codes along K, kept packed (plait.kernels.quant).
 *
 * Built at first use by plait.kernels._native and called through ctypes. The weight is never
 * turned into floats: each row of x is first quantized per group to int16 (dx = max|x| / 32767,
 * an error of at most dx / 2 per element, 2^-16 of the group's largest), then per group the
 * integer dot of codes and x is exact in int32 and
 *     out += float(dot) * (scale * dx) + min * sum(x over the group)
 * with the fp32 sum of the unquantized x. Rows of W come in blocks of 16: a block's codes are
 * interleaved so one 512-bit register holds code pair p of all 16 rows (row r in 32-bit lane r)
 * and a single vpdpwssd against the broadcast pair x[2p], x[2p+1] adds it to 16 accumulators;
 * a block's 16 scales (and mins) per group are contiguous, so they load as one vector and the
 * accumulators never need a horizontal sum. Layout per block and group (k0 = g * group):
 *   4-bit: group / 8 chunks of 64 bytes; 16-bit word w = 2r + e of chunk c holds in its nibble
 *          j (bits 4j..4j+3) the code of row r at k0 + 8c + 2j + e.
 *   8-bit: group / 2 chunks of 32 bytes (int8); byte 2r + e of chunk p is row r at k0 + 2p + e.
 * Codes are read once per call and rows of x are processed MT at a time against them, so a
 * batch (or a prefill) reuses each decoded code for up to 4 rows. Entry points per ISA:
 * AVX-512 VNNI, AVX-512BW, AVX2 (+FMA, F16C), and portable C; plait_qmm_isa() names the best
 * the CPU runs and the caller may ask for a lower one (tests run all of them). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plait_kernels.h"

#define BLOCK_ROWS 16
#define XQ_MAX 32767.0f
/* Codes are prefetched this many bytes ahead into L1 (and 4x as far into L2 for 4-bit codes):
 * the hardware prefetcher alone leaves a one-token decode (weights streaming from DRAM) at
 * about half the bandwidth. */
#define PF_DIST 4096

enum { ISA_GENERIC = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512_VNNI = 3 };

/* ---- activations -> int16 per group (shared by every ISA) ------------------------------- */

/* One row: xq = round(x / dx) with dx = max|x| / 32767 per group; xs = sum of x per group. A
 * group holding inf or nan gets dx = nan, so its outputs are nan. */
PLAIT_INLINE void quantize_row(const float *x, int64_t k, int64_t group, int16_t *xq, float *dx,
                               float *xs) {
    for (int64_t g = 0; g * group < k; ++g) {
        const float *xg = x + g * group;
        float amax = 0.0f, sum = 0.0f;
#pragma omp simd reduction(max : amax) reduction(+ : sum)
        for (int64_t i = 0; i < group; ++i) {
            float a = fabsf(xg[i]);
            amax = a > amax ? a : amax;
            sum += xg[i];
        }
        int finite = amax <= 3.4e38f && sum == sum; /* the max skips nan; the sum does not */
        float inv = finite && amax > 0.0f ? XQ_MAX / amax : 0.0f;
        dx[g] = finite ? amax / XQ_MAX : NAN;
        xs[g] = sum;
        int16_t *qg = xq + g * group;
#pragma omp simd
        for (int64_t i = 0; i < group; ++i) {
            float r = xg[i] * inv;
            qg[i] = (int16_t)(r + (r >= 0.0f ? 0.5f : -0.5f));
        }
    }
}

PLAIT_INLINE float half_to_float(uint16_t h) {
#if defined(__aarch64__)
    __fp16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f; /* one instruction there */
#endif
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

PLAIT_INLINE float load_scale(const void *p, int64_t i, int half) {
    return half ? half_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* ---- portable C ----------------------------------------------------------------------------- */

/* Integer dots of one block's 16 rows with one row of xq over one group, the loops shaped for
 * the auto-vectorizer (the 32 lanes of a chunk, as pmaddwd sees them: lane 2r + e). */
PLAIT_INLINE void generic_group_dots(const uint8_t *cp, const int16_t *xg, int64_t group, int bits,
                                     int32_t acc[BLOCK_ROWS]) {
    enum { LANES = 2 * BLOCK_ROWS };
    int32_t lanes[LANES] = {0};
    int16_t xpat[LANES]; /* int16 x int16 products: a widening multiply the vectorizer knows */
    if (bits == 4) {
        for (int64_t c = 0; c < group; c += 8, cp += 64) {
            uint16_t words[LANES];
            memcpy(words, cp, sizeof words);
            for (int j = 0; j < 4; ++j) {
                for (int r = 0; r < BLOCK_ROWS; ++r) memcpy(xpat + 2 * r, xg + c + 2 * j, 4);
#pragma omp simd
                for (int w = 0; w < LANES; ++w)
                    lanes[w] += (int16_t)((words[w] >> (4 * j)) & 0xf) * xpat[w];
            }
        }
    } else {
        for (int64_t p = 0; p < group; p += 2, cp += 32) {
            int8_t bytes[LANES];
            memcpy(bytes, cp, sizeof bytes);
            for (int r = 0; r < BLOCK_ROWS; ++r) memcpy(xpat + 2 * r, xg + p, 4);
#pragma omp simd
            for (int w = 0; w < LANES; ++w) lanes[w] += (int16_t)bytes[w] * xpat[w];
        }
    }
    for (int r = 0; r < BLOCK_ROWS; ++r) acc[r] = lanes[2 * r] + lanes[2 * r + 1];
}

/* Rows of x go GENERIC_ROWS at a time, groups in the middle loop: a group's scales are
 * converted once for all of them. */
#define GENERIC_ROWS 64

static void generic_block(const int16_t *xq, const float *dx, const float *xs, int64_t m,
                          int64_t k, const uint8_t *codes, const void *scales, const void *mins,
                          int half, int bits, int64_t group, float *out, int64_t ldo,
                          int64_t rows) {
    int64_t gc = k / group, gbytes = group * BLOCK_ROWS * bits / 8;
    for (int64_t i0 = 0; i0 < m; i0 += GENERIC_ROWS) {
        int64_t mt = m - i0 < GENERIC_ROWS ? m - i0 : GENERIC_ROWS;
        float tot[GENERIC_ROWS][BLOCK_ROWS];
        memset(tot, 0, sizeof tot[0] * (size_t)mt);
        for (int64_t g = 0; g < gc; ++g) {
            float s[BLOCK_ROWS], mn[BLOCK_ROWS];
            for (int r = 0; r < BLOCK_ROWS; ++r) {
                s[r] = load_scale(scales, g * BLOCK_ROWS + r, half);
                mn[r] = mins != NULL ? load_scale(mins, g * BLOCK_ROWS + r, half) : 0.0f;
            }
            for (int64_t i = i0; i < i0 + mt; ++i) {
                int32_t acc[BLOCK_ROWS];
                generic_group_dots(codes + g * gbytes, xq + i * k + g * group, group, bits, acc);
                float d = dx[i * gc + g], sx = xs[i * gc + g], *t = tot[i - i0];
                for (int r = 0; r < BLOCK_ROWS; ++r) /* no fmaf: a libm call without FMA */
                    t[r] += (float)acc[r] * (s[r] * d) + mn[r] * sx;
            }
        }
        for (int64_t i = i0; i < i0 + mt; ++i)
            for (int64_t r = 0; r < rows; ++r) out[i * ldo + r] = tot[i - i0][r];
    }
}

/* ---- x86 SIMD ------------------------------------------------------------------------------ */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define T_AVX512 "avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"
#define T_AVX512VNNI T_AVX512 ",avx512vnni"
#define T_AVX2 "avx2,fma,f16c"

PLAIT_INLINE int32_t pair_at(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The AVX-512 tile: one block of 16 rows against MT rows of x. DP(acc, codes, x) adds the
 * pairwise int16 products to acc (vpdpwssd, or vpmaddwd + vpaddd without VNNI). */
#define DEFINE_AVX512_TILE(NAME, TARGET, DP)                                                       \
    __attribute__((target(TARGET))) PLAIT_INLINE __m512 load16_##NAME(const void *p, int64_t at,   \
                                                                      int half) {                  \
        const __m256i *h = (const __m256i *)((const uint16_t *)p + at);                            \
        return half ? _mm512_cvtph_ps(_mm256_loadu_si256(h))                                       \
                    : _mm512_loadu_ps((const float *)p + at);                                      \
    }                                                                                              \
    __attribute__((target(TARGET))) PLAIT_INLINE void NAME(                                       \
        const int16_t *xq, const float *dx, const float *xs, int64_t k, const uint8_t *codes,     \
        const void *scales, const void *mins, int half, int bits, int64_t group, float *out,      \
        int64_t ldo, int64_t rows, const int MT) {                                                 \
        int64_t gc = k / group;                                                                    \
        const int NACC = MT >= 4 ? 1 : 4 / MT; /* independent sums per row: latency */            \
        __m512 tot[4];                                                                             \
        for (int i = 0; i < MT; ++i) tot[i] = _mm512_setzero_ps();                                 \
        const int NACC4 = NACC < 2 ? 2 : NACC;                                                     \
        const __m512i low4 = _mm512_set1_epi16(0xf), high4 = _mm512_set1_epi16(0xf0);             \
        const uint8_t *cp = codes;                                                                 \
        for (int64_t g = 0; g < gc; ++g) {                                                         \
            const int16_t *xg = xq + g * group;                                                    \
            __m512i acc[4][4];                                                                     \
            for (int i = 0; i < MT; ++i)                                                           \
                for (int a = 0; a < 4; ++a) acc[i][a] = _mm512_setzero_si512();                    \
            if (bits == 4) { /* nibbles 1 and 3 kept at 16x: acc[i][odd] sums 16 * dot */        \
                for (int64_t c = 0; c < group; c += 8, cp += 64) {                                 \
                    _mm_prefetch((const char *)cp + PF_DIST, _MM_HINT_T0);                         \
                    _mm_prefetch((const char *)cp + 4 * PF_DIST, _MM_HINT_T1);                     \
                    __m512i v = _mm512_loadu_si512(cp), v8 = _mm512_srli_epi16(v, 8);              \
                    __m512i vj[4] = {_mm512_and_si512(v, low4), _mm512_and_si512(v, high4),        \
                                     _mm512_and_si512(v8, low4), _mm512_and_si512(v8, high4)};     \
                    for (int i = 0; i < MT; ++i)                                                   \
                        for (int j = 0; j < 4; ++j) {                                              \
                            __m512i xb = _mm512_set1_epi32(pair_at(xg + i * k + c + 2 * j));       \
                            acc[i][j % NACC4] = DP(acc[i][j % NACC4], vj[j], xb);                  \
                        }                                                                          \
                }                                                                                  \
                for (int i = 0; i < MT; ++i) {                                                     \
                    for (int a = 2; a < NACC4; ++a)                                                \
                        acc[i][a % 2] = _mm512_add_epi32(acc[i][a % 2], acc[i][a]);                \
                    acc[i][0] = _mm512_add_epi32(acc[i][0], _mm512_srai_epi32(acc[i][1], 4));      \
                }                                                                                  \
            } else {                                                                               \
                for (int64_t p = 0; p < group; p += 2 * NACC) {                                    \
                    for (int a = 0; a < NACC; ++a, cp += 32) {                                     \
                        if (!(a & 1)) _mm_prefetch((const char *)cp + PF_DIST, _MM_HINT_T0);       \
                        __m512i v = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const void *)cp));    \
                        for (int i = 0; i < MT; ++i) {                                             \
                            __m512i xb = _mm512_set1_epi32(pair_at(xg + i * k + p + 2 * a));       \
                            acc[i][a] = DP(acc[i][a], v, xb);                                      \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
                for (int i = 0; i < MT; ++i)                                                       \
                    for (int a = 1; a < NACC; ++a)                                                 \
                        acc[i][0] = _mm512_add_epi32(acc[i][0], acc[i][a]);                        \
            }                                                                                      \
            __m512 s = load16_##NAME(scales, g * BLOCK_ROWS, half);                                \
            for (int i = 0; i < MT; ++i) {                                                         \
                __m512 si = _mm512_mul_ps(s, _mm512_set1_ps(dx[i * gc + g]));                      \
                tot[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][0]), si, tot[i]);               \
            }                                                                                      \
            if (mins != NULL) {                                                                    \
                __m512 mn = load16_##NAME(mins, g * BLOCK_ROWS, half);                             \
                for (int i = 0; i < MT; ++i)                                                       \
                    tot[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xs[i * gc + g]), tot[i]);          \
            }                                                                                      \
        }                                                                                          \
        __mmask16 keep = (__mmask16)((1u << rows) - 1u);                                           \
        for (int i = 0; i < MT; ++i) _mm512_mask_storeu_ps(out + i * ldo, keep, tot[i]);           \
    }

#define DP_VNNI(acc, a, b) _mm512_dpwssd_epi32(acc, a, b)
#define DP_MADD(acc, a, b) _mm512_add_epi32(acc, _mm512_madd_epi16(a, b))
DEFINE_AVX512_TILE(tile_avx512_vnni, T_AVX512VNNI, DP_VNNI)
DEFINE_AVX512_TILE(tile_avx512, T_AVX512, DP_MADD)

/* 8 scales (or mins) from fp16 or fp32. */
__attribute__((target(T_AVX2))) PLAIT_INLINE __m256 load8_avx2(const void *p, int64_t at,
                                                               int half) {
    return half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + at)))
                : _mm256_loadu_ps((const float *)p + at);
}

/* AVX2: the block as two halves of 8 rows (the low and high 32 bytes of a 4-bit chunk, 16 of
 * an 8-bit one), each like the AVX-512 tile with 256-bit registers. */
__attribute__((target(T_AVX2))) PLAIT_INLINE void tile_avx2(
    const int16_t *xq, const float *dx, const float *xs, int64_t k, const uint8_t *codes,
    const void *scales, const void *mins, int half, int bits, int64_t group, float *out,
    int64_t ldo, int64_t rows, const int MT) {
    int64_t gc = k / group;
    const __m256i low4 = _mm256_set1_epi16(0xf);
    for (int h = 0; h < 2; ++h) {
        __m256 tot[4];
        for (int i = 0; i < MT; ++i) tot[i] = _mm256_setzero_ps();
        const uint8_t *cp = codes;
        for (int64_t g = 0; g < gc; ++g) {
            const int16_t *xg = xq + g * group;
            __m256i acc[4];
            for (int i = 0; i < MT; ++i) acc[i] = _mm256_setzero_si256();
            if (bits == 4) {
                for (int64_t c = 0; c < group; c += 8, cp += 64) {
                    _mm_prefetch((const char *)cp + PF_DIST, _MM_HINT_T0);
                    __m256i v = _mm256_loadu_si256((const void *)(cp + 32 * h));
                    __m256i vs[4] = {_mm256_and_si256(v, low4),
                                     _mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                                     _mm256_and_si256(_mm256_srli_epi16(v, 8), low4),
                                     _mm256_srli_epi16(v, 12)};
                    for (int i = 0; i < MT; ++i)
                        for (int j = 0; j < 4; ++j) {
                            __m256i xb = _mm256_set1_epi32(pair_at(xg + i * k + c + 2 * j));
                            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(vs[j], xb));
                        }
                }
            } else {
                for (int64_t p = 0; p < group; p += 2, cp += 32) {
                    if (p % 4 == 0) _mm_prefetch((const char *)cp + PF_DIST, _MM_HINT_T0);
                    __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)(cp + 16 * h)));
                    for (int i = 0; i < MT; ++i) {
                        __m256i xb = _mm256_set1_epi32(pair_at(xg + i * k + p));
                        acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(v, xb));
                    }
                }
            }
            int64_t at = g * BLOCK_ROWS + 8 * h;
            __m256 s = load8_avx2(scales, at, half);
            for (int i = 0; i < MT; ++i) {
                __m256 si = _mm256_mul_ps(s, _mm256_set1_ps(dx[i * gc + g]));
                tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i]), si, tot[i]);
            }
            if (mins != NULL) {
                __m256 mn = load8_avx2(mins, at, half);
                for (int i = 0; i < MT; ++i)
                    tot[i] = _mm256_fmadd_ps(mn, _mm256_set1_ps(xs[i * gc + g]), tot[i]);
            }
        }
        for (int i = 0; i < MT; ++i) {
            float lane[8];
            _mm256_storeu_ps(lane, tot[i]);
            for (int64_t r = 8 * h; r < rows && r < 8 * h + 8; ++r)
                out[i * ldo + r] = lane[r - 8 * h];
        }
    }
}

/* One block against all m rows of x: MT = 4 at a time (8 would spill registers), then the
 * rest by 2 and 1. */
#define DEFINE_BLOCK(NAME, TARGET, TILE)                                                           \
    __attribute__((target(TARGET))) static void NAME(                                             \
        const int16_t *xq, const float *dx, const float *xs, int64_t m, int64_t k,                 \
        const uint8_t *codes, const void *scales, const void *mins, int half, int bits,           \
        int64_t group, float *out, int64_t ldo, int64_t rows) {                                    \
        int64_t gc = k / group, i = 0;                                                             \
        for (; i + 4 <= m; i += 4)                                                                 \
            TILE(xq + i * k, dx + i * gc, xs + i * gc, k, codes, scales, mins, half, bits, group,  \
                 out + i * ldo, ldo, rows, 4);                                                     \
        if (i + 2 <= m) {                                                                          \
            TILE(xq + i * k, dx + i * gc, xs + i * gc, k, codes, scales, mins, half, bits, group,  \
                 out + i * ldo, ldo, rows, 2);                                                     \
            i += 2;                                                                                \
        }                                                                                          \
        if (i < m)                                                                                 \
            TILE(xq + i * k, dx + i * gc, xs + i * gc, k, codes, scales, mins, half, bits, group,  \
                 out + i * ldo, ldo, rows, 1);                                                     \
    }

DEFINE_BLOCK(block_avx512_vnni, T_AVX512VNNI, tile_avx512_vnni)
DEFINE_BLOCK(block_avx512, T_AVX512, tile_avx512)
DEFINE_BLOCK(block_avx2, T_AVX2, tile_avx2)

int plait_qmm_isa(void) {
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (avx512 && __builtin_cpu_supports("avx512vnni")) return ISA_AVX512_VNNI;
    if (avx512) return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
    return ISA_GENERIC;
}
#else
int plait_qmm_isa(void) { return ISA_GENERIC; }
#endif

/* ---- entry point --------------------------------------------------------------------------- */

typedef void (*block_fn)(const int16_t *, const float *, const float *, int64_t, int64_t,
                         const uint8_t *, const void *, const void *, int, int, int64_t, float *,
                         int64_t, int64_t);

static block_fn pick(int isa) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa >= ISA_AVX512_VNNI) return block_avx512_vnni;
    if (isa == ISA_AVX512) return block_avx512;
    if (isa == ISA_AVX2) return block_avx2;
#endif
    (void)isa;
    return generic_block;
}

/* Scratch for the quantized x, kept per thread and grown as needed. */
static void *scratch(size_t bytes) {
    static __thread void *buf = NULL;
    static __thread size_t cap = 0;
    if (bytes > cap) {
        void *grown = realloc(buf, bytes);
        if (grown == NULL) return NULL;
        buf = grown;
        cap = bytes;
    }
    return buf;
}

typedef struct {
    block_fn run;
    const int16_t *xq;
    const float *dx, *xs, *bias;
    const uint8_t *codes;
    const void *scales, *mins;
    int half, bits;
    int64_t m, k, group, n, blocks, ldo;
    float *out;
} job_t;

/* Part `part` of `parts` of a job: a contiguous range of row blocks (so every output is
 * computed the same way whichever thread runs it). */
static void run_part(void *ctx, int part, int parts) {
    const job_t *j = ctx;
    int64_t b0 = j->blocks * part / parts, b1 = j->blocks * (part + 1) / parts;
    int64_t gc = j->k / j->group, block_bytes = j->k * BLOCK_ROWS * j->bits / 8;
    size_t el = j->half ? 2 : 4, block_scales = (size_t)(gc * BLOCK_ROWS) * el;
    for (int64_t b = b0; b < b1; ++b) {
        int64_t rows = j->n - b * BLOCK_ROWS < BLOCK_ROWS ? j->n - b * BLOCK_ROWS : BLOCK_ROWS;
        const char *sc = (const char *)j->scales + (size_t)b * block_scales;
        const char *mn = j->mins ? (const char *)j->mins + (size_t)b * block_scales : NULL;
        float *ob = j->out + b * BLOCK_ROWS;
        j->run(j->xq, j->dx, j->xs, j->m, j->k, j->codes + b * block_bytes, sc, mn, j->half,
               j->bits, j->group, ob, j->ldo, rows);
        if (j->bias == NULL) continue;
        for (int64_t i = 0; i < j->m; ++i)
            for (int64_t r = 0; r < rows; ++r) ob[i * j->ldo + r] += j->bias[b * BLOCK_ROWS + r];
    }
}

/* A part should hold at least this many row blocks x K x rows of x (some microseconds); there
 * are up to PARTS_PER_THREAD parts per thread, so a late thread's share is taken by others. */
#define MIN_PART_WORK 8192
#define PARTS_PER_THREAD 4

/* The packed weight is a plait_weight_t (plait_kernels.h; one struct per weight, built once by
 * the Python side). out[i, :n] = x[i] @ W^T (+ bias) for i < m. x is fp32 with row stride ldx, out [m, n]
 * contiguous, bias [n] or NULL. The row blocks are split over up to `threads` threads through
 * `pool` (plait_pool_run of thread_pool.c; NULL: this thread only). Returns the number of
 * threads asked to run it (>= 1), -1 when out of memory, -3 on an unsupported shape. */
int plait_qmm_f32(int isa, int threads, plait_pool_fn pool, const float *x, int64_t ldx,
                  int64_t m, const plait_weight_t *w, const float *bias, float *out) {
    int64_t k = w->k, group = w->group, n = w->n;
    if ((w->bits != 4 && w->bits != 8) || group < 16 || group > 256 || group % 16 || k % group ||
        n < 0)
        return -3;
    int64_t gc = k / group;
    size_t xq_bytes = ((size_t)(m * k) * sizeof(int16_t) + 63) & ~(size_t)63;
    char *buf = scratch(xq_bytes + 2 * sizeof(float) * (size_t)(m * gc));
    if (buf == NULL) return -1;
    int16_t *xq = (int16_t *)buf;
    float *dx = (float *)(buf + xq_bytes), *xs = dx + m * gc;
    for (int64_t i = 0; i < m; ++i)
        quantize_row(x + i * ldx, k, group, xq + i * k, dx + i * gc, xs + i * gc);
    job_t job = {pick(isa), xq,      dx, xs, bias, w->codes, w->scales, w->mins, (int)w->half,
                 (int)w->bits, m, k, group, n, (n + BLOCK_ROWS - 1) / BLOCK_ROWS, n, out};
    int64_t parts = job.blocks * k * m / MIN_PART_WORK, most = (int64_t)threads * PARTS_PER_THREAD;
    parts = parts < job.blocks ? parts : job.blocks;
    parts = parts < most ? parts : most;
    if (pool != NULL && threads > 1 && parts > 1) return pool(run_part, &job, (int)parts, threads);
    run_part(&job, 0, 1);
    return 1;
}
