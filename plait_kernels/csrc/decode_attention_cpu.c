/* CPU decode attention over the paged KV pool: one query token per request.
 *
 * Built at first use by plait.kernels._native and called through ctypes. Request b attends to
 * its positions [start[b], seq[b]), whose KV slots are table[rows[b] * table_stride + pos]; the
 * pool is [S, Hkv, D] (fp32 or bf16), query head h reads kv head h / (Hq / Hkv). Per request the
 * slots' K rows are read once, in position order, for all query heads (scores to a scratch
 * buffer), then the softmax, then the V rows once. Nothing is gathered or copied, so a decode
 * step reads each cached K/V byte once: the torch path gathers the same rows into temporaries
 * first. Slot ids outside the pool fail the call (-2) rather than read past it. A call computes
 * the query heads of kv heads [kv_lo, kv_hi) only (the decode step, decode_step_cpu.c, splits a
 * request's heads over threads) and leaves the other heads' outputs as they are. The entry
 * points are cloned per ISA (PLAIT_CLONES, plait_kernels.h). */
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

/* Query heads [h0, h1) of one request (the kv heads they read are whole): each head's scores,
 * softmax and output are computed the same way whatever range it is run in. */
#define DEFINE_DECODE(NAME, T, LOAD)                                                          \
    PLAIT_INLINE void NAME##_one(const float *q, const T *k, const T *v, const int32_t *slots, \
                                 int64_t span, int64_t hq, int64_t hkv, int64_t d, int64_t h0, \
                                 int64_t h1, float scale, float *scores, float *out,           \
                                 float *lse) {                                                 \
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
        softmax_rows(scores + h0 * span, h1 - h0, span, lse + h0);                             \
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
                          float *out, float *lse) {                                            \
        int64_t max_span = 1, h0 = kv_lo * (hq / hkv), h1 = kv_hi * (hq / hkv);                \
        if (kv_lo < 0 || kv_hi > hkv || kv_lo >= kv_hi) return -3;                             \
        for (int64_t b = 0; b < batch; ++b)                                                    \
            if (seq[b] - start[b] > max_span) max_span = seq[b] - start[b];                    \
        float *scores = score_buffer((size_t)(hq * max_span));                                 \
        if (scores == NULL) return -1;                                                         \
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
            NAME##_one(q + b * hq * d, k, v, slots, span, hq, hkv, d, h0, h1, scale, scores,   \
                       ob, lb);                                                                \
        }                                                                                      \
        return 0;                                                                              \
    }

DEFINE_DECODE(plait_decode_f32, float, f32_to_f32)
DEFINE_DECODE(plait_decode_bf16, uint16_t, bf16_to_f32)
