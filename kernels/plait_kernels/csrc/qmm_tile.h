/* The quantized matmul's inner loops, compiled once per instruction set: quant_matmul_cpu.c
 * includes this file under `#pragma GCC target(...)` with QMM_SFX (a name suffix), QMM_DP
 * (acc += 4-way dot of u8 codes and s8 x per 32-bit lane), QMM_LUT (16-entry byte table),
 * QMM_CVTPH (16 fp16 -> f32x16) and QMM_CVTI8 (16 int8 -> f32x16) defined. The vectors are GCC vector types, so one text serves
 * AVX-512 (one register each), AVX2 (two) and plain C.
 *
 * Native layout of a part, per block of 16 rows and group of 32 values along k (k0 = 32 g):
 * the group's code planes, GROUP_BYTES(planes) bytes, decoded into eight u8x64 vectors V[t]
 * whose 32-bit lane r holds the codes of row r at k0 + 4t .. k0 + 4t + 3 (byte order):
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

PLAIT_INLINE u8x64 QF(load64)(const uint8_t *p) {
    u8x64 v;
    memcpy(&v, p, sizeof v);
    return v;
}

PLAIT_INLINE u16x32 QF(load64w)(const uint8_t *p) {
    u16x32 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* One group's codes: V[t] for t = 0..7 (see the layout above). */
PLAIT_INLINE void QF(decode)(const int planes, const uint8_t *cp, u8x64 V[8]) {
    const u16x32 m4 = (u16x32){} + 0x0f0f, m3 = (u16x32){} + 0x0303, m1 = (u16x32){} + 0x0101;
    if (planes == QMM_P8) {
        for (int t = 0; t < 8; ++t) V[t] = QF(load64)(cp + 64 * t);
        return;
    }
    if (planes == QMM_P2 || planes == QMM_P2H1) {
        for (int c = 0; c < 2; ++c) {
            u16x32 v = QF(load64w)(cp + 64 * c);
            for (int j = 0; j < 4; ++j) V[4 * c + j] = (u8x64)((v >> (2 * j)) & m3);
        }
        if (planes == QMM_P2H1) {
            u16x32 h = QF(load64w)(cp + 128);
            for (int t = 0; t < 8; ++t) V[t] |= (u8x64)(((h >> t) & m1) << 2);
        }
        return;
    }
    for (int c = 0; c < 4; ++c) {
        u16x32 v = QF(load64w)(cp + 64 * c);
        V[2 * c] = (u8x64)(v & m4);
        V[2 * c + 1] = (u8x64)((v >> 4) & m4);
    }
    if (planes == QMM_P4H1) {
        u16x32 h = QF(load64w)(cp + 256);
        for (int t = 0; t < 8; ++t) V[t] |= (u8x64)(((h >> t) & m1) << 4);
    } else if (planes == QMM_P4H2) {
        u16x32 h[2] = {QF(load64w)(cp + 256), QF(load64w)(cp + 320)};
        for (int t = 0; t < 8; ++t) V[t] |= (u8x64)(((h[t >> 2] >> (2 * (t & 3))) & m3) << 4);
    } else if (planes == QMM_IQ4) {
        for (int t = 0; t < 8; ++t) V[t] = QMM_LUT(V[t]);
    }
}

/* The group's 16 scales (s[0], and s[1] for the second 16 values when sub = 16) and mins. */
typedef struct {
    f32x16 s[2], m[2];
} QF(scales_t);

PLAIT_INLINE f32x16 QF(load_f32)(const void *p) {
    f32x16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Scales of group g (`subs` = 32 / sub of them) from a block's arrays; d and dmin are the
 * block's current super-block scales (SK). */
PLAIT_INLINE QF(scales_t) QF(group_scales)(const plait_qpart_t *p, const uint8_t *sc,
                                           const uint8_t *mn, int64_t g, int subs, f32x16 d,
                                           f32x16 dmin) {
    QF(scales_t) r;
    for (int j = 0; j < subs; ++j) {
        int64_t at = (g * subs + j) * 16;
        if (p->scale_form == QMM_SF16) {
            r.s[j] = QMM_CVTPH((const uint16_t *)sc + at);
            r.m[j] = mn ? QMM_CVTPH((const uint16_t *)mn + at) : (f32x16){};
        } else if (p->scale_form == QMM_SF32) {
            r.s[j] = QF(load_f32)((const float *)sc + at);
            r.m[j] = mn ? QF(load_f32)((const float *)mn + at) : (f32x16){};
        } else {
            r.s[j] = d * QMM_CVTI8(sc + at);
            r.m[j] = mn ? -(dmin * QMM_CVTI8(mn + at)) : (f32x16){};
        }
    }
    return r;
}

/* MT rows of x (from row i0) against one block of 16 rows of a part: out[i][0..rows). */
PLAIT_INLINE void QF(tile)(const int planes, const int MT, const plait_qpart_t *p,
                           const qmm_act_t *a, int64_t i0, int64_t blk, float *out, int64_t ldo,
                           int rows) {
    const int64_t gc = a->k / 32, gbytes = qmm_group_bytes(planes);
    const int subs = p->sub == 16 ? 2 : 1, el = qmm_scale_bytes(p->scale_form);
    const uint8_t *codes = p->codes + blk * gc * gbytes;
    const uint8_t *sc = (const uint8_t *)p->scales + blk * gc * subs * 16 * el;
    const uint8_t *mn = p->mins ? (const uint8_t *)p->mins + blk * gc * subs * 16 * el : NULL;
    const int64_t supers = a->k / 256;
    f32x16 tot[4] = {{0}}, d = {0}, dmin = {0};
    const float zero = (float)p->zero;
    for (int64_t g = 0; g < gc; ++g) {
        const uint8_t *cp = codes + g * gbytes;
        __builtin_prefetch(cp + PF_DIST, 0, 3);
        __builtin_prefetch(cp + PF_DIST + 64, 0, 3);
        __builtin_prefetch(cp + 4 * PF_DIST, 0, 2);
        if (p->scale_form == QMM_SK && g % 8 == 0) {
            d = QMM_CVTPH(p->d + (blk * supers + g / 8) * 16);
            if (p->dmin) dmin = QMM_CVTPH(p->dmin + (blk * supers + g / 8) * 16);
        }
        u8x64 V[8];
        QF(decode)(planes, cp, V);
        QF(scales_t) s = QF(group_scales)(p, sc, mn, g, subs, d, dmin);
        for (int i = 0; i < MT; ++i) {
            const int8_t *xg = a->xq + (i0 + i) * 2 * a->k + 64 * g; /* hi, then lo */
            i32x16 ah[2] = {{0}}, al[2] = {{0}};
#pragma GCC unroll 8
            for (int t = 0; t < 8; ++t) {
                int32_t hi, lo;
                memcpy(&hi, xg + 4 * t, sizeof hi);
                memcpy(&lo, xg + 32 + 4 * t, sizeof lo);
                ah[t >> 2] = QMM_DP(ah[t >> 2], V[t], (i8x64)((i32x16){} + hi));
                al[t >> 2] = QMM_DP(al[t >> 2], V[t], (i8x64)((i32x16){} + lo));
            }
            const float dx = a->dx[(i0 + i) * gc + g];
            const int32_t *is = a->isum + (i0 + i) * 2 * gc + 2 * g;
            if (subs == 1) {
                i32x16 dot = ((ah[0] + ah[1]) << 8) + al[0] + al[1];
                float sum = (float)(is[0] + is[1]);
                f32x16 f = __builtin_convertvector(dot, f32x16);
                tot[i] += (f - zero * sum) * (s.s[0] * dx) + s.m[0] * (sum * dx);
            } else {
                for (int j = 0; j < 2; ++j) {
                    f32x16 f = __builtin_convertvector((ah[j] << 8) + al[j], f32x16);
                    float sum = (float)is[j];
                    tot[i] += (f - zero * sum) * (s.s[j] * dx) + s.m[j] * (sum * dx);
                }
            }
        }
    }
    for (int i = 0; i < MT; ++i) memcpy(out + i * ldo, &tot[i], sizeof(float) * (size_t)rows);
}

/* Every row of x against one block: 4 rows at a time, then one by one (two specializations
 * per plane kind keep the build short: a decode batch of 2 or 3 decodes its codes 2 or 3
 * times, cheap beside reading them). */
#define QMM_DEFINE_ROWS(PLANES)                                                                    \
    static void QF(rows_##PLANES)(const plait_qpart_t *p, const qmm_act_t *a, int64_t blk,        \
                                  float *out, int64_t ldo, int rows) {                             \
        int64_t i = 0;                                                                             \
        for (; i + 4 <= a->m; i += 4) QF(tile)(PLANES, 4, p, a, i, blk, out + i * ldo, ldo, rows); \
        for (; i < a->m; ++i) QF(tile)(PLANES, 1, p, a, i, blk, out + i * ldo, ldo, rows);        \
    }

QMM_DEFINE_ROWS(QMM_P4)
QMM_DEFINE_ROWS(QMM_P8)
QMM_DEFINE_ROWS(QMM_P4H1)
QMM_DEFINE_ROWS(QMM_P4H2)
QMM_DEFINE_ROWS(QMM_P2)
QMM_DEFINE_ROWS(QMM_P2H1)
QMM_DEFINE_ROWS(QMM_IQ4)

static void QF(block)(const plait_qpart_t *p, const qmm_act_t *a, int64_t blk, float *out,
                      int64_t ldo, int rows) {
    switch (p->planes) {
    case QMM_P4: QF(rows_QMM_P4)(p, a, blk, out, ldo, rows); break;
    case QMM_P8: QF(rows_QMM_P8)(p, a, blk, out, ldo, rows); break;
    case QMM_P4H1: QF(rows_QMM_P4H1)(p, a, blk, out, ldo, rows); break;
    case QMM_P4H2: QF(rows_QMM_P4H2)(p, a, blk, out, ldo, rows); break;
    case QMM_P2: QF(rows_QMM_P2)(p, a, blk, out, ldo, rows); break;
    case QMM_P2H1: QF(rows_QMM_P2H1)(p, a, blk, out, ldo, rows); break;
    default: QF(rows_QMM_IQ4)(p, a, blk, out, ldo, rows); break;
    }
}

#undef QMM_DEFINE_ROWS
