/* kvg_quant.h: computing with tensor types: block layouts, (de)quantization, dot products (the
 * type numbers, names and sizes are format/kvg_types.h). */
#ifndef KVG_QUANT_H
#define KVG_QUANT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvg_types.h" /* format/: type numbers, names and block sizes */

/* What kvgen knows about computing with one tensor type (a row of quant.c's table). Rows are
 * whole rows of a tensor: n elements, a multiple of the type's block size. */
typedef struct kvg_type_traits {
    uint32_t type;
    void (*to_float)(const uint8_t *src, float *dst, uint64_t n);   /* dequantize */
    void (*from_float)(const float *src, uint8_t *dst, uint64_t n); /* quantize (test models) */
    float (*dot)(const uint8_t *row, const float *x, uint64_t n);   /* row . x, x in vec_dot_type */
    uint32_t vec_dot_type;                                            /* the activations' type */
} kvg_type_traits;

/* NULL: kvgen cannot compute with this type (it may still be able to size it) */
const kvg_type_traits *kvg_type_traits_of(uint32_t type);
bool kvg_type_supported(uint32_t type);   /* kvg_type_traits_of(type) != NULL */
/* the types of the traits table (all kvgen computes with): fills up to max, returns the count */
size_t kvg_traits_types(uint32_t *types, size_t max);
/* "F32, F16, Q8_0" into buf (like snprintf: returns the length it needed) */
size_t kvg_types_list(const uint32_t *types, size_t n, char *buf, size_t size);

float kvg_f16_to_f32(uint16_t h);
uint16_t kvg_f32_to_f16(float f);
float kvg_bf16_to_f32(uint16_t h);
uint16_t kvg_f32_to_bf16(float f);

void kvg_dequantize_row(uint32_t type, const void *src, float *dst, uint64_t n);
void kvg_quantize_row(uint32_t type, const float *src, void *dst, uint64_t n);
/* dot(row of `type`, f32 vector x), n elements */
float kvg_dot_row(uint32_t type, const void *row, const float *x, uint64_t n);

#endif
