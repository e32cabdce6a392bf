/* Packing quantized weights into the matmul kernel's native layout (qmm_tile.h), and reading
 * them back: GGUF blocks of every kind plait loads, packed once at load with no float or
 * widened copy (plait_pack_gguf); unsigned codes [n, k] of a float checkpoint quantized at
 * load (plait_pack_codes); rows de-quantized to fp32 (plait_dequant_rows: embedding lookups,
 * and the reference the kernel is tested against).
 *
 * Each GGUF kind keeps its own form (ggml's block layouts, llama.cpp's ggml-common.h):
 *   kind    planes  scales (per 16 rows, per `sub` values)      zero  sub  mins
 *   Q4_0    P4      fp16 d                                        8    32
 *   Q4_1    P4      fp16 d                                        0    32   fp16 m
 *   Q5_0    P4H1    fp16 d                                       16    32
 *   Q5_1    P4H1    fp16 d                                        0    32   fp16 m
 *   Q8_0    P8      fp16 d                                      128    32
 *   Q2_K    P2      int8 sc x fp16 d per 256                      0    16   int8 m x dmin
 *   Q3_K    P2H1    int8 (sc - 32) x fp16 d                       4    16
 *   Q4_K    P4      int8 sc x fp16 d                              0    32   int8 m x dmin
 *   Q5_K    P4H1    int8 sc x fp16 d                              0    32   int8 m x dmin
 *   Q6_K    P4H2    int8 sc x fp16 d                             32    16
 *   IQ4_NL  IQ4     fp16 d                                      128    32
 *   IQ4_XS  IQ4     int8 (ls - 32) x fp16 d                     128    32
 * so a weight takes its file's bytes plus at most 1/16 (the fp16 super-block scales of 16 rows
 * are stored per row as in the file; Q3_K's and IQ4_XS's packed 6-bit scales take a byte). */
#include <stdint.h>
#include <string.h>

#include "plait_kernels.h"

#define BLOCK_ROWS 16

typedef struct {
    const char *name;
    int planes, scale_form, zero, sub, mins, block_values, block_bytes;
} kind_t;

static const kind_t KINDS[] = {
    {"Q4_0", QMM_P4, QMM_SF16, 8, 32, 0, 32, 18},
    {"Q4_1", QMM_P4, QMM_SF16, 0, 32, 1, 32, 20},
    {"Q5_0", QMM_P4H1, QMM_SF16, 16, 32, 0, 32, 22},
    {"Q5_1", QMM_P4H1, QMM_SF16, 0, 32, 1, 32, 24},
    {"Q8_0", QMM_P8, QMM_SF16, 128, 32, 0, 32, 34},
    {"Q2_K", QMM_P2, QMM_SK, 0, 16, 1, 256, 84},
    {"Q3_K", QMM_P2H1, QMM_SK, 4, 16, 0, 256, 110},
    {"Q4_K", QMM_P4, QMM_SK, 0, 32, 1, 256, 144},
    {"Q5_K", QMM_P4H1, QMM_SK, 0, 32, 1, 256, 176},
    {"Q6_K", QMM_P4H2, QMM_SK, 32, 16, 0, 256, 210},
    {"IQ4_NL", QMM_IQ4, QMM_SF16, 128, 32, 0, 32, 18},
    {"IQ4_XS", QMM_IQ4, QMM_SK, 128, 32, 0, 256, 136},
};
#define NKINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};

static int64_t group_bytes(int planes) {
    static const int64_t bytes[] = {256, 512, 320, 384, 128, 192, 256};
    return bytes[planes];
}

/* A kind's form: out = {planes, scale_form, zero, sub, mins, block_values, block_bytes};
 * returns its index, or -1 for a name plait does not pack. */
int plait_pack_kind(const char *name, int32_t *out) {
    for (int i = 0; i < NKINDS; ++i) {
        if (strcmp(KINDS[i].name, name) != 0) continue;
        const kind_t *q = &KINDS[i];
        int32_t v[7] = {q->planes, q->scale_form, q->zero, q->sub, q->mins, q->block_values,
                        q->block_bytes};
        memcpy(out, v, sizeof v);
        return i;
    }
    return -1;
}

/* ---- GGUF blocks -> codes and scales ------------------------------------------------------ */

/* One row's block of a kind decoded: its unsigned codes (IQ4: codebook indices), its scales as
 * stored: fp16 bits per block (SF16 kinds) or int8 per sub-block (SK kinds), and its
 * super-block's fp16 d and dmin. Each loop below fills codes with no branch on the data. The
 * codes come first, so a block's address is its codes'. */
typedef struct {
    uint8_t code[256];
    uint16_t s16, m16;
    int8_t sk[16], mk[16];
    uint16_t d, dmin;
} block_t;

static uint16_t u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static void nibbles(const uint8_t *qs, uint8_t *code) { /* Q4_0's order: low 0..15, high 16..31 */
    for (int j = 0; j < 16; ++j) {
        code[j] = qs[j] & 15;
        code[j + 16] = qs[j] >> 4;
    }
}

static void k_scale_min(const uint8_t *s, int j, int8_t *sc, int8_t *m) {
    if (j < 4) {
        *sc = (int8_t)(s[j] & 63);
        *m = (int8_t)(s[j + 4] & 63);
    } else {
        *sc = (int8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *m = (int8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

static void two_bits(const uint8_t *qs, uint8_t *code) { /* Q2_K/Q3_K low bits of 256 values */
    for (int j = 0; j < 8; ++j)
        for (int l = 0; l < 32; ++l) code[32 * j + l] = (qs[32 * (j / 4) + l] >> (2 * (j % 4))) & 3;
}

static void decode_q5(const uint8_t *b, int with_min, block_t *o) { /* Q5_0, Q5_1 */
    int off = with_min ? 4 : 2;
    uint32_t qh = (uint32_t)b[off] | (uint32_t)b[off + 1] << 8 | (uint32_t)b[off + 2] << 16 |
                  (uint32_t)b[off + 3] << 24;
    o->s16 = u16(b);
    o->m16 = with_min ? u16(b + 2) : 0;
    nibbles(b + off + 4, o->code);
    for (int l = 0; l < 32; ++l) o->code[l] |= (uint8_t)(((qh >> l) & 1) << 4);
}

static void decode_q2k(const uint8_t *b, block_t *o) {
    two_bits(b + 16, o->code);
    for (int i = 0; i < 16; ++i) {
        o->sk[i] = (int8_t)(b[i] & 15);
        o->mk[i] = (int8_t)(b[i] >> 4);
    }
    o->d = u16(b + 80);
    o->dmin = u16(b + 82);
}

static void decode_q3k(const uint8_t *b, block_t *o) {
    const uint8_t *s = b + 96;
    two_bits(b + 32, o->code);
    for (int j = 0; j < 8; ++j)
        for (int l = 0; l < 32; ++l) o->code[32 * j + l] |= (uint8_t)(((b[l] >> j) & 1) << 2);
    for (int i = 0; i < 16; ++i) {
        int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4, hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        o->sk[i] = (int8_t)((lo | hi << 4) - 32);
    }
    o->d = u16(b + 108);
}

static void decode_q45k(const uint8_t *b, int five, block_t *o) { /* Q4_K, Q5_K */
    const uint8_t *qs = b + (five ? 48 : 16);
    for (int p = 0; p < 4; ++p)
        for (int l = 0; l < 32; ++l) {
            o->code[64 * p + l] = qs[32 * p + l] & 15;
            o->code[64 * p + 32 + l] = qs[32 * p + l] >> 4;
        }
    if (five)
        for (int j = 0; j < 8; ++j)
            for (int l = 0; l < 32; ++l) o->code[32 * j + l] |= (uint8_t)(((b[16 + l] >> j) & 1) << 4);
    for (int j = 0; j < 8; ++j) k_scale_min(b + 4, j, &o->sk[j], &o->mk[j]);
    o->d = u16(b);
    o->dmin = u16(b + 2);
}

static void decode_q6k(const uint8_t *b, block_t *o) { /* per half of 128 values: ql, qh */
    for (int h = 0; h < 2; ++h) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        uint8_t *c = o->code + 128 * h;
        for (int l = 0; l < 32; ++l) {
            c[l] = (uint8_t)((ql[l] & 15) | (qh[l] & 3) << 4);
            c[32 + l] = (uint8_t)((ql[32 + l] & 15) | ((qh[l] >> 2) & 3) << 4);
            c[64 + l] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
            c[96 + l] = (uint8_t)((ql[32 + l] >> 4) | ((qh[l] >> 6) & 3) << 4);
        }
    }
    for (int i = 0; i < 16; ++i) o->sk[i] = (int8_t)b[192 + i];
    o->d = u16(b + 208);
}

static void decode_iq4xs(const uint8_t *b, block_t *o) {
    uint16_t top = u16(b + 2);
    for (int j = 0; j < 8; ++j) {
        int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((top >> (2 * j)) & 3) << 4);
        o->sk[j] = (int8_t)(ls - 32);
        nibbles(b + 8 + 16 * j, o->code + 32 * j);
    }
    o->d = u16(b);
}

/* Block b (its kind's bytes at b) of one row into o. */
static void decode_block(int kind, const uint8_t *b, block_t *o) {
    switch (kind) {
    case 0: case 10: /* Q4_0, IQ4_NL */
        o->s16 = u16(b);
        nibbles(b + 2, o->code);
        break;
    case 1: /* Q4_1 */
        o->s16 = u16(b);
        o->m16 = u16(b + 2);
        nibbles(b + 4, o->code);
        break;
    case 2: case 3: decode_q5(b, kind == 3, o); break;
    case 4: /* Q8_0 */
        o->s16 = u16(b);
        for (int l = 0; l < 32; ++l) o->code[l] = (uint8_t)((int8_t)b[2 + l] + 128);
        break;
    case 5: decode_q2k(b, o); break;
    case 6: decode_q3k(b, o); break;
    case 7: case 8: decode_q45k(b, kind == 8, o); break;
    case 9: decode_q6k(b, o); break;
    default: decode_iq4xs(b, o); break;
    }
}

/* A padding row's block: code = zero, every scale 0. */
static void pad_block(const kind_t *q, block_t *o) {
    memset(o, 0, sizeof *o);
    memset(o->code, q->zero, sizeof o->code);
}

/* ---- one group of 16 rows -> code planes ------------------------------------------------- */

static uint32_t load4(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void store4(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* Bits from `from` (mask m, `width` of them) of the codes v[4 j + b] (j < count) gathered into
 * one word: value b's go to byte b, the j-th run's at bit width * j. */
static uint32_t gather4(const uint8_t *v, int count, int from, uint32_t m, int width) {
    uint32_t acc = 0;
    for (int j = 0; j < count; ++j) acc |= ((load4(v + 4 * j) >> from) & m) << (width * j);
    return acc;
}

/* Write the planes of codes (row r of 16 at c + stride r, 32 values) at gp (qmm_tile.h layout):
 * byte 4r + b of each 64-byte chunk belongs to row r, so each row's plane bytes are built four
 * at a time, a byte per value b of a run of four (little-endian words). */
static void write_planes(int planes, const uint8_t *c, int64_t stride, uint8_t *gp) {
    for (int r = 0; r < BLOCK_ROWS; ++r) {
        const uint8_t *v = c + stride * r;
        uint8_t *at = gp + 4 * r;
        if (planes == QMM_P8) {
            for (int t = 0; t < 8; ++t) store4(at + 64 * t, load4(v + 4 * t));
        } else if (planes == QMM_P2 || planes == QMM_P2H1) {
            for (int q = 0; q < 2; ++q) store4(at + 64 * q, gather4(v + 16 * q, 4, 0, 0x03030303u, 2));
            if (planes == QMM_P2H1) store4(at + 128, gather4(v, 8, 2, 0x01010101u, 1));
        } else {
            for (int q = 0; q < 4; ++q) store4(at + 64 * q, gather4(v + 8 * q, 2, 0, 0x0f0f0f0fu, 4));
            if (planes == QMM_P4H1) store4(at + 256, gather4(v, 8, 4, 0x01010101u, 1));
            if (planes == QMM_P4H2)
                for (int q = 0; q < 2; ++q)
                    store4(at + 256 + 64 * q, gather4(v + 16 * q, 4, 4, 0x03030303u, 2));
        }
    }
}

/* ---- entry points -------------------------------------------------------------------------- */

typedef struct {
    int kind;
    const uint8_t *raw;
    int64_t row_bytes, n, k;
    const int64_t *src_rows;
    uint8_t *codes;
    void *scales, *mins;
    uint16_t *d, *dmin;
} gguf_job_t;

/* The scales of 16 rows' block b into the part's arrays ([k / sub, 16] and [k / 256, 16] per
 * row block blk). */
static void store_scales(const gguf_job_t *j, const kind_t *q, int64_t blk, int64_t b,
                         const block_t *o) {
    int64_t subs = q->block_values / q->sub, at = (blk * (j->k / q->sub) + b * subs) * BLOCK_ROWS;
    for (int64_t i = 0; i < subs; ++i)
        for (int r = 0; r < BLOCK_ROWS; ++r) {
            int64_t s = at + i * BLOCK_ROWS + r;
            if (q->scale_form == QMM_SF16) {
                ((uint16_t *)j->scales)[s] = o[r].s16;
                if (q->mins) ((uint16_t *)j->mins)[s] = o[r].m16;
            } else {
                ((int8_t *)j->scales)[s] = o[r].sk[i];
                if (q->mins) ((int8_t *)j->mins)[s] = o[r].mk[i];
            }
        }
    if (q->scale_form != QMM_SK) return;
    for (int r = 0; r < BLOCK_ROWS; ++r) {
        int64_t s = (blk * (j->k / 256) + b) * BLOCK_ROWS + r;
        j->d[s] = o[r].d;
        if (q->mins) j->dmin[s] = o[r].dmin;
    }
}

static void pack_gguf_blocks(void *ctx, int part, int parts) {
    const gguf_job_t *j = ctx;
    const kind_t *q = &KINDS[j->kind];
    int64_t blocks = (j->n + BLOCK_ROWS - 1) / BLOCK_ROWS, gc = j->k / 32;
    int64_t per = q->block_values / 32, gbytes = group_bytes(q->planes);
    block_t o[BLOCK_ROWS];
    for (int64_t blk = blocks * part / parts; blk < blocks * (part + 1) / parts; ++blk) {
        for (int64_t b = 0; b < j->k / q->block_values; ++b) {
            for (int r = 0; r < BLOCK_ROWS; ++r) {
                int64_t row = blk * BLOCK_ROWS + r;
                if (row >= j->n) {
                    pad_block(q, &o[r]);
                    continue;
                }
                int64_t src = j->src_rows ? j->src_rows[row] : row;
                decode_block(j->kind, j->raw + src * j->row_bytes + b * q->block_bytes, &o[r]);
            }
            store_scales(j, q, blk, b, o);
            for (int64_t g = 0; g < per; ++g)
                write_planes(q->planes, (const uint8_t *)o + 32 * g, sizeof(block_t),
                             j->codes + (blk * gc + b * per + g) * gbytes);
        }
    }
}

/* Pack rows src_rows[0..n) (NULL: 0..n) of a GGUF tensor of kind `kind` (plait_pack_kind),
 * raw [rows, row_bytes], k values a row, into the part's arrays (sized by the caller from the
 * kind's form: codes [blocks, k / 32, group bytes], scales and mins [blocks, k / sub, 16], d
 * and dmin [blocks, k / 256, 16]), split over `threads` threads of `pool`. Returns 0, or -3
 * when k does not fit the kind's blocks. */
int plait_pack_gguf(int kind, const uint8_t *raw, int64_t row_bytes, const int64_t *src_rows,
                    int64_t n, int64_t k, uint8_t *codes, void *scales, void *mins, uint16_t *d,
                    uint16_t *dmin, int threads, plait_pool_fn pool) {
    if (kind < 0 || kind >= NKINDS || k % KINDS[kind].block_values || k % 32 || n <= 0 ||
        row_bytes != k / KINDS[kind].block_values * KINDS[kind].block_bytes)
        return -3;
    gguf_job_t job = {kind, raw, row_bytes, n, k, src_rows, codes, scales, mins, d, dmin};
    int64_t blocks = (n + BLOCK_ROWS - 1) / BLOCK_ROWS;
    int parts = blocks < 64 * (int64_t)threads ? (int)blocks : 64 * threads;
    if (pool != NULL && threads > 1 && parts > 1) {
        pool(pack_gguf_blocks, &job, parts, threads);
    } else {
        pack_gguf_blocks(&job, 0, 1);
    }
    return 0;
}

/* The planes of unsigned codes [n, k] (row stride k; rows padded to 16 with `pad`). */
int plait_pack_codes(const uint8_t *src, int64_t n, int64_t k, int planes, uint8_t pad,
                     uint8_t *codes) {
    if (k % 32 || n <= 0 || planes < QMM_P4 || planes > QMM_IQ4) return -3;
    int64_t blocks = (n + BLOCK_ROWS - 1) / BLOCK_ROWS, gc = k / 32, gbytes = group_bytes(planes);
    for (int64_t blk = 0; blk < blocks; ++blk) {
        for (int64_t g = 0; g < gc; ++g) {
            uint8_t c[BLOCK_ROWS][32];
            memset(c, pad, sizeof c);
            for (int r = 0; r < BLOCK_ROWS && blk * BLOCK_ROWS + r < n; ++r)
                memcpy(c[r], src + (blk * BLOCK_ROWS + r) * k + 32 * g, 32);
            write_planes(planes, (const uint8_t *)c, 32, codes + (blk * gc + g) * gbytes);
        }
    }
    return 0;
}

/* ---- reading back -------------------------------------------------------------------------- */

/* Value i (of 32) of row r in the group's planes at gp: the unsigned code (IQ4: the index). */
static int code_at(int planes, const uint8_t *gp, int r, int i) {
    int t = i / 4, at = 4 * r + i % 4;
    if (planes == QMM_P8) return gp[64 * t + at];
    if (planes == QMM_P2 || planes == QMM_P2H1) {
        int v = (gp[64 * (t / 4) + at] >> (2 * (t % 4))) & 3;
        return planes == QMM_P2H1 ? v | ((gp[128 + at] >> t) & 1) << 2 : v;
    }
    int v = (gp[64 * (t / 2) + at] >> (4 * (t % 2))) & 15;
    if (planes == QMM_P4H1) v |= ((gp[256 + at] >> t) & 1) << 4;
    if (planes == QMM_P4H2) v |= ((gp[256 + 64 * (t / 4) + at] >> (2 * (t % 4))) & 3) << 4;
    return v;
}

static float scale_at(const plait_qpart_t *p, const void *arr, const uint16_t *super, int64_t s,
                      int64_t sup) {
    if (p->scale_form == QMM_SF16) return half_to_float(((const uint16_t *)arr)[s]);
    if (p->scale_form == QMM_SF32) return ((const float *)arr)[s];
    return half_to_float(super[sup]) * (float)((const int8_t *)arr)[s];
}

/* Row `row` of a part (k values) de-quantized into out: s * (code - zero) (+ m). */
static void dequant_row(const plait_qpart_t *p, int64_t k, int64_t row, float *out) {
    int64_t blk = row / BLOCK_ROWS, r = row % BLOCK_ROWS, gc = k / 32, subs = 32 / p->sub;
    int64_t gbytes = group_bytes(p->planes), supers = k / 256;
    for (int64_t g = 0; g < gc; ++g) {
        const uint8_t *gp = p->codes + (blk * gc + g) * gbytes;
        int64_t sup = (blk * supers + g / 8) * BLOCK_ROWS + r;
        for (int i = 0; i < 32; ++i) {
            int64_t s = ((blk * gc + g) * subs + i / p->sub) * BLOCK_ROWS + r;
            int c = code_at(p->planes, gp, (int)r, i);
            if (p->planes == QMM_IQ4) c = IQ4_VALUES[c] + 128; /* the index */
            float v = scale_at(p, p->scales, p->d, s, sup) * (float)(c - p->zero);
            if (p->mins != NULL) {
                float m = scale_at(p, p->mins, p->dmin, s, sup);
                v = p->scale_form == QMM_SK ? v - m : v + m;
            }
            out[g * 32 + i] = v;
        }
    }
}

/* Rows rows[0..count) of the weight (global row numbers, in [0, n)) into out [count, k]. */
int plait_dequant_rows(const plait_weight_t *w, const int64_t *rows, int64_t count, float *out) {
    for (int64_t i = 0; i < count; ++i) {
        int64_t row = rows[i], p = 0;
        if (row < 0 || row >= w->n) return -2;
        while (row >= w->part[p].n) row -= w->part[p++].n;
        dequant_row(&w->part[p], w->k, row, out + i * w->k);
    }
    return 0;
}
