/* testutil_gguf.c: the C tests' GGUF rewriter (testutil.h: tu_gguf_rewrite, tu_retype). Apart
 * from testutil.c because it uses the library's private format and model headers, which the
 * tests of the Lua module (lua/tests/) do not see. */
#include <string.h>
#include "kvg_gguf.h"
#include "kvg_quant.h"
#include "testutil.h"

char *tu_gguf_rewrite(const char *src_path, const char *out_name, const tu_gguf_edit *e) {
    static const tu_gguf_edit copy = {0};
    if (!e) e = &copy;
    kvg_gguf *src = NULL;
    kvgen_error err = {0};
    if (kvg_gguf_open(src_path, &src, &err)) {
        fprintf(stderr, "rewrite %s: %s\n", out_name, err.message);
        return NULL;
    }
    kvg_gguf_writer *w = kvg_gguf_writer_new();
    if (e->keys) e->keys(w, src, e->ctx);
    else
        for (int i = 0; i < kvg_gguf_n_kv(src); i++) kvg_gguf_copy_kv(w, src, kvg_gguf_key(src, i));
    for (int i = 0; i < kvg_gguf_n_tensors(src); i++) {
        const kvg_tensor *t = kvg_gguf_tensor(src, i);
        if (e->tensor) e->tensor(w, t, e->ctx);
        else kvg_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
    }
    if (e->finish) e->finish(w, src, e->ctx);
    char *path = tu_tmpfile(out_name);
    kvgen_status st = kvg_gguf_writer_save(w, path, &err);
    kvg_gguf_writer_free(w);
    kvg_gguf_close(src);
    if (st) {
        fprintf(stderr, "rewrite %s: %s\n", out_name, err.message);
        free(path);
        return NULL;
    }
    return path;
}

typedef struct retype_ctx {
    const char *name;
    uint32_t type;
} retype_ctx;

static void retype_tensor(kvg_gguf_writer *w, const kvg_tensor *t, const void *ctx) {
    const retype_ctx *r = ctx;
    if (strcmp(t->name, r->name) != 0) {
        kvg_gguf_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->nbytes);
        return;
    }
    size_t nb = kvg_row_bytes(r->type, t->n_elements);
    void *z = calloc(1, nb);
    kvg_gguf_add_tensor(w, t->name, r->type, t->n_dims, t->ne, z, nb);
    free(z);
}

char *tu_retype(const char *src_path, const char *out_name, const char *name, uint32_t type) {
    retype_ctx r = {name, type};
    return tu_gguf_rewrite(src_path, out_name, &(tu_gguf_edit){.tensor = retype_tensor, .ctx = &r});
}
