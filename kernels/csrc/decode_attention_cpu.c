/* CPU decode attention over the paged KV pool: one query token per request.
 *
 * Built at first use by plait.kernels._native and called through ctypes. Request b attends to
 * its positions [start[b], seq[b]), whose KV slots are table[rows[b] * table_stride + pos]; the
 * pool is [S, Hkv, D] (fp32 or bf16), query head h reads kv head h / (Hq / Hkv). Per request the
 * slots' K rows are read once, in position order, for all query heads (scores to a scratch
 * buffer), then the softmax, then the V rows once. Nothing is gathered or copied, so a decode
 * step reads each cached K/V byte once: the torch path gathers the same rows into temporaries
 * first. Slot ids outside the pool fail the call (-2) rather than read past it. On x86-64 with GCC the entry points are cloned for AVX-512, AVX2 and the baseline ISA
 * and the loader picks one at run time. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PLAIT_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PLAIT_CLONES
#endif

/* exp(x) for x <= 0 in float: 2^n * e^r with |r| <= ln2/2, degree-7 Taylor (relative error
 * about 1e-8, below float rounding); branch-free so loops over it vectorize. */
static inline float exp_nonpos(float x) {
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

static inline float bf16_to_f32(uint16_t x) {
    uint32_t bits = (uint32_t)x << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float f32_to_f32(float x) { return x; }

/* Softmax of each head's scores in place; returns nothing, writes the log-sum-exp per head. */
static inline void softmax_rows(float *scores, int64_t hq, int64_t span, float *lse_out) {
    for (int64_t h = 0; h < hq; ++h) {
        float *s = scores + h * span, top = s[0], sum = 0.0f;
        for (int64_t t = 1; t < span; ++t) top = s[t] > top ? s[t] : top;
        for (int64_t t = 0; t < span; ++t) {
            s[t] = exp_nonpos(s[t] - top);
            sum += s[t];
        }
        float inv = 1.0f / sum;
        for (int64_t t = 0; t < span; ++t) s[t] *= inv;
        lse_out[h] = top + logf(sum);
    }
}

#define DEFINE_DECODE(NAME, T, LOAD)                                                          \
    static void NAME##_one(const float *q, const T *k, const T *v, const int32_t *slots,       \
                           int64_t span, int64_t hq, int64_t hkv, int64_t d, float scale,     \
                           float *scores, float *out, float *lse) {                           \
        int64_t group = hq / hkv, row = hkv * d;                                               \
        for (int64_t t = 0; t < span; ++t) {                                                   \
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
                          int64_t hkv,                                                         \
                          int64_t d, float scale, float *out, float *lse) {                    \
        int64_t max_span = 1;                                                                  \
        for (int64_t b = 0; b < batch; ++b)                                                    \
            if (seq[b] - start[b] > max_span) max_span = seq[b] - start[b];                    \
        float *scores = malloc(sizeof(float) * (size_t)(hq * max_span));                       \
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
                    free(scores);                                                              \
                    return -2;                                                                 \
                }                                                                              \
            NAME##_one(q + b * hq * d, k, v, slots, span, hq, hkv, d, scale, scores, ob, lb);  \
        }                                                                                      \
        free(scores);                                                                          \
        return 0;                                                                              \
    }

DEFINE_DECODE(plait_decode_f32, float, f32_to_f32)
DEFINE_DECODE(plait_decode_bf16, uint16_t, bf16_to_f32)
