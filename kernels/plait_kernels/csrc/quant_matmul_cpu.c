/* Weight-only quantized matmul on the CPU: out[M, N] = x[M, K] @ W^T (+ bias), W kept in its
 * native packed form (plait_weight_t, plait_kernels.h; the layout is documented in qmm_tile.h,
 * the packing in quant_pack_cpu.c). Built at first use by plait.kernels._native.
 *
 * Each row of x is quantized once per call per group of 32 into two int8 parts, x / dx = hi +
 * lo / 256 (dx = max|x| / 127 over the group, or over its super-block of 256 where the weight
 * has K-quant parts: llama.cpp's Q8 activations and a byte more, so that x is held as closely
 * as int16 would; one byte alone moves SmolLM2-135M's logits by up to 3.6 against
 * transformers' and its greedy answers with them), with the integer sums of every 16. A
 * weight whose x_bits is 8 takes that one byte (lo = 0; the rows_* functions built without
 * lo skip its products: about 1.3x faster). Per block of 16 weight rows and
 * group, the codes are decoded in registers to unsigned bytes and dotted with both parts four
 * at a time per 32-bit lane (vpdpbusd with AVX-512 VNNI; two vpmaddwd without it; plain C),
 * exact in int32 (dot = 256 dot(hi) + dot(lo)); then per row of x, in fp32,
 *     out += (dot - zero * sum(xq)) * (s * dx / 256) + m * sum(xq) * dx / 256
 * for each 16 or 32 values with their scale s and min m; K-quant parts sum a super-block in
 * integers first (qmm_ktile.h). Every output is computed the same way
 * whatever M, the thread count or the part of the split that computes it, so results do not
 * depend on the batch. Entry points per ISA: AVX-512 VNNI, AVX-512BW, AVX2, portable C;
 * plait_qmm_isa() names the best the CPU runs and the caller may ask for a lower one. */
#define _DEFAULT_SOURCE /* syscall() under -std=c99 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plait_kernels.h"

/* 64-byte vector types in the portable and AVX2 builds are passed only to inlined helpers. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define BLOCK_ROWS 16
#define XQ_MAX 127.0f
/* Codes are prefetched this many bytes ahead: the hardware prefetcher alone leaves a one-token
 * decode (weights from DRAM) well short of bandwidth. PF_DIST for the paths of several rows of x
 * (every line, into all levels; 4 KiB: 2 KiB gave less prefill at two threads, 8 KiB was
 * slower), PF_DIST_ROW for one row (row1, row1k), which streams fastest, into L2 only (locality
 * 2): on a Zen 4 from DRAM, Q4_K's one-row product went from 10.8-23.9 GB/s at 2 KiB into L1 to
 * 16.9-25.5 GB/s, Q6_K's from 12.0-19.0 to 18.0-27.6 (the host's two phases; 4 KiB into L2 was
 * between, 8 KiB into L1 no better than 2 KiB, 12 and 16 KiB into L2 as 8). On a Zen 3 (AVX2),
 * 2 KiB into L1 had given a 1B-class Q4_K_M decode 18.3 tok/s against 16.4 at 4 KiB. */
#define PF_DIST 4096
#define PF_DIST_ROW 8192

enum { ISA_GENERIC = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512_VNNI = 3, ISA_AMX = 4 };

typedef uint8_t u8x64 __attribute__((vector_size(64)));
typedef int8_t i8x64 __attribute__((vector_size(64)));
typedef uint16_t u16x32 __attribute__((vector_size(64)));
typedef int16_t i16x32 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
/* AVX2's widths (qmm_tile.h's QMM_W = 8: eight rows of a block per vector). */
typedef uint8_t u8x32 __attribute__((vector_size(32)));
typedef int8_t i8x32 __attribute__((vector_size(32)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef int16_t i16x16 __attribute__((vector_size(32)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef int8_t i8x8 __attribute__((vector_size(8)));

/* x quantized for one call (quantize_row): xq [m, 2k] int8, dx [m, k / 32], xs [m, k / 16]
 * (the sums of every 16 values as the two bytes hold them, sum(xq) * dx), xi [m, k / 16, 2]
 * (the integer sums of hi and of lo of every 16) and xr [m, 3 k / 16] the same sums as int16
 * runs, hi's and lo's of each 16 then of each 32 (qmm_runs: a K form's mins take them). */
typedef struct {
    const int8_t *xq;
    const float *dx, *xs;
    const int32_t *xi;
    const int16_t *xr;
    int64_t m, k;
    /* AMX, m >= 16 (tile_rows; else NULL): xq's sixteens of rows as tiles (the last filled out
     * with zero rows), and per sixteen rows
     * and group their dx, their sums of 32 (xs1t) and of each 16 (xs2t), 16 floats a piece;
     * xpair: the tiles hold pairs of groups (x with K-quant parts: a TDP takes 64 values) */
    const int8_t *xt;
    const float *dxt, *xs1t, *xs2t;
    int xpair;
    int lo; /* x has lo bytes (the weight's x_bits 16); with 8 they are zeros */
    /* where a super-block path takes a part (sb_any; else NULL): xq laid out by super-block
     * (qmm_xu), + 128 (unsigned) for AVX2's (qmm_sb.h), and for VNNI's (qmm_sbv.h) as it is
     * (signed) or, where every part it takes has a zero and no mins (sbv_unsigned), + 128: ux */
    const uint8_t *xu;
    int ux;
} qmm_act_t;

/* Where a row's runs of `sub` (16 or 32) values of hi (lo: of lo) start in its 3 k / 16 run
 * sums (xr): hi's and lo's of each 16, then of each 32. */
PLAIT_INLINE int64_t qmm_run_at(int64_t k, int sub, int lo) {
    return sub == 16 ? lo * (k / 16) : k / 8 + lo * (k / 32);
}

/* Row `row` of x's integer sums of hi (lo: of lo) over each run of `sub` (16 or 32) values:
 * |sum| <= 32 * 127, so an int16 holds each and two adjacent runs are one int32 pair. */
PLAIT_INLINE const int16_t *qmm_runs(const qmm_act_t *a, int64_t row, int sub, int lo) {
    return a->xr + row * (3 * a->k / 16) + qmm_run_at(a->k, sub, lo);
}

/* The bytes of a row of x over a super-block (qmm_xu): 256 hi, then 256 lo where x
 * has lo. */
PLAIT_INLINE int64_t qmm_xu_bytes(int lo) { return 256 * (1 + lo); }

/* Row `row` of x (+ 128 for AVX2's path, and VNNI's where ux) over super-block u (a run of
 * eight groups, the last of a row may be short): its 256 hi bytes (then its 256 lo bytes where
 * x has lo), every row's one after another per super-block, so that a pass of rows over a
 * super-block reads one piece of memory (rows 2 k bytes apart would share a few cache sets). */
PLAIT_INLINE const uint8_t *qmm_xu(const qmm_act_t *a, int64_t row, int64_t u) {
    return a->xu + (u * a->m + row) * qmm_xu_bytes(a->lo);
}

PLAIT_INLINE int64_t qmm_group_bytes(int planes) {
    static const int64_t bytes[] = {256, 512, 320, 384, 128, 192, 256};
    return bytes[planes];
}

/* The largest code of the planes (P4, P8, P4H1, P4H2, P2, P2H1, IQ4). */
PLAIT_INLINE int qmm_code_top(int planes) {
    static const int top[] = {15, 255, 31, 63, 3, 7, 241};
    return top[planes];
}

/* How many of a group's V[t] (of one half, t in 4j .. 4j + 3) a 16-bit pair dot may sum
 * before its int16 lanes are widened: a pair of codes against x's bytes (both within +-127)
 * sums to at most 2 * 127 * top, and the pairs summed must stay within 32767 (4 at most: a
 * half). 0 where one pair may not (P8's and IQ4's codes reach 255 and 241). */
PLAIT_INLINE int qmm_fold(int planes) {
    const int fold = 32767 / (2 * 127 * qmm_code_top(planes));
    return fold < 4 ? fold : 4;
}

/* The fewest rows of x the super-block path on AVX2 (sb_rows, qmm_sb.h) takes; fewer take
 * tile4k (tile4 for float scales): a K form's super-block decoded for 4 rows cost more than it
 * saved (0.80-0.92x at 4 rows, about even at 8 and 12, 1.02-1.18x at 16: Q4_K and Q6_K of a
 * 1B-class model, one thread of an AVX2 EPYC). */
#define QMM_SB_MIN 16

/* The rows of a pass over rows i0 .. i1 of a super-block path: at most `most` (even), even,
 * the passes split evenly (no short last pass decodes the blocks again for a few rows). */
PLAIT_INLINE int64_t qmm_pass(int64_t i0, int64_t i1, int64_t most) {
    const int64_t passes = (i1 - i0 + most - 1) / most;
    return ((i1 - i0 + passes - 1) / passes + 1) & ~(int64_t)1;
}

/* How many rows of x the super-block path with VNNI (sbv_rows, qmm_sbv.h) runs against a
 * vector of codes with one byte of x (half as many with two: twice the sums a row). */
#define QMM_SBV_R 8

/* AVX2's super-block path multiplies x + 128 (unsigned) against the codes, less a K form's zero
 * (signed): a pair then sums to at most 2 * 255 * max|code - zero|, and qmm_sb_fold(planes) pairs
 * must stay within 32767. 0 where the path does not take the planes; qmm_sb_fits checks a zero (0
 * for the float forms, qmm_sb_takes) against the bound. */
PLAIT_INLINE int qmm_sb_fold(int planes) {
    static const int fold[] = {4, 0, 2, 2, 4, 4, 0};
    return fold[planes];
}

PLAIT_INLINE int qmm_sb_fits(int planes, int32_t zero) {
    const int top = qmm_code_top(planes), fold = qmm_sb_fold(planes);
    if (fold == 0 || zero < 0 || zero > top) return 0;
    const int most = zero > top - zero ? zero : top - zero;
    return fold * 2 * 255 * most <= 32767;
}

/* How many blocks the super-block path takes at once (the dispatch pairs them for it): a K
 * form's one, two rows of x against its two parts with every sum in a register (sb_dots22;
 * against pairs of blocks, one row against four parts, with one byte of x: Q4_K 1.03-1.09x,
 * Q6_K 1.10-1.22x, Q5_K 1.14-1.28x, Q3_K 0.96-1.07x, Q2_K 0.90-0.97x, docs/quantization.md);
 * a float form's two, one row against both blocks' four parts a group at a
 * time (sb_dots14: one block and two rows ran 0.88-0.93x on Q4_0, Q4_1 and Q5_0), but one
 * where x has lo bytes and the codes fold 2 (Q5_0, Q5_1), whose hi and lo sums for four
 * parts spill. */
PLAIT_INLINE int qmm_sb_blocks(const plait_qpart_t *p, int lo) {
    return p->scale_form == QMM_SK || (lo && qmm_sb_fold(p->planes) < 4) ? 1 : 2;
}

/* Whether the super-block path takes part q: a K form's codes less its zero, or the codes as
 * they are of a form with float scales per 32 values (tile4 folds the zero into its offsets),
 * within qmm_sb_fits' bound. */
PLAIT_INLINE int qmm_sb_takes(const plait_qpart_t *q) {
    const int sk = q->scale_form == QMM_SK;
    return (sk || q->sub == 32) && qmm_sb_fits(q->planes, sk ? q->zero : 0);
}

/* Whether the super-block path with VNNI (qmm_sbv.h) takes part q: a K form whose zero times
 * a sub-scale is an int16 (zero <= 128) and which has a zero or mins, not both (every K kind:
 * the path counts either in a row's offsets). */
PLAIT_INLINE int qmm_sbv_takes(const plait_qpart_t *q) {
    return q->scale_form == QMM_SK && q->zero >= 0 && q->zero <= 128 &&
           (q->mins == NULL || q->zero == 0);
}

/* Whether VNNI's super-block path runs part q (of these planes) against x + 128 where the call
 * has it so (sbv_unsigned): the forms with a zero, no mins and sub-blocks of 16 whose codes less
 * the zero are int8, Q6_K (P4H2) and Q3_K (P2H1). */
PLAIT_INLINE int qmm_sbv_ux(int planes, const plait_qpart_t *q) {
    return (planes == QMM_P4H2 || planes == QMM_P2H1) && q->sub == 16 && q->zero != 0 &&
           q->mins == NULL && q->scale_form == QMM_SK;
}

/* The fewest rows of x with which that path takes part q (fewer take tile4k; lo: x has lo
 * bytes). Against tile4k on a Zen 4, one thread, Q4_K / Q6_K [2048, 8192] and [8192, 2048]:
 * with one byte of x 1.0x / 1.05x at 4 rows, 1.25x at 8, 1.4x / 1.4x at 16, 1.4x / 1.2x at
 * 512; with two, Q4_K 1.0x at 4, 1.1x at 8, 1.2-1.3x from 16, but Q6_K (sub-blocks of 16:
 * twice the sub-scale products) 0.87x at 4, 0.95-1.0x at 16, 1.1x at 64, 1.2x at 512. */
PLAIT_INLINE int64_t qmm_sbv_min(const plait_qpart_t *q, int lo) {
    return !lo ? 4 : q->sub == 32 ? 8 : 64;
}

/* Floats of a block's scales and offsets as block_scales makes them: S, then Z, 16 per run of
 * 16 values each (room for sub 16). */
PLAIT_INLINE int64_t qmm_scale_floats(int64_t k) { return 2 * k; }

PLAIT_INLINE int64_t qmm_scale_bytes(int form) {
    return form == QMM_SF32 ? 4 : form == QMM_SF16 ? 2 : 1;
}

/* ---- activations -> two int8 parts per group of 32 (shared by every ISA) ----------------- */

/* r rounded to the nearest integer, halves away from 0 (within int range). */
PLAIT_INLINE int round_away(float r) { return (int)(r + (r >= 0.0f ? 0.5f : -0.5f)); }

/* round_away on 16 lanes: the same float operations, so the same integers. */
PLAIT_INLINE i32x16 round_away16(f32x16 r) {
    const i32x16 up = r >= (f32x16){0}; /* -1 where r >= 0 */
    const i32x16 half = (up & 0x3f000000) | (~up & (int32_t)0xbf000000); /* +-0.5f */
    return __builtin_convertvector(r + (f32x16)half, i32x16);
}

/* 16 values of a group (xg) times inv as quantize_row makes them: hi, and lo where lo_bytes
 * (else lo is left alone), and their sums. One byte in 16-lane vectors (GCC's loop over the
 * 16 had the sums go through the stack: 1.02-1.04x in a matmul of 512 rows); two bytes in the
 * loop, which was the faster there. */
PLAIT_INLINE void quantize16(const float *xg, float inv, int lo_bytes, int8_t *hi, int8_t *lo,
                             int32_t *sh, int32_t *sl) {
    int32_t s = 0, t = 0;
    if (lo_bytes) {
#pragma omp simd reduction(+ : s, t)
        for (int i = 0; i < 16; ++i) {
            float r = xg[i] * inv;
            int q = round_away(r);
            int l = round_away((r - (float)q) * 256.0f);
            l = l > 127 ? 127 : l < -127 ? -127 : l;
            hi[i] = (int8_t)q;
            lo[i] = (int8_t)l;
            s += q;
            t += l;
        }
    } else {
        f32x16 x;
        memcpy(&x, xg, sizeof x);
        const i32x16 q = round_away16(x * inv);
        const i8x16 qb = __builtin_convertvector(q, i8x16);
        memcpy(hi, &qb, sizeof qb);
        for (int i = 0; i < 16; ++i) s += q[i];
    }
    *sh = s;
    *sl = t;
}

/* One row, per group of 32: x / dx = hi + lo / 256 with dx = max|x| / 127 over the group's
 * `span` (32, or the 256 of a K-quant super-block, whose sums then add up in integers),
 * hi = round(x / dx) and lo = round(256 * (x / dx - hi)) (round_away; lo clamped to +-127, so
 * that AVX2's signed dot never meets -128), so x is known to within dx / 512 (dx / 256 where
 * lo is clamped: as well as int16 would hold it) while each part is a byte the VNNI dot takes.
 * xq holds hi then lo per group (64 bytes); dx is stored / 256; xs per 16 is
 * (256 * sum(hi) + sum(lo)) * dx and xi per 16 sum(hi), sum(lo). A span holding inf or nan gets
 * dx = nan, so its outputs are nan. Without `lo` (a weight's x_bits 8: llama.cpp's Q8
 * activations) every lo is 0, so x is known to within dx / 2 and the kernels skip lo's dots. */
PLAIT_INLINE void quantize_row(const float *x, int64_t k, int64_t span, int lo_bytes,
                               int8_t *xq, float *dx, float *xs, int32_t *xi, int16_t *xr) {
    float inv = 0.0f, d = 0.0f;
    for (int64_t g = 0; g * 32 < k; ++g) {
        const float *xg = x + g * 32;
        if (g * 32 % span == 0) {
            float amax = 0.0f, sum = 0.0f;
#pragma omp simd reduction(max : amax) reduction(+ : sum)
            for (int64_t i = 0; i < span; ++i) {
                float a = fabsf(xg[i]);
                amax = a > amax ? a : amax;
                sum += xg[i];
            }
            int finite = amax <= 3.4e38f && sum == sum; /* the max skips nan; the sum does not */
            inv = finite && amax > 0.0f ? XQ_MAX / amax : 0.0f;
            inv = inv <= 3.4e38f ? inv : 0.0f; /* amax below 127 / FLT_MAX: x is all but 0 */
            d = finite ? amax / (XQ_MAX * 256.0f) : NAN;
        }
        dx[g] = d;
        int8_t *hi = xq + g * 64, *lo = hi + 32;
        if (!lo_bytes) memset(lo, 0, 32);
        for (int h = 0; h < 2; ++h) {
            int32_t sh, sl;
            quantize16(xg + 16 * h, inv, lo_bytes, hi + 16 * h, lo + 16 * h, &sh, &sl);
            xs[2 * g + h] = (float)(256 * sh + sl) * d;
            xi[4 * g + 2 * h] = sh;
            xi[4 * g + 2 * h + 1] = sl;
        }
        for (int l = 0; l < 2; ++l) { /* qmm_runs' layout */
            xr[qmm_run_at(k, 16, l) + 2 * g] = (int16_t)xi[4 * g + l];
            xr[qmm_run_at(k, 16, l) + 2 * g + 1] = (int16_t)xi[4 * g + 2 + l];
            xr[qmm_run_at(k, 32, l) + g] = (int16_t)(xi[4 * g + l] + xi[4 * g + 2 + l]);
        }
    }
}

/* x's rows lo .. hi (lo a multiple of 16) in sixteens laid out as the AMX path reads them, the
 * last sixteen filled out with zeros
 * (a->xt.., from a->xq, dx, xs): per sixteen rows and group of 32, the sixteen rows' 64 bytes (hi, lo) one after another, so
 * that a tile is 1 KiB in one piece (rows 2 k bytes apart share a few cache sets and evict
 * each other), or with `pairs` per pair of groups the rows' 128 bytes (hi of both, lo of
 * both); and their scales and sums as vectors of 16. */
static void tile_rows(const qmm_act_t *a, int pairs, int64_t lo, int64_t hi, int8_t *xt,
                      float *dxt, float *xs1t, float *xs2t) {
    const int64_t gc = a->k / 32;
    static const int8_t none[64] = {0};
    static const float no_sums[2] = {0.0f, 0.0f};
    for (int64_t i0 = lo; i0 < hi; i0 += 16) /* a last sixteen short of rows: zeros past m */
        for (int64_t g = 0; g < gc; ++g)
            for (int64_t r = 0; r < 16; ++r) {
                const int64_t at = (i0 / 16 * gc + g) * 16 + r, i = i0 + r;
                const int past = i >= a->m;
                const float *xs = past ? no_sums : a->xs + i * 2 * gc + 2 * g;
                const int8_t *src = past ? none : a->xq + i * 2 * a->k + 64 * g;
                if (pairs) {
                    int8_t *row = xt + (i0 / 16 * gc + (g & ~(int64_t)1)) * 1024 + 128 * r;
                    memcpy(row + 32 * (g & 1), src, 32);
                    memcpy(row + 64 + 32 * (g & 1), src + 32, 32);
                } else {
                    memcpy(xt + at * 64, src, 64);
                }
                dxt[at] = past ? 0.0f : a->dx[i * gc + g];
                xs1t[at] = xs[0] + xs[1];
                xs2t[at + 16 * (at / 16)] = xs[0];
                xs2t[at + 16 * (at / 16) + 16] = xs[1];
            }
}

/* One row of x's outputs of a block: its 16 floats from src, or the first `rows` of them (a
 * part's last block). The constant size of a whole block's lets the compiler store a vector
 * where a call to memcpy would cost as much as summing a short row. */
PLAIT_INLINE void store_row(float *out, const void *src, int rows) {
    if (rows == 16)
        memcpy(out, src, 16 * sizeof(float));
    else
        memcpy(out, src, sizeof(float) * (size_t)rows);
}

/* The IQ4_NL codebook (ggml's kvalues_iq4nl) + 128, as the codes the kernels dot. */
static const uint8_t IQ4_TABLE[16] = {1,   24,  45,  63,  79,  93,  106, 118,
                                      129, 141, 153, 166, 181, 197, 217, 241};

/* ---- portable C ----------------------------------------------------------------------------- */

PLAIT_INLINE i32x16 dp_generic(i32x16 acc, u8x64 a, i8x64 b) {
    i32x16 ua = (i32x16)a, sb = (i32x16)b;
    for (int j = 0; j < 4; ++j) {
        i32x16 aj = (ua >> (8 * j)) & 0xff;
        i32x16 bj = (sb << (24 - 8 * j)) >> 24;
        acc += aj * bj;
    }
    return acc;
}

PLAIT_INLINE u8x64 lut_generic(u8x64 v) {
    u8x64 out;
    for (int i = 0; i < 64; ++i) out[i] = IQ4_TABLE[v[i] & 15];
    return out;
}

PLAIT_INLINE f32x16 cvtph_generic(const uint16_t *p) {
    f32x16 out;
    for (int i = 0; i < 16; ++i) out[i] = half_to_float(p[i]);
    return out;
}

PLAIT_INLINE f32x16 cvti8_generic(const void *p) {
    f32x16 out;
    for (int i = 0; i < 16; ++i) out[i] = (float)((const int8_t *)p)[i];
    return out;
}

#define QMM_SFX _generic
#define QMM_W 16
#define QMM_CVTI8 cvti8_generic
#define QMM_DP dp_generic
#define QMM_LUT lut_generic
#define QMM_CVTPH cvtph_generic
#include "qmm_tile.h"
#undef QMM_SFX
#undef QMM_W
#undef QMM_DP
#undef QMM_LUT
#undef QMM_CVTPH
#undef QMM_CVTI8

/* ---- x86 SIMD ------------------------------------------------------------------------------ */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
/* AVX2: eight rows of a block per 32-byte register (QMM_W 8). The 4-way dot as two vpmaddwd
 * (even and odd bytes widened to 16 bits: exact for any code); for small codes (qmm_fold)
 * vpmaddubsw, its int16 pairs summed and widened by vpmaddwd (against ones, or a K form's
 * sub-scales). */
PLAIT_INLINE i32x8 dp_avx2(i32x8 acc, u8x32 a, i8x32 b) {
    const __m256i ai = (__m256i)a, bi = (__m256i)b;
    __m256i ae = _mm256_and_si256(ai, _mm256_set1_epi16(0xff)), ao = _mm256_srli_epi16(ai, 8);
    __m256i be = _mm256_srai_epi16(_mm256_slli_epi16(bi, 8), 8), bo = _mm256_srai_epi16(bi, 8);
    __m256i s = _mm256_add_epi32(_mm256_madd_epi16(ae, be), _mm256_madd_epi16(ao, bo));
    return (i32x8)_mm256_add_epi32((__m256i)acc, s);
}

PLAIT_INLINE i16x16 dp16_avx2(u8x32 a, i8x32 b) {
    return (i16x16)_mm256_maddubs_epi16((__m256i)a, (__m256i)b);
}

/* (c - 128) x pairs summed in int16 for codes c up to 255: |c - 128| against x with the sign
 * of c - 128 (dots_signed; exact as x's bytes are within +-127). */
PLAIT_INLINE i16x16 dps_avx2(u8x32 c, i8x32 x) {
    const __m256i w = _mm256_xor_si256((__m256i)c, _mm256_set1_epi8((char)0x80));
    return (i16x16)_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8((__m256i)x, w));
}

PLAIT_INLINE i32x8 madd16_avx2(i32x8 acc, i16x16 a, i16x16 b) {
    return (i32x8)_mm256_add_epi32((__m256i)acc, _mm256_madd_epi16((__m256i)a, (__m256i)b));
}

PLAIT_INLINE u8x32 lut_avx2(u8x32 v) {
    __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4_TABLE));
    return (u8x32)_mm256_shuffle_epi8(t, (__m256i)v);
}

PLAIT_INLINE f32x8 cvtph_avx2(const uint16_t *p) {
    return (f32x8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

PLAIT_INLINE i32x8 i8i32_avx2(const int8_t *p) {
    return (i32x8)_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

PLAIT_INLINE f32x8 cvti8_avx2(const void *p) {
    return __builtin_convertvector(i8i32_avx2((const int8_t *)p), f32x8);
}

#define QMM_SFX _avx2
#define QMM_W 8
#define QMM_CVTI8 cvti8_avx2
#define QMM_DP dp_avx2
#define QMM_DP16 dp16_avx2
#define QMM_DPS dps_avx2
#define QMM_MADD16 madd16_avx2
#define QMM_I8I32 i8i32_avx2
#define QMM_LUT lut_avx2
#define QMM_CVTPH cvtph_avx2
#include "qmm_tile.h"
#undef QMM_SFX
#undef QMM_W
#undef QMM_DP
#undef QMM_DP16
#undef QMM_DPS
#undef QMM_MADD16
#undef QMM_I8I32
#undef QMM_LUT
#undef QMM_CVTPH
#undef QMM_CVTI8
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
PLAIT_INLINE i32x16 dp_avx512(i32x16 acc, u8x64 a, i8x64 b) {
    __m512i ai = (__m512i)a, bi = (__m512i)b;
    __m512i ae = _mm512_and_si512(ai, _mm512_set1_epi16(0xff)), ao = _mm512_srli_epi16(ai, 8);
    __m512i be = _mm512_srai_epi16(_mm512_slli_epi16(bi, 8), 8), bo = _mm512_srai_epi16(bi, 8);
    __m512i s = _mm512_add_epi32(_mm512_madd_epi16(ae, be), _mm512_madd_epi16(ao, bo));
    return (i32x16)_mm512_add_epi32((__m512i)acc, s);
}

PLAIT_INLINE u8x64 lut_avx512(u8x64 v) {
    __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)IQ4_TABLE));
    return (u8x64)_mm512_shuffle_epi8(t, (__m512i)v);
}

PLAIT_INLINE f32x16 cvtph_avx512(const uint16_t *p) {
    return (f32x16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

PLAIT_INLINE i32x16 i8i32_avx512(const int8_t *p) {
    return (i32x16)_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
}

PLAIT_INLINE f32x16 cvti8_avx512(const void *p) {
    return __builtin_convertvector(i8i32_avx512((const int8_t *)p), f32x16);
}

#define QMM_SFX _avx512
#define QMM_W 16
#define QMM_CVTI8 cvti8_avx512
#define QMM_I8I32 i8i32_avx512
#define QMM_DP dp_avx512
#define QMM_LUT lut_avx512
#define QMM_CVTPH cvtph_avx512
#include "qmm_tile.h"
#undef QMM_SFX
#undef QMM_DP
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
PLAIT_INLINE i32x16 dp_vnni(i32x16 acc, u8x64 a, i8x64 b) {
    return (i32x16)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)a, (__m512i)b);
}

PLAIT_INLINE i32x16 dpw_vnni(i32x16 acc, i16x32 a, i16x32 b) {
    return (i32x16)_mm512_dpwssd_epi32((__m512i)acc, (__m512i)a, (__m512i)b);
}

#define QMM_SFX _vnni
#define QMM_DP dp_vnni
#define QMM_DPW dpw_vnni
#define QMM_SBV 1
#include "qmm_tile.h"
#undef QMM_SFX
#undef QMM_SBV
#undef QMM_DPW
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c,amx-tile,amx-int8")
#define QMM_SFX _amx
#define QMM_AMX 1
#include "qmm_tile.h"
#undef QMM_SFX
#undef QMM_AMX
#undef QMM_W
#undef QMM_I8I32
#undef QMM_DP
#undef QMM_LUT
#undef QMM_CVTPH
#undef QMM_CVTI8
#pragma GCC pop_options

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

/* AMX-TILE and AMX-INT8 (CPUID 7.0 EDX bits 24, 25), and the kernel's leave to use the tile
 * data (asked once per process: arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, 18). */
static int amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 25 & 1)) return 0;
#ifdef SYS_arch_prctl
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
#else
    return 0;
#endif
}

int plait_qmm_isa(void) {
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                 __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (avx512 && __builtin_cpu_supports("avx512vnni"))
        return amx_usable() ? ISA_AMX : ISA_AVX512_VNNI;
    if (avx512) return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        return ISA_AVX2;
    return ISA_GENERIC;
}
#else
int plait_qmm_isa(void) { return ISA_GENERIC; }
#endif

/* ---- entry point --------------------------------------------------------------------------- */

typedef void (*blocks_fn)(const plait_qpart_t *, const qmm_act_t *, int64_t, int64_t, float *,
                          uint8_t *, float *, int64_t);

static blocks_fn pick(int isa) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa >= ISA_AMX) return blocks_amx;
    if (isa == ISA_AVX512_VNNI) return blocks_vnni;
    if (isa == ISA_AVX512) return blocks_avx512;
    if (isa == ISA_AVX2) return blocks_avx2;
#endif
    (void)isa;
    return blocks_generic;
}

/* The instruction set part p runs on where the CPU's best is `isa`. Every path gives a row the
 * same bits on every ISA (the integers are exact and the float steps the same per lane;
 * tests/test_kernels_native.py holds them to it), so a part may run where it runs fastest. On
 * AVX-512 without VNNI (two vpmaddwd a dot) the K forms that AVX2's super-block path takes
 * (Q2_K .. Q6_K) run AVX2's code, 1.3-2.7x faster at every M there (a Zen 4 at that level,
 * one thread, Q4_K / Q6_K [2048, 8192]). With VNNI they keep its loops: below 4 rows of x
 * they beat AVX2's (1.7x / 1.5x at one row), and from qmm_sbv_min rows its own super-block
 * path (qmm_sbv.h) beats AVX2's (Q4_K 1.4x, Q6_K 1.2x at 512 rows with one byte of x). */
PLAIT_INLINE int part_isa(int isa, const plait_qpart_t *p) {
    if (p->scale_form != QMM_SK || !qmm_sb_takes(p)) return isa;
    return isa == ISA_AVX512 ? ISA_AVX2 : isa;
}

/* Scratch kept per thread and grown as needed (its contents are not kept): `which` 0 for the
 * quantized x (the calling thread), 1 for a chunk of blocks' scales and decoded codes (every
 * thread that runs blocks). Aligned to a cache line, so no tile row loaded from it (64 bytes)
 * straddles two lines: malloc's 16-byte alignment left that to chance, and a process whose
 * buffers landed off the line ran Q4_K's tiles up to a quarter slower. */
#define SCRATCH_ALIGN 64

static void *scratch(int which, size_t bytes) {
    static __thread void *buf[2] = {NULL, NULL};
    static __thread size_t cap[2] = {0, 0};
    if (bytes > cap[which]) {
        free(buf[which]);
        buf[which] = NULL;
        cap[which] = 0;
        if (posix_memalign(&buf[which], SCRATCH_ALIGN, bytes) != 0) return NULL;
        cap[which] = bytes;
    }
    return buf[which];
}

typedef struct {
    blocks_fn run, run_k; /* run_k: the parts part_isa moves to AVX2's code */
    const plait_weight_t *w;
    qmm_act_t act;
    const float *bias;
    float *out;
    int64_t first[PLAIT_QMM_MAX_PARTS + 1]; /* the parts' first block in the job's numbering */
    int64_t row0[PLAIT_QMM_MAX_PARTS];      /* the parts' first output column */
    int isa;
} job_t;

/* Blocks are run this many bytes of scratch at a time (their scales as floats, 8 k bytes a
 * block, and on AMX their decoded codes, 16 k, or for a K form 32 k, the two bytes of its
 * codes times their sub-scales, with its sums in the scales' place): a chunk stays in the
 * core's cache while every row of x passes over it. */
#define CHUNK_BYTES (1 << 20)

PLAIT_INLINE int64_t block_bytes(int64_t k, int sk) { return (sk ? 40 : 24) * k; }

PLAIT_INLINE int64_t chunk_blocks(int64_t k, int sk) {
    int64_t n = CHUNK_BYTES / block_bytes(k, sk);
    return n < 1 ? 1 : n;
}

/* Part `part` of `parts` of a job: a contiguous range of row blocks (so every output is
 * computed the same way whichever thread runs it), in chunks of consecutive blocks of one
 * weight part. */
static void run_part(void *ctx, int part, int parts) {
    const job_t *j = ctx;
    int64_t total = j->first[j->w->nparts], k = j->act.k, m = j->act.m;
    int64_t b0 = total * part / parts, b1 = total * (part + 1) / parts;
    int64_t ldo = j->w->n, p = 0, bytes = 0;
    for (int sk = 0; sk < 2; ++sk) {
        const int64_t most = chunk_blocks(k, sk) * block_bytes(k, sk);
        bytes = most > bytes ? most : bytes;
    }
    char *buf = scratch(1, (size_t)bytes);
    if (buf == NULL) { /* out of memory: the outputs become nan, the caller checks */
        for (int64_t i = 0; i < m; ++i)
            for (int64_t c = 0; c < ldo; ++c) j->out[i * ldo + c] = NAN;
        return;
    }
    for (int64_t b = b0; b < b1;) {
        while (b >= j->first[p + 1]) ++p;
        const plait_qpart_t *q = &j->w->part[p];
        const int64_t most = chunk_blocks(k, q->scale_form == QMM_SK);
        int64_t end = b1 < j->first[p + 1] ? b1 : j->first[p + 1];
        int64_t nblk = end - b < most ? end - b : most, blk = b - j->first[p];
        int64_t r0 = j->row0[p] + blk * BLOCK_ROWS, left = q->n - blk * BLOCK_ROWS;
        int64_t cols = left < nblk * BLOCK_ROWS ? left : nblk * BLOCK_ROWS;
        float *ob = j->out + r0;
        const blocks_fn run = part_isa(j->isa, q) == ISA_AVX2 ? j->run_k : j->run;
        run(q, &j->act, blk, nblk, (float *)buf, (uint8_t *)(buf + 8 * k * most), ob, ldo);
        b += nblk;
        if (j->bias == NULL) continue;
        for (int64_t i = 0; i < m; ++i)
            for (int64_t c = 0; c < cols; ++c) ob[i * ldo + c] += j->bias[r0 + c];
    }
}

/* x quantized for one call (the buffers of act, writable), and laid out as tiles where xt is
 * not NULL: its rows are split over the pool in sixteens. */
typedef struct {
    const float *x;
    int64_t ldx, span;
    qmm_act_t act;
    int8_t *xq, *xt;
    uint8_t *xu, flip; /* flip: fill_xu's */
    float *dx, *xs, *dxt, *xs1t, *xs2t;
    int32_t *xi;
    int16_t *xr;
} xjob_t;

/* Rows lo .. hi of xu (qmm_xu's layout) from xq, each byte xor `flip` (0x80: + 128). */
static void fill_xu(const qmm_act_t *a, uint8_t *xu, uint8_t flip, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
        for (int64_t g = 0; g < a->k / 32; ++g) {
            const int8_t *src = a->xq + i * 2 * a->k + 64 * g;
            uint8_t *dst = xu + (qmm_xu(a, i, g / 8) - a->xu) + 32 * (g % 8);
            for (int t = 0; t < 32; ++t) dst[t] = (uint8_t)(src[t] ^ flip);
            if (a->lo)
                for (int t = 0; t < 32; ++t) dst[256 + t] = (uint8_t)(src[32 + t] ^ flip);
        }
}

PLAIT_CLONES static void quantize_part(void *ctx, int part, int parts) {
    const xjob_t *j = ctx;
    const int64_t m = j->act.m, k = j->act.k, gc = k / 32, units = (m + 15) / 16;
    const int64_t r0 = 16 * (units * part / parts), end = 16 * (units * (part + 1) / parts);
    const int64_t r1 = end < m ? end : m;
    for (int64_t i = r0; i < r1; ++i)
        quantize_row(j->x + i * j->ldx, k, j->span, j->act.lo, j->xq + 2 * i * k, j->dx + i * gc,
                     j->xs + i * 2 * gc, j->xi + i * 4 * gc, j->xr + i * 3 * k / 16);
    if (j->xu != NULL) fill_xu(&j->act, j->xu, j->flip, r0, r1);
    if (j->xt != NULL) tile_rows(&j->act, j->span == 256, r0, r1, j->xt, j->dxt, j->xs1t, j->xs2t);
}

/* A part should hold at least this many row blocks x K x rows of x (some microseconds); there
 * are up to PARTS_PER_THREAD parts per thread, so a late thread's share is taken by others. */
#define MIN_PART_WORK 8192
#define PARTS_PER_THREAD 4

static int check_weight(const plait_weight_t *w) {
    if (w->k <= 0 || w->k % 32 || w->nparts < 1 || w->nparts > PLAIT_QMM_MAX_PARTS) return 0;
    if (w->x_bits != 8 && w->x_bits != 16) return 0;
    int64_t n = 0;
    for (int64_t p = 0; p < w->nparts; ++p) {
        const plait_qpart_t *q = &w->part[p];
        if (q->planes < QMM_P4 || q->planes > QMM_IQ4 || q->scale_form < QMM_SF16 ||
            q->scale_form > QMM_SK || (q->sub != 16 && q->sub != 32) || q->n <= 0)
            return 0;
        if (q->scale_form == QMM_SK && (w->k % 256 || q->d == NULL)) return 0;
        if (q->scale_form == QMM_SK && q->mins != NULL && q->dmin == NULL) return 0;
        n += q->n;
    }
    return n == w->n;
}

/* Which super-block path takes a part of w for m rows of x on `isa` (then x is laid out for
 * it: xu), or 0: AVX2's (qmm_sb.h) where the part runs AVX2's code (part_isa), from
 * QMM_SB_MIN rows, or VNNI's (qmm_sbv.h), from qmm_sbv_min. No call has parts on both:
 * part_isa moves parts to AVX2 only from AVX-512 without VNNI. */
static int sb_any(const plait_weight_t *w, int isa, int64_t m) {
    const int lo = w->x_bits == 16;
    for (int64_t p = 0; p < w->nparts; ++p) {
        const plait_qpart_t *q = &w->part[p];
        const int on = part_isa(isa, q);
        if (on == ISA_AVX2 && m >= QMM_SB_MIN && qmm_sb_takes(q)) return ISA_AVX2;
        if (on == ISA_AVX512_VNNI && qmm_sbv_takes(q) && m >= qmm_sbv_min(q, lo)) return on;
    }
    return 0;
}

/* The fewest rows of x with which sbv_unsigned's form runs: below, the excess's sums per block
 * and super-block cost more than the rows' dots they save (Q6_K [2048, 8192], one byte of x,
 * on a Zen 4: 0.91x at 4 rows, 0.97x at 6, 1.03x at 8, 1.09x at 16, 1.11x at 128; Q3_K 1.04x
 * at 16, 1.12x at 128; with two bytes 1.08-1.12x from 64, where that path starts). */
#define QMM_SBV_UX_MIN 8

/* Whether every part of w that VNNI's super-block path takes on `isa` is qmm_sbv_ux's: then x
 * goes in + 128 (unsigned) against the codes less the zero (signed), and the zero's share of a
 * row's sums, sum_s S[s] zero sum(x over s), a dot per row and super-block, becomes x + 128's
 * excess, 128 sum_s S[s] sum(code - zero over s), one per block and super-block (sbv_decode). */
static int sbv_unsigned(const plait_weight_t *w, int isa) {
    for (int64_t p = 0; p < w->nparts; ++p) {
        const plait_qpart_t *q = &w->part[p];
        if (part_isa(isa, q) == ISA_AVX512_VNNI && qmm_sbv_takes(q) && !qmm_sbv_ux(q->planes, q))
            return 0;
    }
    return 1;
}

/* Bytes of xu (qmm_xu's layout: 256 or 512 a row per run of eight groups, the last run
 * whole), a multiple of the scratch's alignment. */
static size_t xu_size(int64_t m, int64_t k, int lo) {
    const size_t bytes = (size_t)((k + 255) / 256 * m * qmm_xu_bytes(lo));
    return (bytes + SCRATCH_ALIGN - 1) & ~(size_t)(SCRATCH_ALIGN - 1);
}

/* out[i, :n] = x[i] @ W^T (+ bias) for i < m. x is fp32 with row stride ldx, out [m, n]
 * contiguous, bias [n] or NULL. The row blocks are split over up to `threads` threads through
 * `pool` (plait_pool_run of thread_pool.c; NULL: this thread only). Returns the number of
 * threads asked to run it (>= 1), -1 when out of memory, -3 on a weight it does not take. */
int plait_qmm_f32(int isa, int threads, plait_pool_fn pool, const float *x, int64_t ldx,
                  int64_t m, const plait_weight_t *w, const float *bias, float *out) {
    if (!check_weight(w)) return -3;
    int64_t k = w->k, gc = k / 32, span = 32;
    for (int64_t p = 0; p < w->nparts; ++p)
        if (w->part[p].scale_form == QMM_SK) span = 256; /* one dx per super-block */
    const int tiled = isa >= ISA_AMX && m >= 16;
    const int64_t m16 = tiled ? (m + 15) / 16 * 16 : 0; /* rows as tiles: whole sixteens */
    size_t xq_bytes = ((size_t)(2 * m * k) + 63) & ~(size_t)63, xt_bytes = (size_t)(2 * m16 * k);
    size_t floats = (size_t)(3 * m * gc + 4 * m16 * gc), ints = (size_t)(4 * m * gc);
    size_t shorts = (size_t)(3 * m * k / 16);
    size_t sums = (sizeof(float) * (floats + ints) + sizeof(int16_t) * shorts + 63) & ~(size_t)63;
    const int lo = w->x_bits == 16;
    const int sb = sb_any(w, isa, m);
    const size_t xu_bytes = sb ? xu_size(m, k, lo) : 0;
    char *buf = scratch(0, xq_bytes + sums + xt_bytes + xu_bytes);
    if (buf == NULL) return -1;
    xjob_t xj = {x, ldx, span, {0}, (int8_t *)buf, NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    xj.dx = (float *)(buf + xq_bytes), xj.xs = xj.dx + m * gc, xj.xi = (int32_t *)(xj.xs + 2 * m * gc);
    xj.act = (qmm_act_t){xj.xq, xj.dx, xj.xs, xj.xi, NULL, m, k, NULL, NULL, NULL, NULL, 0, lo,
                         NULL, 0};
    if (xu_bytes > 0) xj.xu = (uint8_t *)(buf + xq_bytes + sums + xt_bytes), xj.act.xu = xj.xu;
    xj.act.ux = sb == ISA_AVX512_VNNI && m >= QMM_SBV_UX_MIN && sbv_unsigned(w, isa);
    xj.flip = sb == ISA_AVX2 || xj.act.ux ? 0x80 : 0;
    if (tiled) {
        xj.dxt = (float *)(xj.xi + 4 * m * gc), xj.xs1t = xj.dxt + m16 * gc;
        xj.xs2t = xj.xs1t + m16 * gc, xj.xt = (int8_t *)(buf + xq_bytes + sums);
    }
    xj.xr = (int16_t *)(xj.xi + 4 * m * gc + 4 * m16 * gc), xj.act.xr = xj.xr; /* past dxt .. xs2t */
    const int units = (int)((m + 15) / 16), helpers = units < threads ? units : threads;
    if (pool != NULL && helpers > 1)
        pool(quantize_part, &xj, helpers, helpers);
    else
        quantize_part(&xj, 0, 1);
    job_t job = {pick(isa), pick(ISA_AVX2), w, xj.act, bias, out, {0}, {0}, isa};
    if (tiled) {
        job.act.xt = xj.xt, job.act.dxt = xj.dxt, job.act.xs1t = xj.xs1t, job.act.xs2t = xj.xs2t;
        job.act.xpair = span == 256;
    }
    for (int64_t p = 0; p < w->nparts; ++p) {
        job.first[p + 1] = job.first[p] + (w->part[p].n + BLOCK_ROWS - 1) / BLOCK_ROWS;
        if (p + 1 < w->nparts) job.row0[p + 1] = job.row0[p] + w->part[p].n;
    }
    int64_t blocks = job.first[w->nparts];
    int64_t parts = blocks * k * m / MIN_PART_WORK, most = (int64_t)threads * PARTS_PER_THREAD;
    parts = parts < blocks ? parts : blocks;
    parts = parts < most ? parts : most;
    if (pool != NULL && threads > 1 && parts > 1) return pool(run_part, &job, (int)parts, threads);
    run_part(&job, 0, 1);
    return 1;
}
