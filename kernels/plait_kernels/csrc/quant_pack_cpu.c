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

/* ---- GGUF blocks -> one group of 32 values ------------------------------------------------- */

/* The group's unsigned codes (IQ4: codebook indices) and scales as stored: fp16 bits (SF16 kinds) or int8 (SK kinds)
 * per sub-block, and its super-block's fp16 d and dmin. */
typedef struct {
    uint8_t code[32];
    uint16_t s16[2], m16[2];
    int8_t sk[2], mk[2];
    uint16_t d, dmin;
} group_t;

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

static void two_bits(const uint8_t *qs, int j, uint8_t *code) { /* Q2_K/Q3_K low bits */
    for (int l = 0; l < 32; ++l) code[l] = (qs[32 * (j / 4) + l] >> (2 * (j % 4))) & 3;
}

static void decode_group(int kind, const uint8_t *row, int64_t g, group_t *o) {
    const kind_t *q = &KINDS[kind];
    int64_t per = q->block_values / 32, j = g % per;
    const uint8_t *b = row + (g / per) * q->block_bytes;
    switch (kind) {
    case 0: case 10: /* Q4_0, IQ4_NL */
        o->s16[0] = u16(b);
        nibbles(b + 2, o->code);
        break;
    case 1: /* Q4_1 */
        o->s16[0] = u16(b);
        o->m16[0] = u16(b + 2);
        nibbles(b + 4, o->code);
        break;
    case 2: case 3: { /* Q5_0, Q5_1 */
        int off = kind == 2 ? 2 : 4;
        uint32_t qh = (uint32_t)b[off] | (uint32_t)b[off + 1] << 8 | (uint32_t)b[off + 2] << 16 |
                      (uint32_t)b[off + 3] << 24;
        o->s16[0] = u16(b);
        o->m16[0] = kind == 3 ? u16(b + 2) : 0;
        nibbles(b + off + 4, o->code);
        for (int l = 0; l < 32; ++l) o->code[l] |= (uint8_t)(((qh >> l) & 1) << 4);
        break;
    }
    case 4: /* Q8_0 */
        o->s16[0] = u16(b);
        for (int l = 0; l < 32; ++l) o->code[l] = (uint8_t)((int8_t)b[2 + l] + 128);
        break;
    case 5: /* Q2_K */
        two_bits(b + 16, (int)j, o->code);
        for (int h = 0; h < 2; ++h) {
            o->sk[h] = (int8_t)(b[2 * j + h] & 15);
            o->mk[h] = (int8_t)(b[2 * j + h] >> 4);
        }
        o->d = u16(b + 80);
        o->dmin = u16(b + 82);
        break;
    case 6: { /* Q3_K */
        const uint8_t *s = b + 96;
        two_bits(b + 32, (int)j, o->code);
        for (int l = 0; l < 32; ++l) o->code[l] |= (uint8_t)(((b[l] >> j) & 1) << 2);
        for (int h = 0; h < 2; ++h) {
            int i = (int)(2 * j + h);
            int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4, hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
            o->sk[h] = (int8_t)((lo | hi << 4) - 32);
        }
        o->d = u16(b + 108);
        break;
    }
    case 7: case 8: { /* Q4_K, Q5_K */
        const uint8_t *qs = b + (kind == 7 ? 16 : 48) + 32 * (j / 2);
        for (int l = 0; l < 32; ++l) o->code[l] = j % 2 ? qs[l] >> 4 : qs[l] & 15;
        if (kind == 8)
            for (int l = 0; l < 32; ++l) o->code[l] |= (uint8_t)(((b[16 + l] >> j) & 1) << 4);
        k_scale_min(b + 4, (int)j, &o->sk[0], &o->mk[0]);
        o->d = u16(b);
        o->dmin = u16(b + 2);
        break;
    }
    case 9: { /* Q6_K: per half of 128, low nibbles of ql (values 0..63) then high nibbles */
        int h = (int)j / 4, q4 = (int)j % 4;
        for (int l = 0; l < 32; ++l) {
            int i = 32 * q4 + l;
            uint8_t low = i < 64 ? b[64 * h + i] & 15 : b[64 * h + i - 64] >> 4;
            uint8_t high = (b[128 + 32 * h + l] >> (2 * q4)) & 3;
            o->code[l] = (uint8_t)(low | high << 4);
        }
        o->sk[0] = (int8_t)b[192 + 2 * j];
        o->sk[1] = (int8_t)b[192 + 2 * j + 1];
        o->d = u16(b + 208);
        break;
    }
    default: { /* IQ4_XS */
        uint16_t top = u16(b + 2);
        int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((top >> (2 * j)) & 3) << 4);
        o->sk[0] = (int8_t)(ls - 32);
        nibbles(b + 8 + 16 * j, o->code);
        o->d = u16(b);
        break;
    }
    }
}

/* ---- one group of 16 rows -> code planes ------------------------------------------------- */

/* Write the planes of codes c[r][i] (row r of 16, value i of 32) at gp (qmm_tile.h layout):
 * byte 4r + b of each 64-byte chunk belongs to row r, so each loop below fills whole bytes. */
static void write_planes(int planes, uint8_t c[BLOCK_ROWS][32], uint8_t *gp) {
    for (int r = 0; r < BLOCK_ROWS; ++r) {
        const uint8_t *v = c[r];
        for (int b = 0; b < 4; ++b) {
            uint8_t *at = gp + 4 * r + b;
            if (planes == QMM_P8) {
                for (int t = 0; t < 8; ++t) at[64 * t] = v[4 * t + b];
            } else if (planes == QMM_P2 || planes == QMM_P2H1) {
                for (int q = 0; q < 2; ++q) {
                    uint8_t byte = 0;
                    for (int j = 0; j < 4; ++j) byte |= (uint8_t)((v[16 * q + 4 * j + b] & 3) << (2 * j));
                    at[64 * q] = byte;
                }
                if (planes == QMM_P2H1) {
                    uint8_t h = 0;
                    for (int t = 0; t < 8; ++t) h |= (uint8_t)(((v[4 * t + b] >> 2) & 1) << t);
                    at[128] = h;
                }
            } else {
                for (int q = 0; q < 4; ++q)
                    at[64 * q] = (uint8_t)((v[8 * q + b] & 15) | (v[8 * q + 4 + b] & 15) << 4);
                if (planes == QMM_P4H1) {
                    uint8_t h = 0;
                    for (int t = 0; t < 8; ++t) h |= (uint8_t)(((v[4 * t + b] >> 4) & 1) << t);
                    at[256] = h;
                } else if (planes == QMM_P4H2) {
                    for (int q = 0; q < 2; ++q) {
                        uint8_t h = 0;
                        for (int j = 0; j < 4; ++j)
                            h |= (uint8_t)(((v[16 * q + 4 * j + b] >> 4) & 3) << (2 * j));
                        at[256 + 64 * q] = h;
                    }
                }
            }
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

static void pack_gguf_blocks(void *ctx, int part, int parts) {
    const gguf_job_t *j = ctx;
    const kind_t *q = &KINDS[j->kind];
    int64_t blocks = (j->n + BLOCK_ROWS - 1) / BLOCK_ROWS, gc = j->k / 32, subs = 32 / q->sub;
    int64_t gbytes = group_bytes(q->planes), supers = j->k / 256, el = q->scale_form == QMM_SK ? 1 : 2;
    for (int64_t blk = blocks * part / parts; blk < blocks * (part + 1) / parts; ++blk) {
        for (int64_t g = 0; g < gc; ++g) {
            uint8_t c[BLOCK_ROWS][32];
            int64_t at = (blk * gc + g) * subs * BLOCK_ROWS;
            memset(c, q->zero, sizeof c); /* padding rows: code = zero, scale 0 */
            for (int r = 0; r < BLOCK_ROWS; ++r) {
                int64_t row = blk * BLOCK_ROWS + r;
                group_t o = {{0}, {0}, {0}, {0}, {0}, 0, 0};
                if (row < j->n) {
                    int64_t src = j->src_rows ? j->src_rows[row] : row;
                    decode_group(j->kind, j->raw + src * j->row_bytes, g, &o);
                    memcpy(c[r], o.code, 32);
                }
                for (int h = 0; h < subs; ++h) {
                    int64_t s = at + h * BLOCK_ROWS + r;
                    if (el == 2) {
                        ((uint16_t *)j->scales)[s] = o.s16[h];
                        if (q->mins) ((uint16_t *)j->mins)[s] = o.m16[h];
                    } else {
                        ((int8_t *)j->scales)[s] = o.sk[h];
                        if (q->mins) ((int8_t *)j->mins)[s] = o.mk[h];
                    }
                }
                if (q->scale_form == QMM_SK && g % 8 == 0) {
                    j->d[(blk * supers + g / 8) * BLOCK_ROWS + r] = o.d;
                    if (q->mins) j->dmin[(blk * supers + g / 8) * BLOCK_ROWS + r] = o.dmin;
                }
            }
            write_planes(q->planes, c, j->codes + (blk * gc + g) * gbytes);
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
            write_planes(planes, c, codes + (blk * gc + g) * gbytes);
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
