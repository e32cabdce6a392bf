/* The super-block path of the quantized matmul on AVX2 (QMM_W 8 with a 16-bit pair dot),
 * included by qmm_tile.h after qmm_ktile.h, whose K-form helpers it uses: for 16 rows of x or
 * more, a block's codes are decoded once per run of eight groups (a K form's super-block) for
 * every row of x, against x + 128 laid out by super-block (qmm_xu). It takes the K forms and
 * the forms with float scales per 32 values whose codes qmm_sb_takes; the others take tile4. */
#if QMM_W == 8 && defined(QMM_DP16)
/* ---- K forms: each super-block decoded once for many rows of x ---------------------------
 * tile4k decodes a group's codes again for every four rows of x and broadcasts x's bytes
 * against registers of codes. Here a super-block of a block (8 groups, both parts of 8 rows)
 * is decoded once into D as signed bytes c - zero, and every row of x takes it, two rows at
 * a time: x + 128 is the unsigned operand of vpmaddubsw, broadcast once for both parts, and
 * the codes its signed operand, read from D once for both rows. sum (x + 128)(c - zero) -
 * 128 sum (c - zero) is tile4k's sum x (c - zero) exactly (the second term, times the
 * sub-scales, starts every row's th and tl: K), so the integers, and the bits, are tile4k's;
 * the zero's term costs nothing per row. */
#define SB_ROWS 128 /* rows of x per pass over a block (their sums: 8 KiB) */

/* Super-block u of block blk: D[((g * 2 + h) * 8 + t) * 32 ..] holds group g's V[t] of part
 * h as c - zero; W[(g * 2 + h) * 2 + j] the sub-scales of half j as int16 pairs (dots_k's
 * weights); K[h] = -128 sum_j sc_j sum(c - zero) over the super-block. The codes four
 * super-blocks on are prefetched into L2 (as qmm_sbv.h's; against the next super-block's into
 * L1, with 16 rows of x over weights streaming from memory on a Zen 4 at AVX2's level: Q4_K
 * 1.17x, Q6_K 1.27x; 1.03x at 64 rows). */
PLAIT_INLINE void QF(sb_decode)(const int planes, const plait_qpart_t *p, int64_t k, int64_t blk,
                                int64_t u, int8_t *D, QV_I16 *W, QV_I32 K[2]) {
    const int64_t gc = k / 32, gbytes = qmm_group_bytes(planes);
    const int subs = p->sub == 16 ? 2 : 1;
    const uint8_t *codes = p->codes + (blk * gc + 8 * u) * gbytes;
    const int8_t *sc = (const int8_t *)p->scales + (blk * gc + 8 * u) * subs * 16;
    const QV_U8 zero = (QV_U8){} + (uint8_t)p->zero, ones = (QV_U8){} + 1;
    for (int64_t line = 0; line < 8 * gbytes; line += 64) /* 4 super-blocks on, into L2 */
        __builtin_prefetch(codes + 32 * gbytes + line, 0, 2);
    K[0] = K[1] = (QV_I32){0};
    for (int g = 0; g < 8; ++g)
        for (int h = 0; h < 2; ++h) {
            QV_U8 V[8];
            QF(decode)(planes, codes + g * gbytes + 4 * QMM_W * h, V);
            for (int j = 0; j < 2; ++j) {
                QV_I16 sums = {0};
                for (int t = 4 * j; t < 4 * j + 4; ++t) {
                    const QV_U8 w = V[t] - zero;
                    memcpy(D + ((g * 2 + h) * 8 + t) * 32, &w, sizeof w);
                    sums += QMM_DP16(ones, (QV_I8)w);
                }
                const QV_I32 sj = QF(load_i8)(sc + 16 * (subs * g + j * (subs - 1)) + QMM_W * h);
                W[(g * 2 + h) * 2 + j] = QF(pair16)(sj, sj);
                K[h] -= 128 * sj * QMM_MADD16((QV_I32){0}, sums, (QV_I16){} + 1);
            }
        }
}

/* Part q (of 2 a block: its rows 8 h .. 8 h + 7 for h = q % 2) of the decoded blocks: its
 * group g's V[t] at D + sb_dq(q) + 512 g + 32 t (and, of one block, half j's sub-scales at
 * W[4 g + 2 h + j]). */
PLAIT_INLINE int sb_dq(int q) { return 4096 * (q / 2) + 256 * (q % 2); }

/* Keeps v in a register here. Left alone, GCC reads each code vector from memory again for
 * the second row of x and keeps the sums and totals on the stack; the loads, not the
 * multiplies, then bound sb_dots22 (against the pairs of blocks with one byte of x: Q4_K
 * 0.71x, Q6_K 0.88x unpinned at 512 rows; 1.03-1.09x, 1.10-1.22x pinned at 16 and 512). */
#define SB_PIN(v) __asm__("" : "+x"(v))

PLAIT_INLINE QV_U8 QF(sb_bcast)(const uint8_t *p) { return (QV_U8)QF(bcast32)(p); }

PLAIT_INLINE QV_I8 QF(sb_code)(const int8_t *p) {
    QV_I8 w;
    memcpy(&w, p, sizeof w);
    SB_PIN(w);
    return w;
}

/* Two rows of x from x0 (their bytes + 128 from the first of G groups, qmm_xu: rows rb apart)
 * against both parts of one decoded block: th[r][q], tl[r][q] for row r and part q, starting
 * at K[q], the sums over the G groups of the pair sums times W (the sub-scales; NULL: ones):
 * dots_k's integers over a super-block, or tile4's over one group (hi, then lo). Each code
 * vector is read once for both rows and each broadcast of x serves both parts; the four sums
 * and four totals stay in registers (SB_PIN). */
PLAIT_INLINE void QF(sb_dots22)(const int LO, const int fold, const int G, const int8_t *D,
                                const QV_I16 *W, const QV_I32 *K, const uint8_t *x0, int64_t rb,
                                QV_I32 th[][4], QV_I32 tl[][4]) {
    const QV_I16 ones = (QV_I16){} + 1;
    const QV_I32 z = {0};
    QV_I32 h00 = K[0], h01 = K[1], h10 = K[0], h11 = K[1];
    QV_I32 l00 = LO ? K[0] : z, l01 = LO ? K[1] : z, l10 = l00, l11 = l01;
    for (int g = 0; g < G; ++g, x0 += 32, D += 512) {
#pragma GCC unroll 2
        for (int j = 0; j < 2; ++j)
#pragma GCC unroll 4
            for (int f = 4 * j; f < 4 * j + 4; f += fold)
#pragma GCC unroll 2
                for (int b = 0; b < 1 + LO; ++b) { /* hi into th, then lo into tl */
                    QV_I16 s00 = {0}, s01 = {0}, s10 = {0}, s11 = {0};
#pragma GCC unroll 4
                    for (int t = f; t < f + fold; ++t) {
                        const QV_I8 w0 = QF(sb_code)(D + 32 * t);
                        const QV_I8 w1 = QF(sb_code)(D + 256 + 32 * t);
                        const QV_U8 xa = QF(sb_bcast)(x0 + 256 * b + 4 * t);
                        s00 += QMM_DP16(xa, w0);
                        s01 += QMM_DP16(xa, w1);
                        const QV_U8 xb = QF(sb_bcast)(x0 + rb + 256 * b + 4 * t);
                        s10 += QMM_DP16(xb, w0);
                        s11 += QMM_DP16(xb, w1);
                        SB_PIN(s00);
                        SB_PIN(s01);
                        SB_PIN(s10);
                        SB_PIN(s11);
                    }
                    const QV_I16 v0 = W ? W[4 * g + j] : ones, v1 = W ? W[2 + 4 * g + j] : ones;
                    QV_I32 *o00 = b ? &l00 : &h00, *o01 = b ? &l01 : &h01;
                    QV_I32 *o10 = b ? &l10 : &h10, *o11 = b ? &l11 : &h11;
                    *o00 = QMM_MADD16(*o00, s00, v0), *o01 = QMM_MADD16(*o01, s01, v1);
                    *o10 = QMM_MADD16(*o10, s10, v0), *o11 = QMM_MADD16(*o11, s11, v1);
                    SB_PIN(*o00);
                    SB_PIN(*o01);
                    SB_PIN(*o10);
                    SB_PIN(*o11);
                }
    }
    th[0][0] = h00, th[0][1] = h01, th[1][0] = h10, th[1][1] = h11;
    tl[0][0] = l00, tl[0][1] = l01, tl[1][0] = l10, tl[1][1] = l11;
}

/* One row of x from x0 against the four parts of two decoded blocks, one group at a time (the
 * float forms' pairs of blocks: sbf_rows_n), as sb_dots22 with W ones: th[q], tl[q] for part q
 * from K[q]. A broadcast of x serves the four parts; the codes are read from D as memory
 * operands (pinning them, or the sums, ran 0.93x here). */
PLAIT_INLINE void QF(sb_dots14)(const int LO, const int fold, const int8_t *D, const QV_I32 *K,
                                const uint8_t *x0, QV_I32 th[4], QV_I32 tl[4]) {
    QV_I32 ah[4], al[4]; /* th, tl in registers */
    const QV_I16 ones = (QV_I16){} + 1;
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) ah[q] = K[q], al[q] = LO ? K[q] : (QV_I32){0};
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j)
#pragma GCC unroll 4
        for (int f = 4 * j; f < 4 * j + 4; f += fold)
#pragma GCC unroll 2
            for (int b = 0; b < 1 + LO; ++b) { /* hi into th, then lo into tl */
                QV_U8 xb[4];
#pragma GCC unroll 4
                for (int t = 0; t < fold; ++t) xb[t] = QF(sb_bcast)(x0 + 256 * b + 4 * (f + t));
#pragma GCC unroll 4
                for (int q = 0; q < 4; ++q) {
                    QV_I16 sum = {0};
#pragma GCC unroll 4
                    for (int t = 0; t < fold; ++t) {
                        QV_I8 w;
                        memcpy(&w, D + sb_dq(q) + 32 * (f + t), sizeof w);
                        sum += QMM_DP16(xb[t], w);
                    }
                    QV_I32 *acc = b ? &al[q] : &ah[q];
                    *acc = QMM_MADD16(*acc, sum, ones);
                }
            }
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) th[q] = ah[q], tl[q] = al[q];
}

/* Super-block u of block blk decoded (sb_decode) with its scales: d, dm and the mins' int16
 * pairs MW per part. */
PLAIT_INLINE void QF(sb_prepare)(const int planes, const plait_qpart_t *p, int64_t k,
                                 int64_t blk, int64_t u, int8_t *D, QV_I16 *W, QV_I32 *K,
                                 QV_F32 *d, QV_F32 *dm, QV_I16 MW[][8]) {
    const int subs = p->sub == 16 ? 2 : 1, runs = p->mins ? 8 * subs : 0;
    QF(sb_decode)(planes, p, k, blk, u, D, W, K);
    for (int h = 0; h < 2; ++h) {
        QV_I32 mv[16];
        QF(sk_scales)(p, blk, u, k / 256, subs, QMM_W * h, &d[h], &dm[h], mv);
        for (int c = 0; c < runs / 2; ++c)
            MW[h][c] = QF(pair16)(mv[2 * c], mv[2 * c + 1]);
    }
}

/* A pass's totals (T: row c0 + r's part q at r * 2 NB + q) stored: block b's at out + 16 b,
 * the last block's first `rows`. */
PLAIT_INLINE void QF(sb_store)(const int NB, const QV_F32 *T, int64_t c0, int64_t c1, float *out,
                               int64_t ldo, int rows) {
    for (int64_t row = c0; row < c1; ++row)
        for (int q = 0; q < 2 * NB; ++q)
            QF(store_lanes)(out + row * ldo + 16 * (q / 2), &T[(row - c0) * 2 * NB + q],
                            q / 2 < NB - 1 ? 16 : rows, QMM_W * (q % 2));
}

/* Rows i0 .. i1 (an even count) of x against block blk (its first `rows` outputs at out) of a
 * K form whose codes qmm_sb_fits: in passes of at most SB_ROWS rows (split evenly, so no short
 * pass decodes the block again for a few rows), per super-block, decoded once (sb_prepare) for
 * every row of the pass; two rows at a time (sb_dots22), each row's sums added as tile4k's
 * (sk_add), in the same order. */
PLAIT_INLINE void QF(sb_rows_n)(const int LO, const int planes, const plait_qpart_t *p,
                                const qmm_act_t *a, int64_t i0, int64_t i1, int64_t blk,
                                float *out, int64_t ldo, int rows) {
    const int fold = qmm_sb_fold(planes);
    const int64_t k = a->k, gc = k / 32, supers = gc / 8;
    const int subs = p->sub == 16 ? 2 : 1, runs = p->mins ? 8 * subs : 0;
    int8_t D[4096] __attribute__((aligned(64)));
    QV_I16 W[32], MW[2][8];
    QV_I32 K[2];
    QV_F32 T[SB_ROWS * 2], d[2], dm[2] = {{0}}; /* T: row r's part q at 2 r + q */
    const int64_t step = qmm_pass(i0, i1, SB_ROWS);
    for (int64_t c0 = i0; c0 < i1; c0 += step) {
        const int64_t c1 = c0 + step < i1 ? c0 + step : i1;
        for (int64_t u = 0; u < supers; ++u) {
            QF(sb_prepare)(planes, p, k, blk, u, D, W, K, d, dm, MW);
            for (int64_t i = c0; i < c1; i += 2) {
                QV_I32 th[2][4], tl[2][4];
                QF(sb_dots22)(LO, fold, 8, D, W, K, qmm_xu(a, i, u), qmm_xu_bytes(LO), th, tl);
                for (int r = 0; r < 2; ++r) {
                    const int64_t row = i + r;
                    QV_I32 mh[4], ml[4];
                    const int16_t *sh = qmm_runs(a, row, 32 / subs, 0) + runs * u;
                    QF(run_dots)(2, runs / 2, (const QV_I16(*)[8])MW, sh,
                                 LO ? qmm_runs(a, row, 32 / subs, 1) + runs * u : NULL, mh, ml);
                    for (int q = 0; q < 2; ++q) {
                        QV_F32 *t = &T[(row - c0) * 2 + q];
                        *t = QF(sk_add)(u ? *t : (QV_F32){0}, th[r][q], tl[r][q], d[q],
                                        a->dx[row * gc + 8 * u + 7], runs > 0, dm[q], mh[q], ml[q]);
                    }
                }
            }
        }
        QF(sb_store)(1, T, c0, c1, out, ldo, rows);
    }
}

/* ---- Forms with float scales per 32 values: the same, a group at a time ---------------------
 * tile4 sums x against the codes as they are (the zero folded into its offsets Z) and adds
 * each group to a row's total in fp32. Here a run of up to eight groups of a block is decoded
 * once into D (sb_decode's layout, the codes as they are) and every row of x takes it: per
 * group, sum (x + 128) c - 128 sum c (K) is tile4's integer, and the group is added to the
 * total as tile4 adds it, in the same order, so the bits are tile4's. */

/* Groups 8 u .. 8 u + ng of NB blocks from blk decoded for sb_dots22 (one block) or
 * sb_dots14 (two): D as sb_decode's, and
 * K[2 NB g + q] = -128 sum c over part q's group g. */
PLAIT_INLINE void QF(sbf_decode)(const int planes, const int NB, const plait_qpart_t *p,
                                 int64_t k, int64_t blk, int64_t u, int ng, int8_t *D,
                                 QV_I32 *K) {
    const int64_t gc = k / 32, gbytes = qmm_group_bytes(planes);
    const QV_U8 ones = (QV_U8){} + 1;
    for (int b = 0; b < NB; ++b) {
        const uint8_t *codes = p->codes + ((blk + b) * gc + 8 * u) * gbytes;
        for (int64_t line = 0; line < ng * gbytes; line += 64)
            __builtin_prefetch(codes + 8 * gbytes + line, 0, 3);
        for (int g = 0; g < ng; ++g)
            for (int h = 0; h < 2; ++h) {
                QV_U8 V[8];
                QF(decode)(planes, codes + g * gbytes + 4 * QMM_W * h, V);
                QV_I16 sums = {0};
                for (int t = 0; t < 8; ++t) {
                    memcpy(D + 4096 * b + ((g * 2 + h) * 8 + t) * 32, &V[t], sizeof V[t]);
                    sums += QMM_DP16(ones, (QV_I8)V[t]);
                }
                K[2 * NB * g + 2 * b + h] = -128 * QMM_MADD16((QV_I32){0}, sums, (QV_I16){} + 1);
            }
    }
}

/* One row of x's group `at` (its sums th, tl against the NB blocks' 2 NB parts) added to tot
 * as tile4 adds it: S, Z the first block's scales and offsets (block_scales), bs floats from
 * one block's to the next's. */
PLAIT_INLINE void QF(sbf_add)(const int NB, const qmm_act_t *a, int64_t row, int64_t at,
                              const float *S, const float *Z, int64_t bs, const QV_I32 *th,
                              const QV_I32 *tl, QV_F32 *tot) {
    const int64_t gc = a->k / 32;
    const float dx = a->dx[row * gc + at], *xs = a->xs + row * 2 * gc + 2 * at;
    for (int q = 0; q < 2 * NB; ++q) {
        const int64_t s = bs * (q / 2) + 16 * at + QMM_W * (q % 2);
        const QV_F32 sv = QF(load_f32)(S + s), zv = QF(load_f32)(Z + s);
        QV_F32 f = __builtin_convertvector((th[q] << 8) + tl[q], QV_F32);
        tot[q] += f * (sv * dx);
        tot[q] += zv * (xs[0] + xs[1]);
    }
}

/* Rows i0 .. i1 of x against NB blocks from blk of a form with float scales (S, Z, bs as
 * sbf_add's) whose codes qmm_sb_takes, as sb_rows_n: in passes, per run of eight groups (the
 * last may be short), decoded once (sbf_decode) for every row of the pass; per group,
 * sb_dots22 (one block, two rows at a time) or sb_dots14 (two blocks, a row at a time) over it
 * and sbf_add. */
PLAIT_INLINE void QF(sbf_rows_n)(const int LO, const int planes, const int NB,
                                 const plait_qpart_t *p, const qmm_act_t *a, int64_t i0,
                                 int64_t i1, int64_t blk, const float *S, const float *Z,
                                 int64_t bs, float *out, int64_t ldo, int rows) {
    enum { P = 2 * 2, R = 2 };
    const int np = 2 * NB, nr = 4 / np, fold = qmm_sb_fold(planes);
    const int64_t k = a->k, gc = k / 32, runs = (gc + 7) / 8;
    int8_t D[2 * 4096] __attribute__((aligned(64)));
    QV_I32 K[8 * P];
    QV_F32 T[SB_ROWS * P]; /* row r's part q at r * np + q */
    const int64_t step = qmm_pass(i0, i1, SB_ROWS);
    for (int64_t c0 = i0; c0 < i1; c0 += step) {
        const int64_t c1 = c0 + step < i1 ? c0 + step : i1;
        for (int64_t u = 0; u < runs; ++u) {
            const int ng = gc - 8 * u < 8 ? (int)(gc - 8 * u) : 8;
            QF(sbf_decode)(planes, NB, p, k, blk, u, ng, D, K);
            for (int64_t i = c0; i < c1; i += nr) {
                QV_F32 tot[R][4];
                for (int r = 0; r < nr; ++r)
                    for (int q = 0; q < np; ++q)
                        tot[r][q] = u ? T[(i + r - c0) * np + q] : (QV_F32){0};
                const uint8_t *xu = qmm_xu(a, i, u);
                for (int g = 0; g < ng; ++g) {
                    QV_I32 th[R][4], tl[R][4];
                    if (NB == 1)
                        QF(sb_dots22)(LO, fold, 1, D + 512 * g, NULL, K + np * g, xu + 32 * g,
                                      qmm_xu_bytes(LO), th, tl);
                    else
                        QF(sb_dots14)(LO, fold, D + 512 * g, K + np * g, xu + 32 * g, th[0], tl[0]);
                    for (int r = 0; r < nr; ++r)
                        QF(sbf_add)(NB, a, i + r, 8 * u + g, S, Z, bs, th[r], tl[r], tot[r]);
                }
                for (int r = 0; r < nr; ++r)
                    for (int q = 0; q < np; ++q) T[(i + r - c0) * np + q] = tot[r][q];
            }
        }
        QF(sb_store)(NB, T, c0, c1, out, ldo, rows);
    }
}

/* Rows i0 .. i1 of x against nb blocks from blk: sb_rows_n (K forms, one block, an even count
 * of rows: qmm_sb_blocks is 1 for them) or sbf_rows_n (S, Z, bs theirs; one block, an even
 * count, or two, any count). */
PLAIT_INLINE void QF(sb_rows)(const int LO, const int planes, int nb, const plait_qpart_t *p,
                              const qmm_act_t *a, int64_t i0, int64_t i1, int64_t blk,
                              const float *S, const float *Z, int64_t bs, float *out,
                              int64_t ldo, int rows) {
    if (p->scale_form == QMM_SK)
        QF(sb_rows_n)(LO, planes, p, a, i0, i1, blk, out, ldo, rows);
    else if (nb == 2)
        QF(sbf_rows_n)(LO, planes, 2, p, a, i0, i1, blk, S, Z, bs, out, ldo, rows);
    else
        QF(sbf_rows_n)(LO, planes, 1, p, a, i0, i1, blk, S, Z, bs, out, ldo, rows);
}
#undef SB_ROWS
#undef SB_PIN
#endif
