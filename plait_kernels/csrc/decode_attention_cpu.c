/* CPU decode attention over the paged KV pool: one query token per request.
 *
 * Built at first use by plait.kernels._native and called through ctypes. Request b attends to
 * its positions [start[b], seq[b]), whose KV slots are table[rows[b] * table_stride + pos]; the
 * pool is [S, Hkv, D] (fp32 or bf16), query head h reads kv head h / (Hq / Hkv). Per request the
 * slots' K rows are read once, in position order, for all query heads (scores to a scratch
 * buffer), then the softmax, then the V rows once. Nothing is gathered or copied, so a decode
 * step reads each cached K/V byte once: the torch path gathers the same rows into temporaries
 * first. Slot ids outside the pool fail the call (-2) rather than read past it. With GCC 12+
 * on x86-64 the entry points are cloned for AVX-512, AVX2 and the baseline ISA (the helpers are
 * inlined into each clone) and the loader picks one at run time. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* exp(x) for x <= 0 in float: 2^n * e^r with |r| <= ln2/2, degree-7 Taylor (within 1e-7
 * relative, an ulp of expf); branch-free so loops over it vectorize. x <= -87 (scores are never
 * masked here) gives 1.6e-38 rather than 0. */
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

PLAIT_INLINE float bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

PLAIT_INLINE float f32_to_f32(float x) { return x; }

/* Softmax of each head's scores in place; writes the log-sum-exp per head. */
PLAIT_INLINE void softmax_rows(float *scores, int64_t hq, int64_t span, float *lse_out) {
    for (int64_t h = 0; h < hq; ++h) {
        float *s = scores + h * span, top = s[0], sum = 0.0f;
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

#define DEFINE_DECODE(NAME, T, LOAD)                                                          \
    PLAIT_INLINE void NAME##_one(const float *q, const T *k, const T *v, const int32_t *slots, \
                                 int64_t span, int64_t hq, int64_t hkv, int64_t d, float scale, \
                                 float *scores, float *out, float *lse) {                     \
        int64_t group = hq / hkv, row = hkv * d;                                               \
        for (int64_t t = 0; t < span; ++t) {                                                   \
            if (t + PREFETCH_AHEAD < span)                                                     \
                prefetch_row(k + (int64_t)slots[t + PREFETCH_AHEAD] * row, row * sizeof(T));   \
            const T *kr = k + (int64_t)slots[t] * row;                                         \
            for (int64_t h = 0; h < hq; ++h) {                                                 \
                const float *qh = q + h * d;                                                   \
                const T *kh = kr + (h / group) * d;                                            \
                float acc = 0.0f;                                                              \
                _Pragma("omp simd reduction(+ : acc)") for (int64_t i = 0; i < d; ++i)         \
                    acc += qh[i] * LOAD(kh[i]);                                                \
                scores[h * span + t] = acc * scale;                                            \
            }                                                                                  \
        }                                                                                      \
        softmax_rows(scores, hq, span, lse);                                                   \
        memset(out, 0, sizeof(float) * (size_t)(hq * d));                                      \
        for (int64_t t = 0; t < span; ++t) {                                                   \
            if (t + PREFETCH_AHEAD < span)                                                     \
                prefetch_row(v + (int64_t)slots[t + PREFETCH_AHEAD] * row, row * sizeof(T));   \
            const T *vr = v + (int64_t)slots[t] * row;                                         \
            for (int64_t h = 0; h < hq; ++h) {                                                 \
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
                          int64_t hkv, int64_t d, float scale, float *out, float *lse) {       \
        int64_t max_span = 1;                                                                  \
        for (int64_t b = 0; b < batch; ++b)                                                    \
            if (seq[b] - start[b] > max_span) max_span = seq[b] - start[b];                    \
        float *scores = score_buffer((size_t)(hq * max_span));                                 \
        if (scores == NULL) return -1;                                                         \
        for (int64_t b = 0; b < batch; ++b) {                                                  \
            int64_t span = seq[b] - start[b];                                                  \
            float *ob = out + b * hq * d, *lb = lse + b * hq;                                  \
            if (span <= 0) {                                                                   \
                memset(ob, 0, sizeof(float) * (size_t)(hq * d));                               \
                for (int64_t h = 0; h < hq; ++h) lb[h] = -INFINITY;                            \
                continue;                                                                      \
            }                                                                                  \
            const int32_t *slots = table + rows[b] * table_stride + start[b];                  \
            for (int64_t t = 0; t < span; ++t)                                                 \
                if (slots[t] < 0 || slots[t] >= num_slots) {                                   \
                    return -2;                                                                 \
                }                                                                              \
            NAME##_one(q + b * hq * d, k, v, slots, span, hq, hkv, d, scale, scores, ob, lb);  \
        }                                                                                      \
        return 0;                                                                              \
    }

DEFINE_DECODE(plait_decode_f32, float, f32_to_f32)
DEFINE_DECODE(plait_decode_bf16, uint16_t, bf16_to_f32)
