/* CPU decode attention over the paged KV pool: one query token per request.
 *
 * Built at first use by plait.kernels._native and called through ctypes. Request b attends to
 * its positions [start[b], seq[b]), whose KV slots are table[rows[b] * table_stride + pos]; the
 * pool is [S, Hkv, D] (fp32 or bf16), query head h reads kv head h / (Hq / Hkv). Per request
 * the scores of each query head go to a scratch buffer, then the soft cap where there is one
 * (Gemma 2), the softmax, then the value sums.
 * On an x86-64 CPU with AVX-512, an fp32 pool with D in 16, 32, ..., 256 takes the vector path
 * (16 scores per transpose-and-add tree, outputs in registers: 2.3x the scalar loops at batch
 * 16 x 1,040 positions); elsewhere the scalar loops, which read each K row once for all query
 * heads (GCC splits 16-float shuffles into single elements below AVX-512, which made the
 * vector path 2.7x slower than them on AVX2). Nothing is gathered or copied: the torch path
 * gathers the same rows into temporaries first. Slot ids outside the pool fail the call (-2)
 * rather than read past it. A call computes the query heads of kv heads [kv_lo, kv_hi) only
 * (the decode step, decode_step_cpu.c, splits a request's heads over threads) and leaves the
 * other heads' outputs as they are. The entry points are cloned per ISA (PLAIT_CLONES,
 * plait_kernels.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plait_kernels.h"

PLAIT_INLINE float bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

PLAIT_INLINE float f32_to_f32(float x) { return x; }

/* Softmax of each head's scores in place (first capped: cap * tanh(s / cap), unless cap is 0);
 * writes the log-sum-exp per head. */
PLAIT_INLINE void softmax_rows(float *scores, int64_t hq, int64_t span, float cap,
                               float *lse_out) {
    for (int64_t h = 0; h < hq; ++h) {
        float *s = scores + h * span, top, sum = 0.0f;
        if (cap > 0.0f)
#pragma omp simd
            for (int64_t t = 0; t < span; ++t) s[t] = tanh_f32(s[t] / cap) * cap;
        top = s[0];
        for (int64_t t = 1; t < span; ++t) top = s[t] > top ? s[t] : top;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < span; ++t) {
            s[t] = exp_nonpos(s[t] - top);
            sum += s[t];
        }
        float inv = 1.0f / sum;
        for (int64_t t = 0; t < span; ++t) s[t] *= inv;
        lse_out[h] = top + logf(sum);
    }
}

/* Slots need not be consecutive (the pool's free list fragments), so the hardware prefetcher
 * cannot follow them: each row is requested this many tokens before it is read. */
enum { PREFETCH_AHEAD = 4 };

PLAIT_INLINE void prefetch_row(const void *p, int64_t bytes) {
#if defined(__GNUC__)
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch((const char *)p + off, 0, 3);
#else
    (void)p;
    (void)bytes;
#endif
}

/* Scratch for the scores, kept per thread and grown as needed (large spans would otherwise
 * cost a fresh mapping, and its page faults, per layer per step). */
static float *score_buffer(size_t n) {
    static __thread float *buf = NULL;
    static __thread size_t cap = 0;
    if (n > cap) {
        float *grown = realloc(buf, sizeof(float) * n);
        if (grown == NULL) return NULL;
        buf = grown;
        cap = n;
    }
    return buf;
}

/* ---- fp32 pool, head size a multiple of 16 (up to 256): 16-float vectors -------------------
 * A head's scores come 16 positions at a time: each position's q.k is first a vector of 16
 * partial sums (the head's 16-float chunks multiplied and added in order), and the 16 vectors
 * are then summed lane-wise in one transpose-and-add tree (4 levels of pairwise shuffles), so
 * the horizontal sums cost a few operations per score instead of a reduction each. The value
 * sums keep the head's output in registers across all positions. A score is computed the
 * same way whatever the batch (it depends on its position's place in the request's span). */
enum { LANES = 16, MAX_CHUNKS = 16 };

#if defined(__x86_64__) && defined(__GNUC__)
/* The vector path is compiled for AVX-512 only (vec_one and its helpers) and taken where the
 * CPU has it; vec_one's arguments are pointers and scalars. */
#define VEC_PATH 1
#define VEC_ISA "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"
#define VEC_TARGET __attribute__((target(VEC_ISA), noinline))
#define VEC_INLINE static inline __attribute__((always_inline, target(VEC_ISA)))
#define VEC_AVAILABLE() __builtin_cpu_supports("avx512f")
#else
#define VEC_PATH 0
#define VEC_AVAILABLE() 0
#endif

#if VEC_PATH
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

VEC_INLINE v16f load16(const float *p) {
    v16f r;
    memcpy(&r, p, sizeof r);
    return r;
}

#define STORE16(p, x)                                                                          \
    do {                                                                                       \
        v16f stored_ = (x);                                                                    \
        memcpy((p), &stored_, sizeof stored_);                                                 \
    } while (0)

/* One level of the tree: lane i takes the pair (r, r + w) of x's block (r = i % 2w < w), else
 * of y's, so each output holds half-sums of both inputs. */
#if defined(__clang__)
#define HALF_SUMS(x, y, LO, HI)                                                                \
    (__builtin_shufflevector(x, y, LO) + __builtin_shufflevector(x, y, HI))
#else
#define HALF_SUMS(x, y, LO, HI)                                                                \
    (__builtin_shuffle(x, y, (v16i){LO}) + __builtin_shuffle(x, y, (v16i){HI}))
#endif
#define W8_LO 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define W8_HI 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define W4_LO 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define W4_HI 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define W2_LO 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define W2_HI 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define W1_LO 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define W1_HI 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31

/* Lane i of the result is the sum of the lanes of v[BITREV[i]] (the tree's output order). */
static const int BITREV[LANES] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

VEC_INLINE v16f lane_sums16(const v16f *v) {
    v16f a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i) a[i] = HALF_SUMS(v[2 * i], v[2 * i + 1], W8_LO, W8_HI);
    for (int i = 0; i < 4; ++i) b[i] = HALF_SUMS(a[2 * i], a[2 * i + 1], W4_LO, W4_HI);
    for (int i = 0; i < 2; ++i) c[i] = HALF_SUMS(b[2 * i], b[2 * i + 1], W2_LO, W2_HI);
    return HALF_SUMS(c[0], c[1], W1_LO, W1_HI);
}

VEC_INLINE v16f partial_dot(const v16f *qv, const float *kr, int nc) {
    v16f a = qv[0] * load16(kr);
    for (int c = 1; c < nc; ++c) a += qv[c] * load16(kr + c * LANES);
    return a;
}

/* scale * q.k for one head over the span; `off` is the head's kv head offset in a row. */
VEC_INLINE void head_scores(const float *q, const float *k, const int32_t *slots, int64_t span,
                            int64_t row, int64_t off, int nc, float scale, float *s) {
    v16f qv[MAX_CHUNKS], acc[LANES];
    for (int c = 0; c < nc; ++c) qv[c] = load16(q + c * LANES);
    int64_t t = 0;
    for (; t + LANES <= span; t += LANES) {
        for (int j = 0; j < LANES; ++j) {
            if (t + LANES + j < span)
                prefetch_row(k + (int64_t)slots[t + LANES + j] * row + off, nc * 64);
            acc[BITREV[j]] = partial_dot(qv, k + (int64_t)slots[t + j] * row + off, nc);
        }
        STORE16(s + t, lane_sums16(acc) * scale);
    }
    for (; t < span; ++t) {
        v16f a = partial_dot(qv, k + (int64_t)slots[t] * row + off, nc);
        float sum = 0.0f;
        for (int i = 0; i < LANES; ++i) sum += a[i];
        s[t] = sum * scale;
    }
}

/* out = sum over the span of p[t] * v_t for one head, the output held in registers. */
VEC_INLINE void head_values(const float *p, const float *v, const int32_t *slots, int64_t span,
                            int64_t row, int64_t off, int nc, float *out) {
    v16f acc[MAX_CHUNKS];
    for (int c = 0; c < nc; ++c) acc[c] = (v16f){0};
    for (int64_t t = 0; t < span; ++t) {
        if (t + PREFETCH_AHEAD < span)
            prefetch_row(v + (int64_t)slots[t + PREFETCH_AHEAD] * row + off, nc * 64);
        const float *vr = v + (int64_t)slots[t] * row + off;
        for (int c = 0; c < nc; ++c) acc[c] += p[t] * load16(vr + c * LANES);
    }
    for (int c = 0; c < nc; ++c) STORE16(out + c * LANES, acc[c]);
}

VEC_INLINE void vec_one_nc(const float *q, const float *k, const float *v, const int32_t *slots,
                           int64_t span, int64_t hq, int64_t hkv, int64_t h0, int64_t h1,
                           float scale, float cap, float *scores, float *out, float *lse,
                           int nc) {
    int64_t d = nc * LANES, group = hq / hkv, row = hkv * d;
    for (int64_t h = h0; h < h1; ++h)
        head_scores(q + h * d, k, slots, span, row, h / group * d, nc, scale, scores + h * span);
    softmax_rows(scores + h0 * span, h1 - h0, span, cap, lse + h0);
    for (int64_t h = h0; h < h1; ++h)
        head_values(scores + h * span, v, slots, span, row, h / group * d, nc, out + h * d);
}

/* The vector path, with the chunk count a constant in each branch (registers, unrolling). */
VEC_TARGET static void vec_one(const float *q, const float *k, const float *v,
                               const int32_t *slots, int64_t span, int64_t hq, int64_t hkv,
                               int64_t d, int64_t h0, int64_t h1, float scale, float cap,
                               float *scores, float *out, float *lse) {
    int nc = (int)(d / LANES);
#define VEC_ONE(NC)                                                                            \
    vec_one_nc(q, k, v, slots, span, hq, hkv, h0, h1, scale, cap, scores, out, lse, NC)
    switch (nc) {
    case 4: VEC_ONE(4); break;
    case 8: VEC_ONE(8); break;
    default: VEC_ONE(nc);
    }
#undef VEC_ONE
}

#else
static void vec_one(const float *q, const float *k, const float *v, const int32_t *slots,
                    int64_t span, int64_t hq, int64_t hkv, int64_t d, int64_t h0, int64_t h1,
                    float scale, float cap, float *scores, float *out, float *lse) {
    (void)q, (void)k, (void)v, (void)slots, (void)span, (void)hq, (void)hkv, (void)d;
    (void)h0, (void)h1, (void)scale, (void)cap, (void)scores, (void)out, (void)lse;
}
#endif

/* Query heads [h0, h1) of one request (the kv heads they read are whole): each head's scores,
 * softmax and output are computed the same way whatever range it is run in. */
#define DEFINE_DECODE(NAME, T, LOAD, VEC)                                                       \
    PLAIT_INLINE void NAME##_one(const float *q, const T *k, const T *v, const int32_t *slots, \
                                 int64_t span, int64_t hq, int64_t hkv, int64_t d, int64_t h0, \
                                 int64_t h1, float scale, float cap, float *scores,            \
                                 float *out, float *lse) {                                     \
        int64_t group = hq / hkv, row = hkv * d, first = (h0 / group) * d;                     \
        int64_t bytes = (h1 - h0) / group * d * (int64_t)sizeof(T);                            \
        for (int64_t t = 0; t < span; ++t) {                                                   \
            if (t + PREFETCH_AHEAD < span)                                                     \
                prefetch_row(k + (int64_t)slots[t + PREFETCH_AHEAD] * row + first, bytes);     \
            const T *kr = k + (int64_t)slots[t] * row;                                         \
            for (int64_t h = h0; h < h1; ++h) {                                                \
                const float *qh = q + h * d;                                                   \
                const T *kh = kr + (h / group) * d;                                            \
                float acc = 0.0f;                                                              \
                _Pragma("omp simd reduction(+ : acc)") for (int64_t i = 0; i < d; ++i)         \
                    acc += qh[i] * LOAD(kh[i]);                                                \
                scores[h * span + t] = acc * scale;                                            \
            }                                                                                  \
        }                                                                                      \
        softmax_rows(scores + h0 * span, h1 - h0, span, cap, lse + h0);                        \
        memset(out + h0 * d, 0, sizeof(float) * (size_t)((h1 - h0) * d));                     \
        for (int64_t t = 0; t < span; ++t) {                                                   \
            if (t + PREFETCH_AHEAD < span)                                                     \
                prefetch_row(v + (int64_t)slots[t + PREFETCH_AHEAD] * row + first, bytes);     \
            const T *vr = v + (int64_t)slots[t] * row;                                         \
            for (int64_t h = h0; h < h1; ++h) {                                                \
                float p = scores[h * span + t];                                                \
                const T *vh = vr + (h / group) * d;                                            \
                float *oh = out + h * d;                                                       \
                for (int64_t i = 0; i < d; ++i) oh[i] += p * LOAD(vh[i]);                      \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    PLAIT_CLONES int NAME(const float *q, const T *k, const T *v, const int32_t *table,       \
                          const int64_t *rows, const int64_t *start, const int64_t *seq,       \
                          int64_t table_stride, int64_t num_slots, int64_t batch, int64_t hq,  \
                          int64_t hkv, int64_t d, int64_t kv_lo, int64_t kv_hi, float scale,   \
                          float softcap, float *out, float *lse) {                             \
        int64_t max_span = 1, h0 = kv_lo * (hq / hkv), h1 = kv_hi * (hq / hkv);                \
        if (kv_lo < 0 || kv_hi > hkv || kv_lo >= kv_hi) return -3;                             \
        for (int64_t b = 0; b < batch; ++b)                                                    \
            if (seq[b] - start[b] > max_span) max_span = seq[b] - start[b];                    \
        float *scores = score_buffer((size_t)(hq * max_span));                                 \
        if (scores == NULL) return -1;                                                         \
        int vec = VEC && VEC_PATH && d >= LANES && d <= LANES * MAX_CHUNKS                     \
                  && d % LANES == 0 && VEC_AVAILABLE();                                        \
        for (int64_t b = 0; b < batch; ++b) {                                                  \
            int64_t span = seq[b] - start[b];                                                  \
            float *ob = out + b * hq * d, *lb = lse + b * hq;                                  \
            if (span <= 0) {                                                                   \
                memset(ob + h0 * d, 0, sizeof(float) * (size_t)((h1 - h0) * d));              \
                for (int64_t h = h0; h < h1; ++h) lb[h] = -INFINITY;                           \
                continue;                                                                      \
            }                                                                                  \
            const int32_t *slots = table + rows[b] * table_stride + start[b];                  \
            for (int64_t t = 0; t < span; ++t)                                                 \
                if (slots[t] < 0 || slots[t] >= num_slots) {                                   \
                    return -2;                                                                 \
                }                                                                              \
            if (vec)                                                                           \
                vec_one((const float *)q + b * hq * d, (const float *)k, (const float *)v, slots, \
                        span, hq, hkv, d, h0, h1, scale, softcap, scores, ob, lb);             \
            else                                                                               \
                NAME##_one(q + b * hq * d, k, v, slots, span, hq, hkv, d, h0, h1, scale,       \
                           softcap, scores, ob, lb);                                           \
        }                                                                                      \
        return 0;                                                                              \
    }

DEFINE_DECODE(plait_decode_f32, float, f32_to_f32, 1)
DEFINE_DECODE(plait_decode_bf16, uint16_t, bf16_to_f32, 0)
