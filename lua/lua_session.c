/*
 * lua_session.c: kvgen.Session: creating, forking, restoring and closing sessions, prefill and
 * single steps (decode, sample, logits), the cache's numbers, the sampler's settings and the
 * chat template and turns.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvgen_lua_internal.h"

/* ---- the session handle ----------------------------------------------------------------- */

lsession *kvl_check_session_open(lua_State *L, int arg) {
    lsession *s = kvl_check_udata(L, arg, SESSION_MT);
    if (!s->session) luaL_error(L, "attempt to use a closed " SESSION_MT);
    return s;
}

/* An open session, for calls that only read it: allowed while a stream generates (same
 * thread), not while a job is not final (the worker thread owns the session then). */
static lsession *check_session_read(lua_State *L, int arg) {
    lsession *s = kvl_check_session_open(L, arg);
    if (kvgen_session_busy(s->session))
        luaL_error(L, SESSION_MT " is busy: a kvgen.Job is running on it (poll it to the end, or cancel it and "
                      "poll until it is final)");
    return s;
}

lsession *kvl_check_no_stream(lua_State *L, lsession *s) {
    if (s->active) luaL_error(L, SESSION_MT " is busy: a kvgen.Stream is generating on it (finish or close it first)");
    return s;
}

lsession *kvl_check_session(lua_State *L, int arg) { return kvl_check_no_stream(L, check_session_read(L, arg)); }

/* ---- sessions --------------------------------------------------------------------------- */

static void read_template(lua_State *L, int idx, int arg, kvgen_chat_template *tpl);
static void push_template_name(lua_State *L, lsession *s);
static const char *const on_full_names[] = {"error", "shift", NULL};

/* model:session options; s:set_sampler takes the sampler rows (mode 0) */
enum { SESSION_ONLY = 1 };

typedef struct session_opts {
    kvgen_session_desc d;
    kvgen_sampler_desc sd;
    int on_full;      /* index in on_full_names */
    int prefix_reuse;
    const char *system;
    kvgen_chat_template tpl;
    int has_template;
    const kvgen_adapter *adapters[KVGEN_MAX_ADAPTERS];
    float scales[KVGEN_MAX_ADAPTERS];
    size_t n_adapters;
} session_opts;

/* template = a family name or a table (read_template's messages) */
static void read_session_template(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    (void)o;
    session_opts *so = field; /* the row's destination is the whole struct */
    read_template(c->L, vi, c->arg, &so->tpl);
    so->has_template = 1;
}

/* bias = {[token] = number}: finite floats, or -math.huge to ban a token */
static void read_bias(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_sampler_desc *sd = field;
    if (lua_type(L, vi) != LUA_TTABLE)
        kvl_field_error(c, o, lua_pushfstring(L, "table {[token] = bias} expected, got %s", kvl_push_got(L, vi)));
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, vi)) {
        n++;
        lua_pop(L, 1);
    }
    kvgen_logit_bias *bias = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *bias, 0);
    kvl_anchor_top(c);
    int n_vocab = kvl_model_info(c->model).n_vocab, i = 0;
    lua_pushnil(L);
    while (lua_next(L, vi)) {
        int isint = 0;
        lua_Integer id = kvl_to_integer(L, -2, &isint);
        if (!isint || id < 0 || id >= n_vocab)
            kvl_field_error(c, o,
                            lua_pushfstring(L, "keys must be token ids in [0, %d), got %s", n_vocab,
                                            kvl_push_key_text(L, -2)));
        if (lua_type(L, -1) != LUA_TNUMBER)
            kvl_field_error(c, o,
                            lua_pushfstring(L, "bias of token %I: number expected, got %s", (LUAI_UACINT)id,
                                            kvl_push_got(L, -1)));
        lua_Number b = lua_tonumber(L, -1);
        /* a float bias: finite, or -inf to ban (NaN and +inf are meaningless) */
        if (!(b >= -FLT_MAX && b <= FLT_MAX) && !(isinf(b) && b < 0))
            kvl_field_error(c, o,
                            lua_pushfstring(L, "bias of token %I: %s is not allowed (a finite number, or -math.huge to "
                                            "ban the token)",
                                            (LUAI_UACINT)id, kvl_push_number_text(L, b)));
        bias[i].token = (int32_t)id;
        bias[i].bias = (float)b;
        i++;
        lua_pop(L, 1);
    }
    sd->bias = bias;
    sd->n_bias = n;
}

/* adapters = {adapter, {adapter, scale}, ...} (lua_adapter.c reads the list) */
static void read_session_adapters(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    (void)o;
    session_opts *so = field; /* the row's destination is the whole struct */
    so->n_adapters = kvl_read_adapters(c->L, vi, c->arg, "option 'adapters'", so->adapters, so->scales);
}

#define SO(field) .off = offsetof(session_opts, field)
/* The sampler's ranges are what kvgen_sampler_desc accepts (floats finite as floats), so a bad
 * value is an argument error naming it, never a failure of the C call. */
static const opt_spec session_specs[] = {
    {.key = "context", .type = OPT_INT, SO(d.n_ctx), .lo = 0, .hi = INT_MAX, .need = SESSION_ONLY},
    {.key = "no_cache", .type = OPT_BOOL, SO(d.no_cache), .need = SESSION_ONLY},
    {.key = "on_full", .type = OPT_CHOICE, SO(on_full), .names = on_full_names, .need = SESSION_ONLY},
    {.key = "keep", .type = OPT_INT, SO(d.keep), .lo = 0, .hi = INT_MAX, .need = SESSION_ONLY},
    {.key = "prefix_reuse", .type = OPT_BOOL, SO(prefix_reuse), .need = SESSION_ONLY},
    {.key = "system", .type = OPT_STRING, SO(system), .need = SESSION_ONLY},
    {.key = "template", .type = OPT_CUSTOM, .read = read_session_template, .need = SESSION_ONLY},
    {.key = "adapters", .type = OPT_CUSTOM, .read = read_session_adapters, .need = SESSION_ONLY},
    {.key = "seed", .type = OPT_U64, SO(sd.seed)},
    {.key = "temperature", .type = OPT_FLOAT, SO(sd.temperature), .flo = -FLT_MAX, .fhi = FLT_MAX}, /* <= 0: greedy */
    {.key = "top_k", .type = OPT_INT, SO(sd.top_k), .lo = 0, .hi = INT_MAX},
    {.key = "top_p", .type = OPT_FLOAT, SO(sd.top_p), .flo = 0, .fhi = 1},
    {.key = "min_p", .type = OPT_FLOAT, SO(sd.min_p), .flo = 0, .fhi = 1},
    {.key = "repeat_penalty", .type = OPT_FLOAT, SO(sd.repeat_penalty), .flo = 0, .fhi = FLT_MAX},
    {.key = "frequency_penalty", .type = OPT_FLOAT, SO(sd.frequency_penalty), .flo = -FLT_MAX, .fhi = FLT_MAX},
    {.key = "presence_penalty", .type = OPT_FLOAT, SO(sd.presence_penalty), .flo = -FLT_MAX, .fhi = FLT_MAX},
    {.key = "penalty_window", .type = OPT_INT, SO(sd.penalty_window), .lo = -1, .hi = INT_MAX},
    {.key = "bias", .type = OPT_CUSTOM, SO(sd), .read = read_bias},
};
#undef SO

/* Pushes a closed session userdata whose user value is the model userdata at `model_idx`
 * (the session keeps it alive). */
static lsession *new_session(lua_State *L, kvgen_model *model, int model_idx) {
    model_idx = lua_absindex(L, model_idx);
    lsession *s = lua_newuserdatauv(L, sizeof *s, 2);
    memset(s, 0, sizeof *s);
    s->model = model;
    luaL_setmetatable(L, SESSION_MT);
    lua_pushvalue(L, model_idx);
    lua_setiuservalue(L, -2, 1);
    return s;
}

/* model:session([opts]) -> session */
static int model_session(lua_State *L) {
    lmodel *m = kvl_check_model(L, 1);
    lua_settop(L, 2);
    lua_newtable(L); /* 3: anchor */
    session_opts o = {.prefix_reuse = 1};
    kvl_read_options(L, 2, session_specs, N_SPECS(session_specs), SESSION_ONLY, &o, 3, m->model);
    o.d.on_full = (kvgen_on_full)o.on_full;
    o.d.no_prefix_reuse = !o.prefix_reuse;
    o.d.sampler = &o.sd;

    lsession *s = new_session(L, m->model, 1);
    kvgen_error err = {0};
    if (kvgen_session_create(m->model, &o.d, &s->session, &err) != KVGEN_OK) {
        s->session = NULL;
        return kvl_raise_status(L, &err);
    }
    /* on failure below the new session is garbage and its __gc closes it */
    if (o.n_adapters > 0 && kvgen_session_set_adapters(s->session, o.adapters, o.scales, o.n_adapters, &err) != KVGEN_OK)
        return kvl_raise_status(L, &err);
    if (o.has_template && kvgen_chat_set_template(s->session, &o.tpl, &err) != KVGEN_OK)
        return kvl_raise_status(L, &err);
    if (o.system && kvgen_chat_add(s->session, "system", o.system, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    return 1;
}

/* s:fork() -> a new session continuing from this one (shares its full pages copy-on-write) */
static int session_fork(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    lua_getiuservalue(L, 1, 1);
    lsession *child = new_session(L, s->model, lua_gettop(L));
    kvgen_error err = {0};
    if (kvgen_session_fork(s->session, &child->session, &err) != KVGEN_OK) {
        child->session = NULL;
        return kvl_raise_status(L, &err);
    }
    return 1;
}

/* s:rewind(n) -> new length: drops the last n tokens */
static int session_rewind(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    int isint = 0;
    lua_Integer n = kvl_to_integer(L, 2, &isint);
    if (!isint) kvl_type_error(L, 2, "n", "integer");
    size_t len = kvgen_session_length(s->session);
    if (n < 0 || (lua_Unsigned)n > len)
        kvl_arg_error(L, 2, lua_pushfstring(L, "n: %I is out of range [0, %d]", (LUAI_UACINT)n, (int)len));
    kvgen_error err = {0};
    if (kvgen_session_rewind(s->session, (size_t)n, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    lua_pushinteger(L, (lua_Integer)kvgen_session_length(s->session));
    return 1;
}

static int session_close(lua_State *L) {
    lsession *s = kvl_check_udata(L, 1, SESSION_MT);
    if (s->active) { /* the generator must go first; the stream keeps the text it delivered */
        int top = lua_gettop(L);
        if (lua_getiuservalue(L, 1, 2) == LUA_TTABLE && lua_rawgeti(L, -1, 1) == LUA_TUSERDATA &&
            lua_touserdata(L, -1) == (void *)s->active)
            kvl_stream_finish(L, -1, s->active, KVGEN_FINISH_CANCELLED);
        else /* (being collected with the session: nobody can read its text) */
            kvl_stream_stop(s->active, KVGEN_FINISH_CANCELLED);
        lua_settop(L, top);
    }
    /* cancels the session's jobs and waits for at most the worker step that holds the session */
    kvgen_session_close(s->session);
    s->session = NULL;
    return 0;
}

static int session_tostring(lua_State *L) {
    lsession *s = kvl_check_udata(L, 1, SESSION_MT);
    if (!s->session)
        lua_pushliteral(L, SESSION_MT " (closed)");
    else if (kvgen_session_busy(s->session))
        lua_pushfstring(L, SESSION_MT " (busy: jobs running) (%p)", (void *)s);
    else
        lua_pushfstring(L, SESSION_MT " (%d tokens) (%p)", (int)kvgen_session_length(s->session), (void *)s);
    return 1;
}

static int session_index(lua_State *L) {
    lsession *s = kvl_check_udata(L, 1, SESSION_MT);
    const char *key = kvl_index_key(L);
    if (lua_getfield(L, lua_upvalueindex(1), key) != LUA_TNIL) return 1;
    if (!s->session) return luaL_error(L, "attempt to use a closed " SESSION_MT);
    if (strcmp(key, "model") == 0) {
        lua_getiuservalue(L, 1, 1);
        return 1;
    }
    check_session_read(L, 1);
    if (strcmp(key, "length") == 0) {
        lua_pushinteger(L, (lua_Integer)kvgen_session_length(s->session));
    } else if (strcmp(key, "template") == 0) {
        push_template_name(L, s);
    } else if (strcmp(key, "context") == 0) {
        kvgen_cache_info ci;
        kvgen_session_cache_info(s->session, &ci);
        lua_pushinteger(L, (lua_Integer)ci.capacity);
    } else {
        lua_pushnil(L);
    }
    return 1;
}

/* s:prefill(text_or_ids [, {special=, bos=}]) -> number of tokens appended */
static int session_prefill(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    size_t n = 0;
    const int32_t *ids;
    if (lua_type(L, 2) == LUA_TSTRING) {
        size_t len;
        const char *text = lua_tolstring(L, 2, &len);
        unsigned flags = kvl_tokenize_flags(L, 3, TOKENIZE_BOS);
        ids = kvl_tokenize(L, s->model, text, len, flags, &n);
    } else if (lua_istable(L, 2)) {
        if (kvl_tokenize_flags(L, 3, TOKENIZE_BOS))
            kvl_arg_error(L, 3, "options 'special' and 'bos' apply to text, not to token ids");
        ids = kvl_check_ids(L, 2, "ids", s->model, &n);
    } else {
        return kvl_type_error(L, 2, "input", "string or table of token ids");
    }
    kvgen_error err = {0};
    if (kvgen_session_prefill(s->session, ids, n, NULL, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    lua_pushinteger(L, (lua_Integer)n);
    return 1;
}

/* s:sample() -> the next token chosen by the session's sampler, or nil before any logits */
static int session_sample(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    int32_t t = kvgen_session_sample(s->session);
    if (t < 0)
        lua_pushnil(L);
    else
        lua_pushinteger(L, t);
    return 1;
}

/* s:decode(id) -> the next token the sampler chooses after appending `id` */
static int session_decode(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    int32_t id = kvl_check_token(L, 2, "id", s->model);
    kvgen_error err = {0};
    if (kvgen_session_decode(s->session, id, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    lua_pushinteger(L, kvgen_session_sample(s->session));
    return 1;
}

typedef struct scored {
    float logit;
    int32_t id;
} scored;

static int by_logit_desc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* s:logits([k]) -> the k (default 10) most likely next tokens, best first:
 * {{id=, logit=, p=}, ...}, where p is the softmax over the whole vocabulary. */
static int session_logits(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    int n_vocab = kvl_model_info(s->model).n_vocab;
    lua_Integer k = 10;
    if (!lua_isnoneornil(L, 2)) {
        int isint = 0;
        k = kvl_to_integer(L, 2, &isint); /* "3" is refused like every integer given as text */
        if (!isint) kvl_type_error(L, 2, "k", "integer");
    }
    if (k < 1 || k > n_vocab)
        kvl_arg_error(L, 2, lua_pushfstring(L, "k: %I is out of range [1, %d]", (LUAI_UACINT)k, n_vocab));
    const float *logits = kvgen_session_logits(s->session);
    if (!logits) {
        lua_pushnil(L);
        return 1;
    }
    scored *all = lua_newuserdatauv(L, (size_t)n_vocab * sizeof *all, 0);
    float max = -INFINITY;
    for (int i = 0; i < n_vocab; i++) {
        all[i].logit = isnan(logits[i]) ? -INFINITY : logits[i];
        all[i].id = i;
        if (all[i].logit > max) max = all[i].logit;
    }
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)all[i].logit - max);
    qsort(all, (size_t)n_vocab, sizeof *all, by_logit_desc);
    lua_createtable(L, (int)k, 0);
    for (int i = 0; i < (int)k; i++) {
        lua_createtable(L, 0, 3);
        lua_pushinteger(L, all[i].id);
        lua_setfield(L, -2, "id");
        lua_pushnumber(L, all[i].logit);
        lua_setfield(L, -2, "logit");
        lua_pushnumber(L, exp((double)all[i].logit - max) / sum);
        lua_setfield(L, -2, "p");
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int session_tokens(lua_State *L) {
    lsession *s = check_session_read(L, 1);
    const int32_t *ids = kvgen_session_tokens(s->session);
    size_t n = kvgen_session_length(s->session);
    if (!ids && n > 0) { /* a remote model's session: its history is text */
        kvgen_error e = {.status = KVGEN_E_UNSUPPORTED};
        snprintf(e.message, sizeof e.message,
                 "s:tokens: the session is on a remote model: its token ids are the server's (docs/remote.md)");
        return kvl_raise_status(L, &e);
    }
    kvl_push_ids(L, ids, n);
    return 1;
}

static int session_reset(lua_State *L) {
    kvgen_session_reset(kvl_check_session(L, 1)->session);
    return 0;
}

/* s:cache_info() -> {layers, kv_heads, head_dim, length, capacity, bytes, bytes_per_token, ...} */
static int session_cache_info(lua_State *L) {
#define CI(name, type, field) {name, type, offsetof(kvgen_cache_info, field)}
    static const out_field fields[] = {
        CI("layers", F_INT, n_layer),          CI("kv_heads", F_INT, n_head_kv),
        CI("head_dim", F_INT, head_dim),       CI("length", F_SIZE, length),
        CI("capacity", F_SIZE, capacity),      CI("bytes", F_SIZE, bytes),
        CI("bytes_per_token", F_SIZE, bytes_per_token), CI("page_size", F_SIZE, page_size),
        CI("pages", F_SIZE, pages),            CI("pages_shared", F_SIZE, pages_shared),
        CI("bytes_held", F_SIZE, bytes_held),  CI("tokens_reused", F_SIZE, tokens_reused),
        CI("shifts", F_SIZE, shifts),          CI("window", F_SIZE, window),
        CI("window_pages", F_SIZE, window_pages),
    };
#undef CI
    lsession *s = check_session_read(L, 1);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s->session, &ci);
    kvl_push_fields(L, &ci, fields, N_FIELDS(fields));
    return 1;
}

/* s:read_cache(layer, "k"|"v") -> flat array of kv_heads * length * head_dim floats;
 * element (h, t, d) (all 0-based) is at index (h * length + t) * head_dim + d + 1. */
static int session_read_cache(lua_State *L) {
    static const char *const which_names[] = {"k", "v", NULL};
    lsession *s = check_session_read(L, 1);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s->session, &ci);
    int isint = 0;
    lua_Integer layer = kvl_to_integer(L, 2, &isint);
    if (!isint) kvl_type_error(L, 2, "layer", "integer");
    if (layer < 0 || layer >= ci.n_layer)
        kvl_arg_error(L, 2, lua_pushfstring(L, "layer: %I is out of range [0, %d)", (LUAI_UACINT)layer, ci.n_layer));
    if (lua_type(L, 3) == LUA_TSTRING) kvl_check_cstring(L, 3, 3, "which");
    int which = kvl_check_option(L, 3, which_names);
    size_t n = (size_t)ci.n_head_kv * ci.length * (size_t)ci.head_dim;
    float *out = lua_newuserdatauv(L, (n ? n : 1) * sizeof *out, 0);
    kvgen_error err = {0};
    if (kvgen_session_read_cache(s->session, (int)layer, which, out, n, &err) != KVGEN_OK)
        return kvl_raise_status(L, &err);
    lua_createtable(L, n < INT_MAX ? (int)n : 0, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushnumber(L, out[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* ---- sampler settings ------------------------------------------------------------------- */

/* s:set_sampler(opts): changes the given settings, keeps the others; a seed re-seeds the RNG,
 * without one the RNG continues its stream */
static int session_set_sampler(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    lua_settop(L, 2);
    session_opts o = {0};
    kvgen_session_get_sampler(s->session, &o.sd);
    /* the current bias array points into the session: copy it before it is replaced (3) */
    kvgen_logit_bias *old = lua_newuserdatauv(L, (size_t)(o.sd.n_bias > 0 ? o.sd.n_bias : 1) * sizeof *old, 0);
    if (o.sd.n_bias > 0) memcpy(old, o.sd.bias, (size_t)o.sd.n_bias * sizeof *old);
    o.sd.bias = old;
    o.sd.seed = 0;
    lua_newtable(L); /* 4: anchor */
    kvl_read_options(L, 2, session_specs, N_SPECS(session_specs), 0, &o, 4, s->model);
    kvgen_error err = {0};
    if (kvgen_session_set_sampler(s->session, &o.sd, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    return 0;
}

/* s:sampler() -> the settings in force: the sampler rows of session_specs, read back */
static int session_sampler(lua_State *L) {
    lsession *s = check_session_read(L, 1);
    session_opts o;
    kvgen_session_get_sampler(s->session, &o.sd);
    lua_createtable(L, 0, 10);
    for (size_t i = 0; i < N_SPECS(session_specs); i++) {
        const opt_spec *r = &session_specs[i];
        const void *p = (const char *)&o + r->off;
        if (r->need) continue; /* a session option, not the sampler's */
        if (r->type == OPT_U64) {
            lua_pushinteger(L, (lua_Integer)*(const uint64_t *)p);
        } else if (r->type == OPT_INT) {
            lua_pushinteger(L, *(const int *)p);
        } else if (r->type == OPT_FLOAT) {
            lua_pushnumber(L, *(const float *)p);
        } else { /* bias: {[token] = bias} */
            lua_createtable(L, 0, o.sd.n_bias > 0 ? o.sd.n_bias : 0);
            for (int b = 0; b < o.sd.n_bias; b++) {
                lua_pushnumber(L, o.sd.bias[b].bias);
                lua_rawseti(L, -2, o.sd.bias[b].token);
            }
        }
        lua_setfield(L, -2, r->key);
    }
    return 1;
}

/* ---- chat templates --------------------------------------------------------------------- */

/* system_in_user = a boolean (the message names the type only, not the value) */
static void read_system_in_user(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    if (lua_type(c->L, vi) != LUA_TBOOLEAN)
        kvl_field_error(c, o, lua_pushfstring(c->L, "boolean expected, got %s", luaL_typename(c->L, vi)));
    *(int *)field = lua_toboolean(c->L, vi);
}

#define TF(field) .off = offsetof(kvgen_chat_template, field)
static const opt_spec template_specs[] = {
    {.key = "name", .type = OPT_STRING, TF(name)},
    {.key = "system_prefix", .type = OPT_STRING, TF(system_prefix)},
    {.key = "system_suffix", .type = OPT_STRING, TF(system_suffix)},
    {.key = "user_prefix", .type = OPT_STRING, TF(user_prefix)},
    {.key = "user_suffix", .type = OPT_STRING, TF(user_suffix)},
    {.key = "assistant_prefix", .type = OPT_STRING, TF(assistant_prefix)},
    {.key = "assistant_suffix", .type = OPT_STRING, TF(assistant_suffix)},
    {.key = "jinja", .type = OPT_STRING, TF(jinja)},
    {.key = "system_in_user", .type = OPT_CUSTOM, TF(system_in_user), .read = read_system_in_user},
};
#undef TF

/* Reads a template given as a family name, a Jinja template (a string with "{{" or "{%"), or a
 * table of prefixes/suffixes or { jinja = source }. Its strings stay valid while the value at
 * idx does. */
static void read_template(lua_State *L, int idx, int arg, kvgen_chat_template *tpl) {
    memset(tpl, 0, sizeof *tpl);
    if (lua_type(L, idx) == LUA_TSTRING) {
        const char *v = kvl_check_cstring(L, idx, arg, "template");
        if (strstr(v, "{{") || strstr(v, "{%")) tpl->jinja = v;
        else tpl->name = v;
        return;
    }
    if (!lua_istable(L, idx))
        kvl_arg_error(L, arg, lua_pushfstring(L, "template: string or table expected, got %s", luaL_typename(L, idx)));
    opt_ctx c = {.L = L, .arg = arg, .table = "template"};
    kvl_read_fields(&c, idx, template_specs, N_SPECS(template_specs), tpl);
}

/* s:set_template(name_or_table | nil): nil returns to the model's own template */
static int session_set_template(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    kvgen_error err = {0};
    kvgen_status st;
    if (lua_isnoneornil(L, 2)) {
        st = kvgen_chat_set_template(s->session, NULL, &err);
    } else {
        kvgen_chat_template tpl;
        read_template(L, 2, 2, &tpl);
        st = kvgen_chat_set_template(s->session, &tpl, &err);
    }
    if (st != KVGEN_OK) return kvl_raise_status(L, &err);
    return 0;
}

const char *const kvl_role_names[] = {"system", "user", "assistant", "tool", NULL};

/* a message's fields: tool_calls = a list of calls (or JSON text) */
static void read_tool_calls(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    (void)o;
    *(const char **)field = kvl_json_arg(c, vi, "fields.tool_calls");
    kvl_anchor_top(c);
}
#define MF(field) .off = offsetof(kvgen_chat_message, field)
static const opt_spec message_specs[] = {
    {.key = "tool_calls", .type = OPT_CUSTOM, MF(tool_calls), .read = read_tool_calls},
    {.key = "tool_call_id", .type = OPT_STRING, MF(tool_call_id)},
    {.key = "reasoning_content", .type = OPT_STRING, MF(reasoning_content)},
};
#undef MF

/* s:add(role, text [, fields]): appends one complete chat turn; fields: tool_calls (assistant),
 * tool_call_id (tool), reasoning_content (assistant) */
static int session_add(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    if (lua_type(L, 2) == LUA_TSTRING) kvl_check_cstring(L, 2, 2, "role");
    kvgen_chat_message msg = {.role = kvl_role_names[kvl_check_option(L, 2, kvl_role_names)]};
    msg.content = kvl_check_cstring_arg(L, 3, "text"); /* before settop: a missing text is "no value" */
    lua_settop(L, 4);
    kvgen_error err = {0};
    if (lua_isnil(L, 4)) {
        if (kvgen_chat_add(s->session, msg.role, msg.content, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
        return 0;
    }
    if (!lua_istable(L, 4)) kvl_type_error(L, 4, "fields", "table or nil");
    lua_newtable(L); /* 5: anchor of the JSON text */
    opt_ctx c = {.L = L, .arg = 4, .anchor = 5, .table = "fields", .list_keys = 1};
    kvl_read_fields(&c, 4, message_specs, N_SPECS(message_specs), &msg);
    if (kvgen_chat_add_message(s->session, &msg, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    return 0;
}

/* s:add_tool_result(id, result): a tool message answering call `id`; result a string, or a
 * table written as JSON */
static int session_add_tool_result(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    lua_settop(L, 3);
    kvgen_chat_message msg = {.role = "tool", .tool_call_id = kvl_check_cstring_arg(L, 2, "id")};
    if (lua_istable(L, 3)) {
        opt_ctx c = {.L = L, .arg = 3, .table = "result"};
        msg.content = kvl_json_arg(&c, 3, "result");
    } else {
        msg.content = kvl_check_cstring_arg(L, 3, "result");
    }
    kvgen_error err = {0};
    if (kvgen_chat_add_message(s->session, &msg, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    return 0;
}

/* s:set_chat_vars(vars | nil): the chat template's further variables (a table or JSON text of
 * an object: tools, enable_thinking, ...), kept for every later turn */
static int session_set_chat_vars(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    lua_settop(L, 2);
    const char *json = NULL;
    if (!lua_isnil(L, 2)) {
        opt_ctx c = {.L = L, .arg = 2, .table = "vars"};
        json = kvl_json_arg(&c, 2, "vars");
    }
    kvgen_error err = {0};
    if (kvgen_chat_set_vars(s->session, json, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    return 0;
}

/* The messages of kvgen_chat_messages, held by a userdata whose __gc frees them, so that an
 * error while they are read leaves nothing behind. */
#define MESSAGES_BOX_MT "kvgen.MessagesBox"
typedef struct messages_box {
    kvgen_chat_message *msgs;
    size_t n;
} messages_box;

static int messages_box_gc(lua_State *L) {
    messages_box *b = lua_touserdata(L, 1);
    kvgen_chat_messages_free(b->msgs);
    b->msgs = NULL;
    b->n = 0;
    return 0;
}

/* pushes the box, with the session's messages in it (errors raised) */
static messages_box *push_messages(lua_State *L, lsession *s) {
    messages_box *b = kvl_push_box(L, sizeof *b, MESSAGES_BOX_MT, messages_box_gc);
    kvgen_error err = {0};
    if (kvgen_chat_messages(s->session, &b->msgs, &b->n, &err) != KVGEN_OK) kvl_raise_status(L, &err);
    return b;
}

/* s:messages() -> {{role=, content=, tool_calls=, tool_call_id=, reasoning_content=}, ...}: the
 * conversation, the reply generated since the last turn last (absent fields are nil;
 * tool_calls a list of tables) */
static int session_messages(lua_State *L) {
    lsession *s = check_session_read(L, 1);
    messages_box *b = push_messages(L, s);
    lua_createtable(L, b->n < INT_MAX ? (int)b->n : 0, 0);
    for (size_t i = 0; i < b->n; i++) {
        const kvgen_chat_message *m = &b->msgs[i];
        lua_createtable(L, 0, 5);
        lua_pushstring(L, m->role);
        lua_setfield(L, -2, "role");
        const char *const text[][2] = {
            {"content", m->content}, {"tool_call_id", m->tool_call_id}, {"reasoning_content", m->reasoning_content}};
        for (size_t k = 0; k < sizeof text / sizeof text[0]; k++) {
            if (!text[k][1]) continue;
            lua_pushstring(L, text[k][1]);
            lua_setfield(L, -2, text[k][0]);
        }
        if (m->tool_calls) {
            kvl_push_json_value(L, m->tool_calls, strlen(m->tool_calls));
            lua_setfield(L, -2, "tool_calls");
        }
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* s:undo([n]): takes the last n messages (default 1) out of the conversation, rewinding the
 * cache to where the first of them starts */
static int session_undo(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    lua_Integer n = 1;
    if (!lua_isnoneornil(L, 2)) {
        int isint = 0;
        n = kvl_to_integer(L, 2, &isint);
        if (!isint) kvl_type_error(L, 2, "n", "integer");
    }
    messages_box *b = push_messages(L, s); /* the count, for the range */
    if (n < 0 || (lua_Unsigned)n > b->n)
        kvl_arg_error(L, 2, lua_pushfstring(L, "n: %I is out of range [0, %I] (the messages held)", (LUAI_UACINT)n,
                                            (LUAI_UACINT)b->n));
    kvgen_error err = {0};
    if (kvgen_chat_undo(s->session, (int)n, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    return 0;
}

/* s.template -> "jinja" (a Jinja template runs), the family in use, "custom", or nil when the
 * model has no usable template */
static void push_template_name(lua_State *L, lsession *s) {
    kvgen_error err = {0};
    const char *name = kvgen_chat_template_name(s->session, &err);
    if (name)
        lua_pushstring(L, name);
    else
        lua_pushnil(L);
}

/* ---- save / restore --------------------------------------------------------------------- */

/* s:save(path) */
static int session_save(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    const char *path = kvl_check_cstring_arg(L, 2, "path");
    kvgen_error err = {0};
    if (kvgen_session_save(s->session, path, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    return 0;
}

/* model:restore(path) -> session saved by s:save */
static int model_restore(lua_State *L) {
    lmodel *m = kvl_check_model(L, 1);
    const char *path = kvl_check_cstring_arg(L, 2, "path");
    lsession *s = new_session(L, m->model, 1);
    kvgen_error err = {0};
    if (kvgen_session_restore(m->model, path, &s->session, &err) != KVGEN_OK) {
        s->session = NULL;
        return kvl_raise_status(L, &err);
    }
    return 1;
}

const luaL_Reg kvl_model_session_methods[] = {
    {"session", model_session},
    {"restore", model_restore},
    {NULL, NULL},
};

static const luaL_Reg session_methods[] = {
    {"close", session_close},
    {"prefill", session_prefill},
    {"decode", session_decode},
    {"sample", session_sample},
    {"logits", session_logits},
    {"tokens", session_tokens},
    {"reset", session_reset},
    {"cache_info", session_cache_info},
    {"read_cache", session_read_cache},
    {"fork", session_fork},
    {"rewind", session_rewind},
    {"save", session_save},
    {"set_sampler", session_set_sampler},
    {"sampler", session_sampler},
    {"set_template", session_set_template},
    {"add", session_add},
    {"add_tool_result", session_add_tool_result},
    {"set_chat_vars", session_set_chat_vars},
    {"messages", session_messages},
    {"undo", session_undo},
    {NULL, NULL},
};

static const luaL_Reg *const session_method_lists[] = {session_methods, kvl_session_gen_methods,
                                                                 kvl_session_adapter_methods, NULL};
const kvl_type kvl_session_type = {SESSION_MT, session_method_lists, session_index, session_close, session_tostring,
                                   NULL};
