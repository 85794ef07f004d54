/*
 * kvgen_lua.c: the Lua 5.4 module `kvgen`, a thin layer over core/include/kvgen.h.
 *
 * Handles follow liolib's files: full userdata created closed and filled in after the C call
 * succeeds, one metatable per type, __gc and __close sharing the close function (so close()
 * twice is harmless), and a readable error when a closed handle is used again.
 *
 * Lifetimes: a session holds a C reference on its model (kvgen.h), and its Lua user value
 * holds the model userdata, so finalizers may run in any order. Temporary arrays are Lua
 * userdata, never malloc, so a Lua error raised half-way leaks nothing.
 *
 * No C globals: metatables live in the registry under their type names, the last error code in
 * the registry, so two lua_States in one process each have their own kvgen.
 *
 * Errors: bad arguments raise through luaL_argerror ("bad argument #1 to 'prefill' (ids[3]:
 * integer expected, got string)"); failures inside kvgen raise the string "kvgen: <message>"
 * and record the status name ("context_full", "io", ...) for kvgen.last_error().
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "kvgen.h"

#define MODEL_MT "kvgen.Model"
#define SESSION_MT "kvgen.Session"
#define DETOK_MT "kvgen.Detokenizer"
#define LAST_ERROR_KEY "kvgen.last_error"

typedef struct lmodel {
    kvgen_model *model; /* NULL once closed */
} lmodel;

typedef struct lsession {
    kvgen_session *session; /* NULL once closed */
    kvgen_model *model;     /* borrowed: the session holds its own C reference on it */
} lsession;

typedef struct ldetok {
    kvgen_detok state;
    unsigned flags;
} ldetok;

/* ---- errors ----------------------------------------------------------------------------- */

static void set_last_error(lua_State *L, const char *code, const char *message) {
    lua_createtable(L, 0, 2);
    lua_pushstring(L, code);
    lua_setfield(L, -2, "code");
    lua_pushstring(L, message);
    lua_setfield(L, -2, "message");
    lua_setfield(L, LUA_REGISTRYINDEX, LAST_ERROR_KEY);
}

static int raise_status(lua_State *L, const kvgen_error *err) {
    const char *code = kvgen_status_name(err->status);
    const char *msg = err->message[0] ? err->message : code;
    set_last_error(L, code, msg);
    lua_pushfstring(L, "kvgen: %s", msg);
    return lua_error(L);
}

/* kvgen.last_error() -> code, message of the last failure kvgen raised in this state, or nil */
static int l_last_error(lua_State *L) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, LAST_ERROR_KEY) != LUA_TTABLE) {
        lua_pushnil(L);
        return 1;
    }
    lua_getfield(L, -1, "code");
    lua_getfield(L, -2, "message");
    return 2;
}

static int type_error(lua_State *L, int arg, const char *name, const char *expected) {
    return luaL_argerror(L, arg, lua_pushfstring(L, "%s: %s expected, got %s", name, expected, luaL_typename(L, arg)));
}

/* Integers only: unlike lua_tointegerx, strings such as "2" are refused (an id passed as text is
 * almost always a bug in the caller). Floats with an integral value are accepted. */
static lua_Integer to_integer(lua_State *L, int idx, int *isint) {
    *isint = 0;
    if (lua_type(L, idx) != LUA_TNUMBER) return 0;
    return lua_tointegerx(L, idx, isint);
}

/* ---- options tables --------------------------------------------------------------------- */

/* Rejects keys that are not options, so a typo ("temprature") is an error and not a silent
 * default. A nil or absent table means "all defaults". */
static void check_options(lua_State *L, int arg, const char *const known[]) {
    if (lua_isnoneornil(L, arg)) return;
    if (!lua_istable(L, arg)) type_error(L, arg, "options", "table");
    lua_pushnil(L);
    while (lua_next(L, arg)) {
        lua_pop(L, 1);
        int ok = 0;
        if (lua_type(L, -1) == LUA_TSTRING) {
            const char *k = lua_tostring(L, -1);
            for (int i = 0; known[i] && !ok; i++) ok = strcmp(k, known[i]) == 0;
        }
        if (!ok) {
            const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : luaL_typename(L, -1);
            luaL_argerror(L, arg, lua_pushfstring(L, "unknown option '%s'", k));
        }
    }
}

/* Pushes opts[key] (nil when there is no table) and returns its type. */
static int get_option(lua_State *L, int arg, const char *key) {
    if (lua_isnoneornil(L, arg)) {
        lua_pushnil(L);
        return LUA_TNIL;
    }
    return lua_getfield(L, arg, key);
}

static int option_error(lua_State *L, int arg, const char *key, const char *what) {
    return luaL_argerror(L, arg, lua_pushfstring(L, "option '%s': %s", key, what));
}

static lua_Integer opt_integer(lua_State *L, int arg, const char *key, lua_Integer def, lua_Integer lo,
                               lua_Integer hi) {
    lua_Integer v = def;
    if (get_option(L, arg, key) != LUA_TNIL) {
        int isint = 0;
        v = to_integer(L, -1, &isint);
        if (!isint)
            option_error(L, arg, key, lua_pushfstring(L, "integer expected, got %s", luaL_typename(L, -1)));
        if (v < lo || v > hi)
            option_error(L, arg, key,
                         lua_pushfstring(L, "%I is out of range [%I, %I]", (LUAI_UACINT)v, (LUAI_UACINT)lo,
                                         (LUAI_UACINT)hi));
    }
    lua_pop(L, 1);
    return v;
}

static double opt_number(lua_State *L, int arg, const char *key, double def, double lo, double hi) {
    double v = def;
    if (get_option(L, arg, key) != LUA_TNIL) {
        if (lua_type(L, -1) != LUA_TNUMBER)
            option_error(L, arg, key, lua_pushfstring(L, "number expected, got %s", luaL_typename(L, -1)));
        v = (double)lua_tonumber(L, -1);
        if (!(v >= lo && v <= hi)) /* also catches NaN */
            option_error(L, arg, key, lua_pushfstring(L, "%f is out of range [%f, %f]", v, lo, hi));
    }
    lua_pop(L, 1);
    return v;
}

static int opt_boolean(lua_State *L, int arg, const char *key, int def) {
    int v = def;
    int t = get_option(L, arg, key);
    if (t != LUA_TNIL) {
        if (t != LUA_TBOOLEAN)
            option_error(L, arg, key, lua_pushfstring(L, "boolean expected, got %s", luaL_typename(L, -1)));
        v = lua_toboolean(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

/* The string stays valid while opts[key] does (it is in the caller's table). */
static const char *opt_string(lua_State *L, int arg, const char *key, const char *def) {
    const char *v = def;
    int t = get_option(L, arg, key);
    if (t != LUA_TNIL) {
        if (t != LUA_TSTRING)
            option_error(L, arg, key, lua_pushfstring(L, "string expected, got %s", luaL_typename(L, -1)));
        v = lua_tostring(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

static int opt_choice(lua_State *L, int arg, const char *key, int def, const char *const names[]) {
    const char *s = opt_string(L, arg, key, NULL);
    if (!s) return def;
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (int i = 0; names[i]; i++) {
        if (i) luaL_addstring(&b, ", ");
        luaL_addchar(&b, '\'');
        luaL_addstring(&b, names[i]);
        luaL_addchar(&b, '\'');
    }
    luaL_pushresult(&b);
    return option_error(L, arg, key, lua_pushfstring(L, "'%s' is not one of %s", s, lua_tostring(L, -1)));
}

/* ---- handles ---------------------------------------------------------------------------- */

static lmodel *check_model(lua_State *L, int arg) {
    lmodel *m = luaL_checkudata(L, arg, MODEL_MT);
    if (!m->model) luaL_error(L, "attempt to use a closed " MODEL_MT);
    return m;
}

static lsession *check_session(lua_State *L, int arg) {
    lsession *s = luaL_checkudata(L, arg, SESSION_MT);
    if (!s->session) luaL_error(L, "attempt to use a closed " SESSION_MT);
    return s;
}

static kvgen_model_info model_info(const kvgen_model *model) {
    kvgen_model_info info;
    kvgen_model_get_info(model, &info);
    return info;
}

/* ---- token arrays ----------------------------------------------------------------------- */

static int32_t check_token(lua_State *L, int arg, const char *name, const kvgen_model *model) {
    int isint = 0;
    lua_Integer id = to_integer(L, arg, &isint);
    if (!isint) type_error(L, arg, name, "integer token id");
    int n_vocab = model_info(model).n_vocab;
    if (id < 0 || id >= n_vocab)
        luaL_argerror(L, arg,
                      lua_pushfstring(L, "%s: %I is outside the vocabulary [0, %d)", name, (LUAI_UACINT)id, n_vocab));
    return (int32_t)id;
}

/* Reads a Lua array of token ids into a userdata it leaves on the stack. */
static int32_t *check_ids(lua_State *L, int arg, const char *name, const kvgen_model *model, size_t *n) {
    if (!lua_istable(L, arg)) type_error(L, arg, name, "table of token ids");
    lua_Unsigned len = lua_rawlen(L, arg);
    if (len > (lua_Unsigned)(SIZE_MAX / sizeof(int32_t) - 1))
        luaL_argerror(L, arg, lua_pushfstring(L, "%s: too many tokens", name));
    int32_t *ids = lua_newuserdatauv(L, (size_t)(len ? len : 1) * sizeof *ids, 0);
    int n_vocab = model_info(model).n_vocab;
    for (lua_Unsigned i = 0; i < len; i++) {
        int isint = 0;
        lua_rawgeti(L, arg, (lua_Integer)(i + 1));
        lua_Integer id = to_integer(L, -1, &isint);
        if (!isint)
            luaL_argerror(L, arg,
                          lua_pushfstring(L, "%s[%I]: integer expected, got %s", name, (LUAI_UACINT)(i + 1),
                                          luaL_typename(L, -1)));
        if (id < 0 || id >= n_vocab)
            luaL_argerror(L, arg,
                          lua_pushfstring(L, "%s[%I]: %I is outside the vocabulary [0, %d)", name,
                                          (LUAI_UACINT)(i + 1), (LUAI_UACINT)id, n_vocab));
        ids[i] = (int32_t)id;
        lua_pop(L, 1);
    }
    *n = (size_t)len;
    return ids;
}

/* Tokenizes into a userdata it leaves on the stack. */
static int32_t *tokenize(lua_State *L, const kvgen_model *model, const char *text, size_t len, unsigned flags,
                         size_t *n) {
    kvgen_error err = {0};
    size_t need = 0;
    kvgen_status st = kvgen_tokenize(model, text, len, flags, NULL, 0, &need, &err);
    /* with cap 0 a non-empty result reports INVALID_ARGUMENT and the size it needs */
    if (st != KVGEN_OK && !(st == KVGEN_E_INVALID_ARGUMENT && need > 0)) raise_status(L, &err);
    int32_t *ids = lua_newuserdatauv(L, (need ? need : 1) * sizeof *ids, 0);
    if (need > 0 && kvgen_tokenize(model, text, len, flags, ids, need, n, &err) != KVGEN_OK) raise_status(L, &err);
    *n = need;
    return ids;
}

static void push_ids(lua_State *L, const int32_t *ids, size_t n) {
    lua_createtable(L, n < INT_MAX ? (int)n : 0, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

static const char *const tokenize_options[] = {"special", "bos", NULL};

static unsigned tokenize_flags(lua_State *L, int arg) {
    check_options(L, arg, tokenize_options);
    unsigned flags = 0;
    if (opt_boolean(L, arg, "special", 0)) flags |= KVGEN_TOKENIZE_SPECIAL;
    if (opt_boolean(L, arg, "bos", 0)) flags |= KVGEN_TOKENIZE_ADD_BOS;
    return flags;
}

static const char *const special_options[] = {"special", NULL};

static unsigned special_flag(lua_State *L, int arg) {
    check_options(L, arg, special_options);
    return opt_boolean(L, arg, "special", 0) ? KVGEN_TOKENIZE_SPECIAL : 0u;
}

/* ---- kvgen.load and the model ----------------------------------------------------------- */

static const char *const backend_names[] = {"default", "reference", "vulkan", NULL};
static const char *const load_options[] = {"backend", "device", "threads", "force_f32", NULL};

/* kvgen.load(path [, {backend=, device=, threads=, force_f32=}]) -> model */
static int l_load(lua_State *L) {
    kvgen_model_desc desc = {0};
    if (lua_type(L, 1) != LUA_TSTRING) type_error(L, 1, "path", "string");
    desc.path = lua_tostring(L, 1);
    check_options(L, 2, load_options);
    desc.backend = (kvgen_backend)opt_choice(L, 2, "backend", KVGEN_BACKEND_DEFAULT, backend_names);
    if (get_option(L, 2, "device") == LUA_TNUMBER) {
        int isint = 0;
        lua_Integer d = to_integer(L, -1, &isint);
        if (!isint || d < 0) option_error(L, 2, "device", "a device index must be an integer >= 0");
        lua_tostring(L, -1); /* the index as text, as kvgen_model_desc wants it; kept on the stack */
        desc.device = lua_tostring(L, -1);
    } else {
        lua_pop(L, 1);
        desc.device = opt_string(L, 2, "device", NULL);
        lua_pushnil(L); /* keep the stack shape of the branch above */
    }
    desc.n_threads = (int)opt_integer(L, 2, "threads", 0, 0, 4096);
    desc.force_f32 = opt_boolean(L, 2, "force_f32", 0);

    lmodel *m = lua_newuserdatauv(L, sizeof *m, 0);
    m->model = NULL; /* created closed: a failure below leaves nothing to free */
    luaL_setmetatable(L, MODEL_MT);
    kvgen_error err = {0};
    if (kvgen_model_load(&desc, &m->model, &err) != KVGEN_OK) {
        m->model = NULL;
        return raise_status(L, &err);
    }
    return 1;
}

static int model_close(lua_State *L) {
    lmodel *m = luaL_checkudata(L, 1, MODEL_MT);
    kvgen_model_unload(m->model); /* sessions keep their own reference */
    m->model = NULL;
    return 0;
}

static int model_tostring(lua_State *L) {
    lmodel *m = luaL_checkudata(L, 1, MODEL_MT);
    if (!m->model) {
        lua_pushliteral(L, MODEL_MT " (closed)");
    } else {
        kvgen_model_info info = model_info(m->model);
        lua_pushfstring(L, MODEL_MT " (%s, %s) (%p)", info.name, info.backend, (void *)m);
    }
    return 1;
}

static const char *tokenizer_name(kvgen_tokenizer_kind k) {
    return k == KVGEN_TOKENIZER_BPE ? "bpe" : k == KVGEN_TOKENIZER_SPM ? "spm" : "unknown";
}

/* Pushes one info field; returns 0 when `key` is not one. */
static int push_info_field(lua_State *L, const kvgen_model_info *info, const char *key) {
#define INT_FIELD(k, v)                                                                                                \
    if (strcmp(key, k) == 0) {                                                                                         \
        lua_pushinteger(L, (lua_Integer)(v));                                                                          \
        return 1;                                                                                                      \
    }
#define STR_FIELD(k, v)                                                                                                \
    if (strcmp(key, k) == 0) {                                                                                         \
        lua_pushstring(L, v);                                                                                          \
        return 1;                                                                                                      \
    }
    STR_FIELD("name", info->name)
    STR_FIELD("architecture", info->architecture)
    STR_FIELD("backend", info->backend)
    STR_FIELD("device", info->device)
    INT_FIELD("n_layer", info->n_layer)
    INT_FIELD("n_embd", info->n_embd)
    INT_FIELD("n_ff", info->n_ff)
    INT_FIELD("n_head", info->n_head)
    INT_FIELD("n_head_kv", info->n_head_kv)
    INT_FIELD("head_dim", info->head_dim)
    INT_FIELD("n_rot", info->n_rot)
    INT_FIELD("n_ctx", info->n_ctx_train)
    INT_FIELD("vocab_size", info->n_vocab)
    INT_FIELD("n_params", info->n_params)
    INT_FIELD("weight_bytes", info->weight_bytes)
    STR_FIELD("tokenizer", tokenizer_name(info->tokenizer))
    STR_FIELD("tokenizer_pre", info->tokenizer_pre)
#undef INT_FIELD
#undef STR_FIELD
    if (strcmp(key, "rope_freq_base") == 0) {
        lua_pushnumber(L, info->rope_freq_base);
        return 1;
    }
    if (strcmp(key, "rms_norm_eps") == 0) {
        lua_pushnumber(L, info->rms_norm_eps);
        return 1;
    }
    if (strcmp(key, "tied_embeddings") == 0) {
        lua_pushboolean(L, info->tied_embeddings);
        return 1;
    }
    int32_t special = strcmp(key, "bos") == 0 ? info->bos : strcmp(key, "eos") == 0 ? info->eos
                                                          : strcmp(key, "eot") == 0 ? info->eot
                                                                                     : INT32_MIN;
    if (special == INT32_MIN) return 0;
    if (special < 0)
        lua_pushnil(L);
    else
        lua_pushinteger(L, special);
    return 1;
}

static const char *const info_keys[] = {
    "name",       "architecture", "backend", "device",   "n_layer",       "n_embd",         "n_ff",
    "n_head",     "n_head_kv",    "head_dim", "n_rot",   "n_ctx",         "vocab_size",     "n_params",
    "weight_bytes", "tokenizer",  "tokenizer_pre", "rope_freq_base", "rms_norm_eps", "tied_embeddings", "bos",
    "eos",        "eot",          NULL};

/* model:info() -> table of every field model.<field> answers */
static int model_info_table(lua_State *L) {
    kvgen_model_info info = model_info(check_model(L, 1)->model);
    lua_createtable(L, 0, (int)(sizeof info_keys / sizeof info_keys[0]));
    for (int i = 0; info_keys[i]; i++)
        if (push_info_field(L, &info, info_keys[i])) lua_setfield(L, -2, info_keys[i]);
    return 1;
}

/* methods first (so close() works on a closed model), then info fields */
static int model_index(lua_State *L) {
    lmodel *m = luaL_checkudata(L, 1, MODEL_MT);
    if (lua_getfield(L, lua_upvalueindex(1), luaL_checkstring(L, 2)) != LUA_TNIL) return 1;
    if (!m->model) return luaL_error(L, "attempt to use a closed " MODEL_MT);
    kvgen_model_info info = model_info(m->model);
    if (push_info_field(L, &info, lua_tostring(L, 2))) return 1;
    lua_pushnil(L);
    return 1;
}

static int model_describe(lua_State *L) {
    lmodel *m = check_model(L, 1);
    size_t need = kvgen_model_describe(m->model, NULL, 0);
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, need + 1);
    kvgen_model_describe(m->model, p, need + 1);
    luaL_pushresultsize(&b, need);
    return 1;
}

/* model:tokenize(text [, {special=, bos=}]) -> {ids} */
static int model_tokenize(lua_State *L) {
    lmodel *m = check_model(L, 1);
    size_t len;
    if (lua_type(L, 2) != LUA_TSTRING) type_error(L, 2, "text", "string");
    const char *text = lua_tolstring(L, 2, &len);
    unsigned flags = tokenize_flags(L, 3);
    size_t n = 0;
    const int32_t *ids = tokenize(L, m->model, text, len, flags, &n);
    push_ids(L, ids, n);
    return 1;
}

/* model:detokenize(ids [, {special=}]) -> text */
static int model_detokenize(lua_State *L) {
    lmodel *m = check_model(L, 1);
    unsigned flags = special_flag(L, 3); /* before check_ids pushes its buffer */
    size_t n = 0;
    const int32_t *ids = check_ids(L, 2, "ids", m->model, &n);
    size_t need = kvgen_detokenize(m->model, ids, n, flags, NULL, 0);
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, need + 1);
    kvgen_detokenize(m->model, ids, n, flags, p, need + 1);
    luaL_pushresultsize(&b, need);
    return 1;
}

/* model:piece(id [, {special=}]) -> the raw bytes of one token */
static int model_piece(lua_State *L) {
    lmodel *m = check_model(L, 1);
    int32_t id = check_token(L, 2, "id", m->model);
    unsigned flags = special_flag(L, 3);
    char small[64];
    size_t need = kvgen_token_piece(m->model, id, flags, small, sizeof small);
    if (need < sizeof small) {
        lua_pushlstring(L, small, need);
        return 1;
    }
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, need + 1);
    kvgen_token_piece(m->model, id, flags, p, need + 1);
    luaL_pushresultsize(&b, need);
    return 1;
}

static int model_is_eog(lua_State *L) {
    lmodel *m = check_model(L, 1);
    lua_pushboolean(L, kvgen_token_is_eog(m->model, check_token(L, 2, "id", m->model)));
    return 1;
}

static int model_is_control(lua_State *L) {
    lmodel *m = check_model(L, 1);
    lua_pushboolean(L, kvgen_token_is_control(m->model, check_token(L, 2, "id", m->model)));
    return 1;
}

/* model:token(text) -> id of the token whose text is exactly `text`, or nil */
static int model_token(lua_State *L) {
    lmodel *m = check_model(L, 1);
    if (lua_type(L, 2) != LUA_TSTRING) type_error(L, 2, "text", "string");
    int32_t id = kvgen_token_find(m->model, lua_tostring(L, 2));
    if (id < 0)
        lua_pushnil(L);
    else
        lua_pushinteger(L, id);
    return 1;
}

/* ---- streaming detokenizer -------------------------------------------------------------- */

/* model:detokenizer([{special=}]) -> d; d:push(id) -> complete text; d:flush() -> the rest.
 * Its user value is the model userdata; the model must stay open while it is used. */
static int model_detokenizer(lua_State *L) {
    check_model(L, 1);
    unsigned flags = special_flag(L, 2);
    ldetok *d = lua_newuserdatauv(L, sizeof *d, 1);
    kvgen_detok_init(&d->state);
    d->flags = flags;
    luaL_setmetatable(L, DETOK_MT);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1);
    return 1;
}

static int detok_push(lua_State *L) {
    ldetok *d = luaL_checkudata(L, 1, DETOK_MT);
    lua_getiuservalue(L, 1, 1);
    lmodel *m = check_model(L, lua_gettop(L));
    int32_t id = check_token(L, 2, "id", m->model);
    char small[256];
    luaL_Buffer b;
    /* 64 bytes plus the longest token is always enough (kvgen.h) */
    size_t need = 64 + kvgen_token_piece(m->model, id, d->flags, NULL, 0) + 1;
    char *p = need <= sizeof small ? small : luaL_buffinitsize(L, &b, need);
    size_t n = kvgen_detok_push(m->model, &d->state, id, d->flags, p, need);
    if (p == small)
        lua_pushlstring(L, small, n);
    else
        luaL_pushresultsize(&b, n);
    return 1;
}

static int detok_flush(lua_State *L) {
    ldetok *d = luaL_checkudata(L, 1, DETOK_MT);
    char buf[64];
    size_t n = kvgen_detok_flush(&d->state, buf, sizeof buf);
    lua_pushlstring(L, buf, n < sizeof buf ? n : sizeof buf - 1);
    return 1;
}

static int detok_tostring(lua_State *L) {
    lua_pushfstring(L, DETOK_MT " (%p)", luaL_checkudata(L, 1, DETOK_MT));
    return 1;
}

/* ---- sessions --------------------------------------------------------------------------- */

static const char *const session_options[] = {"context", "no_cache", "seed", "temperature", "top_k", "top_p", NULL};

/* model:session([opts]) -> session */
static int model_session(lua_State *L) {
    lmodel *m = check_model(L, 1);
    check_options(L, 2, session_options);
    kvgen_session_desc desc = {0};
    desc.n_ctx = (int)opt_integer(L, 2, "context", 0, 0, INT_MAX);
    desc.no_cache = opt_boolean(L, 2, "no_cache", 0);
    desc.seed = (uint64_t)opt_integer(L, 2, "seed", 0, LUA_MININTEGER, LUA_MAXINTEGER);
    desc.temperature = (float)opt_number(L, 2, "temperature", 0.0, 0.0, FLT_MAX);
    desc.top_k = (int)opt_integer(L, 2, "top_k", 0, 0, INT_MAX);
    desc.top_p = (float)opt_number(L, 2, "top_p", 0.0, 0.0, 1.0);

    lsession *s = lua_newuserdatauv(L, sizeof *s, 1);
    s->session = NULL;
    s->model = m->model;
    luaL_setmetatable(L, SESSION_MT);
    lua_pushvalue(L, 1); /* the session keeps its model userdata alive */
    lua_setiuservalue(L, -2, 1);
    kvgen_error err = {0};
    if (kvgen_session_create(m->model, &desc, &s->session, &err) != KVGEN_OK) {
        s->session = NULL;
        return raise_status(L, &err);
    }
    return 1;
}

static int session_close(lua_State *L) {
    lsession *s = luaL_checkudata(L, 1, SESSION_MT);
    kvgen_session_close(s->session);
    s->session = NULL;
    return 0;
}

static int session_tostring(lua_State *L) {
    lsession *s = luaL_checkudata(L, 1, SESSION_MT);
    if (!s->session)
        lua_pushliteral(L, SESSION_MT " (closed)");
    else
        lua_pushfstring(L, SESSION_MT " (%d tokens) (%p)", (int)kvgen_session_length(s->session), (void *)s);
    return 1;
}

static int session_index(lua_State *L) {
    lsession *s = luaL_checkudata(L, 1, SESSION_MT);
    const char *key = luaL_checkstring(L, 2);
    if (lua_getfield(L, lua_upvalueindex(1), key) != LUA_TNIL) return 1;
    if (!s->session) return luaL_error(L, "attempt to use a closed " SESSION_MT);
    if (strcmp(key, "length") == 0) {
        lua_pushinteger(L, (lua_Integer)kvgen_session_length(s->session));
    } else if (strcmp(key, "model") == 0) {
        lua_getiuservalue(L, 1, 1);
    } else if (strcmp(key, "context") == 0) {
        kvgen_cache_info ci;
        kvgen_session_cache_info(s->session, &ci);
        lua_pushinteger(L, (lua_Integer)ci.capacity);
    } else {
        lua_pushnil(L);
    }
    return 1;
}

static const char *const prefill_options[] = {"special", "bos", NULL};

/* s:prefill(text_or_ids [, {special=, bos=}]) -> number of tokens appended */
static int session_prefill(lua_State *L) {
    lsession *s = check_session(L, 1);
    size_t n = 0;
    const int32_t *ids;
    if (lua_type(L, 2) == LUA_TSTRING) {
        size_t len;
        const char *text = lua_tolstring(L, 2, &len);
        unsigned flags = tokenize_flags(L, 3);
        ids = tokenize(L, s->model, text, len, flags, &n);
    } else if (lua_istable(L, 2)) {
        check_options(L, 3, prefill_options);
        if (!lua_isnoneornil(L, 3) && (opt_boolean(L, 3, "special", 0) || opt_boolean(L, 3, "bos", 0)))
            luaL_argerror(L, 3, "options 'special' and 'bos' apply to text, not to token ids");
        ids = check_ids(L, 2, "ids", s->model, &n);
    } else {
        return type_error(L, 2, "input", "string or table of token ids");
    }
    kvgen_error err = {0};
    if (kvgen_session_prefill(s->session, ids, n, NULL, &err) != KVGEN_OK) return raise_status(L, &err);
    lua_pushinteger(L, (lua_Integer)n);
    return 1;
}

/* s:sample() -> the next token chosen by the session's sampler, or nil before any logits */
static int session_sample(lua_State *L) {
    lsession *s = check_session(L, 1);
    int32_t t = kvgen_session_sample(s->session);
    if (t < 0)
        lua_pushnil(L);
    else
        lua_pushinteger(L, t);
    return 1;
}

/* s:decode(id) -> the next token the sampler chooses after appending `id` */
static int session_decode(lua_State *L) {
    lsession *s = check_session(L, 1);
    int32_t id = check_token(L, 2, "id", s->model);
    kvgen_error err = {0};
    if (kvgen_session_decode(s->session, id, &err) != KVGEN_OK) return raise_status(L, &err);
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
    lsession *s = check_session(L, 1);
    int n_vocab = model_info(s->model).n_vocab;
    lua_Integer k = luaL_optinteger(L, 2, 10);
    luaL_argcheck(L, k >= 1 && k <= n_vocab, 2, lua_pushfstring(L, "k: %I is out of range [1, %d]", (LUAI_UACINT)k, n_vocab));
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
    lsession *s = check_session(L, 1);
    push_ids(L, kvgen_session_tokens(s->session), kvgen_session_length(s->session));
    return 1;
}

static int session_reset(lua_State *L) {
    kvgen_session_reset(check_session(L, 1)->session);
    return 0;
}

/* s:cache_info() -> {layers, kv_heads, head_dim, length, capacity, bytes, bytes_per_token} */
static int session_cache_info(lua_State *L) {
    lsession *s = check_session(L, 1);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s->session, &ci);
    lua_createtable(L, 0, 7);
    lua_pushinteger(L, ci.n_layer);
    lua_setfield(L, -2, "layers");
    lua_pushinteger(L, ci.n_head_kv);
    lua_setfield(L, -2, "kv_heads");
    lua_pushinteger(L, ci.head_dim);
    lua_setfield(L, -2, "head_dim");
    lua_pushinteger(L, (lua_Integer)ci.length);
    lua_setfield(L, -2, "length");
    lua_pushinteger(L, (lua_Integer)ci.capacity);
    lua_setfield(L, -2, "capacity");
    lua_pushinteger(L, (lua_Integer)ci.bytes);
    lua_setfield(L, -2, "bytes");
    lua_pushinteger(L, (lua_Integer)ci.bytes_per_token);
    lua_setfield(L, -2, "bytes_per_token");
    return 1;
}

/* s:read_cache(layer, "k"|"v") -> flat array of kv_heads * length * head_dim floats;
 * element (h, t, d) (all 0-based) is at index (h * length + t) * head_dim + d + 1. */
static int session_read_cache(lua_State *L) {
    static const char *const which_names[] = {"k", "v", NULL};
    lsession *s = check_session(L, 1);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s->session, &ci);
    int isint = 0;
    lua_Integer layer = to_integer(L, 2, &isint);
    if (!isint) type_error(L, 2, "layer", "integer");
    luaL_argcheck(L, layer >= 0 && layer < ci.n_layer, 2,
                  lua_pushfstring(L, "layer: %I is out of range [0, %d)", (LUAI_UACINT)layer, ci.n_layer));
    int which = luaL_checkoption(L, 3, NULL, which_names);
    size_t n = (size_t)ci.n_head_kv * ci.length * (size_t)ci.head_dim;
    float *out = lua_newuserdatauv(L, (n ? n : 1) * sizeof *out, 0);
    kvgen_error err = {0};
    if (kvgen_session_read_cache(s->session, (int)layer, which, out, n, &err) != KVGEN_OK)
        return raise_status(L, &err);
    lua_createtable(L, n < INT_MAX ? (int)n : 0, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushnumber(L, out[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* ---- module ----------------------------------------------------------------------------- */

/* kvgen.type(x) -> "model" | "session" | "detokenizer" | "closed model" | "closed session" | nil */
static int l_type(lua_State *L) {
    luaL_checkany(L, 1);
    lmodel *m = luaL_testudata(L, 1, MODEL_MT);
    lsession *s = luaL_testudata(L, 1, SESSION_MT);
    if (m)
        lua_pushstring(L, m->model ? "model" : "closed model");
    else if (s)
        lua_pushstring(L, s->session ? "session" : "closed session");
    else if (luaL_testudata(L, 1, DETOK_MT))
        lua_pushliteral(L, "detokenizer");
    else
        luaL_pushfail(L);
    return 1;
}

/* kvgen.devices() -> list of the Vulkan devices kvgen can run on (empty without a driver, and
 * in builds without the Vulkan backend, which have no kvgen_devices) */
static int l_devices(lua_State *L) {
#if KVGEN_LUA_HAVE_DEVICES
    kvgen_error err = {0};
    int count = 0;
    if (kvgen_devices(NULL, 0, &count, &err) != KVGEN_OK) return raise_status(L, &err);
    kvgen_device_info *dev = lua_newuserdatauv(L, (size_t)(count > 0 ? count : 1) * sizeof *dev, 0);
    if (count > 0 && kvgen_devices(dev, count, &count, &err) != KVGEN_OK) return raise_status(L, &err);
    lua_createtable(L, count, 0);
    for (int i = 0; i < count; i++) {
        const kvgen_device_info *d = &dev[i];
        lua_createtable(L, 0, 17);
#define SET_INT(field, v)                                                                                              \
    lua_pushinteger(L, (lua_Integer)(v));                                                                              \
    lua_setfield(L, -2, field)
#define SET_BOOL(field, v)                                                                                             \
    lua_pushboolean(L, (v) != 0);                                                                                      \
    lua_setfield(L, -2, field)
        SET_INT("index", d->index);
        lua_pushstring(L, d->name);
        lua_setfield(L, -2, "name");
        lua_pushstring(L, d->type ? d->type : "other");
        lua_setfield(L, -2, "type");
        SET_INT("vendor_id", d->vendor_id);
        SET_INT("device_id", d->device_id);
        /* VK_MAKE_API_VERSION packing: variant 3 bits, major 7, minor 10, patch 12 */
        lua_pushfstring(L, "%d.%d.%d", (int)((d->api_version >> 22) & 0x7f), (int)((d->api_version >> 12) & 0x3ff),
                        (int)(d->api_version & 0xfff));
        lua_setfield(L, -2, "api_version");
        SET_INT("device_local_bytes", d->device_local_bytes);
        SET_BOOL("host_visible_device_local", d->host_visible_device_local);
        SET_BOOL("shader_float16", d->shader_float16);
        SET_BOOL("storage_16bit", d->storage_16bit);
        SET_BOOL("storage_8bit", d->storage_8bit);
        SET_INT("subgroup_size", d->subgroup_size);
        SET_BOOL("subgroup_arithmetic", d->subgroup_arithmetic);
        SET_INT("max_shared_memory", d->max_shared_memory);
        SET_INT("max_storage_buffer_range", d->max_storage_buffer_range);
        SET_INT("max_allocation_size", d->max_allocation_size);
        SET_BOOL("default", d->is_default);
#undef SET_INT
#undef SET_BOOL
        lua_rawseti(L, -2, i + 1);
    }
#else
    lua_newtable(L);
#endif
    return 1;
}

static const luaL_Reg model_methods[] = {
    {"close", model_close},
    {"info", model_info_table},
    {"describe", model_describe},
    {"tokenize", model_tokenize},
    {"detokenize", model_detokenize},
    {"piece", model_piece},
    {"is_eog", model_is_eog},
    {"is_control", model_is_control},
    {"token", model_token},
    {"detokenizer", model_detokenizer},
    {"session", model_session},
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
    {NULL, NULL},
};

static const luaL_Reg detok_methods[] = {
    {"push", detok_push},
    {"flush", detok_flush},
    {NULL, NULL},
};

/* One metatable per type: __index is a function (upvalue: the methods table) when the type
 * has fields as well as methods, else the methods table itself. */
static void new_type(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction index,
                     lua_CFunction close, lua_CFunction tostring) {
    luaL_newmetatable(L, name);
    lua_createtable(L, 0, 16);
    luaL_setfuncs(L, methods, 0);
    if (index) {
        lua_pushcclosure(L, index, 1);
    }
    lua_setfield(L, -2, "__index");
    if (close) {
        lua_pushcfunction(L, close);
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, "__gc");
        lua_setfield(L, -2, "__close");
    }
    lua_pushcfunction(L, tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
}

static const luaL_Reg module_functions[] = {
    {"load", l_load},
    {"type", l_type},
    {"devices", l_devices},
    {"last_error", l_last_error},
    {NULL, NULL},
};

__attribute__((visibility("default"))) int luaopen_kvgen(lua_State *L) {
    luaL_checkversion(L);
    new_type(L, MODEL_MT, model_methods, model_index, model_close, model_tostring);
    new_type(L, SESSION_MT, session_methods, session_index, session_close, session_tostring);
    new_type(L, DETOK_MT, detok_methods, NULL, NULL, detok_tostring);
    luaL_newlib(L, module_functions);
    lua_pushstring(L, kvgen_version());
    lua_setfield(L, -2, "version");
    return 1;
}
