/* session_file.c: kvgen_session_save / kvgen_session_restore.
 *
 * File layout, version 2, every integer little-endian, floats as their IEEE-754 bits:
 *
 *   header (HEADER_BYTES)
 *     magic "KVGSESS\0"        8
 *     version u32, flags u32   8   flags: 1 has logits, 2 no_cache, 4 prefix reuse
 *     model identity u64       8   kvg_model_identity
 *     n_layer n_head_kv head_dim n_vocab            u32 x 4
 *     n_ctx on_full keep n_adapters                 u32 x 4
 *     n_tokens clean_len shifts tokens_reused       u64 x 4   (clean_len: UINT64_MAX = all)
 *     sampler_bytes file_bytes                      u64 x 2
 *   the LoRA adapters the session runs with, n_adapters x (content hash u64, scale f32, u32 0)
 *   sampler state (sampler_bytes in all: kvg_sampler_state_save, then u32 n and n bytes of
 *     the conversation: kvg_chat_save; n is 0 without one)
 *   token ids                      n_tokens x i32
 *   logits (when flags & 1)        n_vocab x f32
 *   K/V, for each layer: K then V, (n_head_kv, n_tokens, head_dim) f32: the used positions only
 *   checksum u64 over every byte before it
 * Version 1 is version 2 without adapters (its n_adapters field was reserved, always 0); it is
 * still read.
 *
 * Save writes a temporary file in the folder of the target (a symbolic link is followed: the
 * file it points to is replaced, the link stays), syncs it and renames it over the target, then
 * syncs the folder: the target is always either the previous file or the whole new one, and a
 * failed save removes only its temporary file. A target that exists and is not a regular file
 * (device, FIFO, folder) is refused and left alone. The helpers are base/'s (kvg_file.h), shared
 * with the memory store's files.
 *
 * Restore opens regular files only (a device or FIFO would never end or block), reads the
 * fixed-size header and checks, in this order, so each refusal names its real cause: magic,
 * version (newer files are refused, not misread), the file's real size against file_bytes
 * (truncation), checksum (corruption), model identity, shapes. Nothing is read past the header
 * before its size matches the file's, and nothing sized by the header is allocated before its
 * shapes match the model; a header that does not is told apart from corruption by streaming
 * the checksum through a small buffer. The whole file is read and checked before a session
 * exists. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_file.h"
#include "kvg_generate.h"
#include "kvg_hash.h"
#include "kvg_platform.h"
#include "kvg_session.h"
#include "kvg_str.h"

#define FILE_MAGIC "KVGSESS"
/* a session of a kind that saves itself (kvg_session_kind.save; the remote kind's: JSON of the
 * history and sampler settings): "KVGREMOT", u32 version, u32 0, u64 n, n bytes of the kind's,
 * u64 checksum of everything before it */
#define REMOTE_MAGIC "KVGREMOT"
#define REMOTE_HEADER 24
#define FILE_VERSION 2u
#define ADAPTER_BYTES 16 /* one adapter's entry */
#define HEADER_BYTES 112
enum { FLAG_LOGITS = 1, FLAG_NO_CACHE = 2, FLAG_PREFIX_REUSE = 4 };

/* ---- hashing: kvg_hash.h ---------------------------------------------------------------- */

/* Identifies a model's weights without reading all of them: the hyperparameters, every
 * tensor's name, type and shape, and 64 bytes from the start, middle and end of its data.
 * Two random-weight models of one shape differ in those samples. */
uint64_t kvg_model_identity(const kvgen_model *m) {
    kvg_hash64 st = KVG_HASH64_INIT;
    const kvg_hparams *hp = &m->w.hp;
    int ints[] = {hp->n_layer, hp->n_embd, hp->n_ff, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_rot, hp->n_vocab};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) kvg_hash64_add_u64(&st, (uint64_t)(uint32_t)ints[i]);
    uint32_t fb, fe;
    memcpy(&fb, &hp->rope_freq_base, 4);
    memcpy(&fe, &hp->rms_norm_eps, 4);
    kvg_hash64_add_u64(&st, fb);
    kvg_hash64_add_u64(&st, fe);
    int n = kvg_gguf_n_tensors(m->gguf);
    for (int i = 0; i < n; i++) {
        const kvg_tensor *t = kvg_gguf_tensor(m->gguf, i);
        kvg_hash64_add(&st, t->name, strlen(t->name) + 1);
        kvg_hash64_add_u64(&st, t->type);
        for (int d = 0; d < 4; d++) kvg_hash64_add_u64(&st, t->ne[d]);
        size_t sample = t->nbytes < 64 ? t->nbytes : 64;
        const unsigned char *data = t->data;
        if (!data || sample == 0) continue;
        kvg_hash64_add(&st, data, sample);
        kvg_hash64_add(&st, data + (t->nbytes - sample) / 2, sample);
        kvg_hash64_add(&st, data + t->nbytes - sample, sample);
    }
    return kvg_hash64_final(&st);
}

/* The file of a session whose kind saves itself: the header and the kind's bytes, saved as
 * atomically. */
static kvgen_status save_kind(const kvgen_session *s, const char *path, kvg_save *sv, kvgen_error *err) {
    size_t n = 0;
    char *json = s->kind->save(s, &n);
    if (!json) {
        kvg_save_done(sv);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_save: %s: out of memory saving the session", path);
    }
    unsigned char header[REMOTE_HEADER] = {0};
    memcpy(header, REMOTE_MAGIC, 8);
    kvg_put_u32(header + 8, 1);
    kvg_put_u64(header + 16, n);
    kvgen_status st = kvg_save_open(sv, err);
    if (st == KVGEN_OK) {
        kvg_fw_write(&sv->w, header, sizeof header);
        kvg_fw_write(&sv->w, json, n);
        st = kvg_save_commit(sv, KVGEN_OK, err);
    } else {
        kvg_save_done(sv);
    }
    kvg_free(json);
    return st;
}

/* Writes the session to a temporary file next to the target, syncs it and renames it over the
 * target, so that the target is at every moment either the previous file or the complete new
 * one; a failure removes only the temporary file. */
kvgen_status kvgen_session_save(const kvgen_session *s, const char *path, kvgen_error *err) {
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_save: session is NULL");
    kvgen_status busy_ = kvg_session_check_host(s, "kvgen_session_save", err);
    if (busy_ != KVGEN_OK) return busy_;
    if (!path || !*path) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_save: path is empty");
    kvg_save sv;
    kvgen_status st = kvg_save_prepare(&sv, "kvgen_session_save", path, err);
    if (st != KVGEN_OK) return st;
    if (s->kind->save) return save_kind(s, path, &sv, err);
    const kvgen_model *m = s->model;
    const kvg_hparams *hp = &m->w.hp;
    size_t n = s->n_tokens, V = (size_t)hp->n_vocab;
    size_t per = (size_t)hp->n_head_kv * n * (size_t)hp->head_dim; /* floats per layer per K or V */
    size_t chat_bytes = kvg_chat_saved_size(s), sampler_bytes = kvg_sampler_state_size(&s->sampler) + 4 + chat_bytes;
    const float *logits = kvgen_session_logits(s); /* fetched when the device kept them */
    size_t n_adapters = (size_t)s->lora.n;
    uint64_t file_bytes = HEADER_BYTES + n_adapters * ADAPTER_BYTES + sampler_bytes + n * 4 + (logits ? V * 4 : 0) +
                          (uint64_t)hp->n_layer * 2 * per * 4 + 8;

    unsigned char header[HEADER_BYTES] = {0};
    memcpy(header, FILE_MAGIC, 8);
    kvg_put_u32(header + 8, FILE_VERSION);
    kvg_put_u32(header + 12, (logits ? FLAG_LOGITS : 0) | (s->no_cache ? FLAG_NO_CACHE : 0) |
                             (s->prefix_reuse ? FLAG_PREFIX_REUSE : 0));
    kvg_put_u64(header + 16, kvg_model_identity(m));
    kvg_put_u32(header + 24, (uint32_t)hp->n_layer);
    kvg_put_u32(header + 28, (uint32_t)hp->n_head_kv);
    kvg_put_u32(header + 32, (uint32_t)hp->head_dim);
    kvg_put_u32(header + 36, (uint32_t)hp->n_vocab);
    kvg_put_u32(header + 40, (uint32_t)s->n_ctx);
    kvg_put_u32(header + 44, (uint32_t)s->on_full);
    kvg_put_u32(header + 48, (uint32_t)s->keep);
    kvg_put_u32(header + 52, (uint32_t)n_adapters);
    kvg_put_u64(header + 56, n);
    kvg_put_u64(header + 64, s->clean_len == KVG_CLEAN_ALL ? UINT64_MAX : (uint64_t)s->clean_len);
    kvg_put_u64(header + 72, s->shifts);
    kvg_put_u64(header + 80, s->tokens_reused);
    kvg_put_u64(header + 88, sampler_bytes);
    kvg_put_u64(header + 96, file_bytes);

    unsigned char *sampler = kvg_malloc(sampler_bytes ? sampler_bytes : 1);
    size_t scratch_n = per > V ? per : V;
    if (scratch_n < n) scratch_n = n;
    float *scratch = kvg_malloc((scratch_n ? scratch_n : 1) * sizeof(float));
    if (!sampler || !scratch) {
        kvg_free(sampler);
        kvg_free(scratch);
        kvg_save_done(&sv);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_save: %s: out of memory saving the session", path);
    }
    kvg_sampler_state_save(&s->sampler, sampler);
    kvg_put_u32(sampler + sampler_bytes - 4 - chat_bytes, (uint32_t)chat_bytes);
    kvg_chat_save(s, sampler + sampler_bytes - chat_bytes);

    st = kvg_save_open(&sv, err);
    if (st != KVGEN_OK) {
        kvg_free(sampler);
        kvg_free(scratch);
        kvg_save_done(&sv);
        return st;
    }
    kvg_file_writer *w = &sv.w;
    kvg_fw_write(w, header, sizeof header);
    for (size_t i = 0; i < n_adapters; i++) {
        unsigned char entry[ADAPTER_BYTES] = {0};
        uint32_t scale;
        memcpy(&scale, &s->lora.scale[i], 4);
        kvg_put_u64(entry, s->lora.adapter[i]->hash);
        kvg_put_u32(entry + 8, scale);
        kvg_fw_write(w, entry, sizeof entry);
    }
    kvg_fw_write(w, sampler, sampler_bytes);
    memcpy(scratch, s->tokens, n * 4);
    kvg_le32_array(scratch, n);
    kvg_fw_write(w, scratch, n * 4);
    if (logits) {
        memcpy(scratch, logits, V * 4);
        kvg_le32_array(scratch, V);
        kvg_fw_write(w, scratch, V * 4);
    }
    for (int l = 0; st == KVGEN_OK && !w->error && l < hp->n_layer && per > 0; l++)
        for (int which = 0; st == KVGEN_OK && which < 2; which++) {
            st = kvgen_session_read_cache(s, l, which, scratch, per, err);
            if (st != KVGEN_OK) break;
            kvg_le32_array(scratch, per);
            kvg_fw_write(w, scratch, per * 4);
        }
    kvg_free(sampler);
    kvg_free(scratch);
    return kvg_save_commit(&sv, st, err);
}

/* ---- restore ------------------------------------------------------------------------------------- */

/* The header's model, shapes, options and section sizes against `model`: what restore checks
 * once the checksum matched. Passing it bounds every allocation restore makes by the model's
 * shapes and the file's real size. */
static kvgen_status check_header(const kvgen_model *model, const unsigned char *h, const char *path,
                                 kvgen_error *err) {
    const kvg_hparams *hp = &model->w.hp;
    if (kvg_get_u64(h + 16) != kvg_model_identity(model))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "kvgen_session_restore: %s: saved from another model than '%s' (model hash %016llx, this one "
                        "%016llx)",
                        path, model->name, (unsigned long long)kvg_get_u64(h + 16),
                        (unsigned long long)kvg_model_identity(model));
    /* the checksum matched, so what follows was written by a kvgen; the checks guard against a
     * file crafted to match its checksum */
    uint32_t flags = kvg_get_u32(h + 12);
    if (kvg_get_u32(h + 24) != (uint32_t)hp->n_layer || kvg_get_u32(h + 28) != (uint32_t)hp->n_head_kv ||
        kvg_get_u32(h + 32) != (uint32_t)hp->head_dim || kvg_get_u32(h + 36) != (uint32_t)hp->n_vocab)
        return kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: cache shape does not match the model", path);
    uint32_t n_ctx = kvg_get_u32(h + 40), on_full = kvg_get_u32(h + 44), keep = kvg_get_u32(h + 48);
    uint32_t n_adapters = kvg_get_u32(h + 52);
    if (n_adapters > KVGEN_MAX_ADAPTERS || (n_adapters > 0 && kvg_get_u32(h + 8) < 2))
        return kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: bad adapter count %u (at most %d, version 2 "
                        "files only)", path, (unsigned)n_adapters, KVGEN_MAX_ADAPTERS);
    uint64_t n = kvg_get_u64(h + 56), sampler_bytes = kvg_get_u64(h + 88), file_bytes = kvg_get_u64(h + 96);
    if (n_ctx == 0 || n_ctx > KVG_MAX_CTX || n > n_ctx || on_full > KVGEN_ON_FULL_SHIFT || keep > KVG_MAX_CTX)
        return kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: bad session options (n_ctx %u, %llu tokens)",
                        path, (unsigned)n_ctx, (unsigned long long)n);
    uint64_t V = (uint64_t)hp->n_vocab, per = (uint64_t)hp->n_head_kv * n * (uint64_t)hp->head_dim;
    uint64_t body = (uint64_t)n_adapters * ADAPTER_BYTES + n * 4 + ((flags & FLAG_LOGITS) ? V * 4 : 0) +
                    (uint64_t)hp->n_layer * 2 * per * 4;
    if (sampler_bytes > file_bytes || HEADER_BYTES + sampler_bytes + body + 8 != file_bytes)
        return kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: section sizes do not add up to the file size",
                        path);
    return KVGEN_OK;
}

/* The file of a session whose kind saves itself: checked whole (checksum, sizes, then the kind
 * checks its bytes) before the session exists. */
static kvgen_status restore_kind(kvgen_model *model, int fd, uint64_t size, const char *path, kvgen_session **out,
                                 kvgen_error *err) {
    *out = NULL;
    if (size < REMOTE_HEADER + 8 || size > ((uint64_t)1 << 31))
        return kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: a remote session of %llu bytes is truncated "
                        "or too large", path, (unsigned long long)size);
    unsigned char *buf = kvg_malloc((size_t)size);
    if (!buf) return kvg_fail(err, KVGEN_E_NO_MEMORY, "kvgen_session_restore: %s: out of memory", path);
    kvg_file_reader r = {fd, 0, KVG_HASH64_INIT, 0, false};
    if (lseek(fd, 0, SEEK_SET) != 0) r.error = errno;
    if (!r.error) kvg_fr_read(&r, buf, (size_t)size);
    kvgen_status st = KVGEN_OK;
    if (r.error || r.short_read) {
        st = kvg_fail(err, KVGEN_E_IO, "kvgen_session_restore: %s: read error: %s", path,
                      r.error ? strerror(r.error) : "the file changed while it was read");
    } else if (kvg_get_u32(buf + 8) > 1) {
        st = kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvgen_session_restore: %s: remote session version %u is newer than "
                      "this kvgen reads (1)", path, (unsigned)kvg_get_u32(buf + 8));
    } else if (kvg_get_u64(buf + 16) != size - REMOTE_HEADER - 8) {
        st = kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: truncated or corrupted: %llu bytes where the "
                      "header says %llu", path, (unsigned long long)size,
                      (unsigned long long)(kvg_get_u64(buf + 16) + REMOTE_HEADER + 8));
    } else {
        kvg_hash64 hs = KVG_HASH64_INIT;
        kvg_hash64_add(&hs, buf, (size_t)size - 8);
        if (kvg_hash64_final(&hs) != kvg_get_u64(buf + size - 8))
            st = kvg_fail(err, KVGEN_E_FORMAT, "kvgen_session_restore: %s: corrupted (checksum mismatch)", path);
    }
    char who[300];
    snprintf(who, sizeof who, "kvgen_session_restore: %s", path);
    if (st == KVGEN_OK)
        st = kvg_session_kind_of(model)->restore(model, (const char *)buf + REMOTE_HEADER,
                                                 (size_t)(size - REMOTE_HEADER - 8), who, out, err);
    kvg_free(buf);
    return st;
}

kvgen_status kvgen_session_restore(kvgen_model *model, const char *path, kvgen_session **out, kvgen_error *err) {
    if (out) *out = NULL;
    if (!model) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_restore: model is NULL");
    if (!out) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_restore: out is NULL");
    if (!path || !*path) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "kvgen_session_restore: path is empty");
    int fd = -1;
    uint64_t size = 0;
    kvgen_status st = kvg_file_open_regular("kvgen_session_restore", path, &fd, &size, err);
    if (st != KVGEN_OK) return st;
    const kvg_hparams *hp = &model->w.hp;

#define REFUSE(status, ...)                                                                                            \
    do {                                                                                                               \
        st = kvg_fail(err, status, __VA_ARGS__);                                                                       \
        goto done;                                                                                                     \
    } while (0)
#define READ_FAILED(r)                                                                                                 \
    do {                                                                                                               \
        if ((r).error) REFUSE(KVGEN_E_IO, "kvgen_session_restore: %s: read error: %s", path, strerror((r).error));    \
        REFUSE(KVGEN_E_IO, "kvgen_session_restore: %s: the file changed while it was read", path);                    \
    } while (0)

    kvgen_session *s = NULL;
    unsigned char *sampler = NULL;
    int32_t *tokens = NULL;
    float *kv = NULL, *logits = NULL;
    kvg_lora_set lora = {0};
    unsigned char adapters[KVGEN_MAX_ADAPTERS * ADAPTER_BYTES];
    /* the header first, and nothing past it until its sizes agree with the file's */
    unsigned char h[HEADER_BYTES] = {0};
    kvg_file_reader r = {fd, 0, KVG_HASH64_INIT, 0, false};
    size_t head = size < HEADER_BYTES ? (size_t)size : HEADER_BYTES;
    kvg_fr_read(&r, h, head);
    if (r.error || r.short_read) READ_FAILED(r);
    if (size >= 8 && memcmp(h, REMOTE_MAGIC, 8) == 0) {
        if (!kvg_session_kind_of(model)->restore)
            REFUSE(KVGEN_E_INVALID_ARGUMENT,
                   "kvgen_session_restore: %s: saved from a remote model's session; restore it on a model loaded from "
                   "its server's URL",
                   path);
        st = restore_kind(model, fd, size, path, &s, err);
        goto done;
    }
    if (size < 8 || memcmp(h, FILE_MAGIC, 8) != 0)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: not a kvgen session file (no KVGSESS magic)", path);
    if (kvg_session_kind_of(model)->restore)
        REFUSE(KVGEN_E_INVALID_ARGUMENT,
               "kvgen_session_restore: %s: a local session (its cache); restore it on the GGUF model it was saved "
               "from, not the remote model '%s'",
               path, model->name);
    if (size < 12)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: truncated: %llu bytes, no format version", path,
               (unsigned long long)size);
    uint32_t version = kvg_get_u32(h + 8);
    if (version > FILE_VERSION)
        REFUSE(KVGEN_E_UNSUPPORTED,
               "kvgen_session_restore: %s: session format version %u is newer than this kvgen reads (%u); upgrade "
               "kvgen",
               path, (unsigned)version, FILE_VERSION);
    if (version == 0)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: session format version 0 does not exist", path);
    if (size < HEADER_BYTES + 8)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: truncated: %llu bytes, shorter than the %d-byte header",
               path, (unsigned long long)size, HEADER_BYTES + 8);
    uint64_t file_bytes = kvg_get_u64(h + 96);
    if (size < file_bytes)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: truncated: %llu of %llu bytes", path,
               (unsigned long long)size, (unsigned long long)file_bytes);
    if (size > file_bytes)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: corrupted: %llu bytes where the header says %llu", path,
               (unsigned long long)size, (unsigned long long)file_bytes);

    /* A header that does not fit the model is, in a file whose checksum fails, corruption (a
     * flipped bit in a size must not read as a shape mismatch): the checksum is then streamed
     * through a small buffer to tell which, and nothing sized by the header is allocated. */
    kvgen_error why = {0};
    if (check_header(model, h, path, &why) != KVGEN_OK) {
        unsigned char stored[8];
        if (!kvg_fr_hash_to(&r, file_bytes - 8)) READ_FAILED(r);
        kvg_hash64 body_sum = r.sum;
        kvg_fr_read(&r, stored, 8);
        if (r.error || r.short_read) READ_FAILED(r);
        if (kvg_hash64_final(&body_sum) != kvg_get_u64(stored))
            REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: corrupted: checksum mismatch", path);
        REFUSE(why.status, "%s", why.message);
    }

    /* every size below is now bounded by the model's shapes and the file's size */
    uint32_t flags = kvg_get_u32(h + 12);
    uint64_t n = kvg_get_u64(h + 56), clean_len = kvg_get_u64(h + 64), sampler_bytes = kvg_get_u64(h + 88);
    size_t V = (size_t)hp->n_vocab, per = (size_t)hp->n_head_kv * (size_t)n * (size_t)hp->head_dim;
    size_t n_kv = (size_t)hp->n_layer * 2 * per;
    sampler = kvg_malloc(sampler_bytes ? (size_t)sampler_bytes : 1);
    tokens = kvg_malloc((size_t)(n ? n : 1) * 4);
    logits = kvg_malloc((flags & FLAG_LOGITS) ? V * 4 : 1);
    kv = kvg_malloc((n_kv + 1) * sizeof(float));
    if (!sampler || !tokens || !logits || !kv)
        REFUSE(KVGEN_E_NO_MEMORY, "kvgen_session_restore: %s: out of memory restoring %llu tokens", path,
               (unsigned long long)n);
    uint32_t n_adapters = kvg_get_u32(h + 52); /* check_header bounded it */
    kvg_fr_read(&r, adapters, (size_t)n_adapters * ADAPTER_BYTES);
    kvg_fr_read(&r, sampler, (size_t)sampler_bytes);
    kvg_fr_read(&r, tokens, (size_t)n * 4);
    if (flags & FLAG_LOGITS) kvg_fr_read(&r, logits, V * 4);
    kvg_fr_read(&r, kv, n_kv * 4);
    unsigned char stored[8];
    kvg_hash64 body_sum = r.sum;
    kvg_fr_read(&r, stored, 8);
    if (r.error || r.short_read) READ_FAILED(r);
    if (kvg_hash64_final(&body_sum) != kvg_get_u64(stored))
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: corrupted: checksum mismatch", path);
    close(fd);
    fd = -1;

    kvg_from_le32_array(tokens, (size_t)n);
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: token %zu: id %d is outside the vocabulary", path, i,
                   (int)tokens[i]);
    kvg_from_le32_array(kv, n_kv);
    /* the adapters it ran with, among the model's loaded ones, before a session exists */
    for (uint32_t i = 0; i < n_adapters; i++) {
        const unsigned char *e = adapters + (size_t)i * ADAPTER_BYTES;
        uint64_t hash = kvg_get_u64(e);
        uint32_t bits = kvg_get_u32(e + 8);
        float scale;
        memcpy(&scale, &bits, 4);
        if (!isfinite(scale))
            REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: adapter %u's scale is not a finite number", path,
                   (unsigned)i);
        kvgen_adapter *a = kvg_adapter_find(model, hash);
        if (!a)
            REFUSE(KVGEN_E_INVALID_ARGUMENT, "kvgen_session_restore: %s: saved running adapter %016llx (at scale %g), "
                   "which is not loaded on '%s' (kvgen_adapter_load it first)", path, (unsigned long long)hash,
                   (double)scale, model->name);
        lora.adapter[lora.n] = a;
        lora.scale[lora.n++] = scale;
    }
    kvgen_session_desc d = {.n_ctx = (int)kvg_get_u32(h + 40), .no_cache = (flags & FLAG_NO_CACHE) != 0,
                            .on_full = (kvgen_on_full)kvg_get_u32(h + 44), .keep = (int)kvg_get_u32(h + 48),
                            .no_prefix_reuse = (flags & FLAG_PREFIX_REUSE) == 0};
    st = kvg_session_new(model, &d, NULL, &s, err);
    if (st != KVGEN_OK) goto done;
    size_t used = 0;
    st = kvg_sampler_state_load(&s->sampler, sampler, (size_t)sampler_bytes, &used, &why);
    if (st != KVGEN_OK) REFUSE(st, "kvgen_session_restore: %s: %s", path, why.message);
    if (sampler_bytes - used < 4 || kvg_get_u32(sampler + used) != sampler_bytes - used - 4)
        REFUSE(KVGEN_E_FORMAT, "kvgen_session_restore: %s: the conversation after the sampler state is malformed",
               path);
    st = kvg_chat_load(s, sampler + used + 4, (size_t)sampler_bytes - used - 4, &why);
    if (st != KVGEN_OK) REFUSE(st, "kvgen_session_restore: %s: %s", path, why.message);
    if (lora.n > 0) {
        st = kvg_session_can_lora(s, "kvgen_session_restore", err);
        if (st != KVGEN_OK) goto done;
        kvg_session_take_lora(s, &lora); /* an empty session: its pages are keyed under the set */
    }
    s->clean_len = clean_len == UINT64_MAX || clean_len > n ? KVG_CLEAN_ALL : (size_t)clean_len;
    st = kvg_session_load_kv(s, tokens, (size_t)n, kv, err);
    if (st != KVGEN_OK) goto done;
    /* the saved logits, not a recomputation: a contiguous model recomputed them on the way */
    if (flags & FLAG_LOGITS) {
        memcpy(s->logits, logits, V * 4);
        kvg_from_le32_array(s->logits, V);
    }
    s->has_logits = (flags & FLAG_LOGITS) != 0;
    s->shifts = (size_t)kvg_get_u64(h + 72);
    s->tokens_reused = (size_t)kvg_get_u64(h + 80);
#undef READ_FAILED
#undef REFUSE
done:
    if (fd >= 0) close(fd);
    kvg_lora_set_clear(&lora);
    kvg_free(sampler);
    kvg_free(tokens);
    kvg_free(logits);
    kvg_free(kv);
    if (st != KVGEN_OK) {
        kvgen_session_close(s);
        return st;
    }
    *out = s;
    return KVGEN_OK;
}
