/* CPU extend (prefill) attention of one request over the paged KV pool: its `ext` new tokens at
 * positions pre .. pre + ext - 1 attend causally to positions 0 .. their own (or, with a
 * sliding window w, their last w; scores soft-capped where asked), whose KV slots are
 * slots[0 .. pre + ext). q and out are [ext, Hq, D], the pool [S, Hkv, D], fp32; query head h
 * reads kv head h / (Hq / Hkv).
 *
 * Built at first use by plait.kernels._native and called through ctypes. A call first packs
 * each kv head's keys as K^T by blocks ([D, EA_KEYS] each) and its values as [npad, D] (npad:
 * the keys rounded up to a block, zeros past them; parts over kv heads), then computes the rows
 * of each kv head (position-major: row r is position r / G of query head r % G of the head's
 * G) in tiles of EA_ROWS rows, each over its visible keys in blocks of EA_KEYS with an online
 * softmax (extend_attention_vec.h: register blocks, one FMA per query value and key vector).
 * Only the blocks a tile's rows see are computed, so a causal prompt costs about half the n^2
 * of its scores (torch's flash kernel, by blocks of 256 queries x 512 keys, computed about
 * 1.25x the visible ones at 1,000 tokens). Units of a kv head's tiles are claimed by the
 * threads of the C pool (thread_pool.c), costliest first. The blocks start at position 0
 * whatever the call, and a row's output depends on its own scores only, so a token gets the
 * same bits in any chunk, tile or thread split.
 *
 * The vector loops are built for AVX-512 (16 floats a vector) and AVX2 (8); a CPU with
 * neither, or a head size that is not a multiple of their value runs (64 and 16 floats) up to
 * EA_MAX_D, gets -4 and the caller takes torch's kernel. Slot ids outside the pool fail the call (-2) before
 * anything is read. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plait_kernels.h"

enum { EA_ROWS = 4, EA_KEYS = 64, EA_MAX_D = 256, EA_UNIT_TILES = 4 };

/* One row's scores of a block (s, scaled) become its probabilities against the running maximum
 * m (updated), keys outside [first, last] (relative to the block; none visible where last < 0)
 * getting 0; the running sum l is rescaled and added to. Returns the factor the row's output
 * sums take, exp(old m - new m). Inlined into each width's tile loop, vectorized there. */
PLAIT_INLINE float ea_softmax_block(float *s, int64_t first, int64_t last, float *m, float *l) {
    const int lo = first < 0 ? 0 : first < EA_KEYS ? (int)first : EA_KEYS;
    const int hi = last < 0 ? 0 : last + 1 < EA_KEYS ? (int)(last + 1) : EA_KEYS;
    float top = *m, sum = 0.0f;
#pragma omp simd reduction(max : top)
    for (int t = lo; t < hi; ++t) top = s[t] > top ? s[t] : top;
    if (top == -INFINITY) { /* nothing visible yet: the row is untouched */
        memset(s, 0, sizeof(float) * EA_KEYS);
        return 1.0f;
    }
    const float alpha = exp_nonpos(*m - top);
#pragma omp simd reduction(+ : sum)
    for (int t = 0; t < EA_KEYS; ++t) {
        const float p = t >= lo && t < hi ? exp_nonpos(s[t] - top) : 0.0f;
        s[t] = p;
        sum += p;
    }
    *m = top;
    *l = *l * alpha + sum;
    return alpha;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define EA_VEC_PATH 1
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#define EA_W 16
#define EA_SV 4 /* 4 x 4 score vectors in registers */
#define EA_CV 4 /* 4 x 4 output vectors */
#define EA_SFX _avx512
#define EA_VEC __m512
#define EA_ZERO() _mm512_setzero_ps()
#define EA_LOAD(p) _mm512_loadu_ps(p)
#define EA_STORE(p, x) _mm512_storeu_ps(p, x)
#define EA_SET1(x) _mm512_set1_ps(x)
#define EA_MUL(a, b) _mm512_mul_ps(a, b)
#define EA_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#include "extend_attention_vec.h"
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define EA_W 8
#define EA_SV 2 /* 16 registers: 4 x 2 sums, 2 keys, a broadcast */
#define EA_CV 2
#define EA_SFX _avx2
#define EA_VEC __m256
#define EA_ZERO() _mm256_setzero_ps()
#define EA_LOAD(p) _mm256_loadu_ps(p)
#define EA_STORE(p, x) _mm256_storeu_ps(p, x)
#define EA_SET1(x) _mm256_set1_ps(x)
#define EA_MUL(a, b) _mm256_mul_ps(a, b)
#define EA_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#include "extend_attention_vec.h"
#pragma GCC pop_options
#else
#define EA_VEC_PATH 0
#endif

typedef void (*tile_fn)(const float *const *qr, const int64_t *first, const int64_t *last,
                        const float *kt,
                        const float *vp, int64_t d, float scale, float cap, float *o);

/* The tile loop for head size d on this CPU, or NULL (the caller takes torch's kernel): the
 * value sums run over the head in runs of EA_CV vectors (64 floats on AVX-512, 16 on AVX2),
 * so d must be a multiple of one (96, Phi-3's, takes AVX2's loops). */
static tile_fn tile_path(int64_t d) {
#if EA_VEC_PATH
    if (d <= 0 || d > EA_MAX_D) return NULL;
    if (d % (16 * 4) == 0 && __builtin_cpu_supports("avx512f")) return tile_avx512;
    if (d % (8 * 2) == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return tile_avx2;
#else
    (void)d;
#endif
    return NULL;
}

typedef struct {
    const float *q, *k_pool, *v_pool;
    const int32_t *slots;
    int64_t pre, ext, hq, hkv, d, window, npad, unit_tiles, units_per_head;
    float scale, cap;
    float *kt, *vp, *out; /* kt [hkv, npad / EA_KEYS, d, EA_KEYS], vp [hkv, npad, d] */
    tile_fn tile;
} ea_job_t;

/* Part g: kv head g's keys transposed into kt by blocks of EA_KEYS (a block's K^T [d, EA_KEYS]
 * in one piece: rows of a K^T as long as the prompt would be a power-of-two apart, in the same
 * few cache sets) and its values into vp, zeros past the keys. */
static void ea_pack(void *ctx, int g, int parts) {
    (void)parts;
    const ea_job_t *j = ctx;
    const int64_t n = j->pre + j->ext, d = j->d, row = j->hkv * d;
    float *kt = j->kt + g * d * j->npad, *vp = j->vp + g * j->npad * d;
    for (int64_t t = 0; t < n; ++t) {
        const float *kr = j->k_pool + (int64_t)j->slots[t] * row + g * d;
        float *col = kt + t / EA_KEYS * d * EA_KEYS + t % EA_KEYS;
        memcpy(vp + t * d, j->v_pool + (int64_t)j->slots[t] * row + g * d, sizeof(float) * d);
        for (int64_t i = 0; i < d; ++i) col[i * EA_KEYS] = kr[i];
    }
    for (int64_t t = n; t < j->npad; ++t)
        for (int64_t i = 0; i < d; ++i) kt[(t / EA_KEYS * d + i) * EA_KEYS + t % EA_KEYS] = 0;
    memset(vp + n * d, 0, sizeof(float) * (size_t)((j->npad - n) * d));
}

/* Part u: the tiles of one unit (a kv head's run of unit_tiles tiles), the last rows' units
 * first (they see the most keys). */
static void ea_unit(void *ctx, int u, int parts) {
    (void)parts;
    const ea_job_t *j = ctx;
    const int64_t group = j->hq / j->hkv, rows = j->ext * group, d = j->d;
    const int64_t g = u % j->hkv, unit = j->units_per_head - 1 - u / j->hkv;
    float o[EA_ROWS * EA_MAX_D];
    for (int64_t r0 = unit * j->unit_tiles * EA_ROWS, t = 0; t < j->unit_tiles && r0 < rows;
         ++t, r0 += EA_ROWS) {
        const float *qr[EA_ROWS];
        int64_t first[EA_ROWS], last[EA_ROWS], at[EA_ROWS];
        for (int i = 0; i < EA_ROWS; ++i) {
            int64_t r = r0 + i < rows ? r0 + i : rows - 1, pos = r / group;
            at[i] = (pos * j->hq + g * group + r % group) * d;
            qr[i] = j->q + at[i];
            last[i] = j->pre + pos;
            first[i] = j->window > 0 && last[i] >= j->window ? last[i] - j->window + 1 : 0;
        }
        const float *kt = j->kt + g * d * j->npad, *vp = j->vp + g * j->npad * d;
        j->tile(qr, first, last, kt, vp, d, j->scale, j->cap, o);
        for (int i = 0; i < EA_ROWS && r0 + i < rows; ++i)
            memcpy(j->out + at[i], o + i * d, sizeof(float) * d);
    }
}

/* Floats of the packing scratch a call needs: K^T and V of every kv head. */
int64_t plait_extend_scratch(int64_t pre, int64_t ext, int64_t hkv, int64_t d) {
    int64_t npad = (pre + ext + EA_KEYS - 1) / EA_KEYS * EA_KEYS;
    return 2 * hkv * npad * d;
}

/* With window w > 0 a token at position p sees positions p - w + 1 .. p only (0: all up to p);
 * with softcap c > 0 the scaled scores become c * tanh(score / c) (0: none).
 * Returns the threads used (>= 1); -2 a slot outside the pool, -3 bad shapes, -4 no vector
 * path for this CPU and head size. */
PLAIT_CLONES int plait_extend_f32(const float *q, const float *k_pool, const float *v_pool,
                                  const int32_t *slots, int64_t pre, int64_t ext,
                                  int64_t num_slots, int64_t hq, int64_t hkv, int64_t d,
                                  int64_t window, float scale, float softcap, float *scratch,
                                  float *out, int threads, plait_pool_fn pool) {
    if (pre < 0 || ext <= 0 || hkv <= 0 || hq % hkv != 0 || d <= 0 || window < 0) return -3;
    tile_fn tile = tile_path(d);
    if (tile == NULL) return -4;
    for (int64_t t = 0; t < pre + ext; ++t)
        if (slots[t] < 0 || slots[t] >= num_slots) return -2;
    const int64_t npad = (pre + ext + EA_KEYS - 1) / EA_KEYS * EA_KEYS;
    const int64_t tiles = (ext * (hq / hkv) + EA_ROWS - 1) / EA_ROWS;
    /* at least EA_UNIT_TILES tiles a unit, and few enough units for the pool (parts < 2^16) */
    const int64_t most = (hkv * tiles + 59999) / 60000;
    const int64_t unit_tiles = most > EA_UNIT_TILES ? most : EA_UNIT_TILES;
    ea_job_t job = {q, k_pool, v_pool, slots, pre, ext, hq, hkv, d, window, npad, unit_tiles,
                    (tiles + unit_tiles - 1) / unit_tiles, scale, softcap,
                    scratch, scratch + hkv * d * npad, out, tile};
    const int64_t units = hkv * job.units_per_head;
    if (pool == NULL || threads <= 1) {
        for (int g = 0; g < hkv; ++g) ea_pack(&job, g, (int)hkv);
        for (int64_t u = 0; u < units; ++u) ea_unit(&job, (int)u, (int)units);
        return 1;
    }
    pool(ea_pack, &job, (int)hkv, threads);
    pool(ea_unit, &job, (int)units, threads);
    return threads;
}
