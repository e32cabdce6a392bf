/* CPU grammar mask: logits[row, t] = -inf where bit t of bitmask[row] is clear.
 *
 * Built at first use by plait.kernels._native (cc -O3 -shared) and called through ctypes.
 * Per row, the indices of words with any clear bit are first gathered branch-free (so a mask
 * whose clear bits are scattered costs no mispredicted branch per word); each such word then
 * costs a 32-wide fill when fully disallowed, two unconditional stores when it has one or two
 * clear bits (the common case of mostly-allowed masks) and, rarely, a loop or a branch-free
 * blend for the rest. Logits are only read by that blend. */
#include <stdint.h>

enum { CHUNK = 1024 };

#define DEFINE_MASK(NAME, T)                                                                  \
    static void NAME##_word(T *out, uint32_t clear, T neg) {                                  \
        if (clear == 0xFFFFFFFFu) {                                                           \
            for (int j = 0; j < 32; ++j) out[j] = neg;                                        \
            return;                                                                           \
        }                                                                                     \
        uint32_t rest = clear & (clear - 1);                                                  \
        int first = __builtin_ctz(clear);                                                     \
        out[first] = neg;                                                                     \
        out[rest ? __builtin_ctz(rest) : first] = neg;                                        \
        rest &= rest - 1;                                                                     \
        if (rest == 0) return;                                                                \
        if (__builtin_popcount(rest) <= 6) {                                                  \
            for (; rest; rest &= rest - 1) out[__builtin_ctz(rest)] = neg;                    \
        } else {                                                                              \
            for (int j = 0; j < 32; ++j) {                                                    \
                T keep = (T)(((rest >> j) & 1u) - 1u); /* all ones where left as is */       \
                out[j] = (T)((out[j] & keep) | (neg & (T)~keep));                             \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    static void NAME##_row(T *out, const uint32_t *words, int64_t vocab, T neg) {            \
        int64_t full = vocab / 32, tail = vocab % 32;                                         \
        int32_t hits[CHUNK];                                                                  \
        for (int64_t start = 0; start < full; start += CHUNK) {                               \
            int32_t len = (int32_t)(full - start < CHUNK ? full - start : CHUNK), n = 0;      \
            const uint32_t *chunk = words + start;                                            \
            for (int32_t w = 0; w < len; ++w) {                                               \
                hits[n] = w;                                                                  \
                n += chunk[w] != 0xFFFFFFFFu;                                                 \
            }                                                                                 \
            for (int32_t k = 0; k < n; ++k) {                                                 \
                int64_t w = start + hits[k];                                                  \
                NAME##_word(out + w * 32, ~words[w], neg);                                    \
            }                                                                                 \
        }                                                                                     \
        uint32_t clear = tail ? ~words[full] & ((1u << tail) - 1u) : 0;                       \
        for (; clear; clear &= clear - 1) out[full * 32 + __builtin_ctz(clear)] = neg;        \
    }                                                                                         \
    void NAME(T *logits, int64_t logits_stride, const int32_t *bitmask, int64_t bitmask_stride, \
              const int64_t *rows, int64_t n_rows, int64_t vocab, T neg) {                    \
        for (int64_t i = 0; i < n_rows; ++i) {                                                \
            int64_t r = rows ? rows[i] : i;                                                   \
            NAME##_row(logits + r * logits_stride,                                            \
                       (const uint32_t *)(bitmask + r * bitmask_stride), vocab, neg);         \
        }                                                                                     \
    }

DEFINE_MASK(plait_mask_b32, uint32_t)
DEFINE_MASK(plait_mask_b16, uint16_t)
