/* The quantized matmul's inner loops for the K forms (QMM_SK: Q2_K .. Q6_K, IQ4_XS), included
 * by qmm_tile.h once per instruction set with its QF, QMM_DP, QMM_CVTPH and QMM_CVTI8 (and
 * QMM_AMX for the tile path). The layout of the codes is qmm_tile.h's. */
/* ---- K forms (SK): a super-block's sums in integers --------------------------------------
 * x shares one dx per 256 values (quantize_row's span), so within a super-block the integer
 * sub-scales fold into the sums: th = sum_j sc_j sum_{k in j} hi_k (code_k - zero) and tl the
 * same of lo (exact in int32: |hi|, |lo| <= 127, |sc (code - zero)| <= 4096, 256
 * values).
 * Every path (one row, four, the super-blocks of AVX2 and VNNI, the AMX tiles) gets the same
 * integers however it sums them, and adds a super-block to tot through sk_add, so a row gets
 * the same bits on any path. */

/* QMM_W int8 -> QMM_W int32 lanes (QMM_I8I32, vpmovsxbd: without it GCC builds the conversion
 * from scalars, on AVX2 and on AVX-512 alike, and the 16-lane K loops, which convert each
 * group's sub-scales, ran at 0.4x on a Zen 4). */
PLAIT_INLINE QV_I32 QF(load_i8)(const int8_t *p) {
#ifdef QMM_I8I32
    return QMM_I8I32(p);
#else
    QV_I8N b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, QV_I32);
#endif
}

/* Two int32 vectors as int16 pairs: a's low halves in the even lanes, b's in the odd (both
 * within int16), the form a 16-bit pair dot takes them in. */
PLAIT_INLINE QV_I16 QF(pair16)(QV_I32 a, QV_I32 b) { return (QV_I16)((a & 0xffff) | (b * 65536)); }

/* The four bytes at p in every 32-bit lane. */
PLAIT_INLINE QV_I32 QF(bcast32)(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return (QV_I32){} + v;
}

#if defined(QMM_DPW) || defined(QMM_MADD16)
/* acc + the int16 pair dots of a and b (vpdpwssd where the build has it, else vpmaddwd and an
 * add: the same integers). */
PLAIT_INLINE QV_I32 QF(pdot16)(QV_I32 acc, QV_I16 a, QV_I16 b) {
#ifdef QMM_DPW
    return QMM_DPW(acc, a, b);
#else
    return QMM_MADD16(acc, a, b);
#endif
}

/* One row of x's run sums against P parts' int16 pairs (W[q][c]: runs 2 c and 2 c + 1, for c
 * below `pairs`): oh[q] of its sums of hi (sh), ol[q] of lo (sl, NULL without lo). With a
 * part's mins these are sk_mins' integers; the super-block paths also weigh the zero's share
 * so. */
PLAIT_INLINE void QF(run_dots)(const int P, int pairs, const QV_I16 W[][8], const int16_t *sh,
                               const int16_t *sl, QV_I32 *oh, QV_I32 *ol) {
    for (int q = 0; q < P; ++q) oh[q] = ol[q] = (QV_I32){0};
#pragma GCC unroll 8
    for (int c = 0; c < pairs; ++c) {
        const QV_I16 hb = (QV_I16)QF(bcast32)(sh + 2 * c);
        for (int q = 0; q < P; ++q) oh[q] = QF(pdot16)(oh[q], hb, W[q][c]);
        if (sl == NULL) continue;
        const QV_I16 lb = (QV_I16)QF(bcast32)(sl + 2 * c);
        for (int q = 0; q < P; ++q) ol[q] = QF(pdot16)(ol[q], lb, W[q][c]);
    }
}
#endif

/* Super-block u (of `supers` per row) of block blk's scales, of its QMM_W rows from r0: d, and
 * with mins -dmin in dm and each run's mins in mv[0 .. 8 * subs) (mv NULL: not them). */
PLAIT_INLINE void QF(sk_scales)(const plait_qpart_t *p, int64_t blk, int64_t u, int64_t supers,
                                int subs, int r0, QV_F32 *d, QV_F32 *dm, QV_I32 *mv) {
    const int64_t at = (blk * supers + u) * 16 + r0;
    *d = QMM_CVTPH(p->d + at);
    if (p->mins == NULL) return;
    *dm = -QMM_CVTPH(p->dmin + at);
    const int8_t *mn = (const int8_t *)p->mins + (blk * supers + u) * 128 * subs + r0;
    for (int j = 0; j < 8 * subs && mv != NULL; ++j) mv[j] = QF(load_i8)(mn + 16 * j);
}

/* One row of x's mins term of a super-block in integers: mh = sum_j mv[j] sh[j] over `runs`
 * runs, ml the same of sl (the row's run sums, qmm_runs; sl NULL: x has no lo). Exact, so any
 * path's way of summing them gives the same mh, ml. */
PLAIT_INLINE void QF(sk_mins)(const QV_I32 *mv, int runs, const int16_t *sh, const int16_t *sl,
                              QV_I32 *mh, QV_I32 *ml) {
    QV_I32 h = {0}, l = {0};
    for (int j = 0; j < runs; ++j) {
        h += mv[j] * (int32_t)sh[j];
        if (sl != NULL) l += mv[j] * (int32_t)sl[j];
    }
    *mh = h, *ml = l;
}

/* sk_mins of row `row` of x over super-block u (8 subs runs of 32 / subs values). */
PLAIT_INLINE void QF(sk_row_mins)(const int LO, const qmm_act_t *a, int64_t row, int64_t u,
                                  int subs, const QV_I32 *mv, QV_I32 *mh, QV_I32 *ml) {
    const int runs = 8 * subs;
    const int16_t *sh = qmm_runs(a, row, 32 / subs, 0) + runs * u;
    QF(sk_mins)(mv, runs, sh, LO ? qmm_runs(a, row, 32 / subs, 1) + runs * u : NULL, mh, ml);
}

/* One row of x's sums th, tl of a super-block (its scales from sk_scales) added to tot in fp32:
 * (256 th + tl) * (d dx), then with `mins` the mins' (256 mh + ml) * (-dmin dx) (sk_mins). */
PLAIT_INLINE QV_F32 QF(sk_add)(QV_F32 tot, QV_I32 th, QV_I32 tl, QV_F32 d, float dx, int mins,
                               QV_F32 dm, QV_I32 mh, QV_I32 ml) {
    QV_F32 f = __builtin_convertvector(th, QV_F32) * 256.0f + __builtin_convertvector(tl, QV_F32);
    tot += f * (d * dx);
    if (mins) {
        f = __builtin_convertvector(mh, QV_F32) * 256.0f + __builtin_convertvector(ml, QV_F32);
        tot += f * (dm * dx);
    }
    return tot;
}

/* One sub-block's dots (h, l: x's hi and lo against the codes) of one row of x into th, tl:
 * sh, sl are that row's sums of hi and lo over the sub-block, sc the rows' sub-scales. LO = 0
 * (x in one byte: l and sl are 0) leaves tl as it is. */
PLAIT_INLINE void QF(sk_sub)(const int LO, QV_I32 h, QV_I32 l, int32_t sh, int32_t sl,
                             int32_t zero, const int8_t *sc, QV_I32 *th, QV_I32 *tl) {
    const QV_I32 s = QF(load_i8)(sc);
    *th += s * (h - zero * sh);
    if (LO) *tl += s * (l - zero * sl);
}

/* One row of x's dots with a decoded group of a K form, with the group's sub-scales, into th,
 * tl (sk_sub's integers): sc0, sc1 the sub-scales of its first and second 16 values (one
 * pointer when sub = 32: one run), s the row's sums of hi and lo of each 16 (xi). With a
 * 16-bit pair dot (qmm_fold) the int16 pair sums are widened against the sub-scales, each in
 * both halves of its lane, so the sub-scale costs no multiply; the zero's term follows. */
PLAIT_INLINE void QF(dots_k)(const int LO, const int planes, const QV_U8 V[8], const int8_t *xg,
                             const int32_t *s, int32_t zero, const int8_t *sc0,
                             const int8_t *sc1, QV_I32 *th, QV_I32 *tl) {
#ifdef QMM_DP16
    const int fold = qmm_fold(planes);
    if (fold > 0) {
#pragma GCC unroll 2
        for (int j = 0; j < 2; ++j) {
            const QV_I32 sj = QF(load_i8)(j ? sc1 : sc0);
            QF(dots16)(LO, fold, V, xg, j, QF(pair16)(sj, sj), th, tl);
            if (zero != 0) {
                *th -= sj * (zero * s[2 * j]);
                if (LO) *tl -= sj * (zero * s[2 * j + 1]);
            }
        }
        return;
    }
#endif
    QV_I32 h[2], l[2];
    QF(dots)(LO, planes, V, xg, s, h, l);
    if (sc0 == sc1)
        QF(sk_sub)(LO, h[0] + h[1], l[0] + l[1], s[0] + s[2], s[1] + s[3], zero, sc0, th, tl);
    else
        for (int j = 0; j < 2; ++j)
            QF(sk_sub)(LO, h[j], l[j], s[2 * j], s[2 * j + 1], zero, j ? sc1 : sc0, th, tl);
}

/* One row of x (row i0) against one block of a K form: row1's dots, summed per super-block in
 * integers (dots_k) and added to the output once per super-block (sk_add); a group's parts of
 * QMM_W rows one after the other, as row1's. */
PLAIT_INLINE void QF(row1k)(const int LO, const int planes, const int SUBS, const plait_qpart_t *p,
                            const qmm_act_t *a, int64_t i0, int64_t blk, float *out, int rows) {
    const int64_t gc = a->k / 32, gbytes = qmm_group_bytes(planes), runs = gc * SUBS;
    const uint8_t *codes = p->codes + blk * gc * gbytes;
    const int8_t *x = a->xq + i0 * 2 * a->k;
    const int8_t *sc = (const int8_t *)p->scales + blk * runs * 16;
    const float *dx = a->dx + i0 * gc;
    const int32_t *xi = a->xi + i0 * 4 * gc;
    const int parts = (rows + QMM_W - 1) / QMM_W;
    QV_F32 tot[QMM_HALVES] = {{0}};
    QV_I32 th[QMM_HALVES] = {{0}}, tl[QMM_HALVES] = {{0}};
    for (int64_t g = 0; g < gc; ++g) {
        const uint8_t *cp = codes + g * gbytes;
        for (int64_t line = 0; line < gbytes; line += 64) __builtin_prefetch(cp + PF_DIST_ROW + line, 0, 2);
        const int32_t *s = xi + 4 * g; /* sum(hi), sum(lo) of each 16 */
        for (int hf = 0; hf < parts; ++hf) {
            const int r0 = QMM_W * hf;
            const int8_t *sg = sc + 16 * SUBS * g + r0;
            QV_U8 V[8];
            QF(decode)(planes, cp + 4 * r0, V);
            QF(dots_k)(LO, planes, V, x + 64 * g, s, p->zero, sg, sg + 16 * (SUBS - 1), &th[hf],
                       &tl[hf]);
            if ((g & 7) == 7) {
                const int64_t u = g >> 3;
                QV_F32 d, dm = {0};
                QV_I32 mv[16], mh = {0}, ml = {0};
                QF(sk_scales)(p, blk, u, gc / 8, SUBS, r0, &d, &dm, mv);
                if (p->mins != NULL) QF(sk_row_mins)(LO, a, i0, u, SUBS, mv, &mh, &ml);
                tot[hf] = QF(sk_add)(tot[hf], th[hf], tl[hf], d, dx[g], p->mins != NULL, dm, mh, ml);
                th[hf] = tl[hf] = (QV_I32){0};
            }
        }
    }
    for (int hf = 0; hf < parts; ++hf) QF(store_lanes)(out, &tot[hf], rows, QMM_W * hf);
}

/* Four rows of x (from i0) against one block of a K form: tile4's dots, summed as row1k's,
 * QMM_W rows of the block at a time. */
PLAIT_INLINE void QF(tile4k)(const int LO, const int planes, const plait_qpart_t *p, const qmm_act_t *a,
                             int64_t i0, int64_t blk, float *out, int64_t ldo, int rows) {
    const int64_t gc = a->k / 32, gbytes = qmm_group_bytes(planes);
    const int subs = p->sub == 16 ? 2 : 1;
    const uint8_t *codes = p->codes + blk * gc * gbytes;
    const int8_t *sc = (const int8_t *)p->scales + blk * gc * subs * 16;
    for (int r0 = 0; r0 < rows; r0 += QMM_W) {
        QV_F32 tot[4] = {{0}};
        QV_I32 th[4] = {{0}}, tl[4] = {{0}};
        for (int64_t g = 0; g < gc; ++g) {
            const uint8_t *cp = codes + g * gbytes;
            if (r0 == 0)
                for (int64_t line = 0; line < gbytes; line += 64)
                    __builtin_prefetch(cp + PF_DIST + line, 0, 3);
            const int8_t *sg = sc + 16 * subs * g + r0;
            QV_U8 V[8];
            QF(decode)(planes, cp + 4 * r0, V);
            for (int i = 0; i < 4; ++i) {
                const int8_t *xg = a->xq + (i0 + i) * 2 * a->k + 64 * g; /* hi, then lo */
                const int32_t *s = a->xi + (i0 + i) * 4 * gc + 4 * g;
                QF(dots_k)(LO, planes, V, xg, s, p->zero, sg, sg + 16 * (subs - 1), &th[i], &tl[i]);
            }
            if ((g & 7) == 7) {
                const int64_t u = g >> 3;
                QV_F32 d, dm = {0};
                QV_I32 mv[16];
                QF(sk_scales)(p, blk, u, gc / 8, subs, r0, &d, &dm, mv);
                for (int i = 0; i < 4; ++i) {
                    QV_I32 mh = {0}, ml = {0};
                    if (p->mins != NULL) QF(sk_row_mins)(LO, a, i0 + i, u, subs, mv, &mh, &ml);
                    tot[i] = QF(sk_add)(tot[i], th[i], tl[i], d, a->dx[(i0 + i) * gc + g],
                                        p->mins != NULL, dm, mh, ml);
                    th[i] = tl[i] = (QV_I32){0};
                }
            }
        }
        for (int i = 0; i < 4; ++i) QF(store_lanes)(out + i * ldo, &tot[i], rows, r0);
    }
}

#ifdef QMM_AMX
/* One group of a K form decoded for the tiles: P = sc (code - zero) per weight row and value
 * (|P| <= 4096), its low bytes (unsigned) at lo_out and high bytes (signed) at hi_out, 512
 * bytes each laid out as V[t]; sc0, sc1 the sub-scales of the group's first and
 * second 16 values (the same run when sub = 32). Fenced as decode_group. */
PLAIT_INLINE void QF(decode_group_k)(const int planes, const uint8_t *cp, const int8_t *sc0,
                                     const int8_t *sc1, int32_t zero, uint8_t *lo_out,
                                     uint8_t *hi_out) {
    u8x64 V[8], lo[8], hi[8];
    QF(decode)(planes, cp, V);
    const i32x16 s0 = QF(load_i8)(sc0), s1 = QF(load_i8)(sc1);
    const i16x32 w[2] = {QF(pair16)(s0, s0), QF(pair16)(s1, s1)};
    for (int t = 0; t < 8; ++t) {
        const u16x32 v = (u16x32)V[t];
        const u16x32 pe = (u16x32)(((i16x32)(v & 0xff) - (int16_t)zero) * w[t / 4]);
        const u16x32 po = (u16x32)(((i16x32)(v >> 8) - (int16_t)zero) * w[t / 4]);
        lo[t] = (u8x64)((pe & 0xff) | (po << 8));
        hi[t] = (u8x64)((pe >> 8) | (po & 0xff00));
    }
    __asm__ volatile("" : : : "memory");
    memcpy(lo_out, lo, sizeof lo);
    memcpy(hi_out, hi, sizeof hi);
    __asm__ volatile("" : : : "memory");
}

/* Group g of block blk of a K form decoded for the tiles into the 2 KiB of its pair of groups
 * at `pair` (the pair's low bytes, 16 tile rows, then its high bytes), its codes prefetched
 * ahead. */
PLAIT_INLINE void QF(k_group)(const plait_qpart_t *p, int64_t k, int64_t blk, int64_t g,
                              uint8_t *pair) {
    const int64_t gc = k / 32, gbytes = qmm_group_bytes(p->planes), subs = p->sub == 16 ? 2 : 1;
    const uint8_t *cp = p->codes + (blk * gc + g) * gbytes;
    const int8_t *sc = (const int8_t *)p->scales + (blk * gc + g) * subs * 16;
    for (int64_t line = 0; line < gbytes; line += 64) __builtin_prefetch(cp + PF_DIST + line, 0, 3);
    QF(decode_group_k)(p->planes, cp, sc, sc + 16 * (subs - 1), p->zero, pair + 512 * (g & 1),
                       pair + 1024 + 512 * (g & 1));
}

/* Every group of block `blk` of a K form decoded once for all the rows of x: D[2048 q ..] for
 * the pair of groups q. */
static void QF(decode_block_k)(const plait_qpart_t *p, int64_t k, int64_t blk, uint8_t *D) {
    for (int64_t g = 0; g < k / 32; ++g) QF(k_group)(p, k, blk, g, D + 1024 * (g & ~(int64_t)1));
}

/* Rows lo .. hi of the sixteen rows of x from i0: super-block u's four stored tiles (acc: 0, 1
 * hi x the low and high bytes of P, 2, 3 lo x the same) added to their sums in T through
 * sk_add, with the super-block's scales d, dm, mv (sk_scales; `mins`: the part has them). */
PLAIT_INLINE void QF(amx_sk_rows)(const qmm_act_t *a, int64_t i0, int64_t u, int subs, int mins,
                                  f32x16 d, f32x16 dm, const i32x16 *mv, const int32_t *acc,
                                  float *T, int lo, int hi) {
    const float *dx = a->dxt + 16 * (i0 / 16 * (a->k / 32) + 8 * u);
    for (int i = lo; i < hi; ++i) {
        i32x16 v[4], mh = {0}, ml = {0};
        f32x16 tot;
        for (int t = 0; t < 4; ++t) memcpy(&v[t], acc + 256 * t + 16 * i, sizeof v[t]);
        memcpy(&tot, T + 16 * i, sizeof tot);
        if (mins && i0 + i < a->m) QF(sk_row_mins)(1, a, i0 + i, u, subs, mv, &mh, &ml);
        tot = QF(sk_add)(tot, v[0] + v[1] * 256, v[2] + v[3] * 256, d, dx[i], mins, dm, mh, ml);
        memcpy(T + 16 * i, &tot, sizeof tot);
    }
}

/* Sixteen rows of x (from i0) against blocks blk0 .. blk0 + nblk of a K form: per super-block
 * (its 16 rows' x, 8 KiB, stays in L1 while every block takes it), per block, four TDPs per
 * pair of groups (x's hi and lo bytes of 64 values, laid out in pairs by tile_rows, against
 * P's low and high bytes) sum the super-block in tiles 0-3. They are stored once per
 * super-block and block and added to that block's sums in T (256 floats a block) while the
 * next one's first pair multiplies. The pairs come decoded in D (decode_block_k, 32 k bytes a
 * block) or, with `ring`, are decoded here into a ring of two a pair ahead of their use, so
 * the stores land well before the tile loads. */
static void QF(amx16k)(uint8_t *D, const qmm_act_t *a, int64_t i0, const plait_qpart_t *p,
                       int64_t blk0, int64_t nblk, int ring, float *T, float *out, int64_t ldo) {
    const int64_t k = a->k, supers = k / 256, pairs = k / 64;
    const int subs = p->sub == 16 ? 2 : 1, mins = p->mins != NULL;
    const int8_t *x0 = a->xt + i0 * 2 * k;
    int32_t acc[2][1024] __attribute__((aligned(64)));
    f32x16 d = {0}, dm = {0};
    i32x16 mv[16];
    int64_t n = 0, prev = -1, pu = 0; /* n: super-block x block runs so far */
    memset(T, 0, sizeof(float) * 256 * (size_t)nblk);
    if (ring) {
        QF(k_group)(p, k, blk0, 0, D);
        QF(k_group)(p, k, blk0, 1, D);
    }
    for (int64_t u = 0; u < supers; ++u)
        for (int64_t b = 0; b < nblk; ++b, ++n) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t q = 4 * u; q < 4 * u + 4; ++q) {
                const uint8_t *B = D + 32 * k * b + 2048 * q;
                if (ring) { /* decode the next pair (of this block, the next, or the first) */
                    const int64_t nb = q % 4 < 3 ? b : b + 1 < nblk ? b + 1 : 0;
                    const int64_t nq = q % 4 < 3 ? q + 1 : b + 1 < nblk ? 4 * u : q + 1;
                    uint8_t *slot = D + 2048 * ((q + 1) & 1);
                    B = D + 2048 * (q & 1);
                    if (nq < pairs) {
                        QF(k_group)(p, k, blk0 + nb, 2 * nq, slot);
                        QF(k_group)(p, k, blk0 + nb, 2 * nq + 1, slot);
                    }
                }
                const int8_t *xq = x0 + 2048 * q;
                _tile_loadd(6, B, 64);
                _tile_loadd(7, B + 1024, 64);
                _tile_loadd(4, xq, 128);
                _tile_loadd(5, xq + 64, 128);
                _tile_dpbsud(0, 4, 6);
                _tile_dpbssd(1, 4, 7);
                _tile_dpbsud(2, 5, 6);
                _tile_dpbssd(3, 5, 7);
                if (prev >= 0) /* the last run's rows, a quarter after each pair's multiplies */
                    QF(amx_sk_rows)(a, i0, pu, subs, mins, d, dm, mv, acc[(n - 1) & 1],
                                    T + 256 * prev, 4 * (int)(q % 4), 4 * (int)(q % 4) + 4);
            }
            int32_t *st = acc[n & 1];
            _tile_stored(0, st, 64);
            _tile_stored(1, st + 256, 64);
            _tile_stored(2, st + 512, 64);
            _tile_stored(3, st + 768, 64);
            QF(sk_scales)(p, blk0 + b, u, supers, subs, 0, &d, &dm, mv);
            prev = b, pu = u;
        }
    QF(amx_sk_rows)(a, i0, pu, subs, mins, d, dm, mv, acc[(n - 1) & 1], T + 256 * prev, 0, 16);
    for (int64_t b = 0; b < nblk; ++b) {
        const int64_t left = p->n - (blk0 + b) * 16;
        const int rows = left < 16 ? (int)left : 16;
        for (int i = 0; i < 16 && i0 + i < a->m; ++i)
            store_row(out + i * ldo + 16 * b, T + 256 * b + 16 * i, rows);
    }
}
#endif
