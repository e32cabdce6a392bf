/* One decode step of a dense decoder on the CPU, every layer in one call: for a batch of
 * tokens that each attend as a decode query (position p of its request sees [0, p], or the
 * last `window` of them on a sliding layer),
 *     per layer: x = in_norm(r) -> qkv = x W_qkv^T (+ b) -> q/k norms (per head, or over all
 *     of q and of k) -> RoPE on q and k (rotate-half, the layer's cos/sin table) -> k, v
 *     stored into the pool slots -> paged decode attention (scaled, soft-capped) ->
 *     a = attn W_o^T -> r += s * attn_out_norm(a) -> x = mlp_norm(r) -> gate_up ->
 *     act(gate) * up (SiLU or tanh GELU) -> m = act W_down^T -> r += s * mlp_out_norm(m)
 * where each norm is there or not as the family puts it (Llama: in_norm and mlp_norm; Gemma's
 * sandwich: all four; OLMo 2: only the two on the branch outputs, the residual going straight
 * into attention and the MLP) and s is the residual branches' scale (Granite). For the rows
 * the caller takes logits of, x = rmsnorm(r) with the final norm (the LM head stays with the
 * caller).
 *
 * Built at first use by plait.kernels._native; plait.kernels._step_native describes the model
 * once (step_model_t: weights, norms, the pool, the cos/sin tables, and the addresses of the
 * other kernels) and calls plait_decode_step once per step. The matmuls are plait_qmm_f32
 * (quant_matmul_cpu.c) and the attention plait_decode_f32 (decode_attention_cpu.c), called
 * through their addresses; the small ops live here. Threads: the matmuls split their row
 * blocks over the C pool (thread_pool.c); attention splits (token, kv head) units by their
 * span; the norms, RoPE + store and the activation split tokens when there are enough. Every
 * value of a token is computed the same way whatever the batch and the thread count (a greedy
 * token does not depend on what else runs). Indices are checked before anything is read or
 * written: positions against the tables, slots against the pool, rows and lengths against
 * req_to_token, and every KV slot a query will read. Under tensor parallelism each rank holds
 * some heads and intermediate columns, and `reduce` (the caller's all-reduce) sums the
 * attention and MLP outputs over the ranks before they are normed and join the residual. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "plait_kernels.h"

typedef struct {
    const plait_weight_t *qkv, *o, *gate_up, *down;
    const float *qkv_bias, *o_bias, *gate_up_bias, *down_bias; /* NULL: none */
    /* [hidden] each; NULL: no such norm (in_norm, mlp_norm: the branch reads r itself) */
    const float *in_norm, *attn_out_norm, *mlp_norm, *mlp_out_norm;
    const float *q_norm, *k_norm; /* NULL: none; [head_dim] (per head) or [q] / [kv] (whole) */
    const float *cos_sin;         /* [max_pos, head_dim]: cos then sin of each frequency */
    float *k_pool, *v_pool;       /* [num_slots, kv_heads, head_dim] */
    int64_t window;               /* 0: attend to every position */
} step_layer_t;

/* Tensor parallelism: sums the n floats at buf over the ranks, in place (the caller's
 * torch.distributed all-reduce); returns 0 or a negative code. */
typedef int (*plait_reduce_fn)(void *ctx, float *buf, int64_t n);

enum { ACT_SILU, ACT_GELU_TANH };

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, inter;
    int64_t num_slots, max_pos, isa;
    int64_t act, qk_whole; /* ACT_*; q/k norms over all heads (1) or each head (0) */
    float eps, scale, softcap, resid_scale; /* softcap 0: none */
    const float *final_norm;                /* [hidden] */
    const step_layer_t *layers;
    plait_qmm_fn qmm;
    plait_decode_f32_fn attend;
    plait_pool_fn pool;     /* NULL: this thread only */
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

/* The first position a query of `seq` positions attends to under `window` (0: all). */
PLAIT_INLINE int64_t first_position(int64_t seq, int64_t window) {
    return window > 0 && seq > window ? seq - window : 0;
}

/* The widest window of the layers (0 when one attends to every position): the positions a
 * query reads in some layer. */
static int64_t widest_window(const step_model_t *m) {
    int64_t widest = 1;
    for (int64_t i = 0; i < m->num_layers; ++i) {
        int64_t w = m->layers[i].window;
        if (w <= 0) return 0;
        widest = w > widest ? w : widest;
    }
    return widest;
}

/* Every index the step reads is in range, whatever layer reads it. */
static int check_batch(const step_model_t *m, const step_batch_t *b) {
    int64_t window = widest_window(m);
    for (int64_t i = 0; i < b->num_logits; ++i)
        if (b->logits[i] < 0 || b->logits[i] >= b->tokens) return BAD_LOGIT;
    for (int64_t t = 0; t < b->tokens; ++t) {
        int64_t seq = b->seq[t], row = b->rows[t];
        if (b->positions[t] < 0 || b->positions[t] >= m->max_pos) return BAD_POSITION;
        if (b->slots[t] < 0 || b->slots[t] >= m->num_slots) return BAD_SLOT;
        if (row < 0 || row >= b->table_rows) return BAD_ROW;
        if (seq < 0 || seq > b->table_width) return BAD_LENGTH;
        const int32_t *slots = b->table + row * b->table_stride;
        for (int64_t p = first_position(seq, window); p < seq; ++p)
            if (slots[p] < 0 || slots[p] >= m->num_slots) return BAD_TABLE_SLOT;
    }
    return 0;
}

/* A layer's spans: start (the first attended position) and work (cumulative attention cost
 * per token) under its window. */
static void set_spans(const step_batch_t *b, int64_t window) {
    b->work[0] = 0;
    for (int64_t t = 0; t < b->tokens; ++t) {
        b->start[t] = first_position(b->seq[t], window);
        b->work[t + 1] = b->work[t] + (b->seq[t] - b->start[t]) + 1;
    }
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

/* out = a + s * b (out may be a or b), the branch scaled before it is added, as the layers do. */
PLAIT_INLINE void add_scaled_row(const float *a, const float *b, float s, int64_t n,
                                 float *out) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + s * b[i];
}

/* Each of `groups` rows of n floats at x normed in place (w: NULL, no norm). */
PLAIT_INLINE void norm_groups(float *x, const float *w, int64_t groups, int64_t n, float eps) {
    if (w != NULL)
        for (int64_t g = 0; g < groups; ++g) rmsnorm_row(x + g * n, w, n, eps, x + g * n);
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

/* gelu(g) * u with the tanh GELU, torch's approximate="tanh" in its order:
 * 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))). */
PLAIT_INLINE void gelu_tanh_mul(const float *restrict g, const float *restrict u, int64_t n,
                                float *restrict out) {
    const float beta = 0.7978845608028654f, kappa = 0.044715f;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
        float x = g[i], inner = beta * (x + kappa * (x * x * x));
        out[i] = 0.5f * x * (1.0f + tanh_f32(inner)) * u[i];
    }
}

/* ---- phases: a range of tokens (or attention units) per part -------------------------------- */

enum { ADD_NORM, ROPE_STORE, ACT_MUL, ATTEND, FINAL_NORM };

typedef struct {
    const step_model_t *m;
    const step_batch_t *b;
    const step_layer_t *l;
    int phase;
    /* ADD_NORM: r += s * add_norm(add) (unless add is NULL), then x = norm(r) (x = r when norm
     * is NULL); FINAL_NORM: x = norm(r + s * add_norm(add)) for the kept rows */
    float *add;
    const float *add_norm, *norm;
    int status; /* ATTEND: the first error a part met */
} phase_t;

static void rope_store(const step_model_t *m, const step_batch_t *b, const step_layer_t *l,
                       int64_t t) {
    int64_t d = m->head_dim, hq = m->heads, hkv = m->kv_heads, qkv = (hq + 2 * hkv) * d;
    float *src = b->qkv + t * qkv;
    const float *cs = l->cos_sin + b->positions[t] * d;
    float *kdst = l->k_pool + b->slots[t] * hkv * d, *vdst = l->v_pool + b->slots[t] * hkv * d;
    int whole = (int)m->qk_whole;
    norm_groups(src, l->q_norm, whole ? 1 : hq, whole ? hq * d : d, m->eps);
    norm_groups(src + hq * d, l->k_norm, whole ? 1 : hkv, whole ? hkv * d : d, m->eps);
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
                               m->num_slots, 1, hq, hkv, d, g0, g1, m->scale, m->softcap,
                               b->attn + t * hq * d, b->lse + t * hq);
        if (status != 0) __atomic_store_n(&ph->status, status, __ATOMIC_SEQ_CST);
        u0 = t * hkv + g1;
    }
}

/* Token t of an ADD_NORM phase. */
PLAIT_INLINE void add_norm_token(const phase_t *ph, int64_t t) {
    const step_model_t *m = ph->m;
    int64_t hd = m->hidden;
    float *r = ph->b->resid + t * hd, *x = ph->b->x + t * hd;
    if (ph->add != NULL) {
        float *a = ph->add + t * hd;
        norm_groups(a, ph->add_norm, 1, hd, m->eps);
        add_scaled_row(r, a, m->resid_scale, hd, r);
    }
    if (ph->norm != NULL) rmsnorm_row(r, ph->norm, hd, m->eps, x);
    else memcpy(x, r, sizeof(float) * (size_t)hd);
}

/* Row t of the output: token logits[t] (its branch output normed into x first: a token may
 * be kept twice, so add is not written). */
PLAIT_INLINE void final_norm_row(const phase_t *ph, int64_t t) {
    const step_model_t *m = ph->m;
    int64_t hd = m->hidden, src = ph->b->logits[t] * hd;
    float *x = ph->b->x + t * hd;
    if (ph->add_norm != NULL) rmsnorm_row(ph->add + src, ph->add_norm, hd, m->eps, x);
    else memcpy(x, ph->add + src, sizeof(float) * (size_t)hd);
    add_scaled_row(ph->b->resid + src, x, m->resid_scale, hd, x);
    rmsnorm_row(x, ph->norm, hd, m->eps, x);
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
    int64_t t0 = rows * part / parts, t1 = rows * (part + 1) / parts, in = m->inter;
    for (int64_t t = t0; t < t1; ++t) {
        if (ph->phase == ADD_NORM) add_norm_token(ph, t);
        else if (ph->phase == FINAL_NORM) final_norm_row(ph, t);
        else if (ph->phase == ROPE_STORE) rope_store(m, b, ph->l, t);
        else if (m->act == ACT_GELU_TANH)
            gelu_tanh_mul(b->gu + t * 2 * in, b->gu + t * 2 * in + in, in, b->act + t * in);
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

/* One layer; `prev` is the layer before it (NULL for the first), whose MLP output b->y joins
 * the residual here. */
static int layer(const step_model_t *m, const step_batch_t *b, const step_layer_t *l,
                 const step_layer_t *prev, int threads) {
    int64_t t = b->tokens, hd = m->hidden, d = m->head_dim, hkv = m->kv_heads;
    set_spans(b, l->window);
    phase_t ph = {m, b, l, ADD_NORM, prev == NULL ? NULL : b->y,
                  prev == NULL ? NULL : prev->mlp_out_norm, l->in_norm, 0};
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
    ph.add_norm = l->attn_out_norm;
    ph.norm = l->mlp_norm;
    if (!s) s = small_op(&ph, threads, ADD_NORM, hd);
    if (!s) s = matmul(m, threads, b->x, t, l->gate_up, l->gate_up_bias, b->gu);
    if (!s) s = small_op(&ph, threads, ACT_MUL, 3 * m->inter);
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
        s = layer(m, b, &m->layers[i], i == 0 ? NULL : &m->layers[i - 1], threads);
    if (s) return s;
    const step_layer_t *last = &m->layers[m->num_layers - 1];
    phase_t ph = {m, b, NULL, FINAL_NORM, b->y, last->mlp_out_norm, m->final_norm, 0};
    return small_op(&ph, threads, FINAL_NORM, m->hidden);
}
