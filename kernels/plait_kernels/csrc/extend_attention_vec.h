/* Extend attention's vector loops, compiled once per vector width: extend_attention_cpu.c
 * includes this file under `#pragma GCC target(...)` with EA_W (floats a vector holds: 16 on
 * AVX-512, 8 on AVX2), EA_SFX (a name suffix) and the intrinsics below defined; it undefines
 * them at its end.
 *
 * A tile is EA_ROWS query rows of one kv head against the keys in blocks of EA_KEYS: the block's
 * scores come from a register block of EA_ROWS x EA_SV vectors (each packed K^T vector serves
 * every row, each query value broadcast), the online softmax (ea_softmax_block) updates the
 * rows' maxima and sums,
 * and the value sums run over the block in a register block of EA_ROWS x EA_CV vectors of the
 * head's outputs. A row's output depends only on its own scores (the other rows of its tile
 * change nothing), so a token is computed the same way whatever else is in the call. */

#define EA_CAT_(a, b) a##b
#define EA_CAT(a, b) EA_CAT_(a, b)
#define EA(name) EA_CAT(name, EA_SFX)

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
    float s[EA_ROWS][EA_KEYS], m[EA_ROWS], l[EA_ROWS], alpha[EA_ROWS];
    int64_t start = first[0], end = 0;
    for (int j = 0; j < EA_ROWS; ++j) {
        m[j] = -INFINITY;
        l[j] = 0.0f;
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
            alpha[j] = ea_softmax_block(s[j], first[j] - kb, last[j] - kb, &m[j], &l[j]);
        int keys = end - kb < EA_KEYS ? (int)(end - kb) : EA_KEYS;
        EA(values)(s, alpha, vp + kb * d, keys, d, o);
    }
    for (int j = 0; j < EA_ROWS; ++j) {
        const float inv = 1.0f / l[j];
        for (int64_t i = 0; i < d; ++i) o[j * d + i] *= inv;
    }
}

#undef EA
#undef EA_CAT
#undef EA_CAT_
/* what the includer defined for this width */
#undef EA_W
#undef EA_SV
#undef EA_CV
#undef EA_SFX
#undef EA_VEC
#undef EA_ZERO
#undef EA_LOAD
#undef EA_STORE
#undef EA_SET1
#undef EA_MUL
#undef EA_FMA
