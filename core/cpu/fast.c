/* fast.c: the cpu backend, the fast forward pass on the host's cores. It runs every
 * architecture of the table, with the structure of the reference (reference.c: a batch
 * flattened into blocks of tokens, layer by layer, K/V in the model's host pages of
 * cpu_pages.c, every feature as data of the model description), and differs in how it
 * computes:
 * - matrix products take the weights packed (as the file stores them; the 32-element types
 *   regrouped once at load into a copy of the same size, their scales side by side) and the
 *   activations quantized per block to int16 (kvg_qdot.h: blocks of 32 with their scale for
 *   the 32-element types, of 256 for the K types; f32 for F32/F16/BF16), each block's products
 *   summed in integers; a weight row is decoded once per tile of KVG_QDOT_TILE tokens, rows are
 *   taken 8 at a time against all the block's tiles, so a row is read once per block of up to
 *   CPU_BLOCK tokens (prefill runs as GEMM, a batch of many sessions' decodes shares every row
 *   read); where the path has group kernels (avx512vnni, neon, dotprod: the 32-element types
 *   and the K types but Q8_K; avx2 and avx512: the K types but Q8_K and IQ4_XS; avxvnni: the K
 *   types but Q8_K; avx512 and avx512vnni: the float types too) a matrix of a multiple of 16
 *   rows is packed at load into groups of 16 rows computed together (one row per vector lane;
 *   the float types' rows 4 at a time against 4 tokens), each group against tiles of up to 8
 *   tokens;
 * - attention, norms, activations and softmax are vector loops (cpu_vec.c); RoPE angles are
 *   computed once per token and layer (shared by the heads), not per element;
 * - K/V pages hold IEEE f16, not f32 (half the bytes a decode at depth reads); keys and values
 *   are rounded once as they are stored, and attention converts them back as it loads them;
 * - the kernels are those of the instruction set chosen at load (portable C, AVX2, AVX-512,
 *   AVX-VNNI, AArch64 NEON and dotprod; KVGEN_CPU_ISA forces one), on a thread pool that polls between the jobs of a
 *   step instead of sleeping (kvg_cpu_pool_set_spin).
 * Work is split by output rows, attention (token, KV head) pairs and tokens, each computed by one
 * thread in an order that depends on it alone: results do not depend on the thread count, and
 * a token's logits are the same bits whatever batch or block it came in (prefill, decode, a
 * batch of sessions). Against the reference they differ by the activations' quantization and
 * the f16 K/V (test_cpu_backend states and measures the tolerance). Nothing is allocated per
 * token.
 *
 * An encoder (bert) runs the graph of cpu_encode.c with these matrix products (cpu_encode).
 *
 * Shapes in comments: n = tokens in the block, D = n_embd, F = n_ff, H = n_head, Hkv =
 * n_head_kv, hd = head_dim, V = n_vocab. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_backend.h"
#include "kvg_platform.h"
#include "kvg_cpu.h"
#include "kvg_qdot.h"
#include "kvg_quant.h"
#include "kvg_reference.h"

#define CPU_BLOCK 64  /* tokens per block (as the reference's) */
#define CPU_ROWS 8    /* weight rows taken together against every tile of the block */
#define CPU_SPIN_US 300 /* the pool's polling time between jobs */
#define CPU_PREFETCH 8  /* rows ahead a matrix product asks the cache for */

#define WHO "cpu backend"

/* ---- per-model and per-session state ---------------------------------------------------------- */

/* A matrix as the kernels read it: the file's rows, or a repacked copy (kvg_qdot_kernel.repack). */
typedef struct cpu_matrix {
    const kvg_tensor *t;
    const kvg_qdot_kernel *k;
    const uint8_t *rows;
    uint8_t *own;       /* the repacked copy, or NULL */
    size_t group_bytes; /* > 0: rows packed in groups of KVG_QDOT_GROUP for k->group, each this size */
    int n_groups;       /* the groups; the rows past them (fewer than a group: a vocabulary of 32,002
                         * rows leaves 2) follow them, a row each as the row kernel reads it */
} cpu_matrix;

enum { M_Q, M_K, M_V, M_O, M_GATE, M_UP, M_DOWN, N_MATRICES };

typedef struct cpu_layer {
    cpu_matrix w[N_MATRICES];
    double *inv_freq;            /* [n_rot/2]: theta_i = pos * inv_freq[i] (scale, base, factors folded in) */
    int rope_group;              /* the first layer with the same RoPE (base and scale) */
} cpu_layer;

typedef struct cpu_model {
    kvg_cpu_host host; /* first: the layers' small tensors and RoPE, the pages (cpu_common.c) */
    kvg_cpu_pool *pool;
    kvg_cpu_isa isa;
    bool act8; /* 8-bit activations where the path has such kernels (kvgen_model_desc.activation_bits) */
    const kvg_vec_ops *vec;
    const kvg_vec_kv *kv; /* attention's kernels for the pages' type */
    cpu_layer *layers;
    int max_in;                  /* the widest input of a matrix product: max(D, H*hd, F) */
    cpu_matrix output;           /* the logits' matrix (output, or the tied token_embd) */
    bool encode_whole;           /* an encoder whose matrices are all in row groups of f32 activations
                                    (cpu_encode_products) */
} cpu_model;

struct kvg_backend_session {
    kvg_cpu_scratch c; /* first: n_ctx, n_threads and the activations of one block of tokens */
    /* a matrix product's input quantized (kvg_qact), rows of up to max_in */
    int16_t *qb, *qk;
    float *db, *sb, *dk;
    int32_t *bk;
    int8_t *q8, *q8h; /* byte activations: Q8's, or QS's low and high bytes */
    float *d8, *s8;
    int32_t *b8; /* their sums of each 16 */
    float *rope_cs; /* [n][n_rot/2][2] cos, sin of each token's angles for the current layer */
    float *scores;  /* [n_threads][G * n_ctx + G], G = n_head / n_head_kv: a thread's scores of one KV head's
                     * query heads, then their softmax denominators */
};

static void cpu_model_free(kvgen_model *m);

/* The layers' small tensors and RoPE (as the reference's: kvg_cpu_host_init), and each layer's
 * RoPE frequencies in double: theta_i = pos * scale * base^(-2i/n_rot) / factors[i]. */
static kvgen_status layers_init(kvgen_model *m, cpu_model *cm, kvgen_error *err) {
    const kvg_hparams *hp = &m->w.hp;
    size_t L = (size_t)hp->n_layer, half = (size_t)hp->n_rot / 2;
    kvgen_status st = kvg_cpu_host_init(&cm->host, m, WHO, err);
    if (st != KVGEN_OK) return st;
    const kvg_ref_rope_params *ropes = cm->host.ropes;
    cm->layers = kvg_calloc(L, sizeof *cm->layers);
    bool ok = cm->layers != NULL;
    for (size_t l = 0; ok && l < L; l++) {
        cpu_layer *c = &cm->layers[l];
        kvg_ref_rope_params r = ropes[l];
        c->rope_group = (int)l;
        for (size_t e = 0; e < l; e++)
            if (ropes[e].base == r.base && ropes[e].scale == r.scale) {
                c->rope_group = (int)e;
                break;
            }
        c->inv_freq = ok ? kvg_malloc((half ? half : 1) * sizeof(double)) : NULL;
        ok = ok && c->inv_freq;
        for (size_t i = 0; ok && i < half; i++) {
            double f = (double)r.scale * pow(r.base, -2.0 * (double)i / r.n_rot);
            c->inv_freq[i] = r.factors ? f / (double)r.factors[i] : f;
        }
    }
    if (!ok) return kvg_fail(err, KVGEN_E_NO_MEMORY, WHO ": out of memory for the model's small tensors");
    return KVGEN_OK;
}

/* repacking a matrix's rows, a row per item */
typedef struct repack_job {
    cpu_matrix *mx;
    size_t row_bytes;
} repack_job;

static void repack_rows(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const repack_job *j = ctx;
    const cpu_matrix *mx = j->mx;
    for (int r = begin; r < end; r++)
        mx->k->repack((const uint8_t *)mx->t->data + (size_t)r * j->row_bytes, mx->own + (size_t)r * j->row_bytes,
                      (int)mx->t->ne[0]);
}

/* packing a matrix's row groups, a group per item; then the rows past the last group, an item
 * each, as the row kernel reads them */
static void pack_groups(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const repack_job *j = ctx;
    const cpu_matrix *mx = j->mx;
    const uint8_t *src = mx->t->data;
    uint8_t *tail = mx->own + (size_t)mx->n_groups * mx->group_bytes;
    for (int g = begin; g < end; g++) {
        if (g < mx->n_groups) {
            mx->k->group_pack(src + (size_t)g * KVG_QDOT_GROUP * j->row_bytes, j->row_bytes,
                              mx->own + (size_t)g * mx->group_bytes, (int)mx->t->ne[0]);
            continue;
        }
        size_t i = (size_t)(g - mx->n_groups), r = (size_t)mx->n_groups * KVG_QDOT_GROUP + i;
        if (mx->k->repack) mx->k->repack(src + r * j->row_bytes, tail + i * j->row_bytes, (int)mx->t->ne[0]);
        else memcpy(tail + i * j->row_bytes, src + r * j->row_bytes, j->row_bytes);
    }
}

/* t as the kernels of the model's path read it: repacked into memory of the backend's own
 * where the kernel asks for it (the copy is the size of the tensor); the file stays mapped,
 * but its pages of t leave resident memory, so the weights are held once (a later read of the
 * file's bytes, such as a tied embedding's rows, brings back only what it touches) */
static kvgen_status matrix_init(const kvgen_model *m, cpu_model *cm, const kvg_tensor *t, cpu_matrix *mx,
                               kvgen_error *err) {
    *mx = (cpu_matrix){.t = t,
                       .k = cm->act8 ? kvg_qdot_kernel_fast(cm->isa, t->type) : kvg_qdot_kernel_of(cm->isa, t->type),
                       .rows = t->data};
    if (!mx->k) return kvg_fail(err, KVGEN_E_INTERNAL, WHO ": no kernel for %s", kvg_type_name(t->type));
    bool grouped = mx->k->group && t->ne[1] >= KVG_QDOT_GROUP;
    if (!mx->k->repack && !grouped) return KVGEN_OK;
    size_t row_bytes = kvg_row_bytes(t->type, t->ne[0]), bytes = row_bytes * (size_t)t->ne[1];
    int tail = (int)(t->ne[1] % KVG_QDOT_GROUP);
    if (grouped) {
        mx->group_bytes = mx->k->group_bytes((int)t->ne[0]);
        mx->n_groups = (int)(t->ne[1] / KVG_QDOT_GROUP);
        bytes = mx->group_bytes * (size_t)mx->n_groups + row_bytes * (size_t)tail;
    }
    mx->own = kvg_malloc(bytes ? bytes : 1);
    if (!mx->own)
        return kvg_fail(err, KVGEN_E_NO_MEMORY, WHO ": out of memory for a %zu-byte copy of %s", bytes, t->name);
    /* every token streams the copy: in huge pages it takes fewer TLB misses (1B Q4_K_M mix, 2
     * threads, decode 2-4% faster), asked for before the repack first touches it */
    kvg_advise_huge(mx->own, bytes);
    repack_job j = {.mx = mx, .row_bytes = row_bytes};
    if (grouped) kvg_cpu_pool_run(cm->pool, mx->n_groups + tail, pack_groups, &j);
    else kvg_cpu_pool_run(cm->pool, (int)t->ne[1], repack_rows, &j);
    mx->rows = mx->own;
    kvg_gguf_drop_bytes(m->gguf, t->data, row_bytes * (size_t)t->ne[1]);
    return KVGEN_OK;
}

static uint64_t matrix_bytes(const kvg_tensor *t) { return (uint64_t)kvg_row_bytes(t->type, t->ne[0]) * t->ne[1]; }

/* the load's KVGEN_LOAD_UPLOAD stage: bytes of the matrices made ready, one report per matrix */
static kvgen_status matrices_init(kvgen_model *m, cpu_model *cm, kvgen_error *err) {
    /* an encoder has no logits: its token_embd stays as the file has it, read row by row */
    const kvg_tensor *output = m->w.arch && m->w.arch->encoder ? NULL : m->w.output;
    uint64_t total = output ? matrix_bytes(output) : 0, done = 0;
    for (int l = 0; l < m->w.hp.n_layer; l++) {
        const kvg_layer *L = &m->w.layers[l];
        const kvg_tensor *ts[N_MATRICES] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
        for (int i = 0; i < N_MATRICES; i++) total += ts[i] ? matrix_bytes(ts[i]) : 0;
    }
    kvgen_status st = KVGEN_OK;
    if (output) {
        st = matrix_init(m, cm, output, &cm->output, err);
        done += matrix_bytes(output);
        if (st == KVGEN_OK) st = kvg_load_progress(m, KVGEN_LOAD_UPLOAD, done, total, err);
    }
    for (int l = 0; st == KVGEN_OK && l < m->w.hp.n_layer; l++) {
        const kvg_layer *L = &m->w.layers[l];
        const kvg_tensor *ts[N_MATRICES] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
        for (int i = 0; st == KVGEN_OK && i < N_MATRICES; i++) {
            if (!ts[i]) continue; /* an encoder's ungated feed-forward has no ffn_gate */
            st = matrix_init(m, cm, ts[i], &cm->layers[l].w[i], err);
            done += matrix_bytes(ts[i]);
            if (st == KVGEN_OK) st = kvg_load_progress(m, KVGEN_LOAD_UPLOAD, done, total, err);
        }
    }
    return st;
}

static kvgen_status cpu_model_init(kvgen_model *m, const kvgen_model_desc *desc, kvgen_error *err) {
    kvgen_status st = kvg_weights_check_types(m, &kvg_cpu_backend, err);
    if (st == KVGEN_OK) st = kvg_arch_check_backend(m, &kvg_cpu_backend, err);
    if (st != KVGEN_OK) return st;
    const kvg_hparams *hp = &m->w.hp;
    const char *path = m->gguf ? kvg_gguf_path(m->gguf) : "model";
    if (hp->n_layer <= 0 || hp->n_embd <= 0 || hp->n_ff <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->head_dim <= 0 || hp->n_vocab <= 0)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: hyperparameters must be positive", path);
    if (hp->n_head % hp->n_head_kv != 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: n_head %d is not a multiple of n_head_kv %d", path, hp->n_head,
                        hp->n_head_kv);
    if (hp->n_rot < 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: rope dimension %d must be even and at most head_dim %d", path,
                        hp->n_rot, hp->head_dim);
    if (m->w.tok_embd->ne[0] != (uint64_t)hp->n_embd || m->w.tok_embd->ne[1] < (uint64_t)hp->n_vocab ||
        m->w.output->ne[0] != (uint64_t)hp->n_embd || m->w.output->ne[1] != (uint64_t)hp->n_vocab)
        return kvg_fail(err, KVGEN_E_FORMAT, "%s: token_embd/output shapes do not match n_embd %d, n_vocab %d", path,
                        hp->n_embd, hp->n_vocab);
    kvg_cpu_isa isa;
    st = kvg_cpu_isa_choose(WHO, &isa, err);
    if (st != KVGEN_OK) return st;

    int n_threads = kvg_cpu_threads(m->n_threads);
    m->n_threads = n_threads;
    cpu_model *cm = kvg_calloc(1, sizeof *cm);
    if (!cm) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for the cpu backend", path);
    m->backend = cm; /* from here on, cpu_model_free cleans up */
    cm->isa = isa;
    cm->act8 = desc && desc->activation_bits == 8;
    cm->vec = kvg_vec_ops_of(isa);
    cm->kv = kvg_vec_kv_of(isa, m->kv_type);
    if (!cm->kv) {
        cpu_model_free(m);
        return kvg_fail(err, KVGEN_E_INTERNAL, WHO ": no attention kernels for %s K/V pages", kvg_type_name(m->kv_type));
    }
    int qd = hp->n_head * hp->head_dim;
    cm->max_in = hp->n_embd > hp->n_ff ? hp->n_embd : hp->n_ff;
    if (qd > cm->max_in) cm->max_in = qd;
    st = layers_init(m, cm, err);
    if (st == KVGEN_OK) st = kvg_cpu_pool_create(n_threads, WHO, &cm->pool, err);
    if (st == KVGEN_OK) st = matrices_init(m, cm, err);
    if (st != KVGEN_OK) {
        cpu_model_free(m);
        return st;
    }
    cm->encode_whole = m->w.arch && m->w.arch->encoder;
    static const int roles[] = {M_Q, M_K, M_V, M_O, M_UP, M_DOWN};
    for (int l = 0; cm->encode_whole && l < hp->n_layer; l++)
        for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
            const cpu_matrix *w = &cm->layers[l].w[roles[i]];
            cm->encode_whole = cm->encode_whole && w->t && w->group_bytes > 0 &&
                               w->t->ne[1] % KVG_QDOT_GROUP == 0 && w->k->act == KVG_ACT_F32;
        }
    kvg_cpu_pool_set_spin(cm->pool, CPU_SPIN_US);
    snprintf(m->device_name, sizeof m->device_name, "cpu (%s)", kvg_cpu_isa_name(isa));
    return KVGEN_OK;
}

static void cpu_model_free(kvgen_model *m) {
    cpu_model *cm = m->backend;
    if (!cm) return;
    kvg_cpu_pool_destroy(cm->pool);
    kvg_cpu_host_free(&cm->host, m);
    for (int l = 0; cm->layers && l < m->w.hp.n_layer; l++) {
        cpu_layer *c = &cm->layers[l];
        kvg_free(c->inv_freq);
        for (int i = 0; i < N_MATRICES; i++) kvg_free(c->w[i].own);
    }
    kvg_free(cm->output.own);
    kvg_free(cm->layers);
    kvg_free(cm);
    m->backend = NULL;
}

static void cpu_session_free(kvgen_model *m, kvg_backend_session *s) {
    (void)m;
    if (!s) return;
    kvg_cpu_scratch_free(&s->c);
    void *ps[] = {s->qb, s->qk, s->db, s->sb, s->dk, s->bk, s->q8, s->q8h, s->d8, s->s8, s->b8, s->rope_cs, s->scores};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) kvg_free(ps[i]);
    kvg_free(s);
}

static kvgen_status cpu_session_init(kvgen_model *m, int n_ctx, kvg_backend_session **out, kvgen_error *err) {
    const kvg_hparams *hp = &m->w.hp;
    const cpu_model *cm = m->backend;
    if (n_ctx <= 0) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, WHO ": n_ctx %d must be > 0", n_ctx);
    kvg_backend_session *s = kvg_calloc(1, sizeof *s);
    if (!s) return kvg_fail(err, KVGEN_E_NO_MEMORY, WHO ": out of memory for a session");
    kvgen_status st = kvg_cpu_scratch_init(&s->c, hp, CPU_BLOCK, n_ctx, kvg_cpu_pool_threads(cm->pool));
    size_t B = CPU_BLOCK, W = (size_t)cm->max_in;
    s->qb = kvg_malloc(B * W * sizeof(int16_t));
    s->qk = kvg_malloc(B * W * sizeof(int16_t));
    s->db = kvg_malloc((B * W / KVG_QB + 1) * sizeof(float));
    s->sb = kvg_malloc((B * W / KVG_QB + 1) * sizeof(float));
    s->dk = kvg_malloc((B * W / KVG_QK + 1) * sizeof(float));
    s->bk = kvg_malloc((B * W / 16 + 1) * sizeof(int32_t));
    s->q8 = kvg_malloc(B * W);
    s->d8 = kvg_malloc((B * W / KVG_QB + 1) * sizeof(float));
    s->s8 = kvg_malloc((B * W / KVG_QB + 1) * sizeof(float));
    s->q8h = kvg_malloc(B * W);
    s->b8 = kvg_malloc((B * W / 16 + 1) * sizeof(int32_t));
    s->rope_cs = kvg_malloc((B * (size_t)hp->n_rot + 1) * sizeof(float));
    size_t group = (size_t)(hp->n_head / hp->n_head_kv);
    s->scores = kvg_malloc((size_t)s->c.n_threads * group * ((size_t)n_ctx + 1) * sizeof(float));
    if (st != KVGEN_OK || !s->qb || !s->qk || !s->db ||
        !s->sb || !s->dk || !s->bk || !s->q8 || !s->q8h || !s->d8 || !s->s8 || !s->b8 || !s->rope_cs || !s->scores) {
        cpu_session_free(m, s);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, WHO ": out of memory for a %d-token session's scratch", n_ctx);
    }
    *out = s;
    return KVGEN_OK;
}

/* ---- matrix products ---------------------------------------------------------------------------- */

/* out[t][r] = dot(W row r, in[t]) for the block's tokens; up to three matrices sharing one input
 * are one job (Q/K/V, gate/up). */
typedef struct mm_part {
    const uint8_t *w;   /* the groups, then the rows past them (cpu_matrix) */
    size_t row_bytes;   /* a row's bytes */
    size_t group_bytes; /* a group's */
    int rows;
    int groups;         /* items 0..groups-1 are groups of KVG_QDOT_GROUP rows, the rest a row each */
    int items;
    const uint8_t *tail; /* row groups * KVG_QDOT_GROUP + i at tail + i * row_bytes */
    const kvg_qdot_kernel *k;
    float *out;         /* [n][rows] */
    float *const *outs; /* or NULL: token t's row of rows outputs is outs[t] (the logits of many sessions) */
} mm_part;

typedef struct mm_job {
    const kvg_qact *a;
    int n;
    int n_parts;
    mm_part parts[3];
} mm_job;

/* asks for a row a few ahead while this one is computed: decode is bound by how fast rows
 * arrive (measured: Q8_0 rows 20% faster, Q4_1 7%) */
static inline void prefetch_row(const uint8_t *row, size_t bytes) {
#if defined(__GNUC__)
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off, 0, 3);
#else
    (void)row;
    (void)bytes;
#endif
}

/* a group of rows (one item) against every tile of the block: the group stays in cache */
static void mm_group(const mm_job *j, const mm_part *pt, int g) {
    const uint8_t *w = pt->w + (size_t)g * pt->group_bytes;
    size_t r0 = (size_t)g * KVG_QDOT_GROUP;
    for (int t = 0; t < j->n; t += KVG_GROUP_TILE) {
        int nt = j->n - t < KVG_GROUP_TILE ? j->n - t : KVG_GROUP_TILE;
        if (!pt->outs) {
            pt->k->group(w, j->a, t, nt, pt->out + (size_t)t * pt->rows + r0, (size_t)pt->rows);
            continue;
        }
        float tile[KVG_GROUP_TILE][KVG_QDOT_GROUP]; /* then to each token's own row */
        pt->k->group(w, j->a, t, nt, &tile[0][0], KVG_QDOT_GROUP);
        for (int i = 0; i < nt; i++) memcpy(pt->outs[t + i] + r0, tile[i], sizeof tile[i]);
    }
}

static void mm_rows(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const mm_job *j = ctx;
    for (int r0 = begin; r0 < end; r0 += CPU_ROWS) {
        int r1 = r0 + CPU_ROWS < end ? r0 + CPU_ROWS : end;
        int gp = 0, gbase = 0; /* the items that are groups, each on its own */
        for (int item = r0; item < r1; item++) {
            while (item - gbase >= j->parts[gp].items) gbase += j->parts[gp++].items;
            if (item - gbase < j->parts[gp].groups) mm_group(j, &j->parts[gp], item - gbase);
        }
        for (int t = 0; t < j->n; t += KVG_QDOT_TILE) {
            int nt = j->n - t < KVG_QDOT_TILE ? j->n - t : KVG_QDOT_TILE;
            int p = 0, base = 0;
            for (int item = r0; item < r1; item++) {
                while (item - base >= j->parts[p].items) base += j->parts[p++].items;
                const mm_part *pt = &j->parts[p];
                int i = item - base - pt->groups, r = pt->groups * KVG_QDOT_GROUP + i; /* the i-th row item */
                if (i < 0) continue;
                const uint8_t *w = pt->tail + (size_t)i * pt->row_bytes;
                if (t == 0 && r + CPU_PREFETCH < pt->rows) prefetch_row(w + CPU_PREFETCH * pt->row_bytes, pt->row_bytes);
                if (!pt->outs) {
                    pt->k->dot(w, j->a, t, nt, pt->out + (size_t)t * pt->rows + r, (size_t)pt->rows);
                    continue;
                }
                float tile[KVG_QDOT_TILE];
                pt->k->dot(w, j->a, t, nt, tile, 1);
                for (int u = 0; u < nt; u++) pt->outs[t + u][r] = tile[u];
            }
        }
    }
}

/* quantizing a block's input rows, one token per item */
typedef struct quant_job {
    const cpu_model *cm;
    kvg_backend_session *s;
    const float *in;
    int in_dim;
    bool qb, qk, q8, split; /* split: the byte activations as QS (q8 and q8h), else Q8 */
} quant_job;

static void quant_rows(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const quant_job *j = ctx;
    kvg_backend_session *s = j->s;
    size_t W = (size_t)j->in_dim;
    for (int t = begin; t < end; t++) {
        const float *x = j->in + (size_t)t * W;
        if (j->qb)
            kvg_qdot_quantize_qb(j->cm->isa, x, j->in_dim, s->qb + t * W, s->db + t * (W / KVG_QB),
                                 s->sb + t * (W / KVG_QB));
        if (j->qk)
            kvg_qdot_quantize_qk(j->cm->isa, x, j->in_dim, s->qk + t * W, s->dk + t * (W / KVG_QK),
                                 s->bk + t * (W / 16));
        if (j->q8)
            kvg_qdot_quantize_q8(j->cm->isa, x, j->in_dim, s->q8 + t * W, j->split ? s->q8h + t * W : NULL,
                                 s->d8 + t * (W / KVG_QB), s->s8 + t * (W / KVG_QB), s->b8 + t * (W / 16));
    }
}

typedef struct mm_spec {
    const cpu_matrix *w;
    float *out;
    float *const *outs; /* NULL, or per-token output rows (mm_part) */
} mm_spec;

/* out_p = in W_p for the n <= CPU_BLOCK rows of in (each in_dim wide) */
static void matmul(const cpu_model *cm, kvg_backend_session *s, const float *in, int in_dim, int n, int n_parts,
                   const mm_spec *spec) {
    mm_job j = {.n = n, .n_parts = n_parts};
    quant_job qj = {.cm = cm, .s = s, .in = in, .in_dim = in_dim};
    int total = 0;
    for (int p = 0; p < n_parts; p++) {
        const kvg_tensor *w = spec[p].w->t;
        const kvg_qdot_kernel *k = spec[p].w->k;
        const cpu_matrix *mx = spec[p].w;
        int groups = mx->n_groups; /* 0 for a matrix without groups */
        j.parts[p] = (mm_part){.w = mx->rows,
                               .row_bytes = kvg_row_bytes(w->type, w->ne[0]),
                               .group_bytes = mx->group_bytes,
                               .rows = (int)w->ne[1],
                               .groups = groups,
                               .items = groups + (int)w->ne[1] - groups * KVG_QDOT_GROUP,
                               .tail = mx->rows + (size_t)groups * mx->group_bytes,
                               .k = k,
                               .out = spec[p].out,
                               .outs = spec[p].outs};
        qj.qb |= k->act == KVG_ACT_QB;
        qj.qk |= k->act == KVG_ACT_QK;
        qj.q8 |= k->act == KVG_ACT_Q8 || k->act == KVG_ACT_QS;
        qj.split |= k->act == KVG_ACT_QS;
        total += j.parts[p].items;
    }
    if (qj.qb || qj.qk || qj.q8) {
        if (n > 1) kvg_cpu_pool_run(cm->pool, n, quant_rows, &qj);
        else quant_rows(&qj, 0, n, 0);
    }
    kvg_qact a = {.n = in_dim, .x = in, .qb = s->qb, .db = s->db, .sb = s->sb, .qk = s->qk, .dk = s->dk, .bk = s->bk,
                  .q8 = s->q8, .q8h = s->q8h, .d8 = s->d8, .s8 = s->s8, .b8 = s->b8};
    j.a = &a;
    kvg_cpu_pool_run(cm->pool, total, mm_rows, &j);
}

/* ---- LoRA ------------------------------------------------------------------------------------------ */

/* One product a block's adapters change: y (out_dim per token) of matrix `target`. */
typedef struct lora_out {
    kvg_lora_target target;
    float *y;
    int out_dim;
} lora_out;

typedef struct lora_job {
    const kvg_lora_set *const *sets;
    int layer, in_dim, n_outs;
    const float *x;
    const lora_out *outs;
} lora_job;

static void lora_tokens(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const lora_job *j = ctx;
    for (int o = 0; o < j->n_outs; o++) {
        const lora_out *u = &j->outs[o];
        kvg_lora_add(j->sets + begin, j->layer, u->target, j->x + (size_t)begin * j->in_dim, j->in_dim, end - begin,
                     u->y + (size_t)begin * u->out_dim, u->out_dim);
    }
}

/* Adds each token's adapters' products (kvg_lora_add) to the n_outs products of input x, the
 * tokens spread over the pool (each token's sum is the same whichever thread makes it). */
static void lora_add(const cpu_model *cm, const kvg_lora_set *const *sets, int layer, const float *x, int in_dim,
                     int n, int n_outs, const lora_out *outs) {
    if (!sets) return;
    lora_job j = {.sets = sets, .layer = layer, .in_dim = in_dim, .n_outs = n_outs, .x = x, .outs = outs};
    if (n > 1) kvg_cpu_pool_run(cm->pool, n, lora_tokens, &j);
    else lora_tokens(&j, 0, n, 0);
}

/* ---- attention ------------------------------------------------------------------------------------- */

/* K/V pages hold f16 by default, or blocks of q8_0 / q4_0 (kvg_cpu.h): a decode at depth reads
 * every key and value of its context, and fewer bytes is what speeds it up there; a pool of the
 * same bytes holds more tokens. Attention reads the pages in place with the kernels of their
 * type (cm->kv, cpu_vec.c's KV tables). */

/* rows of the next run of keys or values asked for before a run is computed */
#define KVG_KV_RUN_AHEAD 8

typedef struct cpu_slot {
    const int32_t *pages[KVG_KV_GROUPS]; /* the token's page tables, per layer group */
    kvg_backend_session *owner; /* whose score rows (sized to its context) it uses */
    int pos;
    const kvg_lora_set *lora; /* the token's sequence's adapters (kvg_batch_seq.lora) */
} cpu_slot;

typedef struct attention_job {
    const cpu_model *cm;
    kvg_backend_session *s;
    const kvg_hparams *hp;
    const cpu_slot *slots;
    int layer, group; /* the layer and its group */
    int window;    /* > 0: a local layer attends to [pos - window + 1, pos] */
    float softcap; /* > 0: scores become softcap * tanh(score / softcap) */
    int heads;     /* query heads per item, a divisor of n_head / n_head_kv */
} attention_job;

/* One item is a token and `heads` query heads sharing one KV head (grouped-query attention:
 * all of the group, or an equal part of it where the pool needs more items to share out): they
 * are dotted with each run of its keys, and then weigh each run of its values, while the run is
 * in cache, so a decode reads the cache once per KV head rather than once per query head. Every
 * head's scores and output are the same operations in the same order however heads are grouped
 * into items, so the grouping may follow the thread count. */
static void attention_heads(void *ctx, int begin, int end, int tid) {
    const attention_job *j = ctx;
    const kvg_hparams *hp = j->hp;
    const kvg_vec_ops *vec = j->cm->vec;
    const kvg_vec_kv *kv = j->cm->kv;
    const kvg_cpu_pages *pg = &j->cm->host.pages[j->group];
    int hd = hp->head_dim, l = j->layer, P = pg->page_size, group = j->heads;
    int parts = hp->n_head / hp->n_head_kv / group; /* items per KV head */
    float scale = 1.0f / sqrtf((float)hd);
    for (int item = begin; item < end; item++) {
        int t = item / (hp->n_head_kv * parts), kvh = item / parts % hp->n_head_kv;
        int h0 = (item % (hp->n_head_kv * parts)) * group; /* its first query head */
        const cpu_slot *slot = &j->slots[t];
        size_t n_ctx = (size_t)slot->owner->c.n_ctx;
        float *scores = slot->owner->scores + (size_t)tid * (size_t)group * (n_ctx + 1); /* [group][n_ctx] */
        float *sum = scores + (size_t)group * n_ctx;                                   /* [group] */
        int pos = slot->pos;
        int first = j->window > 0 && pos >= j->window ? pos - j->window + 1 : 0;
        int n = pos - first + 1;
        const float *q = j->s->c.q + ((size_t)t * hp->n_head + (size_t)h0) * hd; /* [group][hd] */
        float *o = j->s->c.att + ((size_t)t * hp->n_head + (size_t)h0) * hd;    /* [group][hd] */
        /* keys: runs of consecutive slots within one page are contiguous; the next run's first
         * rows are asked for before this one is computed (the kernels ask for the rest of a run
         * as they go), pages being apart in memory */
        for (int p = first; p <= pos;) {
            int run = P - p % P;
            if (run > pos - p + 1) run = pos - p + 1;
            const void *k = kvg_cpu_pages_at(pg, slot->pages[j->group], l, 0, kvh, p);
            const void *next = p + run <= pos ? kvg_cpu_pages_at(pg, slot->pages[j->group], l, 0, kvh, p + run)
                                              : kvg_cpu_pages_at(pg, slot->pages[j->group], l, 1, kvh, first);
            prefetch_row(next, KVG_KV_RUN_AHEAD * pg->row_bytes);
            kv->dot_heads(q, (size_t)hd, group, k, pg->row_bytes, run, hd, scores + (p - first), n_ctx);
            for (int g = 0; g < group; g++) {
                float *sc = scores + (size_t)g * n_ctx + (p - first);
                if (j->softcap > 0.0f)
                    for (int r = 0; r < run; r++) sc[r] = j->softcap * tanhf(sc[r] * scale / j->softcap);
                else vec->scale(sc, scale, run);
            }
            p += run;
        }
        for (int g = 0; g < group; g++) {
            float *sc = scores + (size_t)g * n_ctx;
            sum[g] = vec->exp_sum(sc, n, vec->max(sc, n));
        }
        memset(o, 0, (size_t)group * hd * sizeof(float));
        for (int p = first; p <= pos;) {
            int run = P - p % P;
            if (run > pos - p + 1) run = pos - p + 1;
            const void *v = kvg_cpu_pages_at(pg, slot->pages[j->group], l, 1, kvh, p);
            if (p + run <= pos)
                prefetch_row(kvg_cpu_pages_at(pg, slot->pages[j->group], l, 1, kvh, p + run),
                             KVG_KV_RUN_AHEAD * pg->row_bytes);
            kv->axpy_heads(o, (size_t)hd, group, scores + (p - first), n_ctx, v, pg->row_bytes, run, hd);
            p += run;
        }
        for (int g = 0; g < group; g++) vec->scale(o + (size_t)g * hd, 1.0f / sum[g], hd);
    }
}

/* query heads per attention item: the whole group, unless that leaves fewer than 4 items per
 * thread (a decode of a model with few KV heads), then the largest divisor of the group that
 * does not */
static int attention_group(const kvg_hparams *hp, int n, int threads) {
    int group = hp->n_head / hp->n_head_kv;
    for (int g = group; g > 1; g--)
        if (group % g == 0 && (long)n * hp->n_head / g >= 4L * threads) return g;
    return 1;
}

/* ---- the forward pass --------------------------------------------------------------------------- */

/* cos and sin of the block's tokens' angles for a layer's RoPE */
static void rope_angles(const kvg_hparams *hp, const cpu_layer *c, const cpu_slot *slots, int n, float *cs) {
    int half = hp->n_rot / 2;
    float af = hp->rope_attn_factor > 0.0f ? hp->rope_attn_factor : 1.0f; /* as the reference: f32 products */
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            double theta = (double)slots[t].pos * c->inv_freq[i];
            cs[((size_t)t * half + i) * 2] = (float)cos(theta) * af;
            cs[((size_t)t * half + i) * 2 + 1] = (float)sin(theta) * af;
        }
}

static void rope_head(float *v, const float *cs, int n_rot, bool neox) {
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = a * s + b * c;
    }
}

static void add_bias(const kvg_vec_ops *vec, float *y, const float *b, int n, int width) {
    if (!b) return;
    for (int t = 0; t < n; t++) vec->add(y + (size_t)t * width, b, width);
}

/* x[t] += f[t], f first normed by `post` where the layer has that norm */
static void residual_add(const cpu_model *cm, float *x, float *f, const float *post, int n, int D, float eps) {
    for (int t = 0; t < n; t++) {
        float *ft = f + (size_t)t * D;
        if (post) cm->vec->rmsnorm(ft, ft, post, D, eps);
        cm->vec->add(x + (size_t)t * D, ft, D);
    }
}

/* Runs one block of n <= CPU_BLOCK tokens through every layer, token t at slots[t], leaving
 * the final residual stream in s->c.x and their K/V in the pages. */
static void forward_block(kvgen_model *m, kvg_backend_session *s, const cpu_slot *slots, const int32_t *tokens,
                          int n) {
    const kvg_hparams *hp = &m->w.hp;
    const cpu_model *cm = m->backend;
    const kvg_vec_ops *vec = cm->vec;
    int D = hp->n_embd, F = hp->n_ff, hd = hp->head_dim;
    int qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    float eps = hp->rms_norm_eps;
    bool neox = m->w.rope == KVG_ROPE_NEOX;
    /* each token's adapters: y += s B (A x) in f32 after each matrix they adapt (NULL: none in the block) */
    const kvg_lora_set *lora_of[CPU_BLOCK], *const *lora = NULL;
    for (int t = 0; t < n; t++)
        if ((lora_of[t] = slots[t].lora) && slots[t].lora->n > 0) lora = lora_of;

    const kvg_tensor *emb = m->w.tok_embd;
    size_t emb_row = kvg_row_bytes(emb->type, emb->ne[0]);
    for (int t = 0; t < n; t++)
        kvg_dequantize_row(emb->type, (const unsigned char *)emb->data + (size_t)tokens[t] * emb_row,
                           s->c.x + (size_t)t * D, (uint64_t)D);
    if (m->w.embd_scale != 1.0f) vec->scale(s->c.x, m->w.embd_scale, n * D);

    int angles_of = -1; /* the RoPE group whose angles s->rope_cs holds */
    for (int l = 0; l < hp->n_layer; l++) {
        const kvg_layer *L = &m->w.layers[l];
        const cpu_layer *C = &cm->layers[l];
        const kvg_cpu_layer_tensors *T = &cm->host.layers[l];

        for (int t = 0; t < n; t++)
            vec->rmsnorm(s->c.xb + (size_t)t * D, s->c.x + (size_t)t * D, cm->host.layers[l].attn_norm, D, eps);
        mm_spec qkv[3] = {{&C->w[M_Q], s->c.q, NULL}, {&C->w[M_K], s->c.k, NULL}, {&C->w[M_V], s->c.v, NULL}};
        matmul(cm, s, s->c.xb, D, n, 3, qkv);
        lora_add(cm, lora, l, s->c.xb, D, n, 3, (lora_out[]){{KVG_LORA_Q, s->c.q, qd}, {KVG_LORA_K, s->c.k, kvd},
                                                          {KVG_LORA_V, s->c.v, kvd}});
        add_bias(vec, s->c.q, T->bq, n, qd);
        add_bias(vec, s->c.k, T->bk, n, kvd);
        add_bias(vec, s->c.v, T->bv, n, kvd);

        /* layers with the same RoPE (usually all, or the local and the global ones) share the
         * angles of the block */
        if (angles_of != C->rope_group) {
            rope_angles(hp, C, slots, n, s->rope_cs);
            angles_of = C->rope_group;
        }
        for (int t = 0; t < n; t++) {
            const float *cs = s->rope_cs + (size_t)t * hp->n_rot;
            for (int h = 0; h < hp->n_head; h++) {
                float *q = s->c.q + (size_t)t * qd + (size_t)h * hd;
                if (T->q_norm) vec->rmsnorm(q, q, T->q_norm, hd, eps);
                rope_head(q, cs, hp->n_rot, neox);
            }
            for (int h = 0; h < hp->n_head_kv; h++) {
                float *k = s->c.k + (size_t)t * kvd + (size_t)h * hd;
                if (T->k_norm) vec->rmsnorm(k, k, T->k_norm, hd, eps);
                rope_head(k, cs, hp->n_rot, neox);
                /* into the pages in their type: the block's own tokens attend to the stored keys
                 * and values too, so a prefill reads what a decode of the same tokens would */
                int g = m->kv.group[l];
                const kvg_cpu_pages *pg = &cm->host.pages[g];
                kvg_cpu_kv_from_f32(pg->type, k, kvg_cpu_pages_at(pg, slots[t].pages[g], l, 0, h, slots[t].pos),
                                    (size_t)hd);
                kvg_cpu_kv_from_f32(pg->type, s->c.v + (size_t)t * kvd + (size_t)h * hd,
                                    kvg_cpu_pages_at(pg, slots[t].pages[g], l, 1, h, slots[t].pos), (size_t)hd);
            }
        }

        attention_job aj = {.cm = cm, .s = s, .hp = hp, .slots = slots, .layer = l, .group = m->kv.group[l],
                            .window = L->swa ? hp->n_swa : 0, .softcap = hp->attn_softcap,
                            .heads = attention_group(hp, n, kvg_cpu_pool_threads(cm->pool))};
        kvg_cpu_pool_run(cm->pool, n * hp->n_head / aj.heads, attention_heads, &aj);

        mm_spec o[1] = {{&C->w[M_O], s->c.xb, NULL}};
        matmul(cm, s, s->c.att, qd, n, 1, o);
        lora_add(cm, lora, l, s->c.att, qd, n, 1, (lora_out[]){{KVG_LORA_O, s->c.xb, D}});
        residual_add(cm, s->c.x, s->c.xb, T->attn_post, n, D, eps);

        for (int t = 0; t < n; t++)
            vec->rmsnorm(s->c.xb + (size_t)t * D, s->c.x + (size_t)t * D, cm->host.layers[l].ffn_norm, D, eps);
        mm_spec gu[2] = {{&C->w[M_GATE], s->c.hb, NULL}, {&C->w[M_UP], s->c.hb2, NULL}};
        matmul(cm, s, s->c.xb, D, n, 2, gu);
        lora_add(cm, lora, l, s->c.xb, D, n, 2, (lora_out[]){{KVG_LORA_GATE, s->c.hb, F}, {KVG_LORA_UP, s->c.hb2, F}});
        if (m->w.act == KVG_ACT_GELU_TANH_GATED) vec->gelu_mul(s->c.hb, s->c.hb2, n * F);
        else vec->silu_mul(s->c.hb, s->c.hb2, n * F);

        mm_spec dn[1] = {{&C->w[M_DOWN], s->c.xb, NULL}};
        matmul(cm, s, s->c.hb, F, n, 1, dn);
        lora_add(cm, lora, l, s->c.hb, F, n, 1, (lora_out[]){{KVG_LORA_DOWN, s->c.xb, D}});
        residual_add(cm, s->c.x, s->c.xb, T->ffn_post, n, D, eps);
    }
}

/* outs[t] = rmsnorm(x[rows[t]]) * out_norm, times output (or the tied tok_embd), for count
 * tokens of the block at once (a batch of sessions' decodes reads the output matrix once)  [V] each */
static void compute_logits(kvgen_model *m, kvg_backend_session *s, const int *rows, float *const *outs, int count) {
    const kvg_hparams *hp = &m->w.hp;
    const cpu_model *cm = m->backend;
    int D = hp->n_embd;
    for (int t = 0; t < count; t++)
        cm->vec->rmsnorm(s->c.xb + (size_t)t * D, s->c.x + (size_t)rows[t] * D, cm->host.out_norm, D, hp->rms_norm_eps);
    mm_spec out[1] = {{.w = &cm->output, .outs = outs}};
    matmul(cm, s, s->c.xb, D, count, 1, out);
    float cap = hp->final_softcap;
    for (int t = 0; cap > 0.0f && t < count; t++)
        for (size_t i = 0; i < (size_t)hp->n_vocab; i++) outs[t][i] = cap * tanhf(outs[t][i] / cap);
}

/* The batch's tokens in order, CPU_BLOCK at a time, as the reference runs them: a block's
 * activations live in the scratch of its first token's session, each token attends through
 * its own page table, and a sequence's logits come from the block holding its tokens. */
static kvgen_status cpu_forward(kvgen_model *m, const kvg_batch *b, kvgen_error *err) {
    const kvg_hparams *hp = &m->w.hp;
    size_t V = (size_t)hp->n_vocab;
    for (int i = 0; i < b->n_seq; i++) {
        kvgen_status st = kvg_cpu_check_seq(m, &b->seq[i], i, WHO, err);
        if (st != KVGEN_OK) return st;
    }
    cpu_slot slots[CPU_BLOCK];
    int32_t tokens[CPU_BLOCK];
    int seq_of[CPU_BLOCK], tok_of[CPU_BLOCK];
    int si = 0, ti = 0; /* the next token to place: b->seq[si].tokens[ti] */
    for (int nb; (nb = kvg_cpu_batch_block(b, &si, &ti, CPU_BLOCK, tokens, seq_of, tok_of)) > 0;) {
        for (int t = 0; t < nb; t++) {
            const kvg_batch_seq *q = &b->seq[seq_of[t]];
            slots[t] = (cpu_slot){.pages = {q->pages[0], q->pages[1]}, .owner = q->bs, .pos = q->pos0 + tok_of[t],
                                  .lora = q->lora};
        }
        kvg_backend_session *scratch = slots[0].owner;
        forward_block(m, scratch, slots, tokens, nb);
        int rows[CPU_BLOCK], count = 0; /* the block's tokens whose logits are wanted, and where they go */
        float *outs[CPU_BLOCK];
        for (int t = 0; t < nb; t++) {
            const kvg_batch_seq *q = &b->seq[seq_of[t]];
            if (q->out == KVG_OUT_HIDDEN) { /* rmsnorm(x) * out_norm, the logits' input */
                const cpu_model *cm = m->backend;
                cm->vec->rmsnorm(q->logits + (size_t)tok_of[t] * hp->n_embd, scratch->c.x + (size_t)t * hp->n_embd,
                                 cm->host.out_norm, hp->n_embd, hp->rms_norm_eps);
                continue;
            }
            if (q->out == KVG_OUT_ALL) outs[count] = q->logits + (size_t)tok_of[t] * V;
            else if (q->out == KVG_OUT_LAST && tok_of[t] == q->n - 1) outs[count] = q->logits;
            else continue;
            rows[count++] = t;
        }
        if (count > 0) compute_logits(m, scratch, rows, outs, count);
    }
    return KVGEN_OK;
}

/* ---- the page pool's storage: host pages (cpu_pages.c) ------------------------------------------ */

/* ---- an encoder ------------------------------------------------------------------------------------ */

typedef struct cpu_encode_ctx {
    const cpu_model *cm;
    kvg_backend_session *s;
} cpu_encode_ctx;

static int encode_matrix(int role) {
    return role == KVG_T_ATTN_Q ? M_Q : role == KVG_T_ATTN_K ? M_K : role == KVG_T_ATTN_V ? M_V
         : role == KVG_T_ATTN_OUT ? M_O : role == KVG_T_FFN_UP ? M_UP : M_DOWN;
}

static void cpu_encode_mm(void *ctx, int layer, int role, const float *in, int in_dim, int n, float *out) {
    cpu_encode_ctx *c = ctx;
    mm_spec spec[1] = {{.w = &c->cm->layers[layer].w[encode_matrix(role)], .out = out}};
    matmul(c->cm, c->s, in, in_dim, n, 1, spec);
}

/* Products of every token of an encoder batch at once with matrices in row groups of f32
 * activations (nothing to quantize), up to three sharing the input (Q, K, V): one job of
 * (matrix, CPU_BLOCK tokens, group) items, so the threads meet once per input instead of once
 * per block and product. Each output is the group kernel's, whatever the item; the item then
 * adds the bias to its outputs and applies the GELU (kvg_cpu_products_fn). */
typedef struct encode_part {
    const cpu_matrix *w;
    const kvg_cpu_product *p;
    int n_groups, items;
} encode_part;

typedef struct encode_mm_job {
    const kvg_qact *a;
    const kvg_vec_ops *vec;
    int n, n_parts;
    encode_part parts[3];
} encode_mm_job;

static void encode_mm_items(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const encode_mm_job *j = ctx;
    for (int item = begin, part = 0, base = 0; item < end; item++) {
        while (item - base >= j->parts[part].items) base += j->parts[part++].items;
        const encode_part *pt = &j->parts[part];
        int b = (item - base) / pt->n_groups, g = (item - base) % pt->n_groups;
        int t0 = b * CPU_BLOCK, t1 = t0 + CPU_BLOCK < j->n ? t0 + CPU_BLOCK : j->n;
        size_t rows = (size_t)pt->p->out_dim, r0 = (size_t)g * KVG_QDOT_GROUP;
        const uint8_t *w = pt->w->rows + (size_t)g * pt->w->group_bytes;
        for (int t = t0; t < t1; t += KVG_GROUP_TILE) {
            int nt = t1 - t < KVG_GROUP_TILE ? t1 - t : KVG_GROUP_TILE;
            pt->w->k->group(w, j->a, t, nt, pt->p->out + (size_t)t * rows + r0, rows);
        }
        const float *bias = pt->p->bias ? pt->p->bias + r0 : NULL;
        for (int t = t0; t < t1 && (bias || pt->p->gelu); t++) {
            float *y = pt->p->out + (size_t)t * rows + r0;
            if (pt->p->gelu) j->vec->gelu_erf(y, bias, KVG_QDOT_GROUP);
            else
                for (int r = 0; r < KVG_QDOT_GROUP; r++) y[r] += bias[r];
        }
    }
}

static void cpu_encode_products(void *ctx, int layer, const float *in, int in_dim, int n, const kvg_cpu_product *p,
                                int n_products) {
    cpu_encode_ctx *c = ctx;
    kvg_qact a = {.n = in_dim, .x = in};
    encode_mm_job j = {.a = &a, .vec = c->cm->vec, .n = n, .n_parts = n_products};
    int blocks = (n + CPU_BLOCK - 1) / CPU_BLOCK, total = 0;
    for (int i = 0; i < n_products; i++) {
        const cpu_matrix *w = &c->cm->layers[layer].w[encode_matrix(p[i].role)];
        int n_groups = (int)(w->t->ne[1] / KVG_QDOT_GROUP);
        j.parts[i] = (encode_part){.w = w, .p = &p[i], .n_groups = n_groups, .items = blocks * n_groups};
        total += j.parts[i].items;
    }
    kvg_cpu_pool_run(c->cm->pool, total, encode_mm_items, &j);
}

/* The shared encoder graph (cpu_encode.c) with this file's products. Where every matrix is in
 * row groups of f32 activations, the products of each input are one job over all the batch's
 * tokens (cpu_encode_products), and a call needs nothing but the activations cpu_encode.c keeps
 * with the model; else each block's activations are quantized as for a prompt into a session's
 * scratch (one block), made for the call. */
static kvgen_status cpu_encode(kvgen_model *m, const kvg_encode_batch *b, kvgen_error *err) {
    cpu_model *cm = m->backend;
    kvg_backend_session *s = NULL;
    kvgen_status st;
    if (!cm->encode_whole) {
        st = cpu_session_init(m, 1, &s, err);
        if (st != KVGEN_OK) return st;
    }
    cpu_encode_ctx c = {cm, s};
    kvg_cpu_encoder e = {.m = m, .host = &cm->host, .pool = cm->pool, .block = CPU_BLOCK,
                         .mm = cm->encode_whole ? NULL : cpu_encode_mm,
                         .products = cm->encode_whole ? cpu_encode_products : NULL, .mm_ctx = &c, .vec = cm->vec,
                         .keep = &cm->host.encode_keep};
    st = kvg_cpu_encode(&e, b, err);
    cpu_session_free(m, s);
    return st;
}

const kvg_backend_ops kvg_cpu_backend = {
    .name = "cpu",
    .kv_groups = true,
    .hidden_out = true,
    .lora = true,
    .features = KVG_F_WIDE_HEADS | KVG_F_ATTN_BIAS | KVG_F_QK_NORM | KVG_F_POST_NORMS | KVG_F_ROPE_NEOX |
                KVG_F_ROPE_FREQS | KVG_F_ROPE_ATTN_FACTOR | KVG_F_GELU | KVG_F_EMBD_SCALE | KVG_F_SOFTCAP |
                KVG_F_SLIDING_WINDOW | KVG_F_ENCODER,
    .weight_types = kvg_traits_types, /* qdot_tables.c has a kernel for every type of the traits table */
    /* f16 by default; the block types for more tokens per byte (cpu_vec.c's KV tables hold
     * attention's kernels for each) */
    .kv_types = (const uint32_t[]){KVG_TYPE_F16, KVG_TYPE_Q8_0, KVG_TYPE_Q4_0},
    .n_kv_types = 3,
    .model_init = cpu_model_init,
    .model_free = cpu_model_free,
    .session_init = cpu_session_init,
    .session_free = cpu_session_free,
    .forward = cpu_forward,
    .encode = cpu_encode,
    KVG_CPU_HOST_PAGE_OPS, /* cpu_common.c */
};
