/* types.c: every ggml tensor type number: its name, block size and block bytes, so a reader can
 * name and size what it cannot run. Below the model: the GGUF reader sizes tensors with it; what
 * kvgen computes with each type (dequantize, dot) is model/quant.c's traits table. */
#include "kvg_types.h"

typedef struct type_info {
    const char *name;
    uint32_t block_elems; /* 0: a retired type number that no longer has a layout */
    uint32_t block_bytes;
} type_info;

/* Every ggml type number, so a reader can name (and size) what it cannot run. */
static const type_info TYPES[] = {
    [0] = {"F32", 1, 4},                             [1] = {"F16", 1, 2},
    [2] = {"Q4_0", KVG_QB_BLOCK, KVG_Q4_0_BYTES},    [3] = {"Q4_1", KVG_QB_BLOCK, KVG_Q4_1_BYTES},
    [4] = {"Q4_2", 0, 0},                            [5] = {"Q4_3", 0, 0},
    [6] = {"Q5_0", KVG_QB_BLOCK, KVG_Q5_0_BYTES},    [7] = {"Q5_1", KVG_QB_BLOCK, KVG_Q5_1_BYTES},
    [8] = {"Q8_0", KVG_QB_BLOCK, KVG_Q8_0_BYTES},    [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", KVG_QK_BLOCK, KVG_Q2_K_BYTES},   [11] = {"Q3_K", KVG_QK_BLOCK, KVG_Q3_K_BYTES},
    [12] = {"Q4_K", KVG_QK_BLOCK, KVG_Q4_K_BYTES},   [13] = {"Q5_K", KVG_QK_BLOCK, KVG_Q5_K_BYTES},
    [14] = {"Q6_K", KVG_QK_BLOCK, KVG_Q6_K_BYTES},   [15] = {"Q8_K", KVG_QK_BLOCK, KVG_Q8_K_BYTES},
    [16] = {"IQ2_XXS", 256, 66},                     [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98},                     [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", KVG_QB_BLOCK, KVG_IQ4_NL_BYTES}, [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},                       [23] = {"IQ4_XS", KVG_QK_BLOCK, KVG_IQ4_XS_BYTES},
    [24] = {"I8", 1, 1},                             [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},                            [27] = {"I64", 1, 8},
    [28] = {"F64", 1, 8},                            [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},                           [31] = {"Q4_0_4_4", 0, 0},
    [32] = {"Q4_0_4_8", 0, 0},                       [33] = {"Q4_0_8_8", 0, 0},
    [34] = {"TQ1_0", 256, 54},                       [35] = {"TQ2_0", 256, 66},
    [36] = {"IQ4_NL_4_4", 0, 0},                     [37] = {"IQ4_NL_4_8", 0, 0},
    [38] = {"IQ4_NL_8_8", 0, 0},                     [39] = {"MXFP4", 32, 17},
    [40] = {"NVFP4", 64, 36},                        [41] = {"Q1_0", 128, 18},
    [42] = {"Q2_0", 64, 18},
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

/* Names for the numbers ggml has never used, so kvg_type_name needs no buffer. */
static const char *const UNKNOWN_NAMES[] = {
    "type 43", "type 44", "type 45", "type 46", "type 47", "type 48", "type 49", "type 50",
    "type 51", "type 52", "type 53", "type 54", "type 55", "type 56", "type 57", "type 58",
    "type 59", "type 60", "type 61", "type 62", "type 63",
};

bool kvg_type_known(uint32_t type) { return type < N_TYPES && TYPES[type].block_elems != 0; }

const char *kvg_type_name(uint32_t type) {
    if (type < N_TYPES) return TYPES[type].name;
    if (type - N_TYPES < sizeof UNKNOWN_NAMES / sizeof UNKNOWN_NAMES[0]) return UNKNOWN_NAMES[type - N_TYPES];
    return "unknown type";
}

uint32_t kvg_type_block_elems(uint32_t type) { return type < N_TYPES ? TYPES[type].block_elems : 0; }
uint32_t kvg_type_block_bytes(uint32_t type) { return type < N_TYPES ? TYPES[type].block_bytes : 0; }

size_t kvg_row_bytes(uint32_t type, uint64_t n) {
    uint32_t be = kvg_type_block_elems(type);
    if (be == 0) return 0;
    return (size_t)(n / be) * kvg_type_block_bytes(type);
}
