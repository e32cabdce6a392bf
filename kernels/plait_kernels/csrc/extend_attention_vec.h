/* Extend attention's vector loops, compiled once per vector width: extend_attention_cpu.c
 * includes this file under `#pragma GCC target(...)` with EA_W (floats a vector holds: 16 on
 * AVX-512, 8 on AVX2), EA_SFX (a name suffix) and the intrinsics below defined.
 *
 * A tile is EA_ROWS query rows of one kv head against the keys in blocks of EA_KEYS: the block's
 * scores come from a register block of EA_ROWS x EA_SV vectors (each packed K^T vector serves
 * every row, each query value broadcast), the online softmax updates the rows' maxima and sums,
 * and the value sums run over the block in a register block of EA_ROWS x EA_CV vectors of the
 * head's outputs. A row's output depends only on its own scores (the other rows of its tile
 * change nothing), so a token is computed the same way whatever else is in the call. */

#define EA_CAT_(a, b) a##b
#define EA_CAT(a, b) EA_CAT_(a, b)
#define EA(name) EA_CAT(name, EA_SFX)

typedef float EA(vf) __attribute__((vector_size(4 * EA_W)));
typedef int32_t EA(vi) __attribute__((vector_size(4 * EA_W)));

/* Lanes of a where `keep`, else of b. */
PLAIT_INLINE EA(vf) EA(select)(EA(vi) keep, EA(vf) a, EA(vf) b) {
    return (EA(vf))((keep & (EA(vi))a) | (~keep & (EA(vi))b));
}

/* exp_nonpos (plait_kernels.h) on every lane: its steps, floor from truncation and the
 * polynomial in FMAs (so within an ulp of it, not always its bits). */
PLAIT_INLINE EA(vf) EA(exp)(EA(vf) x) {
    x = EA(select)(x < -87.0f, (EA(vf)){0} - 87.0f, x);
    const EA(vf) y = x * 1.44269504f + 0.5f;
    EA(vi) t = __builtin_convertvector(y, EA(vi));
    t += __builtin_convertvector(t, EA(vf)) > y; /* truncation went up: one less */
    const EA(vf) n = __builtin_convertvector(t, EA(vf));
    const EA(vf) r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
    EA(vf) p = (EA(vf)){0} + 1.0f / 5040.0f;
    p = EA_FMA(p, r, (EA(vf)){0} + 1.0f / 720.0f);
    p = EA_FMA(p, r, (EA(vf)){0} + 1.0f / 120.0f);
    p = EA_FMA(p, r, (EA(vf)){0} + 1.0f / 24.0f);
    p = EA_FMA(p, r, (EA(vf)){0} + 1.0f / 6.0f);
    p = EA_FMA(p, r, (EA(vf)){0} + 0.5f);
    p = EA_FMA(p, r, (EA(vf)){0} + 1.0f);
    p = EA_FMA(p, r, (EA(vf)){0} + 1.0f);
    return p * (EA(vf))((t + 127) << 23);
}

/* One row's scores of a block (s, scaled) become its probabilities against the running maximum
 * m (updated), keys outside [first, last] (relative to the block; none visible where last < 0)
 * getting 0; the running sums (lanes of a vector, added up at the end) are rescaled and added
 * to. Returns the factor the row's output sums take, exp(old m - new m). */
PLAIT_INLINE float EA(softmax)(float *s, int64_t first, int64_t last, float *m, EA(vf) *sums) {
    const int lo = first < 0 ? 0 : first < EA_KEYS ? (int)first : EA_KEYS;
    const int hi = last < 0 ? 0 : last + 1 < EA_KEYS ? (int)(last + 1) : EA_KEYS;
    EA(vf) v[EA_KEYS / EA_W], top = (EA(vf)){0} + *m;
    EA(vi) keep[EA_KEYS / EA_W];
    for (int c = 0; c < EA_KEYS / EA_W; ++c) {
        EA(vi) at = {0};
        for (int i = 0; i < EA_W; ++i) at[i] = c * EA_W + i;
        keep[c] = (at >= lo) & (at < hi);
        memcpy(&v[c], s + c * EA_W, sizeof v[c]);
        const EA(vf) seen = EA(select)(keep[c], v[c], (EA(vf)){0} - INFINITY);
        top = EA(select)(seen > top, seen, top);
    }
    float mx = top[0];
    for (int i = 1; i < EA_W; ++i) mx = top[i] > mx ? top[i] : mx;
    if (mx == -INFINITY) { /* nothing visible yet: the row is untouched */
        memset(s, 0, sizeof(float) * EA_KEYS);
        return 1.0f;
    }
    const float alpha = exp_nonpos(*m - mx);
    EA(vf) sum = {0};
    for (int c = 0; c < EA_KEYS / EA_W; ++c) {
        const EA(vf) p = EA(select)(keep[c], EA(exp)(v[c] - mx), (EA(vf)){0});
        memcpy(s + c * EA_W, &p, sizeof p);
        sum += p;
    }
    *m = mx;
    *sums = *sums * alpha + sum;
    return alpha;
}

/* scale * q.k of the tile's rows against a block of EA_KEYS keys, kt its K^T [d, EA_KEYS]
 * (columns past the keys are zeros). */
PLAIT_INLINE void EA(scores)(const float *const *qr, const float *kt, int64_t d, float scale,
                             float s[EA_ROWS][EA_KEYS]) {
    for (int c0 = 0; c0 < EA_KEYS; c0 += EA_SV * EA_W) {
        EA_VEC acc[EA_ROWS][EA_SV];
        for (int j = 0; j < EA_ROWS; ++j)
            for (int c = 0; c < EA_SV; ++c) acc[j][c] = EA_ZERO();
        const float *col = kt + c0;
        for (int64_t i = 0; i < d; ++i, col += EA_KEYS) {
            EA_VEC kv[EA_SV];
            for (int c = 0; c < EA_SV; ++c) kv[c] = EA_LOAD(col + c * EA_W);
            for (int j = 0; j < EA_ROWS; ++j) {
                EA_VEC qb = EA_SET1(qr[j][i]);
                for (int c = 0; c < EA_SV; ++c) acc[j][c] = EA_FMA(qb, kv[c], acc[j][c]);
            }
        }
        EA_VEC sv = EA_SET1(scale);
        for (int j = 0; j < EA_ROWS; ++j)
            for (int c = 0; c < EA_SV; ++c)
                EA_STORE(&s[j][c0 + c * EA_W], EA_MUL(acc[j][c], sv));
    }
}

/* o[j] = alpha[j] * o[j] + sum over the block's `keys` keys of p[j][t] * v_t, for head size d
 * a multiple of EA_CV vectors (tile_path; v: the packed rows of the block, d floats apart). */
PLAIT_INLINE void EA(values)(const float p[EA_ROWS][EA_KEYS], const float *alpha,
                             const float *v, int keys, int64_t d, float *o) {
    for (int64_t c0 = 0; c0 < d; c0 += EA_CV * EA_W) {
        EA_VEC acc[EA_ROWS][EA_CV];
        for (int j = 0; j < EA_ROWS; ++j) {
            EA_VEC a = EA_SET1(alpha[j]);
            for (int c = 0; c < EA_CV; ++c)
                acc[j][c] = EA_MUL(a, EA_LOAD(o + j * d + c0 + c * EA_W));
        }
        const float *vr = v + c0;
        for (int t = 0; t < keys; ++t, vr += d) {
            EA_VEC vv[EA_CV];
            for (int c = 0; c < EA_CV; ++c) vv[c] = EA_LOAD(vr + c * EA_W);
            for (int j = 0; j < EA_ROWS; ++j) {
                EA_VEC pb = EA_SET1(p[j][t]);
                for (int c = 0; c < EA_CV; ++c) acc[j][c] = EA_FMA(pb, vv[c], acc[j][c]);
            }
        }
        for (int j = 0; j < EA_ROWS; ++j)
            for (int c = 0; c < EA_CV; ++c) EA_STORE(o + j * d + c0 + c * EA_W, acc[j][c]);
    }
}

/* One tile: rows whose queries are qr and visible keys first[j] .. last[j] (a row of the tile
 * past the call's rows repeats a real one; its output is not stored), over the packed K^T and V
 * of their kv head, the scores capped (cap * tanh(score / cap)) where cap > 0; o receives each
 * row's output. Blocks before every row's first are skipped. */
__attribute__((noinline)) static void EA(tile)(const float *const *qr, const int64_t *first,
                                               const int64_t *last,
                                               const float *kt, const float *vp, int64_t d,
                                               float scale, float cap, float *o) {
    float s[EA_ROWS][EA_KEYS], m[EA_ROWS], alpha[EA_ROWS];
    EA(vf) sums[EA_ROWS];
    int64_t start = first[0], end = 0;
    for (int j = 0; j < EA_ROWS; ++j) {
        m[j] = -INFINITY;
        sums[j] = (EA(vf)){0};
        start = first[j] < start ? first[j] : start;
        end = last[j] + 1 > end ? last[j] + 1 : end;
    }
    memset(o, 0, sizeof(float) * (size_t)(EA_ROWS * d));
    for (int64_t kb = start / EA_KEYS * EA_KEYS; kb < end; kb += EA_KEYS) {
        EA(scores)(qr, kt + kb * d, d, scale, s);
        if (cap > 0.0f) /* the soft cap, as the decode kernel applies it */
            for (int j = 0; j < EA_ROWS; ++j)
#pragma omp simd
                for (int t = 0; t < EA_KEYS; ++t) s[j][t] = tanh_f32(s[j][t] / cap) * cap;
        for (int j = 0; j < EA_ROWS; ++j)
            alpha[j] = EA(softmax)(s[j], first[j] - kb, last[j] - kb, &m[j], &sums[j]);
        int keys = end - kb < EA_KEYS ? (int)(end - kb) : EA_KEYS;
        EA(values)(s, alpha, vp + kb * d, keys, d, o);
    }
    for (int j = 0; j < EA_ROWS; ++j) {
        float l = 0.0f;
        for (int i = 0; i < EA_W; ++i) l += sums[j][i];
        const float inv = 1.0f / l;
        for (int64_t i = 0; i < d; ++i) o[j * d + i] *= inv;
    }
}

#undef EA
#undef EA_CAT
#undef EA_CAT_
