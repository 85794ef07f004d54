/* history.c: a remote session's history (kvg_remote.h): the text a completion continues, or the
 * chat messages a chat completion answers. It is what every request sends, whole and in the same
 * bytes each time, so that a server's prefix cache recognises the part it computed before. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_remote.h"
#include "kvg_str.h"

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

const char *kvg_rhist_message(const kvg_rhist *h, size_t i, const char **content) {
    if (i >= h->n_msgs) return NULL;
    *content = h->msgs[i].text;
    return h->msgs[i].role;
}

void kvg_rhist_drop(kvg_rhist *h, size_t n) {
    while (n-- > 0 && h->n_msgs > 0) {
        h->n_msgs--;
        kvg_free(h->msgs[h->n_msgs].role);
        kvg_free(h->msgs[h->n_msgs].text);
    }
    if (h->n_msgs == 0 && h->mode == KVG_RMODE_CHAT) h->mode = KVG_RMODE_EMPTY;
}

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
#include <float.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include "kvg_remote_json.h"

kvg_json *kvg_rjson_parse(const char *text, size_t len) {
    size_t end, bom = len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0 ? 3 : 0; /* a UTF-8 byte order mark */
    return kvg_json_parse_ex(text + bom, len - bom, 256, KVG_JSON_ANY_BYTES, &end, NULL, NULL, 0);
}

bool kvg_rjson_string(kvg_json *o, const char *key, const char *s) {
    return kvg_json_add(o, key, kvg_json_new_string(s, strlen(s))) != NULL;
}

bool kvg_rjson_number(kvg_json *o, const char *key, double v) {
    return kvg_json_add(o, key, kvg_json_new_number(v)) != NULL;
}

bool kvg_rhist_put(const kvg_rhist *h, kvg_json *body) {
    if (h->mode != KVG_RMODE_CHAT)
        return kvg_json_add(body, "prompt", kvg_json_new_string(h->text.p ? h->text.p : "", h->text.n)) != NULL;
    kvg_json *a = kvg_json_add(body, "messages", kvg_json_new(KVG_JSON_ARRAY));
    for (size_t i = 0; a && i < h->n_msgs; i++) {
        kvg_json *m = kvg_json_add(a, NULL, kvg_json_new(KVG_JSON_OBJECT));
        if (!m || !kvg_rjson_string(m, "role", h->msgs[i].role) || !kvg_rjson_string(m, "content", h->msgs[i].text))
            return false;
    }
    return a != NULL;
}

const char *kvg_rhist_text(const kvg_rhist *h, size_t *len) {
    *len = h->text.n;
    return h->text.p ? h->text.p : "";
}

/* A sampler setting in the text session files have always held: a fraction as %.15g
 * when that reads back within a relative DBL_EPSILON, else %.17g. The codec's own text (the
 * shortest that reads back exactly) differs in some digits (0.9f: 0.8999999761581421 for
 * 0.899999976158142), and a saved session's bytes stay the same across versions. Integers and
 * the rest: the codec's text, which is the same. */
static bool file_number(kvg_json *o, const char *key, double v) {
    kvg_json *n = kvg_json_add(o, key, kvg_json_new_number(v));
    if (!n || !isfinite(v) || (v == floor(v) && fabs(v) < 1e15)) return n != NULL;
    char t[40];
    snprintf(t, sizeof t, "%.15g", v);
    double back = strtod(t, NULL);
    if (!(fabs(back - v) <= fmax(fabs(back), fabs(v)) * DBL_EPSILON)) snprintf(t, sizeof t, "%.17g", v);
    const char *point = localeconv()->decimal_point;
    char *p = point && point[0] && point[0] != '.' ? strchr(t, point[0]) : NULL;
    if (p) *p = '.';
    n->len = strlen(t);
    n->str = kvg_strndup(t, n->len); /* a number's text: the codec writes it as it is */
    return n->str != NULL;
}

char *kvg_rhist_to_json(const kvg_rhist *h, const kvgen_sampler_desc *sp, const char *model, size_t *len) {
    kvg_json *o = kvg_json_new(KVG_JSON_OBJECT);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)sp->seed); /* 64 bits: not a double */
    kvg_json *s = NULL;
    bool ok = o && kvg_rjson_string(o, "format", "kvgen remote session") && kvg_rjson_number(o, "version", 1) &&
              kvg_rjson_string(o, "model", model) &&
              kvg_rjson_string(o, "mode", h->mode == KVG_RMODE_CHAT ? "chat" : h->mode == KVG_RMODE_TEXT ? "text" : "empty") &&
              kvg_rhist_put(h, o) && (s = kvg_json_add(o, "sampler", kvg_json_new(KVG_JSON_OBJECT))) &&
              kvg_rjson_string(s, "seed", seed) && file_number(s, "temperature", sp->temperature) &&
              file_number(s, "top_k", sp->top_k) && file_number(s, "top_p", sp->top_p) &&
              file_number(s, "min_p", sp->min_p) && file_number(s, "repeat_penalty", sp->repeat_penalty) &&
              file_number(s, "frequency_penalty", sp->frequency_penalty) &&
              file_number(s, "presence_penalty", sp->presence_penalty) &&
              file_number(s, "penalty_window", sp->penalty_window);
    size_t n = 0;
    char *out = ok ? kvg_json_print(o, &n) : NULL;
    kvg_json_free(o);
    if (out && len) *len = n;
    return out;
}

static double num(const kvg_json *o, const char *key) {
    const kvg_json *v = kvg_json_get(o, key);
    return kvg_rjson_is(v, KVG_JSON_NUMBER) && isfinite(v->number) ? v->number : 0;
}

kvgen_status kvg_rhist_from_json(const char *json, size_t len, kvg_rhist **out, kvgen_sampler_desc *sp,
                                 kvgen_logit_bias **bias, const char *who, kvgen_error *err) {
    *out = NULL;
    if (bias) *bias = NULL;
    kvg_json *o = kvg_rjson_parse(json, len);
    if (!o) return kvg_fail(err, KVGEN_E_FORMAT, "%s: the remote session's JSON does not parse", who);
    kvgen_status st = KVGEN_OK;
    const char *fmt = kvg_json_get_string(o, "format", NULL);
    const char *mode = kvg_json_get_string(o, "mode", NULL);
    kvg_rhist *h = kvg_rhist_new();
    if (!h) st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    else if (!fmt || strcmp(fmt, "kvgen remote session") != 0 || !mode)
        st = kvg_fail(err, KVGEN_E_FORMAT, "%s: not a remote session", who);
    else if (num(o, "version") > 1)
        st = kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: remote session version %g is newer than this kvgen reads (1)", who,
                      num(o, "version"));
    if (st == KVGEN_OK && strcmp(mode, "chat") == 0) {
        const kvg_json *msgs = kvg_json_get(o, "messages");
        if (!kvg_rjson_is(msgs, KVG_JSON_ARRAY)) st = kvg_fail(err, KVGEN_E_FORMAT, "%s: a chat without messages", who);
        for (const kvg_json *m = st == KVGEN_OK ? msgs->child : NULL; m && st == KVGEN_OK; m = m->next) {
            const char *role = kvg_json_get_string(m, "role", NULL);
            const char *content = kvg_json_get_string(m, "content", NULL);
            if (!role || !content) st = kvg_fail(err, KVGEN_E_FORMAT, "%s: a message without role or content", who);
            else st = kvg_rhist_add_message(h, role, content, strlen(content), who, err);
        }
    } else if (st == KVGEN_OK && strcmp(mode, "text") == 0) {
        const char *p = kvg_json_get_string(o, "prompt", NULL);
        if (!p) st = kvg_fail(err, KVGEN_E_FORMAT, "%s: a text session without its text", who);
        else st = kvg_rhist_add_text(h, p, strlen(p), who, err);
    } else if (st == KVGEN_OK && strcmp(mode, "empty") != 0) {
        st = kvg_fail(err, KVGEN_E_FORMAT, "%s: unknown remote session mode '%s'", who, mode);
    }
    if (st == KVGEN_OK && sp) {
        const kvg_json *s = kvg_json_get(o, "sampler");
        memset(sp, 0, sizeof *sp);
        const char *seed = kvg_json_get_string(s, "seed", NULL);
        if (seed) sp->seed = strtoull(seed, NULL, 10);
        sp->temperature = (float)num(s, "temperature");
        sp->top_k = (int)num(s, "top_k");
        sp->top_p = (float)num(s, "top_p");
        sp->min_p = (float)num(s, "min_p");
        sp->repeat_penalty = (float)num(s, "repeat_penalty");
        sp->frequency_penalty = (float)num(s, "frequency_penalty");
        sp->presence_penalty = (float)num(s, "presence_penalty");
        sp->penalty_window = (int)num(s, "penalty_window");
    }
    kvg_json_free(o);
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
