/* One decode step of a Llama-family decoder on the CPU, every layer in one call: for a batch
 * of tokens that each attend as a decode query (position p of its request sees [0, p]),
 *     per layer: x = rmsnorm(r) -> qkv = x W_qkv^T (+ b) -> RoPE on q and k (rotate-half, the
 *     model's cos/sin table) -> k, v stored into the pool slots -> paged decode attention ->
 *     r += attn W_o^T -> x = rmsnorm(r) -> gate_up -> silu(gate) * up -> r += act W_down^T
 * and, for the rows the caller takes logits of, x = rmsnorm(r) with the final norm (the LM
 * head stays with the caller).
 *
 * Built at first use by plait.kernels._native; plait.kernels._step_native describes the model
 * once (step_model_t: weights, norms, the pool, the cos/sin table, and the addresses of the
 * other kernels) and calls plait_decode_step once per step. The matmuls are plait_qmm_f32
 * (quant_matmul_cpu.c) and the attention plait_decode_f32 (decode_attention_cpu.c), called
 * through their addresses; the small ops live here. Threads: the matmuls split their row
 * blocks over the C pool (thread_pool.c); attention splits (token, kv head) units by their
 * span; RMSNorm, RoPE + store and silu * mul split tokens when there are enough. Every value of
 * a token is computed the same way whatever the batch and the thread count (a greedy token
 * does not depend on what else runs). Indices are checked before anything is read or
 * written: positions against the table, slots against the pool, rows and lengths against
 * req_to_token, and every KV slot a query will read. Under tensor parallelism each rank holds
 * some heads and intermediate columns, and `reduce` (the caller's all-reduce) sums the
 * attention and MLP outputs over the ranks before they join the residual. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "plait_kernels.h"

typedef struct {
    const plait_weight_t *qkv, *o, *gate_up, *down;
    const float *qkv_bias, *o_bias, *gate_up_bias, *down_bias; /* NULL: none */
    const float *input_norm, *post_norm;                        /* [hidden] */
    float *k_pool, *v_pool;                                     /* [num_slots, kv_heads, head_dim] */
} step_layer_t;

/* Tensor parallelism: sums the n floats at buf over the ranks, in place (the caller's
 * torch.distributed all-reduce); returns 0 or a negative code. */
typedef int (*plait_reduce_fn)(void *ctx, float *buf, int64_t n);

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, inter;
    int64_t num_slots, max_pos, window, isa; /* window 0: attend to every position */
    float eps, scale;
    const float *cos_sin;    /* [max_pos, head_dim]: cos then sin of each frequency */
    const float *final_norm; /* [hidden] */
    const step_layer_t *layers;
    plait_qmm_fn qmm;
    plait_decode_f32_fn attend;
    plait_pool_fn pool; /* NULL: this thread only */
    plait_reduce_fn reduce; /* NULL: one rank; else called on each row-parallel output */
    void *reduce_ctx;
} step_model_t;

typedef struct {
    int64_t tokens, table_rows, table_width, table_stride, num_logits;
    const int64_t *positions, *slots, *rows, *seq; /* [tokens] */
    const int64_t *logits;                         /* [num_logits]: tokens whose output is kept */
    const int32_t *table;                          /* req_to_token */
    const float *embed;                            /* [tokens, hidden]: the input */
    int64_t *start, *work;                         /* [tokens], [tokens + 1] */
    float *resid;                                  /* [tokens, hidden]: the residual stream */
    float *x, *qkv, *q, *attn, *lse, *y, *gu, *act; /* scratch; x[:num_logits]: the output */
} step_batch_t;

enum {
    BAD_POSITION = -10,
    BAD_SLOT = -11,
    BAD_ROW = -12,
    BAD_LENGTH = -13,
    BAD_TABLE_SLOT = -14,
    BAD_LOGIT = -15,
};

/* Elements a small op must touch before its tokens are split over threads (a hand-off to the
 * pool's spinning workers costs about a microsecond). */
#define MIN_SPLIT_ELEMS 16384
/* K/V elements an attention part should read (some microseconds of work). */
#define MIN_ATTN_WORK 8192
#define PARTS_PER_THREAD 4

/* Every index the step reads is in range; fills start (the first attended position) and work
 * (cumulative attention cost per token). */
static int check_batch(const step_model_t *m, const step_batch_t *b) {
    b->work[0] = 0;
    for (int64_t i = 0; i < b->num_logits; ++i)
        if (b->logits[i] < 0 || b->logits[i] >= b->tokens) return BAD_LOGIT;
    for (int64_t t = 0; t < b->tokens; ++t) {
        int64_t seq = b->seq[t], row = b->rows[t];
        if (b->positions[t] < 0 || b->positions[t] >= m->max_pos) return BAD_POSITION;
        if (b->slots[t] < 0 || b->slots[t] >= m->num_slots) return BAD_SLOT;
        if (row < 0 || row >= b->table_rows) return BAD_ROW;
        if (seq < 0 || seq > b->table_width) return BAD_LENGTH;
        int64_t start = m->window > 0 && seq > m->window ? seq - m->window : 0;
        const int32_t *slots = b->table + row * b->table_stride;
        for (int64_t p = start; p < seq; ++p)
            if (slots[p] < 0 || slots[p] >= m->num_slots) return BAD_TABLE_SLOT;
        b->start[t] = start;
        b->work[t + 1] = b->work[t] + (seq - start) + 1;
    }
    return 0;
}

/* ---- small ops, one token at a time --------------------------------------------------------- */

/* out = w * (r * rsqrt(mean(r^2) + eps)), the HF Llama order for fp32 (out may be r). */
PLAIT_INLINE void rmsnorm_row(const float *r, const float *restrict w, int64_t n, float eps,
                              float *out) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < n; ++i) ss += r[i] * r[i];
    float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (r[i] * inv);
}

/* out = a + b (out may be a). */
PLAIT_INLINE void add_row(const float *a, const float *restrict b, int64_t n, float *out) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

/* Rotate-half RoPE of one head: out[:h] = x1 cos - x2 sin, out[h:] = x2 cos + x1 sin. */
PLAIT_INLINE void rope_head(const float *restrict x, const float *restrict cs, int64_t d,
                            float *restrict out) {
    int64_t half = d / 2;
    const float *cosv = cs, *sinv = cs + half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
        float x1 = x[i], x2 = x[i + half];
        out[i] = x1 * cosv[i] - x2 * sinv[i];
        out[i + half] = x2 * cosv[i] + x1 * sinv[i];
    }
}

/* silu(g) * u with silu(g) = g * sigmoid(g), sigmoid from exp(-|g|) (no overflow). */
PLAIT_INLINE void silu_mul(const float *restrict g, const float *restrict u, int64_t n,
                           float *restrict out) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
        float e = exp_nonpos(-fabsf(g[i])), den = 1.0f + e;
        float sig = g[i] >= 0.0f ? 1.0f / den : e / den;
        out[i] = g[i] * sig * u[i];
    }
}

/* ---- phases: a range of tokens (or attention units) per part -------------------------------- */

enum { ADD_NORM, ROPE_STORE, SILU_MUL, ATTEND, FINAL_NORM };

typedef struct {
    const step_model_t *m;
    const step_batch_t *b;
    const step_layer_t *l;
    int phase;
    const float *add, *norm; /* ADD_NORM: r += add (unless NULL), x = rmsnorm(r) * norm */
    int status;              /* ATTEND: the first error a part met */
} phase_t;

static void rope_store(const step_model_t *m, const step_batch_t *b, const step_layer_t *l,
                       int64_t t) {
    int64_t d = m->head_dim, hq = m->heads, hkv = m->kv_heads, qkv = (hq + 2 * hkv) * d;
    const float *src = b->qkv + t * qkv, *cs = m->cos_sin + b->positions[t] * d;
    float *kdst = l->k_pool + b->slots[t] * hkv * d, *vdst = l->v_pool + b->slots[t] * hkv * d;
    for (int64_t h = 0; h < hq; ++h) rope_head(src + h * d, cs, d, b->q + t * hq * d + h * d);
    for (int64_t h = 0; h < hkv; ++h) rope_head(src + (hq + h) * d, cs, d, kdst + h * d);
    memcpy(vdst, src + (hq + hkv) * d, sizeof(float) * (size_t)(hkv * d));
}

/* The first attention unit (token t, kv head g; unit t * hkv + g, costing work[t + 1] -
 * work[t] per head) whose cost starts at or after `target`. */
static int64_t first_unit(const step_batch_t *b, int64_t hkv, int64_t target) {
    int64_t lo = 0, hi = b->tokens; /* the first token whose heads end after target */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (b->work[mid + 1] * hkv <= target) lo = mid + 1;
        else hi = mid;
    }
    if (lo == b->tokens) return lo * hkv;
    int64_t cost = b->work[lo + 1] - b->work[lo], base = b->work[lo] * hkv;
    int64_t g = target <= base ? 0 : (target - base + cost - 1) / cost;
    return lo * hkv + (g < hkv ? g : hkv);
}

static void attend_units(phase_t *ph, int64_t u0, int64_t u1) {
    const step_model_t *m = ph->m;
    const step_batch_t *b = ph->b;
    int64_t hkv = m->kv_heads, hq = m->heads, d = m->head_dim;
    while (u0 < u1) {
        int64_t t = u0 / hkv, g0 = u0 % hkv, g1 = u1 - t * hkv < hkv ? u1 - t * hkv : hkv;
        int status = m->attend(b->q + t * hq * d, ph->l->k_pool, ph->l->v_pool, b->table,
                               b->rows + t, b->start + t, b->seq + t, b->table_stride,
                               m->num_slots, 1, hq, hkv, d, g0, g1, m->scale, 0.0f,
                               b->attn + t * hq * d, b->lse + t * hq);
        if (status != 0) __atomic_store_n(&ph->status, status, __ATOMIC_SEQ_CST);
        u0 = t * hkv + g1;
    }
}

PLAIT_CLONES void plait_step_part(void *ctx, int part, int parts) {
    phase_t *ph = ctx;
    const step_model_t *m = ph->m;
    const step_batch_t *b = ph->b;
    if (ph->phase == ATTEND) {
        int64_t total = b->work[b->tokens] * m->kv_heads;
        attend_units(ph, first_unit(b, m->kv_heads, total * part / parts),
                     first_unit(b, m->kv_heads, total * (part + 1) / parts));
        return;
    }
    int64_t rows = ph->phase == FINAL_NORM ? b->num_logits : b->tokens;
    int64_t t0 = rows * part / parts, t1 = rows * (part + 1) / parts;
    int64_t hd = m->hidden, in = m->inter;
    for (int64_t t = t0; t < t1; ++t) {
        float *r = b->resid + t * hd, *x = b->x + t * hd;
        if (ph->phase == ADD_NORM) {
            if (ph->add != NULL) add_row(r, ph->add + t * hd, hd, r);
            rmsnorm_row(r, ph->norm, hd, m->eps, x);
        } else if (ph->phase == FINAL_NORM) { /* row t of the output: token logits[t] */
            int64_t src = b->logits[t] * hd;
            add_row(b->resid + src, ph->add + src, hd, x);
            rmsnorm_row(x, ph->norm, hd, m->eps, x);
        } else if (ph->phase == ROPE_STORE)
            rope_store(m, b, ph->l, t);
        else
            silu_mul(b->gu + t * 2 * in, b->gu + t * 2 * in + in, in, b->act + t * in);
    }
}

/* Run a phase over `units` (tokens, or attention cost) in up to threads * PARTS_PER_THREAD
 * parts when there is enough work to share, else on this thread. */
static int run_phase(phase_t *ph, int threads, int64_t units, int64_t per_part) {
    int64_t parts = units / per_part, most = (int64_t)threads * PARTS_PER_THREAD;
    parts = parts < most ? parts : most;
    int64_t most_units = ph->phase == ATTEND        ? ph->b->tokens * ph->m->kv_heads
                         : ph->phase == FINAL_NORM ? ph->b->num_logits
                                                   : ph->b->tokens;
    parts = parts < most_units ? parts : most_units;
    if (ph->m->pool != NULL && threads > 1 && parts > 1)
        ph->m->pool(plait_step_part, ph, (int)parts, threads);
    else
        plait_step_part(ph, 0, 1);
    return ph->status;
}

static int small_op(phase_t *ph, int threads, int phase, int64_t elems_per_token) {
    ph->phase = phase;
    int64_t rows = phase == FINAL_NORM ? ph->b->num_logits : ph->b->tokens;
    return run_phase(ph, threads, rows * elems_per_token, MIN_SPLIT_ELEMS);
}

static int matmul(const step_model_t *m, int threads, const float *x, int64_t t,
                  const plait_weight_t *w, const float *bias, float *out) {
    int status = m->qmm((int)m->isa, threads, m->pool, x, w->k, t, w, bias, out);
    return status < 0 ? status : 0;
}

static int layer(const step_model_t *m, const step_batch_t *b, const step_layer_t *l,
                 const float *add, int threads) {
    int64_t t = b->tokens, hd = m->hidden, d = m->head_dim, hkv = m->kv_heads;
    phase_t ph = {m, b, l, ADD_NORM, add, l->input_norm, 0};
    int s = small_op(&ph, threads, ADD_NORM, hd);
    if (!s) s = matmul(m, threads, b->x, t, l->qkv, l->qkv_bias, b->qkv);
    if (!s) s = small_op(&ph, threads, ROPE_STORE, (m->heads + 2 * hkv) * d);
    if (!s) {
        ph.phase = ATTEND;
        s = run_phase(&ph, threads, b->work[t] * hkv * d, MIN_ATTN_WORK);
    }
    if (!s) s = matmul(m, threads, b->attn, t, l->o, l->o_bias, b->y);
    if (!s && m->reduce != NULL) s = m->reduce(m->reduce_ctx, b->y, t * hd);
    ph.add = b->y;
    ph.norm = l->post_norm;
    if (!s) s = small_op(&ph, threads, ADD_NORM, hd);
    if (!s) s = matmul(m, threads, b->x, t, l->gate_up, l->gate_up_bias, b->gu);
    if (!s) s = small_op(&ph, threads, SILU_MUL, 3 * m->inter);
    if (!s) s = matmul(m, threads, b->act, t, l->down, l->down_bias, b->y);
    if (!s && m->reduce != NULL) s = m->reduce(m->reduce_ctx, b->y, t * hd);
    return s;
}

/* The whole step: from the tokens' embeddings b->embed to row i of b->x, the final hidden
 * state of token logits[i]. Returns 0, or a negative code: BAD_* (the
 * batch was rejected before anything was written), -1 out of memory, -2 a KV slot outside the
 * pool, -3 a shape the matmul does not take. */
int plait_decode_step(const step_model_t *m, const step_batch_t *b, int threads) {
    int s = check_batch(m, b);
    if (!s) memcpy(b->resid, b->embed, sizeof(float) * (size_t)(b->tokens * m->hidden));
    for (int64_t i = 0; !s && i < m->num_layers; ++i)
        s = layer(m, b, &m->layers[i], i == 0 ? NULL : b->y, threads);
    if (s) return s;
    phase_t ph = {m, b, NULL, FINAL_NORM, b->y, m->final_norm, 0};
    return small_op(&ph, threads, FINAL_NORM, m->hidden);
}
