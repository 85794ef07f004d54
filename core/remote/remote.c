/* remote.c: the connection to an OpenAI-compatible server (kvg_remote.h): model discovery,
 * streamed generation requests read as server-sent events while they arrive, the jobs' shared
 * transfer pool, retries, timeouts, and errors mapped to kvgen statuses.
 *
 * Threads: a stream started for the jobs' worker lives in the model's shared pool (one curl
 * multi handle, its connections reused across requests) and only the worker thread drives or
 * changes that pool; a stream freed on another thread (a session closing on the host) is only
 * marked and handed to the worker, which removes it at its next drive. A stream of a call on
 * the host's own thread (kvgen_gen_next) has a pool of its own. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_model.h"
#include "kvg_platform.h"
#include "kvg_remote.h"
#include "kvg_str.h"

bool kvg_remote_is_url(const char *path) {
    return path && (strncmp(path, "http://", 7) == 0 || strncmp(path, "https://", 8) == 0);
}

/* Where a URL's password lies ("scheme://user:PASSWORD@host/..."): its offset and length; false
 * when it has none. */
static bool url_password(const char *url, size_t *at, size_t *len) {
    const char *p = strstr(url, "://");
    if (!p) return false;
    p += 3;
    size_t host_end = strcspn(p, "/?#");
    const char *atsign = NULL;
    for (size_t i = 0; i < host_end; i++)
        if (p[i] == '@') atsign = p + i; /* the last '@' ends the userinfo */
    if (!atsign) return false;
    const char *colon = memchr(p, ':', (size_t)(atsign - p));
    if (!colon) return false;
    *at = (size_t)(colon + 1 - url);
    *len = (size_t)(atsign - colon - 1);
    return true;
}

char *kvg_remote_redact_url(const char *url) {
    size_t at, len;
    if (!url) return NULL;
    if (!url_password(url, &at, &len)) return kvg_strdup(url);
    size_t n = strlen(url);
    char *d = kvg_malloc(n - len + 4);
    if (!d) return NULL;
    memcpy(d, url, at);
    memcpy(d + at, "***", 3);
    memcpy(d + at + 3, url + at + len, n - at - len + 1);
    return d;
}

#if defined(KVGEN_HAVE_REMOTE)
#include <curl/curl.h>
#include "kvg_remote_json.h"

/* Each occurrence of secret (n bytes) in the message becomes "***" (what would pass the
 * message's end is dropped). */
static void scrub(kvgen_error *err, const char *secret, size_t n) {
    if (!err || !secret || n == 0) return;
    char out[sizeof err->message];
    const char *m = err->message;
    size_t k = 0, len = strlen(m);
    bool hit = false;
    for (size_t i = 0; i < len && k + 1 < sizeof out;) {
        if (i + n <= len && memcmp(m + i, secret, n) == 0) {
            for (int c = 0; c < 3 && k + 1 < sizeof out; c++) out[k++] = '*';
            i += n;
            hit = true;
        } else {
            out[k++] = m[i++];
        }
    }
    out[k] = 0;
    if (hit) memcpy(err->message, out, k + 1);
}

#define DEFAULT_MAX_REQUESTS 32
#define DEFAULT_TIMEOUT_MS 60000
#define MAX_ATTEMPTS 3     /* a refused connection or a 429/503 before any reply byte is retried */
#define BACKOFF_MS 250     /* then 500, 1000: doubled each time */
#define CONNECT_TIMEOUT_MS 10000

struct kvg_remote {
    char *base;  /* without a trailing '/' */
    char *shown; /* base as messages show it: its password as "***" */
    char *secret[3]; /* never in a message: the URL's password (as written and decoded), the API key */
    char *model;
    char *auth; /* "Authorization: Bearer ..." or NULL */
    int max_requests, timeout_ms;
    CURLM *multi; /* the jobs' pool: the worker thread's */
    int active;   /* its streams that are not over (worker thread) */
    kvg_mutex mu; /* guards graveyard */
    kvg_rstream *graveyard; /* streams freed off the worker, for it to remove */
};

struct kvg_rstream {
    kvg_remote *r;
    CURL *e;
    CURLM *m;
    bool own, added, counted;
    int orphan; /* set by any thread (kvg_rstream_free), read by the worker: atomic */
    struct curl_slist *hdrs;
    char *body, *url;
    char *shown; /* url as messages show it */
    const char *who;
    bool chat;
    char errbuf[CURL_ERROR_SIZE];
    long http;
    bool got_bytes;
    kvg_buf raw;  /* reply bytes not parsed yet (or the error body) */
    kvg_buf data; /* the current event's data */
    kvg_buf out;  /* text not yet taken */
    kvg_buf ends; /* where each of its events ends in it: size_t offsets */
    int pieces, pieces_total;
    kvgen_finish finish; /* from finish_reason */
    bool sse_done;
    int attempts;
    uint64_t retry_at; /* ns; 0: none */
    uint64_t last_ns;  /* when the transfer started or last received bytes */
    bool over;
    kvgen_status status;
    kvgen_error err;
    kvg_rstream *next_dead;
};

/* The URL's password and the API key out of a message about r (a server may echo them). */
static kvgen_status hide(const kvg_remote *r, kvgen_error *err, kvgen_status st) {
    for (int i = 0; i < 3; i++)
        if (r->secret[i] && strlen(r->secret[i]) >= 4) scrub(err, r->secret[i], strlen(r->secret[i]));
    return st;
}

/* The pool this thread drives (kvg_remote_drive): a stream of it freed here is removed at once. */
static _Thread_local const kvg_remote *tl_driven;

static kvg_mutex g_init_mu = KVG_MUTEX_INIT;
static bool g_init;

static kvgen_status global_init(kvgen_error *err) {
    kvg_mutex_lock(&g_init_mu);
    if (!g_init && curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK) g_init = true;
    bool ok = g_init;
    kvg_mutex_unlock(&g_init_mu);
    return ok ? KVGEN_OK : kvg_fail(err, KVGEN_E_NETWORK, "kvgen_model_load: libcurl failed to initialise");
}

/* ---- errors ------------------------------------------------------------------------------ */

/* A one-line excerpt of a server's text for a message. */
static void excerpt(char *dst, size_t cap, const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        dst[k++] = c == '\n' || c == '\r' || c == '\t' ? ' ' : (c < 32 ? '?' : (char)c);
    }
    dst[k] = 0;
}

static bool has_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == needle[i]) i++;
        if (i == n) return true;
    }
    return false;
}

/* The status an error reply means: rate limits, an over-long prompt, or the server's own. */
static kvgen_status http_status(long code, const char *msg, const char *errcode) {
    if (code == 429 || code == 503) return KVGEN_E_RATE_LIMITED;
    if ((errcode && has_ci(errcode, "context_length")) ||
        (has_ci(msg, "context") && (has_ci(msg, "exceed") || has_ci(msg, "maximum") || has_ci(msg, "too long"))))
        return KVGEN_E_CONTEXT_FULL;
    return KVGEN_E_SERVER;
}

/* The message of a JSON error object ({"error": {"message", "code"}}, {"error": "..."},
 * {"detail": ...}, {"message": ...}) or of the raw body. */
static kvgen_status fail_reply(kvgen_error *err, long code, const char *body, size_t n, const char *who,
                               const char *url) {
    char msg[320] = "", errcode[64] = "";
    kvg_json *o = kvg_rjson_parse(body, n);
    const kvg_json *e = kvg_json_get(o, "error");
    const kvg_json *m = kvg_rjson_is(e, KVG_JSON_OBJECT) ? kvg_json_get(e, "message") : e;
    if (!kvg_rjson_is(m, KVG_JSON_STRING) && o) m = kvg_json_get(o, "detail");
    if (!kvg_rjson_is(m, KVG_JSON_STRING) && o) m = kvg_json_get(o, "message");
    const kvg_json *c = kvg_rjson_is(e, KVG_JSON_OBJECT) ? kvg_json_get(e, "code") : NULL;
    if (kvg_rjson_is(c, KVG_JSON_STRING)) excerpt(errcode, sizeof errcode, c->str, strlen(c->str));
    if (kvg_rjson_is(m, KVG_JSON_STRING)) {
        excerpt(msg, sizeof msg, m->str, strlen(m->str));
    } else if (m) {
        char *t = kvg_json_print(m, NULL);
        if (t) excerpt(msg, sizeof msg, t, strlen(t));
        kvg_free(t);
    } else {
        excerpt(msg, sizeof msg, body, n);
    }
    kvg_json_free(o);
    if (!msg[0]) snprintf(msg, sizeof msg, "(no message)");
    kvgen_status st = http_status(code, msg, errcode);
    if (code > 0) return kvg_fail(err, st, "%s: %s: HTTP %ld: %s", who, url, code, msg);
    return kvg_fail(err, st, "%s: %s: the server reported an error: %s", who, url, msg);
}

static bool retryable(CURLcode rc) {
    return rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_GOT_NOTHING;
}

/* ---- easy handles ------------------------------------------------------------------------ */

static size_t collect(char *p, size_t size, size_t n, void *user) {
    kvg_buf *b = user;
    return kvg_buf_add(b, p, size * n) ? size * n : 0;
}

static CURL *easy_new(kvg_remote *r, const char *url, const char *body, bool stream, struct curl_slist **hdrs,
                      char *errbuf) {
    CURL *e = curl_easy_init();
    if (!e) return NULL;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(r->timeout_ms < CONNECT_TIMEOUT_MS ? r->timeout_ms : CONNECT_TIMEOUT_MS));
    /* a reply that sends nothing for timeout_ms fails; a slow but live stream does not */
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)((r->timeout_ms + 999) / 1000 + 1));
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    errbuf[0] = 0;
    struct curl_slist *h = NULL, *t;
    h = curl_slist_append(h, "Content-Type: application/json");
    if (h && stream && (t = curl_slist_append(h, "Accept: text/event-stream"))) h = t;
    if (h && r->auth && (t = curl_slist_append(h, r->auth))) h = t;
    if (h && (t = curl_slist_append(h, "Expect:"))) h = t; /* no 100-continue round trip */
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    *hdrs = h;
    if (body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    return e;
}

/* A blocking JSON request (model list, scoring): retried on a refused connection and on 429/503,
 * all its attempts and their backoffs within remote_timeout_ms (a retry that could not start
 * before then is not made). */
static kvgen_status http_json(kvg_remote *r, const char *path, const char *body, kvg_json **out, const char *who,
                              kvgen_error *err) {
    *out = NULL;
    size_t ul = strlen(r->base) + strlen(path) + 1, sl = strlen(r->shown) + strlen(path) + 1;
    char *url = kvg_malloc(ul), *shown = kvg_malloc(sl);
    if (!url || !shown) {
        kvg_free(url);
        kvg_free(shown);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    }
    snprintf(url, ul, "%s%s", r->base, path);
    snprintf(shown, sl, "%s%s", r->shown, path);
    const uint64_t ms = 1000000u, deadline = kvg_time_ns() + (uint64_t)r->timeout_ms * ms;
    kvgen_status st = KVGEN_OK;
    for (int attempt = 0;; attempt++) {
        uint64_t now = kvg_time_ns();
        long left_ms = now < deadline ? (long)((deadline - now + ms - 1) / ms) : 1;
        char errbuf[CURL_ERROR_SIZE];
        struct curl_slist *h = NULL;
        kvg_buf reply = {0};
        CURL *e = easy_new(r, url, body, false, &h, errbuf);
        if (!e) {
            st = kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
            break;
        }
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &reply);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, left_ms);
        if (left_ms < CONNECT_TIMEOUT_MS) curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, left_ms);
        CURLcode rc = curl_easy_perform(e);
        long code = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_cleanup(e);
        curl_slist_free_all(h);
        uint64_t backoff = (uint64_t)(BACKOFF_MS << attempt) * ms;
        bool again = attempt + 1 < MAX_ATTEMPTS && kvg_time_ns() + backoff < deadline &&
                     ((rc != CURLE_OK && retryable(rc)) || (rc == CURLE_OK && (code == 429 || code == 503)));
        if (again) {
            kvg_free(reply.p);
            kvg_sleep_ns(backoff);
            continue;
        }
        if (rc == CURLE_OPERATION_TIMEDOUT) {
            st = kvg_fail(err, KVGEN_E_NETWORK, "%s: %s %s: no complete reply within %d ms (remote_timeout_ms)%s", who,
                          body ? "POST" : "GET", shown, r->timeout_ms,
                          attempt > 0 ? ", retries included" : "");
        } else if (rc != CURLE_OK) {
            st = kvg_fail(err, KVGEN_E_NETWORK, "%s: %s %s: %s", who, body ? "POST" : "GET", shown,
                          errbuf[0] ? errbuf : curl_easy_strerror(rc));
        } else if (code >= 400) {
            st = fail_reply(err, code, reply.p ? reply.p : "", reply.n, who, shown);
        } else if (!(*out = kvg_rjson_parse(reply.p ? reply.p : "", reply.n))) {
            char ex[100];
            excerpt(ex, sizeof ex, reply.p ? reply.p : "", reply.n);
            st = kvg_fail(err, KVGEN_E_SERVER, "%s: %s: the reply is not JSON: %s", who, shown, ex);
        }
        kvg_free(reply.p);
        break;
    }
    kvg_free(url);
    kvg_free(shown);
    return hide(r, err, st);
}

/* ---- the model ------------------------------------------------------------------------------ */

static void stream_destroy(kvg_rstream *st);
static void uncount(kvg_rstream *st);

/* Frees the streams handed over to the pool's thread (kvg_rstream_free). */
static void reap(kvg_remote *r) {
    kvg_mutex_lock(&r->mu);
    kvg_rstream *dead = r->graveyard;
    r->graveyard = NULL;
    kvg_mutex_unlock(&r->mu);
    while (dead) {
        kvg_rstream *next = dead->next_dead;
        uncount(dead);
        stream_destroy(dead);
        dead = next;
    }
}

void kvg_remote_close(kvg_remote *r) {
    if (!r) return;
    if (r->multi) reap(r); /* frees the streams handed over */
    if (r->multi) curl_multi_cleanup(r->multi);
    kvg_mutex_destroy(&r->mu);
    kvg_free(r->base);
    kvg_free(r->shown);
    for (int i = 0; i < 3; i++) kvg_free(r->secret[i]);
    kvg_free(r->model);
    kvg_free(r->auth);
    kvg_free(r);
}

kvgen_status kvg_remote_open(const kvgen_model_desc *d, kvg_remote **out, kvgen_error *err) {
    *out = NULL;
    const char *who = "kvgen_model_load";
    if (d->remote_max_requests < 0 || d->remote_max_requests > 4096)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: desc.remote_max_requests %d is outside [0, 4096]", who,
                        d->remote_max_requests);
    if (d->remote_timeout_ms < 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: desc.remote_timeout_ms %d is negative", who,
                        d->remote_timeout_ms);
    if (d->api_key && strpbrk(d->api_key, "\r\n"))
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: desc.api_key holds a line break", who);
    kvgen_status st = global_init(err);
    if (st != KVGEN_OK) return st;
    kvg_remote *r = kvg_calloc(1, sizeof *r);
    if (!r) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    kvg_mutex_init(&r->mu);
    r->max_requests = d->remote_max_requests > 0 ? d->remote_max_requests : DEFAULT_MAX_REQUESTS;
    r->timeout_ms = d->remote_timeout_ms > 0 ? d->remote_timeout_ms : DEFAULT_TIMEOUT_MS;
    r->base = kvg_strdup(d->path);
    if (r->base) {
        size_t n = strlen(r->base);
        while (n > 0 && r->base[n - 1] == '/') r->base[--n] = 0;
    }
    r->shown = kvg_remote_redact_url(r->base);
    bool secrets_ok = true;
    size_t pw_at, pw_len;
    if (r->base && url_password(r->base, &pw_at, &pw_len) && pw_len > 0) {
        r->secret[0] = kvg_strndup(r->base + pw_at, pw_len);
        char *dec = r->secret[0] ? curl_easy_unescape(NULL, r->secret[0], 0, NULL) : NULL;
        if (dec && strcmp(dec, r->secret[0]) != 0) r->secret[1] = kvg_strdup(dec);
        curl_free(dec);
        secrets_ok = r->secret[0] != NULL;
    }
    if (d->api_key && *d->api_key) {
        size_t n = strlen(d->api_key) + 32;
        if ((r->auth = kvg_malloc(n))) snprintf(r->auth, n, "Authorization: Bearer %s", d->api_key);
        secrets_ok = secrets_ok && (r->secret[2] = kvg_strdup(d->api_key)) != NULL;
    }
    r->multi = curl_multi_init();
    if (!r->base || !r->shown || !secrets_ok || !r->multi || (d->api_key && *d->api_key && !r->auth)) {
        kvg_remote_close(r);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    }
    curl_multi_setopt(r->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)r->max_requests);
    curl_multi_setopt(r->multi, CURLMOPT_MAXCONNECTS, (long)r->max_requests);

    kvg_json *list = NULL;
    st = http_json(r, "/models", NULL, &list, who, err);
    const kvg_json *data = kvg_json_get(list, "data");
    if (st == KVGEN_OK && !kvg_rjson_is(data, KVG_JSON_ARRAY))
        st = kvg_fail(err, KVGEN_E_SERVER, "%s: %s/models: the reply has no \"data\" list of models", who, r->shown);
    char names[256] = "";
    size_t nl = 0;
    for (const kvg_json *it = kvg_rjson_is(data, KVG_JSON_ARRAY) ? data->child : NULL; it; it = it->next) {
        const char *id = kvg_json_get_string(it, "id", NULL);
        if (!id) continue;
        if (!r->model && (!d->remote_model || strcmp(d->remote_model, id) == 0)) r->model = kvg_strdup(id);
        if (nl < sizeof names - 1) nl += (size_t)snprintf(names + nl, sizeof names - nl, "%s'%s'", nl ? ", " : "", id);
    }
    kvg_json_free(list);
    if (st == KVGEN_OK && !r->model)
        st = d->remote_model ? kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                                        "%s: %s: desc.remote_model '%s' is not among the models the server lists (%s)",
                                        who, r->shown, d->remote_model, nl ? names : "none")
                             : kvg_fail(err, KVGEN_E_SERVER, "%s: %s/models lists no model", who, r->shown);
    if (st != KVGEN_OK) {
        hide(r, err, st);
        kvg_remote_close(r);
        return st;
    }
    *out = r;
    return KVGEN_OK;
}

const char *kvg_remote_model_name(const kvg_remote *r) { return r->model; }
const char *kvg_remote_url(const kvg_remote *r) { return r->shown; }
int kvg_remote_max_requests(const kvg_remote *r) { return r->max_requests; }
int kvg_remote_active(const kvg_remote *r) { return r->active; }

/* ---- requests ------------------------------------------------------------------------------- */

static bool add_sampler(kvg_json *o, const kvgen_sampler_desc *sp) {
    /* every setting is sent, the "off" ones as their neutral values, so that the server's own
     * defaults (top_k 40, ...) never apply in their place */
    return kvg_rjson_number(o, "temperature", sp->temperature > 0 ? sp->temperature : 0.0) &&
           kvg_rjson_number(o, "top_k", sp->top_k > 0 ? sp->top_k : 0) &&
           kvg_rjson_number(o, "top_p", sp->top_p > 0 && sp->top_p < 1 ? sp->top_p : 1.0) &&
           kvg_rjson_number(o, "min_p", sp->min_p > 0 ? sp->min_p : 0.0) &&
           kvg_rjson_number(o, "repeat_penalty", sp->repeat_penalty > 0 ? sp->repeat_penalty : 1.0) &&
           kvg_rjson_number(o, "frequency_penalty", sp->frequency_penalty) &&
           kvg_rjson_number(o, "presence_penalty", sp->presence_penalty) &&
           /* the server's seed is a 32-bit integer in most of them */
           kvg_rjson_number(o, "seed", (double)((sp->seed ? sp->seed : 0x5eed) & 0x7fffffffu));
}

/* the request body's text, o freed; NULL when out of memory (ok false: a member was not added) */
static char *print_free(kvg_json *o, bool ok) {
    char *t = o && ok ? kvg_json_print(o, NULL) : NULL;
    kvg_json_free(o);
    return t;
}

static void stream_fail(kvg_rstream *st, kvgen_status status, const char *fmt, const char *detail) {
    st->over = true;
    st->finish = KVGEN_FINISH_ERROR;
    st->status = hide(st->r, &st->err, kvg_fail(&st->err, status, fmt, st->who, st->shown, detail));
}

/* SSE: one event's data */
static void on_event(kvg_rstream *st) {
    const char *d = st->data.p ? st->data.p : "";
    size_t n = st->data.n;
    if (n == 6 && memcmp(d, "[DONE]", 6) == 0) {
        st->sse_done = true;
        return;
    }
    kvg_json *o = kvg_rjson_parse(d, n);
    if (!o) {
        char ex[100];
        excerpt(ex, sizeof ex, d, n);
        stream_fail(st, KVGEN_E_SERVER, "%s: %s: malformed event in the reply: %s", ex);
        return;
    }
    const kvg_json *e = kvg_json_get(o, "error");
    if (e && e->type != KVG_JSON_NULL) {
        char *t = kvg_json_print(o, NULL);
        hide(st->r, &st->err, fail_reply(&st->err, 0, t ? t : "", t ? strlen(t) : 0, st->who, st->shown));
        kvg_free(t);
        st->status = st->err.status;
        st->over = true;
        st->finish = KVGEN_FINISH_ERROR;
        kvg_json_free(o);
        return;
    }
    const kvg_json *c = kvg_json_item(kvg_json_get(o, "choices"), 0);
    const char *txt = st->chat ? kvg_json_get_string(kvg_json_get(c, "delta"), "content", NULL)
                               : kvg_json_get_string(c, "text", NULL);
    if (txt && txt[0]) {
        size_t end = st->out.n + strlen(txt);
        if (!kvg_buf_add(&st->out, txt, strlen(txt)) ||
            !kvg_buf_add(&st->ends, (const char *)&end, sizeof end)) {
            stream_fail(st, KVGEN_E_NO_MEMORY, "%s: %s: out of memory%s", "");
        } else {
            st->pieces++;
            st->pieces_total++;
        }
    }
    const char *fr = kvg_json_get_string(c, "finish_reason", NULL);
    if (fr) st->finish = strcmp(fr, "length") == 0 ? KVGEN_FINISH_LENGTH : KVGEN_FINISH_STOP;
    kvg_json_free(o);
}

/* Parses the complete lines of raw: "data:" lines gather into an event, a blank line ends it. */
static void parse(kvg_rstream *st, bool flush) {
    if (st->http >= 400 || st->over) return;
    size_t at = 0;
    while (!st->over) {
        char *nl = st->raw.n > at ? memchr(st->raw.p + at, '\n', st->raw.n - at) : NULL;
        size_t end = nl ? (size_t)(nl - st->raw.p) : st->raw.n;
        if (!nl && !(flush && end > at)) break;
        size_t len = end - at;
        const char *line = st->raw.p + at;
        if (len > 0 && line[len - 1] == '\r') len--;
        if (len == 0) {
            if (st->data.n > 0) on_event(st);
            st->data.n = 0;
        } else if (len >= 5 && memcmp(line, "data:", 5) == 0) {
            size_t skip = len > 5 && line[5] == ' ' ? 6 : 5;
            if ((st->data.n > 0 && !kvg_buf_add(&st->data, "\n", 1)) || !kvg_buf_add(&st->data, line + skip, len - skip))
                stream_fail(st, KVGEN_E_NO_MEMORY, "%s: %s: out of memory%s", "");
        } /* comments (":"), "event:", "id:", "retry:" carry nothing kvgen uses */
        at = nl ? end + 1 : st->raw.n;
    }
    if (flush && !st->over && st->data.n > 0) {
        on_event(st);
        st->data.n = 0;
    }
    if (at > 0) {
        memmove(st->raw.p, st->raw.p + at, st->raw.n - at);
        st->raw.n -= at;
    }
}

static size_t on_bytes(char *p, size_t size, size_t n, void *user) {
    kvg_rstream *st = user;
    if (__atomic_load_n(&st->orphan, __ATOMIC_ACQUIRE)) return size * n;
    if (st->http == 0) curl_easy_getinfo(st->e, CURLINFO_RESPONSE_CODE, &st->http);
    st->got_bytes = true;
    st->last_ns = kvg_time_ns();
    if (!kvg_buf_add(&st->raw, p, size * n)) return 0;
    if (st->http < 400) parse(st, false);
    return size * n;
}

static void uncount(kvg_rstream *st) {
    if (st->counted) {
        st->r->active--;
        st->counted = false;
    }
}

/* A transfer ended: the reply is complete, failed, or worth another attempt. */
static void transfer_done(kvg_rstream *st, CURLcode rc) {
    curl_multi_remove_handle(st->m, st->e);
    st->added = false;
    if (__atomic_load_n(&st->orphan, __ATOMIC_ACQUIRE) || st->over) return;
    long code = st->http;
    if (!code) curl_easy_getinfo(st->e, CURLINFO_RESPONSE_CODE, &code);
    bool fresh = !st->got_bytes || (code == 429 || code == 503);
    if (fresh && st->attempts < MAX_ATTEMPTS &&
        ((rc != CURLE_OK && retryable(rc)) || (rc == CURLE_OK && (code == 429 || code == 503)))) {
        st->retry_at = kvg_time_ns() + (uint64_t)(BACKOFF_MS << (st->attempts - 1)) * 1000000u;
        st->raw.n = st->data.n = 0;
        st->http = 0;
        st->got_bytes = false;
        return;
    }
    if (rc != CURLE_OK) {
        char detail[CURL_ERROR_SIZE + 64];
        snprintf(detail, sizeof detail, "%s", st->errbuf[0] ? st->errbuf : curl_easy_strerror(rc));
        if (st->pieces_total > 0) {
            char d2[sizeof detail + 64];
            snprintf(d2, sizeof d2, "after %d pieces (%s)", st->pieces_total, detail);
            stream_fail(st, KVGEN_E_NETWORK, "%s: %s: the connection dropped %s", d2);
        } else {
            stream_fail(st, KVGEN_E_NETWORK, "%s: %s: %s", detail);
        }
    } else if (code >= 400) {
        hide(st->r, &st->err, fail_reply(&st->err, code, st->raw.p ? st->raw.p : "", st->raw.n, st->who, st->shown));
        st->status = st->err.status;
        st->over = true;
        st->finish = KVGEN_FINISH_ERROR;
    } else {
        parse(st, true);
        if (!st->over && st->finish == KVGEN_FINISH_NONE && !st->sse_done && st->pieces_total == 0)
            stream_fail(st, KVGEN_E_SERVER,
                        "%s: %s: the server ended its reply without any event%s (servers end a stream so when the "
                        "request fails before its first token, e.g. a prompt over the context)",
                        "");
        if (!st->over && st->finish == KVGEN_FINISH_NONE && !st->sse_done)
            stream_fail(st, KVGEN_E_NETWORK, "%s: %s: the reply ended without a finish reason%s", "");
        if (!st->over && st->finish == KVGEN_FINISH_NONE) st->finish = KVGEN_FINISH_STOP;
        st->over = true;
    }
    uncount(st);
}

static void read_done(CURLM *m) {
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        kvg_rstream *st = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&st);
        CURLcode rc = msg->data.result;
        if (st) transfer_done(st, rc);
    }
}

/* Starts (or starts again) the transfer when it is due. */
static void launch(kvg_rstream *st) {
    if (st->over || st->added || __atomic_load_n(&st->orphan, __ATOMIC_ACQUIRE)) return;
    if (st->retry_at && kvg_time_ns() < st->retry_at) return;
    if (st->attempts > 0 && !st->retry_at) return; /* sent, and not to be retried */
    st->retry_at = 0;
    st->attempts++;
    if (curl_multi_add_handle(st->m, st->e) != CURLM_OK) {
        stream_fail(st, KVGEN_E_NETWORK, "%s: %s: cannot start the request%s", "");
        uncount(st);
        return;
    }
    st->added = true;
    st->last_ns = kvg_time_ns();
}

/* A transfer that received nothing for timeout_ms ends (curl's own low-speed limit, counted in
 * whole seconds, is only the backstop). */
static void check_silence(kvg_rstream *st) {
    if (st->over || !st->added || kvg_time_ns() - st->last_ns < (uint64_t)st->r->timeout_ms * 1000000u) return;
    curl_multi_remove_handle(st->m, st->e);
    st->added = false;
    char detail[64];
    snprintf(detail, sizeof detail, "%d ms", st->r->timeout_ms);
    stream_fail(st, KVGEN_E_NETWORK, "%s: %s: no reply for %s (remote_timeout_ms)", detail);
    uncount(st);
}

kvgen_status kvg_rstream_start(kvg_remote *r, const kvg_rrequest *q, bool worker, kvg_rstream **out, const char *who,
                               kvgen_error *err) {
    *out = NULL;
    bool chat = kvg_rhist_mode(q->hist) == KVG_RMODE_CHAT;
    kvg_json *o = kvg_json_new(KVG_JSON_OBJECT);
    bool ok = o && kvg_rjson_string(o, "model", r->model) && kvg_rhist_put(q->hist, o) &&
              kvg_json_add(o, "stream", kvg_json_new_bool(true)) &&
              (q->max_tokens < 0 || kvg_rjson_number(o, "max_tokens", q->max_tokens)) && add_sampler(o, q->sampler) &&
              kvg_json_add(o, "cache_prompt", kvg_json_new_bool(true)) && /* llama.cpp's server: keep the prefix's KV */
              (!q->ignore_eog || kvg_json_add(o, "ignore_eos", kvg_json_new_bool(true))) &&
              (!q->grammar || kvg_rjson_string(o, "grammar", q->grammar));
    kvg_rstream *st = kvg_calloc(1, sizeof *st);
    char *body = print_free(o, ok);
    const char *path = chat ? "/chat/completions" : "/completions";
    size_t ul = strlen(r->base) + strlen(path) + 1;
    size_t sl = strlen(r->shown) + strlen(path) + 1;
    char *url = kvg_malloc(ul), *shown = kvg_malloc(sl);
    if (!st || !body || !url || !shown) {
        kvg_free(st);
        kvg_free(body);
        kvg_free(url);
        kvg_free(shown);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for the request", who);
    }
    snprintf(url, ul, "%s%s", r->base, path);
    snprintf(shown, sl, "%s%s", r->shown, path);
    st->r = r;
    st->body = body;
    st->url = url;
    st->shown = shown;
    st->who = who;
    st->chat = chat;
    st->own = !worker;
    st->e = easy_new(r, url, body, true, &st->hdrs, st->errbuf);
    st->m = worker ? r->multi : curl_multi_init();
    if (!st->e || !st->m) {
        if (st->own && st->m) curl_multi_cleanup(st->m);
        st->m = NULL;
        st->own = false;
        kvg_rstream_free(st);
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory for the request", who);
    }
    curl_easy_setopt(st->e, CURLOPT_WRITEFUNCTION, on_bytes);
    curl_easy_setopt(st->e, CURLOPT_WRITEDATA, st);
    curl_easy_setopt(st->e, CURLOPT_PRIVATE, (char *)st);
    if (worker) {
        r->active++;
        st->counted = true;
    }
    *out = st;
    return KVGEN_OK;
}

kvgen_status kvg_rstream_pump(kvg_rstream *st, int wait_ms, kvg_buf *text, kvg_buf *ends, int *pieces,
                              kvgen_finish *finish, kvgen_error *err) {
    *finish = KVGEN_FINISH_NONE;
    *pieces = 0;
    launch(st);
    if (st->own && !st->over) {
        int running = 0;
        curl_multi_perform(st->m, &running);
        read_done(st->m);
        if (st->out.n == 0 && !st->over && wait_ms > 0) {
            if (st->retry_at) {
                double left = (double)(st->retry_at - kvg_time_ns()) / 1e6;
                if (left < wait_ms) wait_ms = left > 0 ? (int)left + 1 : 0;
            }
            curl_multi_poll(st->m, NULL, 0, wait_ms, NULL);
            curl_multi_perform(st->m, &running);
            read_done(st->m);
        }
        launch(st);
    }
    check_silence(st);
    if (st->out.n > 0) {
        if (!kvg_buf_add(text, st->out.p, st->out.n) || (ends && !kvg_buf_add(ends, st->ends.p, st->ends.n))) {
            stream_fail(st, KVGEN_E_NO_MEMORY, "%s: %s: out of memory%s", "");
        } else {
            *pieces = st->pieces;
            st->out.n = 0;
            st->ends.n = 0;
            st->pieces = 0;
        }
    }
    if (!st->over) return KVGEN_OK;
    *finish = st->finish;
    if (st->status != KVGEN_OK && err) *err = st->err;
    return st->status;
}

static void stream_destroy(kvg_rstream *st) {
    if (st->e) {
        if (st->added) curl_multi_remove_handle(st->m, st->e);
        curl_easy_cleanup(st->e);
    }
    if (st->own && st->m) curl_multi_cleanup(st->m);
    curl_slist_free_all(st->hdrs);
    kvg_free(st->body);
    kvg_free(st->url);
    kvg_free(st->shown);
    kvg_free(st->raw.p);
    kvg_free(st->data.p);
    kvg_free(st->out.p);
    kvg_free(st->ends.p);
    kvg_free(st);
}

void kvg_rstream_free(kvg_rstream *st) {
    if (!st) return;
    if (st->own || !st->m || tl_driven == st->r) { /* the connection closes now, not at a later drive */
        uncount(st);
        stream_destroy(st);
        return;
    }
    /* the shared pool is the worker's: it removes the transfer at its next drive */
    kvg_remote *r = st->r;
    kvg_mutex_lock(&r->mu);
    __atomic_store_n(&st->orphan, 1, __ATOMIC_RELEASE);
    st->next_dead = r->graveyard;
    r->graveyard = st;
    kvg_mutex_unlock(&r->mu);
    curl_multi_wakeup(r->multi);
}

bool kvg_remote_has_freed(kvg_remote *r) {
    kvg_mutex_lock(&r->mu);
    bool any = r->graveyard != NULL;
    kvg_mutex_unlock(&r->mu);
    return any;
}

void kvg_remote_wakeup(kvg_remote *r) {
    if (r && r->multi) curl_multi_wakeup(r->multi);
}

void kvg_remote_drive(kvg_remote *r, int wait_ms) {
    tl_driven = r;
    reap(r);
    int running = 0;
    curl_multi_perform(r->multi, &running);
    read_done(r->multi);
    if (wait_ms > 0) {
        curl_multi_poll(r->multi, NULL, 0, wait_ms, NULL);
        curl_multi_perform(r->multi, &running);
        read_done(r->multi);
    }
}

/* ---- scoring ---------------------------------------------------------------------------------- */

/* A greedy one-token completion of the history followed by `cand`, with the prompt echoed
 * and its log-probabilities: the reply (the caller deletes it) and its "logprobs" object. */
static kvgen_status echo_request(kvg_remote *r, const kvg_rhist *h, const char *cand, kvg_json **rep,
                                 const kvg_json **lps, const char *who, kvgen_error *err) {
    *rep = NULL;
    size_t hl = 0, cl = strlen(cand);
    const char *ht = kvg_rhist_text(h, &hl);
    char *prompt = kvg_malloc(hl + cl + 1);
    if (!prompt) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    memcpy(prompt, ht, hl);
    memcpy(prompt + hl, cand, cl + 1);
    kvg_json *o = kvg_json_new(KVG_JSON_OBJECT);
    bool ok = o && kvg_rjson_string(o, "model", r->model) && kvg_rjson_string(o, "prompt", prompt) &&
              kvg_rjson_number(o, "max_tokens", 1) && kvg_rjson_number(o, "temperature", 0) &&
              kvg_json_add(o, "echo", kvg_json_new_bool(true)) && kvg_rjson_number(o, "logprobs", 1) &&
              kvg_json_add(o, "cache_prompt", kvg_json_new_bool(true));
    kvg_free(prompt);
    char *body = print_free(o, ok);
    if (!body) return kvg_fail(err, KVGEN_E_NO_MEMORY, "%s: out of memory", who);
    kvgen_status st = http_json(r, "/completions", body, rep, who, err);
    kvg_free(body);
    if (st != KVGEN_OK) return st;
    *lps = kvg_json_get(kvg_json_item(kvg_json_get(*rep, "choices"), 0), "logprobs");
    return KVGEN_OK;
}

static kvgen_status no_echo(const kvg_remote *r, const char *who, kvgen_error *err) {
    return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                    "%s: %s/completions returns no prompt log-probabilities (echo with logprobs), which choice "
                    "scoring needs",
                    who, r->shown);
}

/* One candidate: the echoed prompt's log-probabilities of the tokens that start at or after
 * the history's end. */
static kvgen_status score_one(kvg_remote *r, const kvg_rhist *h, const char *cand, double *lp, int *nt,
                              const char *who, kvgen_error *err) {
    size_t hl = 0, cl = strlen(cand);
    kvg_rhist_text(h, &hl);
    kvg_json *rep;
    const kvg_json *lps;
    kvgen_status st = echo_request(r, h, cand, &rep, &lps, who, err);
    if (st != KVGEN_OK) return st;
    const kvg_json *tl = kvg_json_get(lps, "token_logprobs");
    const kvg_json *off = kvg_json_get(lps, "text_offset");
    double sum = 0;
    int used = 0;
    if (!kvg_rjson_is(tl, KVG_JSON_ARRAY) || !kvg_rjson_is(off, KVG_JSON_ARRAY) || tl->n != off->n) {
        st = no_echo(r, who, err);
    } else {
        const kvg_json *o1 = off->child, *l1 = tl->child;
        for (int i = 0; o1 && l1 && st == KVGEN_OK; i++, o1 = o1->next, l1 = l1->next) {
            if (!kvg_rjson_is(o1, KVG_JSON_NUMBER)) continue;
            double at = o1->number;
            if (at < (double)hl || at >= (double)(hl + cl)) continue;
            if (!kvg_rjson_is(l1, KVG_JSON_NUMBER))
                st = kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: %s: no log-probability for prompt token %d", who, r->shown,
                              i);
            else sum += l1->number, used++;
        }
        if (st == KVGEN_OK && used == 0)
            st = kvg_fail(err, KVGEN_E_UNSUPPORTED,
                          "%s: %s: no echoed token starts inside the candidate '%s' (the server's tokens merge it "
                          "with the text before)",
                          who, r->shown, cand);
    }
    kvg_json_free(rep);
    *lp = sum;
    *nt = used;
    return st;
}

/* Whether the server's echoed log-probabilities score each token by the distribution before it
 * (the OpenAI contract): the greedy continuation of a probe text must be the most likely choice
 * at its own position. A server that scores each token by the distribution after it instead
 * fails this and is refused, since its sums would be wrong. */
static kvgen_status probe_alignment(kvg_remote *r, const kvg_rhist *h, const char *who, kvgen_error *err) {
    kvg_json *rep;
    const kvg_json *lps;
    kvgen_status st = echo_request(r, h, "", &rep, &lps, who, err);
    if (st != KVGEN_OK) return st;
    /* with echo, the last entry is the generated (greedy) token: its log-probability must be the
     * best of its position's top list */
    const kvg_json *tl = kvg_json_get(lps, "token_logprobs");
    const kvg_json *top = kvg_json_get(lps, "top_logprobs");
    size_t n = kvg_rjson_is(tl, KVG_JSON_ARRAY) || kvg_rjson_is(tl, KVG_JSON_OBJECT) ? tl->n : 0;
    const kvg_json *last = n ? kvg_json_item(tl, n - 1) : NULL, *tops = n ? kvg_json_item(top, n - 1) : NULL;
    if (n < 2 || !kvg_rjson_is(last, KVG_JSON_NUMBER) || !kvg_rjson_is(tops, KVG_JSON_OBJECT)) {
        st = no_echo(r, who, err);
    } else {
        double best = -INFINITY;
        for (const kvg_json *it = tops->child; it; it = it->next)
            if (kvg_rjson_is(it, KVG_JSON_NUMBER) && it->number > best) best = it->number;
        if (last->number < best - 1e-3)
            st = kvg_fail(err, KVGEN_E_UNSUPPORTED,
                          "%s: %s: the server's echoed log-probabilities score each token by the distribution after "
                          "it, not before (its greedy token has %.3f where the best at its position is %.3f), so "
                          "choice scoring is refused on it",
                          who, r->shown, last->number, best);
    }
    kvg_json_free(rep);
    return st;
}

kvgen_status kvg_remote_score(kvg_remote *r, const kvg_rhist *h, const char *const *cands, size_t n, double *logprob,
                              int *n_tokens, const char *who, kvgen_error *err) {
    if (kvg_rhist_mode(h) == KVG_RMODE_CHAT)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED,
                        "%s: a remote chat cannot score choices (the server renders the chat, so the text they "
                        "continue is not known here); score on a session holding text",
                        who);
    if (kvg_rhist_length(h) == 0)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: the session is empty: choices continue its text", who);
    kvgen_status st = probe_alignment(r, h, who, err);
    for (size_t i = 0; st == KVGEN_OK && i < n; i++) st = score_one(r, h, cands[i], &logprob[i], &n_tokens[i], who, err);
    return st;
}

#else /* no libcurl: remote models are refused at load */

kvgen_status kvg_remote_open(const kvgen_model_desc *d, kvg_remote **out, kvgen_error *err) {
    *out = NULL;
    char *shown = kvg_remote_redact_url(d->path);
    kvgen_status st = kvg_fail(err, KVGEN_E_UNSUPPORTED,
                               "kvgen_model_load: %s: this kvgen was built without remote models (they need libcurl)",
                               shown ? shown : "(the URL)");
    kvg_free(shown);
    return st;
}
void kvg_remote_close(kvg_remote *r) { (void)r; }
const char *kvg_remote_model_name(const kvg_remote *r) { return (void)r, ""; }
const char *kvg_remote_url(const kvg_remote *r) { return (void)r, ""; }
int kvg_remote_max_requests(const kvg_remote *r) { return (void)r, 0; }
int kvg_remote_active(const kvg_remote *r) { return (void)r, 0; }
kvgen_status kvg_rstream_start(kvg_remote *r, const kvg_rrequest *q, bool worker, kvg_rstream **out, const char *who,
                               kvgen_error *err) {
    (void)r, (void)q, (void)worker;
    *out = NULL;
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: no remote models in this build", who);
}
kvgen_status kvg_rstream_pump(kvg_rstream *st, int wait_ms, kvg_buf *text, kvg_buf *ends, int *pieces,
                              kvgen_finish *finish, kvgen_error *err) {
    (void)st, (void)wait_ms, (void)text, (void)ends;
    *pieces = 0;
    *finish = KVGEN_FINISH_ERROR;
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "remote: no remote models in this build");
}
void kvg_rstream_free(kvg_rstream *st) { (void)st; }
void kvg_remote_drive(kvg_remote *r, int wait_ms) { (void)r, (void)wait_ms; }
void kvg_remote_wakeup(kvg_remote *r) { (void)r; }
bool kvg_remote_has_freed(kvg_remote *r) { return (void)r, false; }
kvgen_status kvg_remote_score(kvg_remote *r, const kvg_rhist *h, const char *const *cands, size_t n, double *logprob,
                              int *n_tokens, const char *who, kvgen_error *err) {
    (void)r, (void)h, (void)cands, (void)n, (void)logprob, (void)n_tokens;
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: no remote models in this build", who);
}
#endif
