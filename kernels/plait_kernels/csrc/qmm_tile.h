/* The quantized matmul's inner loops, compiled once per instruction set: quant_matmul_cpu.c
 * includes this file under `#pragma GCC target(...)` with QMM_SFX (a name suffix), QMM_W (the
 * vectors' lanes, 16 or 8: below), QMM_DP (acc += 4-way dot of u8 codes and s8 x per 32-bit
 * lane), QMM_LUT (16-entry byte table), QMM_CVTPH (QMM_W fp16 -> floats) and QMM_CVTI8
 * (QMM_W int8 -> floats) defined, and optionally QMM_DP16 and QMM_MADD16 (a 16-bit pair dot,
 * `dots`), QMM_DPS (its signed form, `dots_signed`) and QMM_I8I32 (int8 -> int32 lanes). The
 * vectors are GCC vector types, so one text serves AVX-512 (one register each), AVX2 (eight
 * rows a vector) and plain C.
 *
 * Native layout of a part, per block of 16 rows and group of 32 values along k (k0 = 32 g):
 * the group's code planes, GROUP_BYTES(planes) bytes, decoded into eight vectors V[t] whose
 * 32-bit lane r holds the codes of row r (of the block's rows r0 .. r0 + QMM_W) at
 * k0 + 4t .. k0 + 4t + 3 (byte order):
 *   P4   4 chunks of 64 bytes; byte 4r + b of chunk c: low nibble k0 + 8c + b, high nibble
 *        k0 + 8c + 4 + b (codes 0..15). IQ4: the same nibbles index the IQ4_NL codebook,
 *        stored + 128.
 *   P8   8 chunks; byte 4r + b of chunk t: k0 + 4t + b (codes 0..255).
 *   P2   2 chunks; bits 2j, 2j + 1 of byte 4r + b of chunk c: k0 + 16c + 4j + b (0..3).
 *   H1   after P4 (P2): 64 bytes; bit t of byte 4r + b is bit 4 (bit 2) of V[t]'s byte.
 *   H2   after P4: 2 x 64 bytes; bits 2(t % 4), +1 of byte 4r + b of chunk t / 4 are bits 4, 5.
 * A weight value is s * (code - zero) + m, with per 16 rows and `sub` values (16 or 32) a
 * scale s and, where the part has them, a min m: fp16 or fp32 values (SF16, SF32), or int8
 * sub-scales times fp16 super-block scales per 256 values (SK: s = d * sc, m = -dmin * mn,
 * llama.cpp's K-quants). */

#define QMM_CAT_(a, b) a##b
#define QMM_CAT(a, b) QMM_CAT_(a, b)
#define QF(name) QMM_CAT(name, QMM_SFX)

/* The vectors of the paths below hold QMM_W of a block's 16 rows (one per 32-bit lane): 16
 * where the ISA has 64-byte registers (and in plain C), 8 on AVX2, where a 64-byte vector
 * has no register and GCC keeps it in memory. Such a path runs a block as QMM_HALVES parts of
 * QMM_W rows from row r0: a part's codes are bytes 4 r0 .. 4 (r0 + QMM_W) of every 64-byte
 * chunk, its scales and outputs those of its rows. Every lane computes what it would in a
 * 16-lane vector, so the width changes no bit. */
#if QMM_W == 8
#define QV_U8 u8x32
#define QV_I8 i8x32
#define QV_U16 u16x16
#define QV_I16 i16x16
#define QV_I32 i32x8
#define QV_F32 f32x8
#define QV_I8N i8x8
#elif QMM_W == 16
#define QV_U8 u8x64
#define QV_I8 i8x64
#define QV_U16 u16x32
#define QV_I16 i16x32
#define QV_I32 i32x16
#define QV_F32 f32x16
#define QV_I8N i8x16
#else
#error "QMM_W must be 8 or 16"
#endif
#define QMM_HALVES (16 / QMM_W)

PLAIT_INLINE QV_U8 QF(loadv)(const uint8_t *p) {
    QV_U8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

PLAIT_INLINE QV_U16 QF(loadvw)(const uint8_t *p) {
    QV_U16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* One group's codes: V[t] for t = 0..7 (see the layout above), of the QMM_W rows whose bytes
 * start at cp (the group's codes + 4 r0). */
PLAIT_INLINE void QF(decode)(const int planes, const uint8_t *cp, QV_U8 V[8]) {
    const QV_U16 m4 = (QV_U16){} + 0x0f0f, m3 = (QV_U16){} + 0x0303, m1 = (QV_U16){} + 0x0101;
    if (planes == QMM_P8) {
        for (int t = 0; t < 8; ++t) V[t] = QF(loadv)(cp + 64 * t);
        return;
    }
    if (planes == QMM_P2 || planes == QMM_P2H1) {
        for (int c = 0; c < 2; ++c) {
            QV_U16 v = QF(loadvw)(cp + 64 * c);
            for (int j = 0; j < 4; ++j) V[4 * c + j] = (QV_U8)((v >> (2 * j)) & m3);
        }
        if (planes == QMM_P2H1) {
            QV_U16 h = QF(loadvw)(cp + 128);
            for (int t = 0; t < 8; ++t) V[t] |= (QV_U8)(((h >> t) & m1) << 2);
        }
        return;
    }
    for (int c = 0; c < 4; ++c) {
        QV_U16 v = QF(loadvw)(cp + 64 * c);
        V[2 * c] = (QV_U8)(v & m4);
        V[2 * c + 1] = (QV_U8)((v >> 4) & m4);
    }
    if (planes == QMM_P4H1) {
        QV_U16 h = QF(loadvw)(cp + 256);
        for (int t = 0; t < 8; ++t) V[t] |= (QV_U8)(((h >> t) & m1) << 4);
    } else if (planes == QMM_P4H2) {
        QV_U16 h[2] = {QF(loadvw)(cp + 256), QF(loadvw)(cp + 320)};
        for (int t = 0; t < 8; ++t) V[t] |= (QV_U8)(((h[t >> 2] >> (2 * (t & 3))) & m3) << 4);
    } else if (planes == QMM_IQ4) {
        for (int t = 0; t < 8; ++t) V[t] = QMM_LUT(V[t]);
    }
}

PLAIT_INLINE QV_F32 QF(load_f32)(const void *p) {
    QV_F32 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* A part's outputs of one row of x: lanes from r0 of the block's first `rows` (a part's last
 * block may be short), at out[r0 ..]. The constant size of a whole part's lets the compiler
 * store a vector where a call to memcpy would cost as much as summing a short row. */
PLAIT_INLINE void QF(store_lanes)(float *out, const QV_F32 *v, int rows, int r0) {
    const int n = rows - r0;
    if (n >= QMM_W)
        memcpy(out + r0, v, sizeof(float) * QMM_W);
    else if (n > 0)
        memcpy(out + r0, v, sizeof(float) * (size_t)n);
}

/* A row of x's hi and lo bytes at k0 + 4t .. k0 + 4t + 3 of a group (xg: 32 bytes hi, then
 * 32 lo), each four broadcast to every lane, as the dots take them against V[t]. */
PLAIT_INLINE void QF(x_bytes)(const int8_t *xg, int t, QV_I8 *hi, QV_I8 *lo) {
    int32_t h, l;
    memcpy(&h, xg + 4 * t, sizeof h);
    memcpy(&l, xg + 32 + 4 * t, sizeof l);
    *hi = (QV_I8)((QV_I32){} + h);
    *lo = (QV_I8)((QV_I32){} + l);
}

#ifdef QMM_DP16
/* Half j of a group (its V[4j .. 4j + 4), 16 values) against one row of x's hi and lo bytes
 * through the 16-bit pair dot: `fold` V[t]'s pair sums add in int16, then QMM_MADD16 adds them
 * times the int16 weights w (ones, or a K form's sub-scales in both halves of a lane) to *h
 * and *l. Exact while qmm_fold(planes) bounds the int16 sums (qmm_fold). LO: x has lo bytes
 * (with one byte, LO = 0, its lo bytes are zeros and their products are skipped: *l is left
 * as it is, as adding their zeros would leave it). */
PLAIT_INLINE void QF(dots16)(const int LO, const int fold, const QV_U8 V[8], const int8_t *xg,
                             int j, QV_I16 w, QV_I32 *h, QV_I32 *l) {
    QV_I16 sh = {0}, sl = {0};
#pragma GCC unroll 4
    for (int t = 4 * j; t < 4 * j + 4; ++t) {
        QV_I8 hi, lo;
        QF(x_bytes)(xg, t, &hi, &lo);
        sh += QMM_DP16(V[t], hi);
        if (LO) sl += QMM_DP16(V[t], lo);
        if ((t + 1) % fold == 0) {
            *h = QMM_MADD16(*h, sh, w);
            if (LO) *l = QMM_MADD16(*l, sl, w);
            sh = sl = (QV_I16){0};
        }
    }
}
#endif

#ifdef QMM_DPS
/* A group whose codes reach 255 (fold 0: P8, IQ4) against one row of x through the signed
 * 16-bit pair dot: QMM_DPS(V, xb) sums pairs of (code - 128) xb in int16 (AVX2: vpmaddubsw of
 * |code - 128| and xb with the sign of code - 128, vpsignb; a pair is within 2 * 128 * 127,
 * as neither of x's bytes is -128), each widened alone (QMM_MADD16 against ones); then
 * 128 sum(x) of each 16 (s: the row's sums of hi and lo, xi) gives the codes' sums. */
PLAIT_INLINE void QF(dots_signed)(const int LO, const QV_U8 V[8], const int8_t *xg,
                                  const int32_t *s, QV_I32 h[2], QV_I32 l[2]) {
    const QV_I16 one = (QV_I16){} + 1;
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
        QV_I8 hi, lo;
        QF(x_bytes)(xg, t, &hi, &lo);
        h[t / 4] = QMM_MADD16(h[t / 4], QMM_DPS(V[t], hi), one);
        if (LO) l[t / 4] = QMM_MADD16(l[t / 4], QMM_DPS(V[t], lo), one);
    }
    for (int j = 0; j < 2; ++j) {
        h[j] += 128 * s[2 * j];
        if (LO) l[j] += 128 * s[2 * j + 1];
    }
}
#endif

/* One row of x's dots with a decoded group (x's group: 32 bytes hi, then 32 lo; s: the row's
 * sums of hi and lo of each 16, xi): h[0], l[0] the sums of hi and lo over its first 16
 * values, h[1], l[1] over its second 16, exact. Where the ISA has a 16-bit pair dot (QMM_DP16,
 * u8 x s8 pairs summed in int16 lanes, and QMM_MADD16, int16 pairs times int16 weights added
 * to int32 lanes: AVX2's vpmaddubsw and vpmaddwd) and the codes are small enough (qmm_fold),
 * qmm_fold(planes) V[t]'s pair sums add in int16 before one widening; larger codes take the
 * signed pair dot where there is one (dots_signed): the same integers in fewer instructions.
 * LO = 0 (x in one byte): l stays 0, its products skipped. */
PLAIT_INLINE void QF(dots)(const int LO, const int planes, const QV_U8 V[8], const int8_t *xg,
                           const int32_t *s, QV_I32 h[2], QV_I32 l[2]) {
    h[0] = h[1] = l[0] = l[1] = (QV_I32){0};
#ifdef QMM_DP16
    const int fold = qmm_fold(planes);
    if (fold > 0) {
        QF(dots16)(LO, fold, V, xg, 0, (QV_I16){} + 1, &h[0], &l[0]);
        QF(dots16)(LO, fold, V, xg, 1, (QV_I16){} + 1, &h[1], &l[1]);
        return;
    }
#endif
#ifdef QMM_DPS
    QF(dots_signed)(LO, V, xg, s, h, l);
    return;
#endif
    (void)planes;
    (void)s;
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
        QV_I8 hi, lo;
        QF(x_bytes)(xg, t, &hi, &lo);
        h[t / 4] = QMM_DP(h[t / 4], V[t], hi);
        if (LO) l[t / 4] = QMM_DP(l[t / 4], V[t], lo);
    }
}

/* The scale s and the offset z = m - zero * s of the QMM_W rows from r0 of block `blk` for its
 * `at`-th run of `sub` values along k; a K form's super-block scales d and dmin are read at
 * each super-block's first run and kept in *d, *dmin for the runs after it. */
PLAIT_INLINE void QF(run_scales)(const plait_qpart_t *p, int64_t k, int64_t blk, const int subs,
                                 int64_t at, int r0, QV_F32 *d, QV_F32 *dmin, QV_F32 *s,
                                 QV_F32 *z) {
    const int64_t n = k / 32 * subs, supers = k / 256, super = at >> (subs == 2 ? 4 : 3);
    const int el = (int)qmm_scale_bytes(p->scale_form);
    const uint8_t *sc = (const uint8_t *)p->scales + (blk * n * 16 + r0) * el;
    const uint8_t *mn = p->mins ? (const uint8_t *)p->mins + (blk * n * 16 + r0) * el : NULL;
    const QV_F32 zero = (QV_F32){} + (float)p->zero;
    QV_F32 m = {0};
    if (p->scale_form == QMM_SF16) {
        *s = QMM_CVTPH((const uint16_t *)sc + 16 * at);
        if (mn) m = QMM_CVTPH((const uint16_t *)mn + 16 * at);
    } else if (p->scale_form == QMM_SF32) {
        *s = QF(load_f32)((const float *)sc + 16 * at);
        if (mn) m = QF(load_f32)((const float *)mn + 16 * at);
    } else {
        if ((at & (8 * subs - 1)) == 0) { /* a new super-block of 256 values */
            *d = QMM_CVTPH(p->d + (blk * supers + super) * 16 + r0);
            if (p->dmin) *dmin = QMM_CVTPH(p->dmin + (blk * supers + super) * 16 + r0);
        }
        *s = *d * QMM_CVTI8(sc + 16 * at);
        if (mn) m = -(*dmin * QMM_CVTI8(mn + 16 * at));
    }
    *z = m - zero * *s;
}

/* A block's scales as floats, once for all its rows of x: for each group g and each of its
 * `subs` runs of values (32 / sub), 16 scales s at S[(g * subs + j) * 16] and 16 offsets
 * m - zero * s at Z[...] (the zero folded into the min, so the dot needs no correction). */
static void QF(block_scales)(const plait_qpart_t *p, int64_t k, int64_t blk, float *S, float *Z) {
    const int subs = p->sub == 16 ? 2 : 1;
    for (int r0 = 0; r0 < 16; r0 += QMM_W) {
        QV_F32 d = {0}, dmin = {0}, s, z;
        for (int64_t at = 0; at < k / 32 * subs; ++at) {
            QF(run_scales)(p, k, blk, subs, at, r0, &d, &dmin, &s, &z);
            memcpy(S + 16 * at + r0, &s, sizeof s);
            memcpy(Z + 16 * at + r0, &z, sizeof z);
        }
    }
}

/* Four rows of x (from row i0) against one block of 16 rows of a part (its scales S, Z from
 * block_scales): out[i][0..rows), QMM_W rows of the block at a time. Two sums each of hi and
 * lo per row; the four rows interleave their dots' latencies. */
PLAIT_INLINE void QF(tile4)(const int LO, const int planes, const plait_qpart_t *p, const qmm_act_t *a,
                            int64_t i0, int64_t blk, const float *S, const float *Z, float *out,
                            int64_t ldo, int rows) {
    const int64_t gc = a->k / 32, gbytes = qmm_group_bytes(planes);
    const int subs = p->sub == 16 ? 2 : 1;
    const uint8_t *codes = p->codes + blk * gc * gbytes;
    for (int r0 = 0; r0 < rows; r0 += QMM_W) {
        QV_F32 tot[4] = {{0}};
        for (int64_t g = 0; g < gc; ++g) {
            const uint8_t *cp = codes + g * gbytes;
            if (r0 == 0)
                for (int64_t line = 0; line < gbytes; line += 64)
                    __builtin_prefetch(cp + PF_DIST + line, 0, 3);
            QV_U8 V[8];
            QF(decode)(planes, cp + 4 * r0, V);
            QV_F32 sv[2], zv[2];
            for (int j = 0; j < subs; ++j) {
                sv[j] = QF(load_f32)(S + 16 * (g * subs + j) + r0);
                zv[j] = QF(load_f32)(Z + 16 * (g * subs + j) + r0);
            }
            for (int i = 0; i < 4; ++i) {
                const int8_t *xg = a->xq + (i0 + i) * 2 * a->k + 64 * g; /* hi, then lo */
                /* the first and second 16 values' sums (sub-blocks when sub = 16) */
                QV_I32 h[2], l[2];
                QF(dots)(LO, planes, V, xg, a->xi + ((i0 + i) * gc + g) * 4, h, l);
                const float dx = a->dx[(i0 + i) * gc + g];
                const float *xs = a->xs + (i0 + i) * 2 * gc + 2 * g; /* sum(xq) * dx per 16 */
                if (subs == 1) {
                    QV_F32 f = __builtin_convertvector(((h[0] + h[1]) << 8) + l[0] + l[1], QV_F32);
                    tot[i] += f * (sv[0] * dx);
                    tot[i] += zv[0] * (xs[0] + xs[1]);
                } else {
                    for (int j = 0; j < 2; ++j) {
                        QV_F32 f = __builtin_convertvector((h[j] << 8) + l[j], QV_F32);
                        tot[i] += f * (sv[j] * dx);
                        tot[i] += zv[j] * xs[j];
                    }
                }
            }
        }
        for (int i = 0; i < 4; ++i) QF(store_lanes)(out + i * ldo, &tot[i], rows, r0);
    }
}

/* One row of x (row i0) against one block (a step of one to three rows, and the last one to
 * three rows of a larger one): as tile4, but each run's scales are made from the stored ones
 * where the group uses them
 * (run_scales' arithmetic, so the results are the same bits), not in a pass over the block
 * first: the scales then stream with the codes, and a decode reading its weights from memory
 * keeps the memory busy. With its own prefetch distance (PF_DIST_ROW) a 1B-class Q4_K_M
 * decode went from 13.4 to 17.6 tok/s at one thread. SUBS is 32 / sub; two sums per hi and
 * lo byte keep the dot's latency hidden (across groups, which are independent). A group's
 * parts of QMM_W rows run one after the other, so its codes are read once. */
PLAIT_INLINE void QF(row1)(const int LO, const int planes, const int SUBS, const plait_qpart_t *p,
                           const qmm_act_t *a, int64_t i0, int64_t blk, float *out, int rows) {
    const int64_t gc = a->k / 32, gbytes = qmm_group_bytes(planes);
    const uint8_t *codes = p->codes + blk * gc * gbytes;
    const int8_t *x = a->xq + i0 * 2 * a->k;
    const float *dx = a->dx + i0 * gc, *xs = a->xs + i0 * 2 * gc;
    const int parts = (rows + QMM_W - 1) / QMM_W;
    QV_F32 tot[QMM_HALVES] = {{0}}, d[QMM_HALVES] = {{0}}, dmin[QMM_HALVES] = {{0}};
    for (int64_t g = 0; g < gc; ++g) {
        const uint8_t *cp = codes + g * gbytes;
        for (int64_t line = 0; line < gbytes; line += 64) __builtin_prefetch(cp + PF_DIST_ROW + line, 0, 2);
        for (int hf = 0; hf < parts; ++hf) {
            QV_U8 V[8];
            QF(decode)(planes, cp + 4 * QMM_W * hf, V);
            QV_I32 h[2], l[2];
            QF(dots)(LO, planes, V, x + 64 * g, a->xi + (i0 * gc + g) * 4, h, l);
            for (int j = 0; j < SUBS; ++j) {
                QV_F32 sv, zv;
                QF(run_scales)(p, a->k, blk, SUBS, g * SUBS + j, QMM_W * hf, &d[hf], &dmin[hf],
                               &sv, &zv);
                QV_I32 sum = SUBS == 1 ? ((h[0] + h[1]) << 8) + l[0] + l[1] : (h[j] << 8) + l[j];
                tot[hf] += __builtin_convertvector(sum, QV_F32) * (sv * dx[g]);
                tot[hf] += zv * (SUBS == 1 ? xs[2 * g] + xs[2 * g + 1] : xs[2 * g + j]);
            }
        }
    }
    for (int hf = 0; hf < parts; ++hf) QF(store_lanes)(out, &tot[hf], rows, QMM_W * hf);
}

#include "qmm_ktile.h"
#include "qmm_sb.h"
#include "qmm_sbv.h"

#ifdef QMM_AMX
/* AMX: 16 rows of x at a time. Forms with float scales (amx16): against one block whose codes
 * are decoded into memory (D: per group the eight vectors V[t], 512 bytes; the whole block
 * ahead, decode_block, or a group ahead in a ring of two for a single sixteen). Per step (a
 * group of 32 values, or half a group when sub = 16), the decoded codes are a B tile as they
 * are (row t of the tile is V[t]: 16 weight rows x 4 values), x's two bytes are A tiles (the
 * sixteen rows' bytes for the group lie together in a->xt, tile_rows), and TDPBSUD (signed x,
 * unsigned codes) gives every row of x the same integer sums the vector path computes; the
 * float steps after it are the vector path's, in its order, so the results are bit for bit
 * the same. The sums of even and odd steps go to two pairs of tiles and two buffers: a step's
 * tiles are stored while the next one is computed and scaled a step later, so no load waits
 * on a tile store just issued. Tiles: 0, 1 and 2, 3 the hi and lo sums (16 x 16 int32); 4, 5
 * hi and lo x (16 x 32 or 16 bytes); 6 the codes (8 or 4 rows of 64). K forms (amx16k,
 * qmm_ktile.h) sum a super-block in the tiles instead. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} qmm_tilecfg_t;

/* Out of line, and the config's stores fenced: GCC does not count LDTILECFG as reading memory,
 * so inlined, the config's stack slot was reused before it was read. */
__attribute__((noinline)) static void QF(amx_config)(int values) {
    qmm_tilecfg_t c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; ++t) {
        c.colsb[t] = t == 4 || t == 5 ? (uint16_t)values : 64;
        c.rows[t] = t >= 6 ? (uint8_t)(values / 4) : 16;
    }
    __asm__ volatile("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
}

/* One group's codes decoded into memory as the tiles read them (V[0..7], 512 bytes). The
 * fences keep the stores after the tile loads before them and ahead of those after them: GCC's
 * TILELOADD is an asm statement with no memory operand, so nothing else orders them. */
PLAIT_INLINE void QF(decode_group)(const int planes, const uint8_t *cp, uint8_t *out) {
    u8x64 V[8];
    QF(decode)(planes, cp, V);
    __asm__ volatile("" : : : "memory");
    memcpy(out, V, sizeof V);
    __asm__ volatile("" : : : "memory");
}

/* Every group's codes of block `blk`, decoded once for all the rows of x: D[512 g ..]. */
static void QF(decode_block)(const plait_qpart_t *p, int64_t k, int64_t blk, uint8_t *D) {
    const int64_t gc = k / 32, gbytes = qmm_group_bytes(p->planes);
    const uint8_t *codes = p->codes + blk * gc * gbytes;
    for (int64_t g = 0; g < gc; ++g) QF(decode_group)(p->planes, codes + g * gbytes, D + 512 * g);
}

/* A step's sums into tiles HI and LO (literal tile numbers: the intrinsics spell them into
 * the instruction). */
#define QMM_AMX_DOT(HI, LO, codes, xg, stride)                                                    \
    do {                                                                                           \
        _tile_zero(HI);                                                                            \
        _tile_zero(LO);                                                                            \
        _tile_loadd(6, codes, 64);                                                                 \
        _tile_loadd(4, xg, stride);                                                                \
        _tile_loadd(5, (xg) + (stride) / 2, stride);                                               \
        _tile_dpbsud(HI, 4, 6);                                                                    \
        _tile_dpbsud(LO, 5, 6);                                                                    \
    } while (0)

/* Step `st`'s sums (tiles stored in chi, clo) scaled into tot: the vector path's float steps. */
PLAIT_INLINE void QF(amx_scale)(const int subs, const qmm_act_t *a, int64_t i0, int64_t st,
                                const float *S, const float *Z, const int32_t *chi,
                                const int32_t *clo, f32x16 tot[16]) {
    const int64_t first = i0 / 16 * (a->k / 32), at = first + st / subs; /* tile_rows' index */
    const float *dx = a->dxt + 16 * at;
    const float *xs = subs == 1 ? a->xs1t + 16 * at : a->xs2t + 32 * first + 16 * st;
    const f32x16 sv = QF(load_f32)(S + 16 * st), zv = QF(load_f32)(Z + 16 * st);
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
        i32x16 h, l;
        memcpy(&h, chi + 16 * i, sizeof h);
        memcpy(&l, clo + 16 * i, sizeof l);
        f32x16 f = __builtin_convertvector((h << 8) + l, f32x16);
        tot[i] += f * (sv * dx[i]);
        tot[i] += zv * xs[i];
    }
}

/* Sixteen rows of x (from i0) against one block: its codes decoded ahead in D (p NULL), or,
 * for a single sixteen, decoded here a group ahead of their use into D, a ring of two groups
 * (p, blk: the block; the stores then land well before the tile load that reads them). */
PLAIT_INLINE void QF(amx16)(uint8_t *D, const int subs, const qmm_act_t *a, int64_t i0,
                            const float *S, const float *Z, float *out, int64_t ldo, int rows,
                            const plait_qpart_t *p, int64_t blk) {
    const int64_t steps = a->k / 32 * subs, gc = a->k / 32;
    const int width = 32 / subs;
    const int8_t *x0 = a->xt + i0 * 2 * a->k;
    const int xstride = a->xpair ? 128 : 64; /* tile_rows' layout */
    const int64_t gbytes = p ? qmm_group_bytes(p->planes) : 0;
    const uint8_t *codes = p ? p->codes + blk * gc * gbytes : NULL;
    int32_t chi[2][256] __attribute__((aligned(64))), clo[2][256] __attribute__((aligned(64)));
    f32x16 tot[16] = {{0}};
    if (p) QF(decode_group)(p->planes, codes, D);
    for (int64_t st = 0; st < steps + 2; ++st) {
        if (st < steps) { /* issue step st */
            const int64_t g = st / subs, j = st % subs;
            if (p && j == 0 && g + 1 < gc) {
                const uint8_t *next = codes + (g + 1) * gbytes;
                for (int64_t line = 0; line < gbytes; line += 64)
                    __builtin_prefetch(next + PF_DIST + line, 0, 3);
                QF(decode_group)(p->planes, next, D + 512 * ((g + 1) & 1));
            }
            const uint8_t *b = D + 512 * (p ? g & 1 : g) + 256 * j;
            const int8_t *xg = x0 + width * j +
                               (a->xpair ? 2048 * (g >> 1) + 32 * (g & 1) : 1024 * g);
            if (st & 1)
                QMM_AMX_DOT(2, 3, b, xg, xstride);
            else
                QMM_AMX_DOT(0, 1, b, xg, xstride);
        }
        if (st >= 1 && st <= steps) { /* store step st - 1 */
            if (st & 1) {
                _tile_stored(0, chi[0], 64);
                _tile_stored(1, clo[0], 64);
            } else {
                _tile_stored(2, chi[1], 64);
                _tile_stored(3, clo[1], 64);
            }
        }
        if (st >= 2) /* scale step st - 2, stored a step ago */
            QF(amx_scale)(subs, a, i0, st - 2, S, Z, chi[st & 1], clo[st & 1], tot);
    }
    for (int i = 0; i < 16 && i0 + i < a->m; ++i) store_row(out + i * ldo, &tot[i], rows);
}
#undef QMM_AMX_DOT

/* The rows of x in sixteens against `nblk` blocks. With two sixteens or more, each block's
 * codes are decoded once (into D, 16 k bytes a block), then per sixteen rows of x every block,
 * so that the sixteen rows stay in cache while the blocks' codes and scales do too; a single
 * sixteen decodes each group as it goes (amx16). Returns the rows done: all of them, the last
 * sixteen filled out with zero rows. */
static int64_t QF(amx_rows)(const plait_qpart_t *p, const qmm_act_t *a, int64_t blk0,
                            int64_t nblk, float *SZ, uint8_t *D, float *out, int64_t ldo) {
    const int64_t k = a->k, zs = qmm_scale_floats(k) / 2;
    const int subs = p->sub == 16 ? 2 : 1, once = a->m >= 32, sk = p->scale_form == QMM_SK;
    const int64_t dblk = (sk ? 32 : 16) * k; /* decoded bytes per block */
    if (once)
        for (int64_t b = 0; b < nblk; ++b) {
            if (sk)
                QF(decode_block_k)(p, k, blk0 + b, D + b * dblk);
            else
                QF(decode_block)(p, k, blk0 + b, D + b * dblk);
        }
    QF(amx_config)(sk ? 64 : p->sub); /* a K form's steps are pairs of groups */
    int64_t i = 0;
    for (; i < a->m; i += 16) { /* the last sixteen may be short: its rows past m are zeros */
        if (sk) QF(amx16k)(D, a, i, p, blk0, nblk, !once, SZ, out + i * ldo, ldo);
        for (int64_t b = 0; b < nblk && !sk; ++b) {
            const int64_t left = p->n - (blk0 + b) * 16;
            const float *S = SZ + 2 * zs * b, *Z = S + zs;
            uint8_t *Db = once ? D + b * dblk : D;
            float *ob = out + i * ldo + 16 * b;
            const int rows = left < 16 ? (int)left : 16;
            if (sk)
                continue; /* below, all blocks at once */
            else if (subs == 1)
                QF(amx16)(Db, 1, a, i, S, Z, ob, ldo, rows, once ? NULL : p, blk0 + b);
            else
                QF(amx16)(Db, 2, a, i, S, Z, ob, ldo, rows, once ? NULL : p, blk0 + b);
        }
    }
    _tile_release();
    return i;
}
#endif

#if QMM_W == 8 && defined(QMM_DP16)
/* QMM_SB_MIN rows of x or more of a part the super-block path takes (qmm_sb_takes): sb_rows
 * takes them all for two blocks, an even count of them for one (a last odd row goes on
 * below: row1k, row1). */
#define QMM_SB_ROWS(PLANES)                                                                        \
    if (qmm_sb_fold(PLANES) > 0 && a->xu && a->m - i >= QMM_SB_MIN && qmm_sb_takes(p)) {           \
        const int64_t end = nb == 2 ? a->m : i + ((a->m - i) & ~(int64_t)1);                       \
        QF(sb_rows)(LO, PLANES, nb, p, a, i, end, blk0, S, Z, bs, out0, ldo, rows0);               \
        i = end;                                                                                   \
    }
#elif QMM_W == 16 && defined(QMM_SBV)
/* qmm_sbv_min rows of x or more of a K form the VNNI super-block path takes: sbv_rows takes
 * them all (nb is 1 for a K form). */
#define QMM_SB_ROWS(PLANES)                                                                        \
    if (a->xu && qmm_sbv_takes(p) && a->m - i >= qmm_sbv_min(p, LO)) {                             \
        QF(sbv_rows)(LO, PLANES, p, a, i, a->m, blk0, out0, ldo, rows0);                           \
        i = a->m;                                                                                  \
    }
#else
#define QMM_SB_ROWS(PLANES)
#endif

/* Rows i.. of x against nb blocks from blk0 (two only for AVX2's super-block path, the first
 * whole; S, Z block blk0's scales, the next block's qmm_scale_floats(k) floats on; out0 block
 * blk0's outputs, the last block's first `rows`): a super-block path where it takes them (AVX2's:
 * both blocks at once; VNNI's: K forms, one block), then per block four rows at a time, then one
 * by one (two specializations per plane kind keep the build short: a decode batch of 2 or 3
 * decodes its codes 2 or 3 times, cheap beside reading them), each built for x with lo bytes and
 * without (a->lo). */
#define QMM_DEFINE_ROWS(PLANES)                                                                    \
    PLAIT_INLINE void QF(rows_lo_##PLANES)(const int LO, const plait_qpart_t *p,                  \
                                           const qmm_act_t *a, int64_t i0, int64_t blk0, int nb,  \
                                           const float *S, const float *Z, float *out0,           \
                                           int64_t ldo, int rows0) {                              \
        const int sk = p->scale_form == QMM_SK;                                                    \
        const int64_t bs = qmm_scale_floats(a->k);                                                 \
        int64_t i = i0;                                                                            \
        QMM_SB_ROWS(PLANES)                                                                        \
        for (int nth = 0; nth < nb; ++nth)                                                         \
            QF(rest_##PLANES)(LO, sk, p, a, i, blk0 + nth, S + bs * nth, Z + bs * nth,             \
                              out0 + 16 * nth, ldo, nth < nb - 1 ? 16 : rows0);                    \
    }                                                                                              \
    static void QF(rows_##PLANES)(const plait_qpart_t *p, const qmm_act_t *a, int64_t i,          \
                                  int64_t blk, int nb, const float *S, const float *Z,            \
                                  float *out, int64_t ldo, int rows) {                            \
        if (a->lo)                                                                                 \
            QF(rows_lo_##PLANES)(1, p, a, i, blk, nb, S, Z, out, ldo, rows);                       \
        else                                                                                       \
            QF(rows_lo_##PLANES)(0, p, a, i, blk, nb, S, Z, out, ldo, rows);                       \
    }

/* Rows i.. of x against one block (rows_lo's rest). */
#define QMM_DEFINE_REST(PLANES)                                                                    \
    PLAIT_INLINE void QF(rest_##PLANES)(const int LO, const int sk, const plait_qpart_t *p,       \
                                        const qmm_act_t *a, int64_t i, int64_t blk,               \
                                        const float *S, const float *Z, float *out, int64_t ldo,  \
                                        int rows) {                                               \
        for (; i + 4 <= a->m; i += 4) {                                                            \
            if (sk)                                                                                \
                QF(tile4k)(LO, PLANES, p, a, i, blk, out + i * ldo, ldo, rows);                    \
            else                                                                                   \
                QF(tile4)(LO, PLANES, p, a, i, blk, S, Z, out + i * ldo, ldo, rows);               \
        }                                                                                          \
        for (; i < a->m; ++i) {                                                                    \
            if (sk && p->sub == 32)                                                                \
                QF(row1k)(LO, PLANES, 1, p, a, i, blk, out + i * ldo, rows);                       \
            else if (sk)                                                                           \
                QF(row1k)(LO, PLANES, 2, p, a, i, blk, out + i * ldo, rows);                       \
            else if (p->sub == 32)                                                                 \
                QF(row1)(LO, PLANES, 1, p, a, i, blk, out + i * ldo, rows);                        \
            else                                                                                   \
                QF(row1)(LO, PLANES, 2, p, a, i, blk, out + i * ldo, rows);                        \
        }                                                                                          \
    }

#define QMM_DEFINE(PLANES) QMM_DEFINE_REST(PLANES) QMM_DEFINE_ROWS(PLANES)
QMM_DEFINE(QMM_P4)
QMM_DEFINE(QMM_P8)
QMM_DEFINE(QMM_P4H1)
QMM_DEFINE(QMM_P4H2)
QMM_DEFINE(QMM_P2)
QMM_DEFINE(QMM_P2H1)
QMM_DEFINE(QMM_IQ4)

/* Blocks blk0 .. blk0 + nblk of a part against every row of x (out: block blk0's first
 * column). `SZ` holds 2 k floats and `D` 16 k bytes per block: the blocks' scales as floats
 * (block_scales: S then Z, for four or more rows of x; single rows make their own) and, on
 * AMX, their decoded codes. On AMX with 16 or more rows every block's scales are made first,
 * then the sixteens run (amx_rows); otherwise a block's are made just before its rows, in the
 * first slot (the first two for a pair of blocks on the super-block path). */
static void QF(blocks)(const plait_qpart_t *p, const qmm_act_t *a, int64_t blk0, int64_t nblk,
                       float *SZ, uint8_t *D, float *out, int64_t ldo) {
    const int64_t zs = qmm_scale_floats(a->k) / 2;
    int64_t i = 0, made = 0;
#ifdef QMM_AMX
    if (a->xt != NULL) { /* 16 rows or more: plait_qmm_f32 laid them out as tiles */
        if (p->scale_form != QMM_SK) /* K forms read their integer sub-scales as they go */
            for (int64_t b = 0; b < nblk; ++b)
                QF(block_scales)(p, a->k, blk0 + b, SZ + 2 * zs * b, SZ + 2 * zs * b + zs);
        made = 1;
        i = QF(amx_rows)(p, a, blk0, nblk, SZ, D, out, ldo);
    }
#else
    (void)D;
#endif
    if (i >= a->m) return;
    for (int64_t b = 0, nb; b < nblk; b += nb) {
        const int64_t blk = blk0 + b, left = p->n - blk * 16;
        float *S = SZ + 2 * zs * b * made, *Z = S + zs;
        float *ob = out + 16 * b;
        nb = a->xu && qmm_sb_takes(p) && b + 1 < nblk && left > 16 ? qmm_sb_blocks(p, a->lo) : 1;
        const int64_t last = left - 16 * (nb - 1);
        const int rows = last < 16 ? (int)last : 16, n2 = (int)nb;
        for (int64_t c = 0; c < nb && !made && a->m >= 4 && p->scale_form != QMM_SK; ++c)
            QF(block_scales)(p, a->k, blk + c, S + 2 * zs * c, Z + 2 * zs * c);
        switch (p->planes) {
        case QMM_P4: QF(rows_QMM_P4)(p, a, i, blk, n2, S, Z, ob, ldo, rows); break;
        case QMM_P8: QF(rows_QMM_P8)(p, a, i, blk, n2, S, Z, ob, ldo, rows); break;
        case QMM_P4H1: QF(rows_QMM_P4H1)(p, a, i, blk, n2, S, Z, ob, ldo, rows); break;
        case QMM_P4H2: QF(rows_QMM_P4H2)(p, a, i, blk, n2, S, Z, ob, ldo, rows); break;
        case QMM_P2: QF(rows_QMM_P2)(p, a, i, blk, n2, S, Z, ob, ldo, rows); break;
        case QMM_P2H1: QF(rows_QMM_P2H1)(p, a, i, blk, n2, S, Z, ob, ldo, rows); break;
        default: QF(rows_QMM_IQ4)(p, a, i, blk, n2, S, Z, ob, ldo, rows); break;
        }
    }
}

#undef QMM_DEFINE_ROWS
#undef QMM_DEFINE_REST
#undef QMM_DEFINE
#undef QMM_SB_ROWS
#undef QV_U8
#undef QV_I8
#undef QV_U16
#undef QV_I16
#undef QV_I32
#undef QV_F32
#undef QV_I8N
#undef QMM_HALVES
