/* test_types.c: which weight types a backend runs, from its own table. The reference backend's
 * list is quant.c's traits table; kvg_weights_check_types refuses a weight tensor of a type the
 * backend lacks (a type the traits table lacks, IQ2_XXS and MXFP4, at the start of the reference
 * backend's model_init; a backend with a shorter table) with a message naming the file, the
 * tensor, its type and the backend and listing that backend's types; kvgen-mkmodel's --type
 * list comes from the traits table. The Vulkan backend's table: test_vk_types. */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <sys/wait.h>
#include "kvg_backend.h"
#include "kvg_quant.h"
#include "testutil.h"

/* "F32, F16, ..." of a backend's table */
static void backend_list(const kvg_backend_ops *ops, char *buf, size_t size) {
    uint32_t types[64];
    size_t n = ops->weight_types(types, 64);
    kvg_types_list(types, n < 64 ? n : 64, buf, size);
}

/* the traits table's list is the reference backend's, in the same order */
static void test_reference_list(void) {
    uint32_t traits[64], ref[64];
    size_t nt = kvg_traits_types(traits, 64);
    CHECK(kvg_reference_backend.weight_types != NULL);
    size_t nr = kvg_reference_backend.weight_types(ref, 64);
    CHECKF(nt == nr && nt > 0 && nt <= 64, "traits %zu types, reference %zu", nt, nr);
    for (size_t i = 0; i < nt && i < nr && i < 64; i++) {
        CHECKF(traits[i] == ref[i], "type %zu: traits %s, reference %s", i, kvg_type_name(traits[i]),
               kvg_type_name(ref[i]));
        CHECK(kvg_type_traits_of(ref[i]) != NULL && kvg_type_traits_of(ref[i])->to_float != NULL);
        CHECK(kvg_backend_runs_type(&kvg_reference_backend, ref[i]));
    }
    for (uint32_t t = 0; t < 64; t++)
        CHECKF(kvg_backend_runs_type(&kvg_reference_backend, t) == (kvg_type_traits_of(t) != NULL), "type %s",
               kvg_type_name(t));
    /* the K types and Q5_0 are rows of the table; IQ2_XXS (16) and MXFP4 (39) are not */
    CHECK(kvg_backend_runs_type(&kvg_reference_backend, KVG_TYPE_Q6_K) &&
          kvg_backend_runs_type(&kvg_reference_backend, KVG_TYPE_Q4_K) &&
          kvg_backend_runs_type(&kvg_reference_backend, KVG_TYPE_Q5_0));
    CHECK(!kvg_backend_runs_type(&kvg_reference_backend, 16) && !kvg_backend_runs_type(&kvg_reference_backend, 39));
}

/* A model described from `good`, one of whose tensors (`which`) is then pointed at `bad`'s
 * tensor of that name: kvg_weights_describe refuses a type the traits table lacks, so this is how
 * a backend's own check gets to see one. */
typedef struct fake_model {
    kvgen_model m;
    kvg_gguf *good;
} fake_model;

static bool fake_open(fake_model *f, const char *good, const char *bad, const char *which) {
    memset(f, 0, sizeof *f);
    kvgen_error err = {0};
    if (kvg_gguf_open(good, &f->good, &err) || kvg_weights_describe(f->good, &f->m.w, &err)) {
        fprintf(stderr, "%s: %s\n", good, err.message);
        return false;
    }
    if (!bad) return true;
    if (kvg_gguf_open(bad, &f->m.gguf, &err)) {
        fprintf(stderr, "%s: %s\n", bad, err.message);
        return false;
    }
    const kvg_tensor *t = kvg_gguf_find_tensor(f->m.gguf, which);
    if (!t) return false;
    kvg_weights *w = &f->m.w;
    const kvg_tensor **slots[] = {&w->tok_embd, &w->output, &w->output_norm};
    for (size_t i = 0; i < 3; i++)
        if (strcmp((*slots[i])->name, which) == 0) *slots[i] = t;
    for (int l = 0; l < w->hp.n_layer; l++) {
        kvg_layer *L = &w->layers[l];
        const kvg_tensor **ls[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_norm, &L->w_gate,
                                   &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ls / sizeof ls[0]; i++)
            if (strcmp((*ls[i])->name, which) == 0) *ls[i] = t;
    }
    return true;
}

static void fake_close(fake_model *f) {
    kvg_weights_free(&f->m.w);
    kvg_gguf_close(f->m.gguf);
    kvg_gguf_close(f->good);
}

/* ops->model_init on the model with `which` of type `type` refuses it, naming everything */
static void expect_backend_refusal(const kvg_backend_ops *ops, const char *good, const char *bad, const char *which,
                                   uint32_t type) {
    fake_model f;
    bool ok = fake_open(&f, good, bad, which);
    CHECKF(ok, "%s: could not build the model", bad);
    if (ok) {
        kvgen_model_desc desc = {.path = bad, .n_threads = 1};
        kvgen_error err = {0};
        kvgen_status st = ops->model_init(&f.m, &desc, &err);
        char list[512], want[1024];
        backend_list(ops, list, sizeof list);
        snprintf(want, sizeof want, "%s: tensor %s has type %s, which the %s backend does not run (%s runs: %s)", bad,
                 which, kvg_type_name(type), ops->name, ops->name, list);
        CHECKF(st == KVGEN_E_UNSUPPORTED, "%s %s: status %s (%s)", ops->name, which, kvgen_status_name(st),
               err.message);
        CHECKF(strcmp(err.message, want) == 0, "%s: message\n  %s\nwant\n  %s", ops->name, err.message, want);
        CHECK(f.m.backend == NULL);
        if (st == KVGEN_OK && ops->model_free) ops->model_free(&f.m);
    }
    fake_close(&f);
}

static size_t narrow_types(uint32_t *types, size_t max) {
    static const uint32_t t[] = {KVG_TYPE_F32, KVG_TYPE_Q4_1};
    for (size_t i = 0; i < 2 && i < max; i++) types[i] = t[i];
    return 2;
}

static size_t f32_only_types(uint32_t *types, size_t max) {
    if (max) types[0] = KVG_TYPE_F32;
    return 1;
}

static void test_refusals(void) {
    /* 256-wide rows so an IQ2_XXS tensor (256-element blocks) can stand in for a matrix */
    char *good = tu_make_model("t-src.gguf", "--layers 2 --embd 256 --heads 4 --kv-heads 2 --ff 256 --type Q8_0");
    CHECK(good != NULL);
    if (!good) return;
    char *iq2 = tu_retype(good, "t-iq2xxs.gguf", "blk.0.attn_q.weight", 16);
    char *mxfp4 = tu_retype(good, "t-mxfp4.gguf", "blk.1.ffn_down.weight", 39);
    CHECK(iq2 && mxfp4);
    CHECK(!kvg_type_supported(16) && !kvg_type_supported(39));
    if (iq2 && mxfp4) {
        expect_backend_refusal(&kvg_reference_backend, good, iq2, "blk.0.attn_q.weight", 16);
        expect_backend_refusal(&kvg_reference_backend, good, mxfp4, "blk.1.ffn_down.weight", 39);
        /* loading either file refuses it too, on the reference backend as on the default one */
        const char *files[] = {iq2, mxfp4};
        for (int i = 0; i < 2; i++)
            for (int b = 0; b < 2; b++) {
                kvgen_model_desc d = {.path = files[i], .backend = b ? KVGEN_BACKEND_REFERENCE : KVGEN_BACKEND_DEFAULT};
                kvgen_model *m = NULL;
                kvgen_error err = {0};
                kvgen_status st = kvgen_model_load(&d, &m, &err);
                CHECKF(st == KVGEN_E_UNSUPPORTED && !m, "%s: %s", files[i], err.message);
                CHECKF(strstr(err.message, files[i]) && strstr(err.message, i ? "MXFP4" : "IQ2_XXS") &&
                           strstr(err.message, i ? "blk.1.ffn_down.weight" : "blk.0.attn_q.weight"),
                       "%s", err.message);
                kvgen_model_unload(m);
            }
    }

    /* the check walks every weight tensor and lists exactly the backend's table */
    fake_model f;
    bool ok = fake_open(&f, good, NULL, NULL);
    CHECK(ok);
    if (ok) {
        kvgen_error err = {0};
        CHECK_OK(kvg_weights_check_types(&f.m, &kvg_reference_backend, &err));
        f.m.gguf = f.good;
        kvg_backend_ops narrow = kvg_reference_backend;
        narrow.name = "narrow";
        narrow.weight_types = narrow_types; /* F32 and Q4_1: the Q8_0 matrices are refused */
        kvgen_status st = kvg_weights_check_types(&f.m, &narrow, &err);
        char want[512];
        snprintf(want, sizeof want, "%s: tensor token_embd.weight has type Q8_0, which the narrow backend does not "
                 "run (narrow runs: F32, Q4_1)", good);
        CHECKF(st == KVGEN_E_UNSUPPORTED && strcmp(err.message, want) == 0, "%s", err.message);
        narrow.weight_types = NULL;
        CHECK(kvg_weights_check_types(&f.m, &narrow, &err) == KVGEN_E_INTERNAL);
        f.m.gguf = NULL;
    }
    fake_close(&f);

    /* past the embeddings: a Q4_1 model with F32 embeddings passes F32 + Q4_1; with F32 alone the
     * first layer's first matrix is refused */
    char *mixed = tu_make_model("t-q41.gguf", "--layers 2 --embd 64 --heads 4 --type Q4_1 --embd-type F32");
    CHECK(mixed != NULL);
    if (mixed) {
        ok = fake_open(&f, mixed, NULL, NULL);
        CHECK(ok);
        if (ok) {
            kvgen_error err = {0};
            f.m.gguf = f.good;
            kvg_backend_ops narrow = kvg_reference_backend;
            narrow.name = "narrow";
            narrow.weight_types = narrow_types;
            CHECK_OK(kvg_weights_check_types(&f.m, &narrow, &err));
            narrow.weight_types = f32_only_types; /* every Q4_1 matrix refused: the first is blk.0's */
            kvgen_status st = kvg_weights_check_types(&f.m, &narrow, &err);
            CHECKF(st == KVGEN_E_UNSUPPORTED && strstr(err.message, "tensor blk.0.attn_q.weight has type Q4_1") &&
                       strstr(err.message, "(narrow runs: F32)"),
                   "%s", err.message);
            f.m.gguf = NULL;
        }
        fake_close(&f);
    }
    free(mixed);
    free(iq2);
    free(mxfp4);
    free(good);
}

/* kvgen-mkmodel --type: the traits table's types that can be written; others refused with the list */
static int mkmodel(const char *args, char *out, size_t size) {
    return tu_run_mkmodel("t-mk.gguf", args, out, size);
}

static void test_mkmodel_types(void) {
    uint32_t all[64], writable[64];
    size_t n = kvg_traits_types(all, 64), nw = 0;
    for (size_t i = 0; i < n && i < 64; i++)
        if (kvg_type_traits_of(all[i])->from_float) writable[nw++] = all[i];
    CHECK(nw > 0);
    char list[512], bar[512], out[4096], args[256];
    kvg_types_list(writable, nw, list, sizeof list);
    /* the usage line separates them with | */
    snprintf(bar, sizeof bar, "%s", list);
    for (char *c = bar; (c = strstr(c, ", ")) != NULL;) {
        *c = '|';
        memmove(c + 1, c + 2, strlen(c + 2) + 1);
    }
    for (size_t i = 0; i < nw; i++) { /* rows a whole number of blocks: 256 wide for the K types */
        int width = kvg_type_block_elems(writable[i]) > 64 ? 256 : 64;
        snprintf(args, sizeof args, "--type %s --embd %d --ff %d --layers 1", kvg_type_name(writable[i]), width, width);
        CHECKF(mkmodel(args, out, sizeof out) == 0, "mkmodel %s: %s", args, out);
    }
    const char *bad[] = {"IQ2_XXS", "MXFP4", "q4_k", "bogus"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "--type %s", bad[i]);
        CHECKF(mkmodel(args, out, sizeof out) != 0, "mkmodel %s succeeded", args);
        char want[700];
        snprintf(want, sizeof want, "--type %s is not a type kvgen-mkmodel can write (valid: %s)", bad[i], list);
        CHECKF(strstr(out, want) != NULL, "mkmodel %s said:\n%s\nwant: %s", args, out, want);
    }
    CHECK(mkmodel("--embd-type IQ2_XXS", out, sizeof out) != 0 && strstr(out, "--embd-type IQ2_XXS") &&
          strstr(out, list));
    CHECK(mkmodel("--help", out, sizeof out) != 0);
    char want[700];
    snprintf(want, sizeof want, "[--type %s]", bar);
    CHECKF(strstr(out, want) != NULL, "mkmodel --help:\n%s\nwant: %s", out, want);
}

int main(void) {
    test_reference_list();
    test_refusals();
    test_mkmodel_types();
    return tu_finish("test_types");
}
