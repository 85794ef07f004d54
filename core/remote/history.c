/* history.c: a remote session's history (kvg_remote.h): the text a completion continues, or the
 * chat messages a chat completion answers. It is what every request sends, whole and in the same
 * bytes each time, so that a server's prefix cache recognises the part it computed before. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_remote.h"

typedef struct rmsg {
    char *role;
    char *text;
    size_t len;
} rmsg;

struct kvg_rhist {
    kvg_rmode mode;
    kvg_buf text;
    rmsg *msgs;
    size_t n_msgs, cap_msgs;
};

kvg_rhist *kvg_rhist_new(void) { return kvg_calloc(1, sizeof(kvg_rhist)); }

void kvg_rhist_reset(kvg_rhist *h) {
    if (!h) return;
    for (size_t i = 0; i < h->n_msgs; i++) {
        kvg_free(h->msgs[i].role);
        kvg_free(h->msgs[i].text);
    }
    h->n_msgs = 0;
    h->text.n = 0;
    h->mode = KVG_RMODE_EMPTY;
}

void kvg_rhist_free(kvg_rhist *h) {
    if (!h) return;
    kvg_rhist_reset(h);
    kvg_free(h->msgs);
    kvg_free(h->text.p);
    kvg_free(h);
}

static bool push_msg(kvg_rhist *h, const char *role, const char *text, size_t len) {
    if (h->n_msgs == h->cap_msgs) {
        size_t cap = h->cap_msgs ? h->cap_msgs * 2 : 8;
        rmsg *m = kvg_realloc(h->msgs, cap * sizeof *m);
        if (!m) return false;
        h->msgs = m;
        h->cap_msgs = cap;
    }
    rmsg *m = &h->msgs[h->n_msgs];
    m->role = kvg_strndup(role, strlen(role));
    m->text = kvg_strndup(text ? text : "", len);
    if (!m->role || !m->text) {
        kvg_free(m->role);
        kvg_free(m->text);
        return false;
    }
    m->len = strlen(m->text); /* a message is a C string: its length is what it holds */
    h->n_msgs++;
    return true;
}

kvg_rhist *kvg_rhist_clone(const kvg_rhist *h) {
    kvg_rhist *c = kvg_rhist_new();
    if (!c) return NULL;
    c->mode = h->mode;
    bool ok = h->text.n == 0 || kvg_buf_add(&c->text, h->text.p, h->text.n);
    for (size_t i = 0; ok && i < h->n_msgs; i++) ok = push_msg(c, h->msgs[i].role, h->msgs[i].text, h->msgs[i].len);
    if (!ok) {
        kvg_rhist_free(c);
        return NULL;
    }
    return c;
}

kvg_rmode kvg_rhist_mode(const kvg_rhist *h) { return h->mode; }

size_t kvg_rhist_n_messages(const kvg_rhist *h) { return h->n_msgs; }

size_t kvg_rhist_length(const kvg_rhist *h) {
    if (h->mode == KVG_RMODE_TEXT) return h->text.n;
    size_t n = 0;
    for (size_t i = 0; i < h->n_msgs; i++) n += h->msgs[i].len + 1;
    return n;
}

kvgen_status kvg_rhist_add_text(kvg_rhist *h, const char *text, size_t len, const char *who, kvgen_error *err) {
    if (h->mode == KVG_RMODE_CHAT)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "%s: this remote session holds a chat of %zu messages; text goes to a session without one "
                        "(the server renders a chat itself)",
                        who, h->n_msgs);
    if (len == 0) return KVGEN_OK;
    if (!kvg_buf_add(&h->text, text, len)) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    h->mode = KVG_RMODE_TEXT;
    return KVGEN_OK;
}

kvgen_status kvg_rhist_add_message(kvg_rhist *h, const char *role, const char *text, size_t len, const char *who,
                                   kvgen_error *err) {
    if (h->mode == KVG_RMODE_TEXT)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "%s: this remote session holds %zu bytes of plain text; a chat goes to a session without it",
                        who, h->text.n);
    if (!push_msg(h, role, text, len)) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    h->mode = KVG_RMODE_CHAT;
    return KVGEN_OK;
}

kvgen_status kvg_rhist_rewind(kvg_rhist *h, size_t n, const char *who, kvgen_error *err) {
    size_t len = kvg_rhist_length(h);
    if (n > len)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: n %zu is more than the session's length %zu", who, n, len);
    if (n == 0) return KVGEN_OK;
    if (h->mode == KVG_RMODE_TEXT) {
        h->text.n -= n;
        if (h->text.n == 0) h->mode = KVG_RMODE_EMPTY;
        return KVGEN_OK;
    }
    /* whole messages only */
    size_t k = h->n_msgs, cut = 0;
    while (k > 0 && cut < n) cut += h->msgs[--k].len + 1;
    if (cut != n)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                        "%s: n %zu ends inside message %zu of a remote chat (its messages count content bytes + 1: "
                        "the last %zu messages make %zu); rewind whole messages",
                        who, n, k + 1, h->n_msgs - k, cut);
    for (size_t i = k; i < h->n_msgs; i++) {
        kvg_free(h->msgs[i].role);
        kvg_free(h->msgs[i].text);
    }
    h->n_msgs = k;
    if (k == 0) h->mode = KVG_RMODE_EMPTY;
    return KVGEN_OK;
}

/* the remote build's JSON parts: request bodies and session files */
#if defined(KVGEN_HAVE_REMOTE)
#include <cjson/cJSON.h>
#include <math.h>
#include "kvg_remote_json.h"

void kvg_rhist_put(const kvg_rhist *h, cJSON *body) {
    if (h->mode == KVG_RMODE_CHAT) {
        cJSON *a = cJSON_AddArrayToObject(body, "messages");
        for (size_t i = 0; a && i < h->n_msgs; i++) {
            cJSON *m = cJSON_CreateObject();
            if (!m) break;
            cJSON_AddStringToObject(m, "role", h->msgs[i].role);
            cJSON_AddStringToObject(m, "content", h->msgs[i].text);
            cJSON_AddItemToArray(a, m);
        }
    } else {
        char *t = kvg_strndup(h->text.p ? h->text.p : "", h->text.n);
        if (t) cJSON_AddStringToObject(body, "prompt", t);
        kvg_free(t);
    }
}

const char *kvg_rhist_text(const kvg_rhist *h, size_t *len) {
    *len = h->text.n;
    return h->text.p ? h->text.p : "";
}

char *kvg_rhist_to_json(const kvg_rhist *h, const kvgen_sampler_desc *sp, const char *model, size_t *len) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "format", "kvgen remote session");
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddStringToObject(o, "mode", h->mode == KVG_RMODE_CHAT ? "chat" : h->mode == KVG_RMODE_TEXT ? "text" : "empty");
    kvg_rhist_put(h, o);
    cJSON *s = cJSON_AddObjectToObject(o, "sampler");
    if (s) {
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)sp->seed); /* 64 bits: not a double */
        cJSON_AddStringToObject(s, "seed", seed);
        cJSON_AddNumberToObject(s, "temperature", sp->temperature);
        cJSON_AddNumberToObject(s, "top_k", sp->top_k);
        cJSON_AddNumberToObject(s, "top_p", sp->top_p);
        cJSON_AddNumberToObject(s, "min_p", sp->min_p);
        cJSON_AddNumberToObject(s, "repeat_penalty", sp->repeat_penalty);
        cJSON_AddNumberToObject(s, "frequency_penalty", sp->frequency_penalty);
        cJSON_AddNumberToObject(s, "presence_penalty", sp->presence_penalty);
        cJSON_AddNumberToObject(s, "penalty_window", sp->penalty_window);
    }
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!txt) return NULL;
    size_t n = strlen(txt);
    char *out = kvg_strndup(txt, n);
    cJSON_free(txt);
    if (out && len) *len = n;
    return out;
}

static double num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : 0;
}

kvgen_status kvg_rhist_from_json(const char *json, size_t len, kvg_rhist **out, kvgen_sampler_desc *sp,
                                 kvgen_logit_bias **bias, const char *who, kvgen_error *err) {
    *out = NULL;
    if (bias) *bias = NULL;
    cJSON *o = cJSON_ParseWithLength(json, len);
    if (!o) return kvg_fail(err, KVGEN_E_FORMAT, "%s: the remote session's JSON does not parse", who);
    kvgen_status st = KVGEN_OK;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(o, "mode");
    kvg_rhist *h = kvg_rhist_new();
    if (!h) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "kvgen remote session") != 0 || !cJSON_IsString(mode))
        st = kvg_fail(err, KVGEN_E_FORMAT, "%s: not a remote session", who);
    else if (num(o, "version") > 1)
        st = kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: remote session version %g is newer than this kvgen reads (1)", who,
                      num(o, "version"));
    if (st == KVGEN_OK && strcmp(mode->valuestring, "chat") == 0) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages"), *m;
        if (!cJSON_IsArray(msgs)) st = kvg_fail(err, KVGEN_E_FORMAT, "%s: a chat without messages", who);
        cJSON_ArrayForEach(m, msgs) {
            if (st != KVGEN_OK) break;
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
            if (!cJSON_IsString(role) || !cJSON_IsString(content))
                st = kvg_fail(err, KVGEN_E_FORMAT, "%s: a message without role or content", who);
            else
                st = kvg_rhist_add_message(h, role->valuestring, content->valuestring, strlen(content->valuestring),
                                           who, err);
        }
    } else if (st == KVGEN_OK && strcmp(mode->valuestring, "text") == 0) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
        if (!cJSON_IsString(p)) st = kvg_fail(err, KVGEN_E_FORMAT, "%s: a text session without its text", who);
        else st = kvg_rhist_add_text(h, p->valuestring, strlen(p->valuestring), who, err);
    } else if (st == KVGEN_OK && strcmp(mode->valuestring, "empty") != 0) {
        st = kvg_fail(err, KVGEN_E_FORMAT, "%s: unknown remote session mode '%s'", who, mode->valuestring);
    }
    if (st == KVGEN_OK && sp) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "sampler");
        memset(sp, 0, sizeof *sp);
        const cJSON *seed = cJSON_GetObjectItemCaseSensitive(s, "seed");
        if (cJSON_IsString(seed)) sp->seed = strtoull(seed->valuestring, NULL, 10);
        sp->temperature = (float)num(s, "temperature");
        sp->top_k = (int)num(s, "top_k");
        sp->top_p = (float)num(s, "top_p");
        sp->min_p = (float)num(s, "min_p");
        sp->repeat_penalty = (float)num(s, "repeat_penalty");
        sp->frequency_penalty = (float)num(s, "frequency_penalty");
        sp->presence_penalty = (float)num(s, "presence_penalty");
        sp->penalty_window = (int)num(s, "penalty_window");
    }
    cJSON_Delete(o);
    if (st != KVGEN_OK) {
        kvg_rhist_free(h);
        return st;
    }
    *out = h;
    return KVGEN_OK;
}
#else
char *kvg_rhist_to_json(const kvg_rhist *h, const kvgen_sampler_desc *sp, const char *model, size_t *len) {
    (void)h, (void)sp, (void)model, (void)len;
    return NULL;
}
kvgen_status kvg_rhist_from_json(const char *json, size_t len, kvg_rhist **out, kvgen_sampler_desc *sp,
                                 kvgen_logit_bias **bias, const char *who, kvgen_error *err) {
    (void)json, (void)len, (void)sp, (void)bias;
    *out = NULL;
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: this kvgen was built without remote models", who);
}
#endif
