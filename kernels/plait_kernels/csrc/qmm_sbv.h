/* The super-block path of the quantized matmul with AVX-512 VNNI (QMM_W 16, QMM_SBV), included
 * by qmm_tile.h after qmm_ktile.h, whose K-form helpers it uses: for qmm_sbv_min rows of x or
 * more of a K form, a super-block of a block (8 groups, its 16 rows) is decoded once into D
 * and every row of x takes it, QMM_SBV_R rows at a time (half as many with lo bytes) against
 * x laid out by super-block (qmm_xu; signed, but where ux). Per vector of codes (16 rows x 4
 * values) each row's vpdpbusd takes four of its bytes as a broadcast memory operand; a sub-block's
 * int32 sums times its sub-scales (vpmulld) add up th and tl. The zero's share,
 * zero sum_s S[s] sum(x over s), is one row's run sums against int16 pairs (vpdpwssd), as are
 * the mins where a part has them (a K form with mins has zero 0), so th, tl and the mins' mh,
 * ml are tile4k's integers exactly, and sk_add makes the same bits. Where the call has x + 128
 * (ux: Q6_K, Q3_K, sbv_unsigned) the roles turn: x's bytes are the unsigned operand (broadcast
 * into a register), the codes less the zero the signed one, and the zero's share becomes x +
 * 128's excess, 128 sum_s S[s] sum(code - zero over s), the same for every row (C, made with the
 * decode): the same integers again, without a row's eight pair dots per super-block (Q6_K
 * 1.09x at 16 rows, 1.11x at 128). Where tile4k decodes a
 * group again for every four rows of x and widens its sums per group, here the decode is paid
 * once a pass and a vector of codes serves QMM_SBV_R rows with one instruction each. */
#if QMM_W == 16 && defined(QMM_SBV)
#define SBV_ROWS 128 /* rows of x per pass over a block (their totals: 8 KiB); even (qmm_pass) */
/* Keeps v in a register (any of the 32): left alone, GCC kept the rows' sums on the stack. */
#define SBV_PIN(v) __asm__("" : "+v"(v))

/* acc + the 4-way dots of the codes w (unsigned) and four bytes of x at p (signed), broadcast:
 * vpdpbusd with a broadcast memory operand (GCC, given the broadcast, loads it apart). */
PLAIT_INLINE QV_I32 QF(sbv_dp)(QV_I32 acc, QV_U8 w, const int8_t *p) {
    __asm__("vpdpbusd %[x]%{1to16%}, %[w], %[acc]"
            : [acc] "+v"(acc)
            : [w] "v"(w), [x] "m"(*(const int32_t *)p));
    return acc;
}

/* acc + the 4-way dots of four bytes of x at p (unsigned, x + 128: ux), broadcast, and the
 * codes less the zero w (signed). */
PLAIT_INLINE QV_I32 QF(sbv_dpu)(QV_I32 acc, QV_U8 w, const uint8_t *p) {
    QV_I32 xb;
    __asm__("vpbroadcastd %[x], %[xb]\n\tvpdpbusd %[w], %[xb], %[acc]"
            : [acc] "+v"(acc), [xb] "=&v"(xb)
            : [w] "v"(w), [x] "m"(*(const int32_t *)p));
    return acc;
}

/* Super-block u of block blk decoded: D[64 (8 g + t) ..] holds group g's V[t] (the codes as
 * they are; UX: less the zero, signed, and C the excess sbv_step takes from each row's sums),
 * S[s] the sub-scales of its sub-block s (of 8 subs, each 32 / subs values: V[t] for t in s
 * (8 / subs) ..), and O[c] int16 pairs of runs 2 c, 2 c + 1 (runs: the sub-blocks)
 * for each row's offsets (run_dots): the mins where the part has them, else zero * S (a
 * K form with mins has zero 0). The codes four super-blocks on are prefetched into L2: with
 * the weights streaming from memory (16 rows of x, Q4_K / Q6_K), into L1 the next
 * super-block's ran at 0.78x / 0.74x, into L2 at two to eight super-blocks on alike. */
PLAIT_INLINE void QF(sbv_decode)(const int UX, const int planes, const int subs,
                                 const plait_qpart_t *p, int64_t k, int64_t blk, int64_t u,
                                 uint8_t *D, QV_I32 *S, QV_I16 *O, QV_I32 *C) {
    const int64_t gc = k / 32, gbytes = qmm_group_bytes(planes), supers = k / 256;
    const uint8_t *codes = p->codes + (blk * gc + 8 * u) * gbytes;
    const int8_t *sc = (const int8_t *)p->scales + (blk * gc + 8 * u) * subs * 16;
    const int8_t *mn = p->mins ? (const int8_t *)p->mins + (blk * supers + u) * 128 * subs : NULL;
    for (int64_t line = 0; line < 8 * gbytes; line += 64) /* 4 super-blocks ahead, into L2 */
        __builtin_prefetch(codes + 32 * gbytes + line, 0, 2);
    for (int g = 0; g < 8; ++g) {
        QV_U8 V[8];
        QF(decode)(planes, codes + g * gbytes, V);
        for (int t = 0; t < 8 && UX; ++t) V[t] -= (uint8_t)p->zero; /* signed: code - zero */
        memcpy(D + 512 * g, V, sizeof V);
    }
    for (int s = 0; s < 8 * subs; ++s) S[s] = QF(load_i8)(sc + 16 * s);
    if (UX) { /* 128 sum_s S[s] sum(code - zero over s): x + 128's excess */
        const QV_U8 ones = (QV_U8){} + 1;
        QV_I32 c = {0};
        for (int s = 0; s < 8 * subs; ++s) {
            QV_I32 z = {0};
            for (int t = 8 / subs * s; t < 8 / subs * (s + 1); ++t) {
                QV_U8 w;
                memcpy(&w, D + 64 * t, sizeof w);
                z = QMM_DP(z, ones, (QV_I8)w);
            }
            c += S[s] * z;
        }
        *C = c * 128;
        return;
    }
    for (int c = 0; c < 4 * subs; ++c) {
        const QV_I32 a = mn ? QF(load_i8)(mn + 32 * c) : S[2 * c] * p->zero;
        const QV_I32 b = mn ? QF(load_i8)(mn + 32 * c + 16) : S[2 * c + 1] * p->zero;
        O[c] = QF(pair16)(a, b);
    }
}

/* R rows of x from x0 (their 256 hi bytes, then with LO 256 lo bytes; rows rb apart: qmm_xu)
 * against a decoded super-block: th[r], tl[r], each sub-block's dots times its sub-scales. A
 * vector of codes is loaded once for the R rows, and each takes four bytes of x broadcast
 * (vpdpbusd's memory operand). */
PLAIT_INLINE void QF(sbv_dots)(const int UX, const int LO, const int R, const int subs,
                               const uint8_t *D, const QV_I32 *S, const int8_t *x0, int64_t rb,
                               QV_I32 *th, QV_I32 *tl) {
    const int per = 8 / subs;
    QV_I32 h[QMM_SBV_R], l[QMM_SBV_R]; /* R <= QMM_SBV_R (no VLA: GCC keeps those in memory) */
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) h[r] = l[r] = (QV_I32){0};
    for (int s = 0; s < 8 * subs; ++s) {
        QV_I32 ah[QMM_SBV_R], al[QMM_SBV_R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) ah[r] = al[r] = (QV_I32){0};
#pragma GCC unroll 8
        for (int t = per * s; t < per * s + per; ++t) {
            QV_U8 w;
            memcpy(&w, D + 64 * t, sizeof w);
            SBV_PIN(w);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const int8_t *xr = x0 + r * rb + 4 * t;
                ah[r] = UX ? QF(sbv_dpu)(ah[r], w, (const uint8_t *)xr) : QF(sbv_dp)(ah[r], w, xr);
                SBV_PIN(ah[r]);
                if (!LO) continue;
                al[r] = UX ? QF(sbv_dpu)(al[r], w, (const uint8_t *)xr + 256)
                           : QF(sbv_dp)(al[r], w, xr + 256);
                SBV_PIN(al[r]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            h[r] += S[s] * ah[r];
            SBV_PIN(h[r]);
            if (!LO) continue;
            l[r] += S[s] * al[r];
            SBV_PIN(l[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) th[r] = h[r], tl[r] = l[r];
}

/* R rows of x from row i against super-block u (decoded: D, S, O; scales d, dm from
 * sk_scales) added to their totals T (row i + r at T[i - c0 + r]) as tile4k adds them
 * (sk_add). */
PLAIT_INLINE void QF(sbv_step)(const int UX, const int LO, const int R, const int subs,
                               const qmm_act_t *a, int64_t i, int64_t c0, int64_t u,
                               const uint8_t *D, const QV_I32 *S, const QV_I16 *O, QV_I32 C,
                               QV_F32 d, QV_F32 dm, int mins, QV_F32 *T) {
    const int64_t gc = a->k / 32, runs = 8 * subs;
    QV_I32 th[QMM_SBV_R], tl[QMM_SBV_R];
    QF(sbv_dots)(UX, LO, R, subs, D, S, (const int8_t *)qmm_xu(a, i, u), qmm_xu_bytes(LO), th,
                 tl);
    for (int r = 0; r < R; ++r) {
        const int64_t row = i + r;
        QV_I32 oh = {0}, ol = {0}, none = {0};
        if (UX) { /* the zero's share is in C, the same for every row (no mins) */
            th[r] -= C;
            if (LO) tl[r] -= C;
        } else {
            const int16_t *sh = qmm_runs(a, row, 32 / subs, 0) + runs * u;
            const int16_t *sl = LO ? qmm_runs(a, row, 32 / subs, 1) + runs * u : NULL;
            QF(run_dots)(1, 4 * subs, (const QV_I16(*)[8])O, sh, sl, &oh, &ol);
            if (!mins) th[r] -= oh, tl[r] -= ol; /* the zero's share */
        }
        QV_F32 *t = &T[row - c0];
        *t = QF(sk_add)(u ? *t : (QV_F32){0}, th[r], tl[r], d, a->dx[row * gc + 8 * u], mins,
                        dm, mins ? oh : none, mins ? ol : none);
    }
}

/* Rows i0 .. i1 of x against block blk (its first `rows` outputs at out) of a K form: in
 * passes of at most SBV_ROWS rows (split evenly: qmm_pass), per super-block, decoded once
 * (sbv_decode) for every row of the pass; R rows at a time (QMM_SBV_R, half with lo bytes),
 * then at most one step of R / 2, then one at a time. */
PLAIT_INLINE void QF(sbv_rows_n)(const int UX, const int LO, const int planes, const int subs,
                                 const plait_qpart_t *p, const qmm_act_t *a, int64_t i0,
                                 int64_t i1, int64_t blk, float *out, int64_t ldo, int rows) {
    const int R = LO ? QMM_SBV_R / 2 : QMM_SBV_R; /* with lo, twice the sums a row */
    const int64_t k = a->k, supers = k / 256, step = qmm_pass(i0, i1, SBV_ROWS);
    const int mins = p->mins != NULL;
    uint8_t D[4096] __attribute__((aligned(64)));
    QV_I32 S[16];
    QV_I16 O[8];
    QV_F32 T[SBV_ROWS], d, dm = {0};
    QV_I32 C = {0};
    for (int64_t c0 = i0; c0 < i1; c0 += step) {
        const int64_t c1 = c0 + step < i1 ? c0 + step : i1;
        for (int64_t u = 0; u < supers; ++u) {
            QF(sbv_decode)(UX, planes, subs, p, k, blk, u, D, S, O, &C);
            QF(sk_scales)(p, blk, u, supers, subs, 0, &d, &dm, NULL);
            int64_t i = c0;
            for (; i + R <= c1; i += R)
                QF(sbv_step)(UX, LO, R, subs, a, i, c0, u, D, S, O, C, d, dm, mins, T);
            for (; i + R / 2 <= c1; i += R / 2)
                QF(sbv_step)(UX, LO, R / 2, subs, a, i, c0, u, D, S, O, C, d, dm, mins, T);
            for (; i < c1; ++i)
                QF(sbv_step)(UX, LO, 1, subs, a, i, c0, u, D, S, O, C, d, dm, mins, T);
        }
        for (int64_t row = c0; row < c1; ++row)
            QF(store_lanes)(out + row * ldo, &T[row - c0], rows, 0);
    }
}

/* Rows i0 .. i1 of x against block blk of a K form qmm_sbv_takes (sbv_rows_n, its sub-blocks'
 * count a constant). */
PLAIT_INLINE void QF(sbv_rows)(const int LO, const int planes, const plait_qpart_t *p,
                               const qmm_act_t *a, int64_t i0, int64_t i1, int64_t blk,
                               float *out, int64_t ldo, int rows) {
    /* x + 128 (planes a constant: the rest build none); with ux every part this path takes is
     * qmm_sbv_ux's (sbv_unsigned), so none runs the signed form against it */
    if (a->ux && qmm_sbv_ux(planes, p))
        QF(sbv_rows_n)(1, LO, planes, 2, p, a, i0, i1, blk, out, ldo, rows);
    else if (p->sub == 16)
        QF(sbv_rows_n)(0, LO, planes, 2, p, a, i0, i1, blk, out, ldo, rows);
    else
        QF(sbv_rows_n)(0, LO, planes, 1, p, a, i0, i1, blk, out, ldo, rows);
}
#undef SBV_ROWS
#undef SBV_PIN
#endif
