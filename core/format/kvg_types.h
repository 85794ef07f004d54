/* kvg_types.h: ggml tensor types: numbers, names, block sizes (format/types.c). */
#ifndef KVG_TYPES_H
#define KVG_TYPES_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kvg_type {
    KVG_TYPE_F32 = 0, KVG_TYPE_F16 = 1, KVG_TYPE_Q4_0 = 2, KVG_TYPE_Q4_1 = 3, KVG_TYPE_Q5_0 = 6,
    KVG_TYPE_Q5_1 = 7, KVG_TYPE_Q8_0 = 8, KVG_TYPE_Q2_K = 10, KVG_TYPE_Q3_K = 11, KVG_TYPE_Q4_K = 12,
    KVG_TYPE_Q5_K = 13, KVG_TYPE_Q6_K = 14, KVG_TYPE_Q8_K = 15, KVG_TYPE_IQ4_NL = 20, KVG_TYPE_IQ4_XS = 23,
    KVG_TYPE_BF16 = 30
} kvg_type;

/* Bytes of one block of each type kvgen computes with (the layouts: quant.c's top comment), the
 * one place they are written: types.c's size table, quant.c's row functions, and the cpu
 * backend's kernels, read them from here. Blocks hold KVG_QK_BLOCK or KVG_QB_BLOCK elements. */
#define KVG_QB_BLOCK 32  /* elements of a block of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL */
#define KVG_QK_BLOCK 256 /* elements of a block of the K types and IQ4_XS */
enum {
    KVG_Q4_0_BYTES = 18, KVG_Q4_1_BYTES = 20, KVG_Q5_0_BYTES = 22, KVG_Q5_1_BYTES = 24, KVG_Q8_0_BYTES = 34,
    KVG_IQ4_NL_BYTES = 18, KVG_Q2_K_BYTES = 84, KVG_Q3_K_BYTES = 110, KVG_Q4_K_BYTES = 144,
    KVG_Q5_K_BYTES = 176, KVG_Q6_K_BYTES = 210, KVG_Q8_K_BYTES = 292, KVG_IQ4_XS_BYTES = 136
};

bool kvg_type_known(uint32_t type);       /* a ggml type number kvgen can size (may be unsupported) */
const char *kvg_type_name(uint32_t type); /* "Q4_1", or "type 14" style for unknown ones (static buffer-free) */
uint32_t kvg_type_block_elems(uint32_t type);  /* elements per block (1 for F32/F16/BF16, 32 for Q*_0/1 and
                                                  * IQ4_NL, 256 for the K types and IQ4_XS) */
uint32_t kvg_type_block_bytes(uint32_t type);  /* bytes per block */
size_t kvg_row_bytes(uint32_t type, uint64_t n);  /* n must be a multiple of the block size */

#endif
