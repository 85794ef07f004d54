/* kvg_shaders.h: the SPIR-V modules embedded at build time by shaders/CMakeLists.txt (private). */
#ifndef KVG_SHADERS_H
#define KVG_SHADERS_H
#include <stddef.h>
#include <stdint.h>

typedef struct kvg_shader_blob {
    const char *name;     /* "matvec_q4_1", "attn", ... */
    const uint32_t *code; /* SPIR-V words */
    size_t size;          /* bytes */
    const char *defines;  /* the -D defines it was compiled with, comma separated ("" for none) */
} kvg_shader_blob;

/* NULL when no shader has that name */
const kvg_shader_blob *kvg_shader_find(const char *name);
size_t kvg_shader_count(void);
const kvg_shader_blob *kvg_shader_at(size_t i); /* NULL past the end */

#endif
