/* session_file.c: kvgen_session_save / kvgen_session_restore.
 *
 * File layout, version 1, every integer little-endian, floats as their IEEE-754 bits:
 *
 *   header (HEADER_BYTES)
 *     magic "KVGSESS\0"        8
 *     version u32, flags u32   8   flags: 1 has logits, 2 no_cache, 4 prefix reuse
 *     model identity u64       8   kvg_model_identity
 *     n_layer n_head_kv head_dim n_vocab            u32 x 4
 *     n_ctx on_full keep reserved                   u32 x 4
 *     n_tokens clean_len shifts tokens_reused       u64 x 4   (clean_len: UINT64_MAX = all)
 *     sampler_bytes file_bytes                      u64 x 2
 *   sampler state (sampler_bytes: kvg_sampler_state_save)
 *   token ids                      n_tokens x i32
 *   logits (when flags & 1)        n_vocab x f32
 *   K/V, for each layer: K then V, (n_head_kv, n_tokens, head_dim) f32: the used positions only
 *   checksum u64 over every byte before it
 *
 * Restore checks, in this order, so each refusal names its real cause: magic, version (newer
 * files are refused, not misread), size against file_bytes (truncation), checksum
 * (corruption), model identity, shapes. The whole file is read and checked before a session
 * exists. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_session.h"

#define FILE_MAGIC "KVGSESS"
#define FILE_VERSION 1u
#define HEADER_BYTES 112
enum { FLAG_LOGITS = 1, FLAG_NO_CACHE = 2, FLAG_PREFIX_REUSE = 4 };

/* ---- hashing ------------------------------------------------------------------------------ */

/* 64-bit FNV-1a folded 8 bytes at a time, with a splitmix finaliser: fast enough to checksum a
 * few hundred MiB of K/V, and any flipped bit changes the result. Not cryptographic. Bytes
 * are gathered into words across calls, so the result does not depend on how the data was
 * split into calls (save writes in sections, restore hashes the file in one go). */
typedef struct hash64 {
    uint64_t h, word;
    int n; /* bytes in word */
} hash64;

#define HASH64_INIT {0xcbf29ce484222325ull, 0, 0}

static void hash_bytes(hash64 *st, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        st->word |= (uint64_t)p[i] << (8 * st->n);
        if (++st->n == 8) {
            st->h = (st->h ^ st->word) * 0x100000001b3ull;
            st->h ^= st->h >> 29;
            st->word = 0;
            st->n = 0;
        }
    }
}

static uint64_t hash_final(const hash64 *st) {
    uint64_t h = (st->h ^ st->word ^ ((uint64_t)st->n << 59)) * 0x100000001b3ull;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

static void hash_u64(hash64 *st, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    hash_bytes(st, b, 8);
}

/* Identifies a model's weights without reading all of them: the hyperparameters, every
 * tensor's name, type and shape, and 64 bytes from the start, middle and end of its data.
 * Two random-weight models of one shape differ in those samples. */
uint64_t kvg_model_identity(const kvgen_model *m) {
    hash64 st = HASH64_INIT;
    const kvg_hparams *hp = &m->w.hp;
    int ints[] = {hp->n_layer, hp->n_embd, hp->n_ff, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->n_vocab};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) hash_u64(&st, (uint64_t)(uint32_t)ints[i]);
    uint32_t fb, fe;
    memcpy(&fb, &hp->rope_freq_base, 4);
    memcpy(&fe, &hp->rms_norm_eps, 4);
    hash_u64(&st, fb);
    hash_u64(&st, fe);
    int n = kvg_gguf_n_tensors(m->gguf);
    for (int i = 0; i < n; i++) {
        const kvg_tensor *t = kvg_gguf_tensor(m->gguf, i);
        hash_bytes(&st, t->name, strlen(t->name) + 1);
        hash_u64(&st, t->type);
        for (int d = 0; d < 4; d++) hash_u64(&st, t->ne[d]);
        size_t sample = t->nbytes < 64 ? t->nbytes : 64;
        const unsigned char *data = t->data;
        if (!data || sample == 0) continue;
        hash_bytes(&st, data, sample);
        hash_bytes(&st, data + (t->nbytes - sample) / 2, sample);
        hash_bytes(&st, data + t->nbytes - sample, sample);
    }
    return hash_final(&st);
}

/* ---- little-endian helpers ------------------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* 32-bit values (ids, float bits) in place to little-endian and back; a no-op on LE hosts */
static void le32_array(void *data, size_t n) {
    unsigned char *p = data;
    for (size_t i = 0; i < n; i++, p += 4) {
        uint32_t v;
        memcpy(&v, p, 4);
        put_u32(p, v);
    }
}
static void from_le32_array(void *data, size_t n) {
    unsigned char *p = data;
    for (size_t i = 0; i < n; i++, p += 4) {
        uint32_t v = get_u32(p);
        memcpy(p, &v, 4);
    }
}

/* ---- save --------------------------------------------------------------------------------------- */

typedef struct file_writer {
    FILE *f;
    hash64 sum;
    bool failed;
} file_writer;

static void fw_write(file_writer *w, const void *data, size_t n) {
    if (w->failed || n == 0) return;
    hash_bytes(&w->sum, data, n);
    if (fwrite(data, 1, n, w->f) != n) w->failed = true;
}

kvgen_status kvgen_session_save(const kvgen_session *s, const char *path, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_save: session is NULL");
    if (!path || !*path) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_save: path is empty");
    const kvgen_model *m = s->model;
    const kvg_hparams *hp = &m->w.hp;
    size_t n = s->n_tokens, V = (size_t)hp->n_vocab;
    size_t per = (size_t)hp->n_head_kv * n * (size_t)hp->head_dim; /* floats per layer per K or V */
    size_t sampler_bytes = kvg_sampler_state_size(&s->sampler);
    const float *logits = kvgen_session_logits(s); /* fetched when the device kept them */
    uint64_t file_bytes = HEADER_BYTES + sampler_bytes + n * 4 + (logits ? V * 4 : 0) +
                          (uint64_t)hp->n_layer * 2 * per * 4 + 8;

    unsigned char header[HEADER_BYTES] = {0};
    memcpy(header, FILE_MAGIC, 8);
    put_u32(header + 8, FILE_VERSION);
    put_u32(header + 12, (logits ? FLAG_LOGITS : 0) | (s->no_cache ? FLAG_NO_CACHE : 0) |
                             (s->prefix_reuse ? FLAG_PREFIX_REUSE : 0));
    put_u64(header + 16, kvg_model_identity(m));
    put_u32(header + 24, (uint32_t)hp->n_layer);
    put_u32(header + 28, (uint32_t)hp->n_head_kv);
    put_u32(header + 32, (uint32_t)hp->head_dim);
    put_u32(header + 36, (uint32_t)hp->n_vocab);
    put_u32(header + 40, (uint32_t)s->n_ctx);
    put_u32(header + 44, (uint32_t)s->on_full);
    put_u32(header + 48, (uint32_t)s->keep);
    put_u64(header + 56, n);
    put_u64(header + 64, s->clean_len == KVG_CLEAN_ALL ? UINT64_MAX : (uint64_t)s->clean_len);
    put_u64(header + 72, s->shifts);
    put_u64(header + 80, s->tokens_reused);
    put_u64(header + 88, sampler_bytes);
    put_u64(header + 96, file_bytes);

    unsigned char *sampler = malloc(sampler_bytes ? sampler_bytes : 1);
    size_t scratch_n = per > V ? per : V;
    if (scratch_n < n) scratch_n = n;
    float *scratch = malloc((scratch_n ? scratch_n : 1) * sizeof(float));
    if (!sampler || !scratch) {
        free(sampler);
        free(scratch);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory saving the session", path);
    }
    kvg_sampler_state_save(&s->sampler, sampler);

    FILE *f = fopen(path, "wb");
    if (!f) {
        free(sampler);
        free(scratch);
        return kvg_fail(err, KVGEN_E_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    file_writer w = {f, HASH64_INIT, false};
    kvgen_status st = KVGEN_OK;
    fw_write(&w, header, sizeof header);
    fw_write(&w, sampler, sampler_bytes);
    memcpy(scratch, s->tokens, n * 4);
    le32_array(scratch, n);
    fw_write(&w, scratch, n * 4);
    if (logits) {
        memcpy(scratch, logits, V * 4);
        le32_array(scratch, V);
        fw_write(&w, scratch, V * 4);
    }
    for (int l = 0; st == KVGEN_OK && l < hp->n_layer && per > 0; l++)
        for (int which = 0; st == KVGEN_OK && which < 2; which++) {
            st = kvgen_session_read_cache(s, l, which, scratch, per, err);
            if (st != KVGEN_OK) break;
            le32_array(scratch, per);
            fw_write(&w, scratch, per * 4);
        }
    unsigned char sum[8];
    put_u64(sum, hash_final(&w.sum));
    fw_write(&w, sum, 8);
    if (fclose(f) != 0) w.failed = true;
    free(sampler);
    free(scratch);
    if (st == KVGEN_OK && w.failed) st = kvg_fail(err, KVGEN_E_IO, "%s: write failed (disk full?)", path);
    if (st != KVGEN_OK) remove(path); /* never leave a half-written file that looks like a session */
    return st;
}

/* ---- restore ------------------------------------------------------------------------------------- */

static kvgen_status read_whole(const char *path, unsigned char **out, size_t *size, kvgen_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return kvg_fail(err, KVGEN_E_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            unsigned char *bigger = cap < ((size_t)1 << 40) ? realloc(buf, cap * 2) : NULL;
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory reading the session file", path);
    if (bad) {
        free(buf);
        return kvg_fail(err, KVGEN_E_IO, "%s: read error", path);
    }
    *out = buf;
    *size = n;
    return KVGEN_OK;
}

kvgen_status kvgen_session_restore(kvgen_model *model, const char *path, kvgen_session **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!model) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_restore: model is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_restore: out is NULL");
    if (!path || !*path) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_restore: path is empty");
    unsigned char *buf = NULL;
    size_t size = 0;
    kvgen_status st = read_whole(path, &buf, &size, err);
    if (st != KVGEN_OK) return st;
    const kvg_hparams *hp = &model->w.hp;
    const unsigned char *h = buf;

#define REFUSE(status, ...)                                                                                            \
    do {                                                                                                               \
        st = kvg_fail(err, status, __VA_ARGS__);                                                                       \
        goto done;                                                                                                     \
    } while (0)

    kvgen_session *s = NULL;
    float *kv = NULL;
    if (size < 8 || memcmp(h, FILE_MAGIC, 8) != 0)
        REFUSE(KVGEN_E_FORMAT, "%s: not a kvgen session file (no KVGSESS magic)", path);
    if (size < 12) REFUSE(KVGEN_E_FORMAT, "%s: truncated: %zu bytes, no format version", path, size);
    uint32_t version = get_u32(h + 8);
    if (version > FILE_VERSION)
        REFUSE(KVGEN_E_UNSUPPORTED, "%s: session format version %u is newer than this kvgen reads (%u); upgrade kvgen",
               path, (unsigned)version, FILE_VERSION);
    if (version == 0) REFUSE(KVGEN_E_FORMAT, "%s: session format version 0 does not exist", path);
    if (size < HEADER_BYTES + 8)
        REFUSE(KVGEN_E_FORMAT, "%s: truncated: %zu bytes, shorter than the %d-byte header", path, size,
               HEADER_BYTES + 8);
    uint64_t file_bytes = get_u64(h + 96);
    if (size < file_bytes)
        REFUSE(KVGEN_E_FORMAT, "%s: truncated: %zu of %llu bytes", path, size, (unsigned long long)file_bytes);
    if (size > file_bytes)
        REFUSE(KVGEN_E_FORMAT, "%s: corrupted: %zu bytes where the header says %llu", path, size,
               (unsigned long long)file_bytes);
    hash64 sum = HASH64_INIT;
    hash_bytes(&sum, buf, size - 8);
    if (hash_final(&sum) != get_u64(buf + size - 8))
        REFUSE(KVGEN_E_FORMAT, "%s: corrupted: checksum mismatch", path);
    if (get_u64(h + 16) != kvg_model_identity(model))
        REFUSE(KVGEN_E_INVALID_ARGUMENT, "%s: saved from another model than '%s' (model hash %016llx, this one %016llx)",
               path, model->name, (unsigned long long)get_u64(h + 16),
               (unsigned long long)kvg_model_identity(model));

    /* the checksum matched, so what follows was written by a kvgen; the checks guard against a
     * file crafted to match its checksum */
    uint32_t flags = get_u32(h + 12);
    if (get_u32(h + 24) != (uint32_t)hp->n_layer || get_u32(h + 28) != (uint32_t)hp->n_head_kv ||
        get_u32(h + 32) != (uint32_t)hp->head_dim || get_u32(h + 36) != (uint32_t)hp->n_vocab)
        REFUSE(KVGEN_E_FORMAT, "%s: cache shape does not match the model", path);
    uint32_t n_ctx = get_u32(h + 40), on_full = get_u32(h + 44), keep = get_u32(h + 48);
    uint64_t n = get_u64(h + 56), clean_len = get_u64(h + 64), sampler_bytes = get_u64(h + 88);
    if (n_ctx == 0 || n_ctx > KVG_MAX_CTX || n > n_ctx || on_full > KVGEN_ON_FULL_SHIFT || keep > KVG_MAX_CTX)
        REFUSE(KVGEN_E_FORMAT, "%s: bad session options (n_ctx %u, %llu tokens)", path, (unsigned)n_ctx,
               (unsigned long long)n);
    size_t V = (size_t)hp->n_vocab, per = (size_t)hp->n_head_kv * (size_t)n * (size_t)hp->head_dim;
    uint64_t body = sampler_bytes + n * 4 + ((flags & FLAG_LOGITS) ? V * 4 : 0) + (uint64_t)hp->n_layer * 2 * per * 4;
    if (sampler_bytes > file_bytes || HEADER_BYTES + body + 8 != file_bytes)
        REFUSE(KVGEN_E_FORMAT, "%s: section sizes do not add up to the file size", path);

    const unsigned char *p = buf + HEADER_BYTES;
    kvgen_session_desc d = {.n_ctx = (int)n_ctx, .no_cache = (flags & FLAG_NO_CACHE) != 0,
                            .on_full = (kvgen_on_full)on_full, .keep = (int)keep,
                            .no_prefix_reuse = (flags & FLAG_PREFIX_REUSE) == 0};
    st = kvg_session_new(model, &d, NULL, &s, err);
    if (st != KVGEN_OK) goto done;
    kvgen_error why = {0};
    st = kvg_sampler_state_load(&s->sampler, p, (size_t)sampler_bytes, &why);
    if (st != KVGEN_OK) REFUSE(st, "%s: sampler state: %s", path, why.message);
    p += sampler_bytes;
    int32_t *tokens = malloc((size_t)(n ? n : 1) * 4);
    kv = malloc(((size_t)hp->n_layer * 2 * per + 1) * sizeof(float));
    if (!tokens || !kv) {
        free(tokens);
        REFUSE(KVGEN_E_NO_MEMORY, "%s: out of memory restoring %llu tokens", path, (unsigned long long)n);
    }
    memcpy(tokens, p, (size_t)n * 4);
    from_le32_array(tokens, (size_t)n);
    p += n * 4;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab) {
            int bad = (int)tokens[i];
            free(tokens);
            REFUSE(KVGEN_E_FORMAT, "%s: token %zu: id %d is outside the vocabulary", path, i, bad);
        }
    const unsigned char *logits = p;
    if (flags & FLAG_LOGITS) p += V * 4;
    memcpy(kv, p, (size_t)hp->n_layer * 2 * per * 4);
    from_le32_array(kv, (size_t)hp->n_layer * 2 * per);
    s->clean_len = clean_len == UINT64_MAX || clean_len > n ? KVG_CLEAN_ALL : (size_t)clean_len;
    st = kvg_session_load_kv(s, tokens, (size_t)n, kv, err);
    free(tokens);
    if (st != KVGEN_OK) goto done;
    /* the saved logits, not a recomputation: a contiguous model recomputed them on the way */
    if (flags & FLAG_LOGITS) {
        memcpy(s->logits, logits, V * 4);
        from_le32_array(s->logits, V);
    }
    s->has_logits = (flags & FLAG_LOGITS) != 0;
    s->shifts = (size_t)get_u64(h + 72);
    s->tokens_reused = (size_t)get_u64(h + 80);
#undef REFUSE
done:
    free(kv);
    free(buf);
    if (st != KVGEN_OK) {
        kvgen_session_close(s);
        return st;
    }
    *out = s;
    return KVGEN_OK;
}
