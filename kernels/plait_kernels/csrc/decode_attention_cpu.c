/* CPU decode attention over the paged KV pool: one query token per request.
 *
 * Built at first use by plait.kernels._native and called through ctypes. Request b attends to
 * its positions [start[b], seq[b]), whose KV slots are table[rows[b] * table_stride + pos]; the
 * pool is [S, Hkv, D] (fp32 or bf16), query head h reads kv head h / (Hq / Hkv). Per request
 * the scores of each query head go to a scratch buffer, then the soft cap where there is one
 * (Gemma 2), the softmax, then the value sums.
 * On an x86-64 CPU with AVX-512, an fp32 pool with D in 16, 32, ..., 256 takes the vector path
 * (16 scores per transpose-and-add tree, outputs in registers: 2.3x the scalar loops at batch
 * 16 x 1,040 positions), with AVX2 D in 8, 16, ..., 256 the same at 8 lanes
 * (decode_attention_vec.h); elsewhere the scalar loops, which read each K row once for all
 * query heads. Nothing is gathered or copied: the torch path
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

/* ---- fp32 pool, head size a multiple of the vector width (up to 256) ----------------------
 * decode_attention_vec.h, compiled for AVX-512 (16 floats a vector) and for AVX2 (8: GCC
 * splits 16-float shuffles into single elements below AVX-512, which made a 16-lane path 2.7x
 * slower than the scalar loops there); the best the CPU has is taken (vec_path). */
#if defined(__x86_64__) && defined(__GNUC__)
#define VEC_PATH 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
#define VA_W 16
#define VA_SFX _avx512
#include "decode_attention_vec.h"
#undef VA_W
#undef VA_SFX
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define VA_W 8
#define VA_SFX _avx2
#include "decode_attention_vec.h"
#undef VA_W
#undef VA_SFX
#pragma GCC pop_options
#else
#define VEC_PATH 0
#endif

typedef void (*vec_fn)(const float *q, const float *k, const float *v, const int32_t *slots,
                       int64_t span, int64_t hq, int64_t hkv, int64_t d, int64_t h0, int64_t h1,
                       float scale, float cap, float *scores, float *out, float *lse);

/* The vector path for head size d on this CPU, or NULL (the scalar loops). */
static vec_fn vec_path(int64_t d) {
#if VEC_PATH
    if (d < 8 || d > 256) return NULL;
    if (d % 16 == 0 && __builtin_cpu_supports("avx512f")) return vec_one_avx512;
    if (d % 8 == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return vec_one_avx2;
#else
    (void)d;
#endif
    return NULL;
}

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
        vec_fn vec = VEC ? vec_path(d) : NULL;                                                 \
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
                vec((const float *)q + b * hq * d, (const float *)k, (const float *)v, slots, \
                        span, hq, hkv, d, h0, h1, scale, softcap, scores, ob, lb);             \
            else                                                                               \
                NAME##_one(q + b * hq * d, k, v, slots, span, hq, hkv, d, h0, h1, scale,       \
                           softcap, scores, ob, lb);                                           \
        }                                                                                      \
        return 0;                                                                              \
    }

DEFINE_DECODE(plait_decode_f32, float, f32_to_f32, 1)
DEFINE_DECODE(plait_decode_bf16, uint16_t, bf16_to_f32, 0)
