/* Decode attention's vector path over an fp32 pool, compiled once per vector width:
 * decode_attention_cpu.c includes this file under `#pragma GCC target(...)` with VA_W (the
 * floats a vector holds: 16 on AVX-512, 8 on AVX2) and VA_SFX (a name suffix) defined.
 *
 * A head's scores come VA_W positions at a time: each position's q.k is first a vector of
 * VA_W partial sums (the head's VA_W-float chunks multiplied and added in order), and the
 * VA_W vectors are then summed lane-wise in one transpose-and-add tree (log2 VA_W levels of
 * pairwise shuffles, each a native shuffle at its width), so the horizontal sums cost a few
 * operations per score instead of a reduction each. The value sums keep the head's output in
 * registers across all positions. A score is computed the same way whatever the batch (it
 * depends on its position's place in the request's span). */

#define VA_CAT_(a, b) a##b
#define VA_CAT(a, b) VA_CAT_(a, b)
#define VA(name) VA_CAT(name, VA_SFX)
#define VA_CHUNKS (256 / VA_W) /* head sizes up to 256 */

typedef float VA(vf) __attribute__((vector_size(4 * VA_W)));
typedef int32_t VA(vi) __attribute__((vector_size(4 * VA_W)));

PLAIT_INLINE VA(vf) VA(load)(const float *p) {
    VA(vf) r;
    memcpy(&r, p, sizeof r);
    return r;
}

PLAIT_INLINE void VA(store)(float *p, VA(vf) x) { memcpy(p, &x, sizeof x); }

/* One level of the tree: lane i takes the pair (r, r + w) of x's block (r = i % 2w < w), else
 * of y's, so each output holds half-sums of both inputs. */
#if defined(__clang__)
#define VA_HALF_SUMS(x, y, LO, HI)                                                             \
    (__builtin_shufflevector(x, y, LO) + __builtin_shufflevector(x, y, HI))
#else
#define VA_HALF_SUMS(x, y, LO, HI)                                                             \
    (__builtin_shuffle(x, y, (VA(vi)){LO}) + __builtin_shuffle(x, y, (VA(vi)){HI}))
#endif

#if VA_W == 16
#define VA_W8_LO 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define VA_W8_HI 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define VA_W4_LO 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27
#define VA_W4_HI 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define VA_W2_LO 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29
#define VA_W2_HI 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define VA_W1_LO 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30
#define VA_W1_HI 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31
/* Lane i of the result is the sum of the lanes of v[BITREV[i]] (the tree's output order). */
static const int VA(BITREV)[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

PLAIT_INLINE VA(vf) VA(lane_sums)(const VA(vf) *v) {
    VA(vf) a[8], b[4], c[2];
    for (int i = 0; i < 8; ++i) a[i] = VA_HALF_SUMS(v[2 * i], v[2 * i + 1], VA_W8_LO, VA_W8_HI);
    for (int i = 0; i < 4; ++i) b[i] = VA_HALF_SUMS(a[2 * i], a[2 * i + 1], VA_W4_LO, VA_W4_HI);
    for (int i = 0; i < 2; ++i) c[i] = VA_HALF_SUMS(b[2 * i], b[2 * i + 1], VA_W2_LO, VA_W2_HI);
    return VA_HALF_SUMS(c[0], c[1], VA_W1_LO, VA_W1_HI);
}
#elif VA_W == 8
/* The same tree on eight lanes: vperm2f128, then two levels of vshufps-like pairs. */
#define VA_W4_LO 0, 1, 2, 3, 8, 9, 10, 11
#define VA_W4_HI 4, 5, 6, 7, 12, 13, 14, 15
#define VA_W2_LO 0, 1, 8, 9, 4, 5, 12, 13
#define VA_W2_HI 2, 3, 10, 11, 6, 7, 14, 15
#define VA_W1_LO 0, 8, 2, 10, 4, 12, 6, 14
#define VA_W1_HI 1, 9, 3, 11, 5, 13, 7, 15
static const int VA(BITREV)[8] = {0, 4, 2, 6, 1, 5, 3, 7};

PLAIT_INLINE VA(vf) VA(lane_sums)(const VA(vf) *v) {
    VA(vf) b[4], c[2];
    for (int i = 0; i < 4; ++i) b[i] = VA_HALF_SUMS(v[2 * i], v[2 * i + 1], VA_W4_LO, VA_W4_HI);
    for (int i = 0; i < 2; ++i) c[i] = VA_HALF_SUMS(b[2 * i], b[2 * i + 1], VA_W2_LO, VA_W2_HI);
    return VA_HALF_SUMS(c[0], c[1], VA_W1_LO, VA_W1_HI);
}
#else
#error "VA_W must be 16 or 8"
#endif

PLAIT_INLINE VA(vf) VA(partial_dot)(const VA(vf) *qv, const float *kr, int nc) {
    VA(vf) a = qv[0] * VA(load)(kr);
    for (int c = 1; c < nc; ++c) a += qv[c] * VA(load)(kr + c * VA_W);
    return a;
}

/* scale * q.k for one head over the span; `off` is the head's kv head offset in a row. */
PLAIT_INLINE void VA(head_scores)(const float *q, const float *k, const int32_t *slots,
                                  int64_t span, int64_t row, int64_t off, int nc, float scale,
                                  float *s) {
    VA(vf) qv[VA_CHUNKS], acc[VA_W];
    for (int c = 0; c < nc; ++c) qv[c] = VA(load)(q + c * VA_W);
    int64_t t = 0;
    for (; t + VA_W <= span; t += VA_W) {
        for (int j = 0; j < VA_W; ++j) {
            if (t + VA_W + j < span)
                prefetch_row(k + (int64_t)slots[t + VA_W + j] * row + off, nc * 4 * VA_W);
            acc[VA(BITREV)[j]] = VA(partial_dot)(qv, k + (int64_t)slots[t + j] * row + off, nc);
        }
        VA(store)(s + t, VA(lane_sums)(acc) * scale);
    }
    for (; t < span; ++t) {
        VA(vf) a = VA(partial_dot)(qv, k + (int64_t)slots[t] * row + off, nc);
        float sum = 0.0f;
        for (int i = 0; i < VA_W; ++i) sum += a[i];
        s[t] = sum * scale;
    }
}

/* out = sum over the span of p[t] * v_t for one head, the output held in registers. */
PLAIT_INLINE void VA(head_values)(const float *p, const float *v, const int32_t *slots,
                                  int64_t span, int64_t row, int64_t off, int nc, float *out) {
    VA(vf) acc[VA_CHUNKS];
    for (int c = 0; c < nc; ++c) acc[c] = (VA(vf)){0};
    for (int64_t t = 0; t < span; ++t) {
        if (t + PREFETCH_AHEAD < span)
            prefetch_row(v + (int64_t)slots[t + PREFETCH_AHEAD] * row + off, nc * 4 * VA_W);
        const float *vr = v + (int64_t)slots[t] * row + off;
        for (int c = 0; c < nc; ++c) acc[c] += p[t] * VA(load)(vr + c * VA_W);
    }
    for (int c = 0; c < nc; ++c) VA(store)(out + c * VA_W, acc[c]);
}

PLAIT_INLINE void VA(one_nc)(const float *q, const float *k, const float *v,
                             const int32_t *slots, int64_t span, int64_t hq, int64_t hkv,
                             int64_t h0, int64_t h1, float scale, float cap, float *scores,
                             float *out, float *lse, int nc) {
    int64_t d = nc * VA_W, group = hq / hkv, row = hkv * d;
    for (int64_t h = h0; h < h1; ++h)
        VA(head_scores)(q + h * d, k, slots, span, row, h / group * d, nc, scale,
                        scores + h * span);
    softmax_rows(scores + h0 * span, h1 - h0, span, cap, lse + h0);
    for (int64_t h = h0; h < h1; ++h)
        VA(head_values)(scores + h * span, v, slots, span, row, h / group * d, nc, out + h * d);
}

/* The vector path for d a multiple of VA_W up to 256, with the chunk count a constant in each
 * branch (registers, unrolling); its arguments are pointers and scalars. */
__attribute__((noinline)) static void VA(vec_one)(const float *q, const float *k,
                                                  const float *v, const int32_t *slots,
                                                  int64_t span, int64_t hq, int64_t hkv,
                                                  int64_t d, int64_t h0, int64_t h1,
                                                  float scale, float cap, float *scores,
                                                  float *out, float *lse) {
    int nc = (int)(d / VA_W);
#define VA_ONE(NC)                                                                             \
    VA(one_nc)(q, k, v, slots, span, hq, hkv, h0, h1, scale, cap, scores, out, lse, NC)
    switch (d) {
    case 64: VA_ONE(64 / VA_W); break;
    case 128: VA_ONE(128 / VA_W); break;
    default: VA_ONE(nc);
    }
#undef VA_ONE
}

#undef VA_HALF_SUMS
#undef VA_W4_LO
#undef VA_W4_HI
#undef VA_W2_LO
#undef VA_W2_HI
#undef VA_W1_LO
#undef VA_W1_HI
#if VA_W == 16
#undef VA_W8_LO
#undef VA_W8_HI
#endif
#undef VA_CHUNKS
#undef VA
#undef VA_CAT
#undef VA_CAT_
