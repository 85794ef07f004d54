/*
 * lua_model.c: kvgen.load and kvgen.Model: the model's fields, its tokenizer (tokenize,
 * detokenize, pieces, the streaming detokenizer), embeddings (embed) and the token arrays every
 * call reads.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvgen_lua_internal.h"

/* ---- the model handle ------------------------------------------------------------------- */

lmodel *kvl_check_model(lua_State *L, int arg) {
    lmodel *m = kvl_check_udata(L, arg, MODEL_MT);
    if (!m->model) luaL_error(L, "attempt to use a closed " MODEL_MT);
    return m;
}

kvgen_model_info kvl_model_info(const kvgen_model *model) {
    kvgen_model_info info;
    kvgen_model_get_info(model, &info);
    return info;
}

/* ---- token arrays ----------------------------------------------------------------------- */

int32_t kvl_check_token(lua_State *L, int arg, const char *name, const kvgen_model *model) {
    int isint = 0;
    lua_Integer id = kvl_to_integer(L, arg, &isint);
    if (!isint) kvl_type_error(L, arg, name, "integer token id");
    int n_vocab = kvl_model_info(model).n_vocab;
    if (id < 0 || id >= n_vocab)
        kvl_arg_error(L, arg,
                      lua_pushfstring(L, "%s: %I is outside the vocabulary [0, %d)", name, (LUAI_UACINT)id, n_vocab));
    return (int32_t)id;
}

/* Reads a Lua array of token ids into a userdata it leaves on the stack. */
int32_t *kvl_check_ids(lua_State *L, int arg, const char *name, const kvgen_model *model, size_t *n) {
    if (!lua_istable(L, arg)) kvl_type_error(L, arg, name, "table of token ids");
    kvl_need_stack(L, 8, name);
    lua_Unsigned len = kvl_check_sequence(L, arg, arg, name);
    if (len > (lua_Unsigned)(SIZE_MAX / sizeof(int32_t) - 1))
        kvl_arg_error(L, arg, lua_pushfstring(L, "%s: too many tokens", name));
    int32_t *ids = lua_newuserdatauv(L, (size_t)(len ? len : 1) * sizeof *ids, 0);
    int n_vocab = kvl_model_info(model).n_vocab;
    for (lua_Unsigned i = 0; i < len; i++) {
        int isint = 0;
        lua_rawgeti(L, arg, (lua_Integer)(i + 1));
        lua_Integer id = kvl_to_integer(L, -1, &isint);
        if (!isint)
            kvl_arg_error(L, arg,
                          lua_pushfstring(L, "%s[%I]: integer expected, got %s", name, (LUAI_UACINT)(i + 1),
                                          kvl_push_got(L, -1)));
        if (id < 0 || (n_vocab > 0 && id >= n_vocab)) /* 0: a remote model, whose calls refuse ids */
            kvl_arg_error(L, arg,
                          lua_pushfstring(L, "%s[%I]: %I is outside the vocabulary [0, %d)", name,
                                          (LUAI_UACINT)(i + 1), (LUAI_UACINT)id, n_vocab));
        ids[i] = (int32_t)id;
        lua_pop(L, 1);
    }
    *n = (size_t)len;
    return ids;
}

/* Tokenizes into a userdata it leaves on the stack. */
int32_t *kvl_tokenize(lua_State *L, const kvgen_model *model, const char *text, size_t len, unsigned flags,
                      size_t *n) {
    kvgen_error err = {0};
    size_t need = 0;
    kvgen_status st = kvgen_tokenize(model, text, len, flags, NULL, 0, &need, &err);
    /* with cap 0 a non-empty result reports INVALID_ARGUMENT and the size it needs */
    if (st != KVGEN_OK && !(st == KVGEN_E_INVALID_ARGUMENT && need > 0)) kvl_raise_status(L, &err);
    int32_t *ids = lua_newuserdatauv(L, (need ? need : 1) * sizeof *ids, 0);
    if (need > 0 && kvgen_tokenize(model, text, len, flags, ids, need, n, &err) != KVGEN_OK) kvl_raise_status(L, &err);
    *n = need;
    return ids;
}

void kvl_push_ids(lua_State *L, const int32_t *ids, size_t n) {
    lua_createtable(L, n < INT_MAX ? (int)n : 0, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

static const opt_spec tokenize_specs[] = {
    {.key = "special", .type = OPT_FLAG, .flag = KVGEN_TOKENIZE_SPECIAL},
    {.key = "bos", .type = OPT_FLAG, .flag = KVGEN_TOKENIZE_ADD_BOS, .need = TOKENIZE_BOS},
};

/* {special=, bos=} (mode TOKENIZE_BOS) or {special=} (0) as KVGEN_TOKENIZE_* flags */
unsigned kvl_tokenize_flags(lua_State *L, int arg, unsigned mode) {
    unsigned flags = 0;
    kvl_read_options(L, arg, tokenize_specs, N_SPECS(tokenize_specs), mode, &flags, 0, NULL);
    return flags;
}

/* ---- kvgen.load and the model ----------------------------------------------------------- */

static const char *const backend_names[] = {"default", "reference", "vulkan", "cpu", NULL}; /* kvgen_backend order */

typedef struct load_opts {
    kvgen_model_desc d;
    int backend;  /* index in backend_names */
    int pc_given; /* pipeline_cache = path or false; else the default path */
    int progress; /* progress = function given */
} load_opts;

/* device = index (an integer >= 0, passed as its text) or name substring */
static void read_device(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    if (lua_type(L, vi) != LUA_TNUMBER) {
        *(const char **)field = kvl_read_string(c, o, vi);
        return;
    }
    int isint = 0;
    lua_Integer d = kvl_to_integer(L, vi, &isint);
    if (!isint || d < 0) kvl_field_error(c, o, "a device index must be an integer >= 0");
    lua_pushfstring(L, "%I", (LUAI_UACINT)d); /* the index as text, as kvgen_model_desc wants it */
    *(const char **)field = lua_tostring(L, -1);
    kvl_anchor_top(c);
}

/* pipeline_cache = a path, false (none) or true (the default) */
static void read_pipeline_cache(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    load_opts *lo = field; /* the row's destination is the whole struct */
    if (lua_type(L, vi) == LUA_TSTRING) {
        lo->d.pipeline_cache_path = kvl_read_string(c, o, vi);
        if (!*lo->d.pipeline_cache_path)
            kvl_field_error(c, o, "empty path (false turns the pipeline cache off)");
        lo->pc_given = 1;
    } else if (lua_type(L, vi) == LUA_TBOOLEAN) {
        lo->pc_given = !lua_toboolean(L, vi); /* false: no cache (path NULL); true: the default */
    } else {
        const char *type = luaL_typename(L, vi);
        const char *value = luaL_tolstring(L, vi, NULL);
        kvl_field_error(c, o, lua_pushfstring(L, "path (string) or false expected, got %s (%s)", type, value));
    }
}

static const opt_spec load_specs[] = {
    {.key = "backend", .type = OPT_CHOICE, .off = offsetof(load_opts, backend), .names = backend_names},
    {.key = "device", .type = OPT_CUSTOM, .off = offsetof(load_opts, d.device), .read = read_device},
    {.key = "threads", .type = OPT_INT, .off = offsetof(load_opts, d.n_threads), .lo = 0, .hi = 4096},
    {.key = "force_f32", .type = OPT_BOOL, .off = offsetof(load_opts, d.force_f32)},
    {.key = "pool_bytes", .type = OPT_SIZE, .off = offsetof(load_opts, d.kv_pool_bytes), .lo = 0, .hi = LUA_MAXINTEGER},
    {.key = "pool_tokens", .type = OPT_SIZE, .off = offsetof(load_opts, d.kv_pool_tokens), .lo = 0, .hi = LUA_MAXINTEGER},
    {.key = "page_size", .type = OPT_INT, .off = offsetof(load_opts, d.kv_page_size), .lo = 0, .hi = INT_MAX},
    {.key = "context", .type = OPT_INT, .off = offsetof(load_opts, d.n_ctx), .lo = 0, .hi = INT_MAX},
    {.key = "kv_type", .type = OPT_STRING, .off = offsetof(load_opts, d.kv_type)},
    {.key = "activation_bits", .type = OPT_INT, .off = offsetof(load_opts, d.activation_bits), .lo = 0, .hi = 16},
    {.key = "pipeline_cache", .type = OPT_CUSTOM, .read = read_pipeline_cache},
    /* remote models (path "http://..."): docs/remote.md */
    {.key = "model", .type = OPT_STRING, .off = offsetof(load_opts, d.remote_model)},
    {.key = "api_key", .type = OPT_STRING, .off = offsetof(load_opts, d.api_key)},
    {.key = "max_requests", .type = OPT_INT, .off = offsetof(load_opts, d.remote_max_requests), .lo = 0, .hi = 4096},
    {.key = "timeout_ms", .type = OPT_INT, .off = offsetof(load_opts, d.remote_timeout_ms), .lo = 0, .hi = INT_MAX},
    {.key = "progress", .type = OPT_FUNCTION, .off = offsetof(load_opts, progress)},
};

/* progress = function(stage, done, total): called from inside kvgen_model_load through a
 * protected call, so an error in it never unwinds through kvgen's frames: the error is kept,
 * the load cancelled (everything it made freed), and the error raised once kvgen_model_load
 * has returned. false from the function cancels the load (KVGEN_E_CANCELLED). */
typedef struct load_progress {
    lua_State *L;
    int fn, err_slot; /* stack slots of the function and of a raised error */
    int raised;
    kvgen_load_stage stage;
    uint64_t done, total;
} load_progress;

static const char *load_stage_name(kvgen_load_stage stage) {
    switch (stage) {
    case KVGEN_LOAD_READ: return "read";
    case KVGEN_LOAD_UPLOAD: return "upload";
    case KVGEN_LOAD_PIPELINES: return "pipelines";
    }
    return "?";
}

static int load_progress_call(lua_State *L) {
    load_progress *p = lua_touserdata(L, 1); /* 2: the function */
    lua_pushvalue(L, 2);
    lua_pushstring(L, load_stage_name(p->stage));
    lua_pushinteger(L, (lua_Integer)p->done);
    lua_pushinteger(L, (lua_Integer)p->total);
    lua_call(L, 3, 1);
    lua_pushboolean(L, !(lua_isboolean(L, -1) && !lua_toboolean(L, -1))); /* only false cancels */
    return 1;
}

static int load_progress_fn(void *user, kvgen_load_stage stage, uint64_t done, uint64_t total) {
    load_progress *p = user;
    lua_State *L = p->L;
    p->stage = stage;
    p->done = done;
    p->total = total;
    if (!lua_checkstack(L, 8)) return 0;
    lua_pushcfunction(L, load_progress_call); /* no push allocates: nothing here can raise */
    lua_pushlightuserdata(L, p);
    lua_pushvalue(L, p->fn); /* an index of l_load's frame, the one running kvgen_model_load */
    if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
        lua_replace(L, p->err_slot);
        p->raised = 1;
        return 0;
    }
    int go = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return go;
}

/* Pushes the pipeline cache file kvgen.load uses when its options name none, or nil for none:
 * $KVGEN_PIPELINE_CACHE ("" or "off": none), else a file in the user's cache folder. Windows
 * usually has neither XDG_CACHE_HOME nor HOME: there it is the local application data folder. */
static void push_default_pipeline_cache(lua_State *L) {
    const char *env = getenv("KVGEN_PIPELINE_CACHE");
    if (env) {
        lua_pushstring(L, *env && strcmp(env, "off") != 0 ? env : NULL);
        return;
    }
#ifdef _WIN32
    const char *local = getenv("LOCALAPPDATA"), *roaming = getenv("APPDATA"), *profile = getenv("USERPROFILE");
    if (local && *local) lua_pushfstring(L, "%s\\kvgen\\pipelines-{device}.bin", local);
    else if (roaming && *roaming) lua_pushfstring(L, "%s\\kvgen\\pipelines-{device}.bin", roaming);
    else if (profile && *profile) lua_pushfstring(L, "%s\\AppData\\Local\\kvgen\\pipelines-{device}.bin", profile);
    else lua_pushnil(L);
#else
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && xdg[0] == '/') lua_pushfstring(L, "%s/kvgen/pipelines-{device}.bin", xdg);
    else if (home && *home) lua_pushfstring(L, "%s/.cache/kvgen/pipelines-{device}.bin", home);
    else lua_pushnil(L);
#endif
}

/* kvgen.pipeline_cache_path() -> the file kvgen.load uses when pipeline_cache is not given
 * (with "{device}" still in it), or nil for none */
int kvl_pipeline_cache_path(lua_State *L) {
    push_default_pipeline_cache(L);
    return 1;
}

/* kvgen.load(path [, {backend=, device=, threads=, force_f32=, pool_bytes=, pool_tokens=, page_size=,
 * pipeline_cache=, progress=}]) -> model. pipeline_cache: a file path, false (none) or true / absent
 * (the default: push_default_pipeline_cache). */
int kvl_load(lua_State *L) {
    if (lua_type(L, 1) != LUA_TSTRING) kvl_type_error(L, 1, "path", "string");
    lua_settop(L, 2);
    lua_newtable(L); /* 3: anchor */
    load_opts o = {0};
    o.d.path = kvl_check_cstring_arg(L, 1, "path");
    kvl_read_options(L, 2, load_specs, N_SPECS(load_specs), 0, &o, 3, NULL);
    o.d.backend = (kvgen_backend)o.backend;
    if (!o.pc_given) {
        push_default_pipeline_cache(L);
        o.d.pipeline_cache_path = lua_tostring(L, -1); /* stays on the stack until the load is done */
    }

    load_progress prog = {.L = L};
    if (o.progress) {
        lua_getfield(L, 2, "progress");
        prog.fn = lua_gettop(L);
        lua_pushnil(L);
        prog.err_slot = lua_gettop(L);
        o.d.progress = load_progress_fn;
        o.d.progress_user = &prog;
    }

    lmodel *m = lua_newuserdatauv(L, sizeof *m, 0);
    m->model = NULL; /* created closed: a failure below leaves nothing to free */
    luaL_setmetatable(L, MODEL_MT);
    kvgen_error err = {0};
    if (kvgen_model_load(&o.d, &m->model, &err) != KVGEN_OK) {
        m->model = NULL;
        kvl_deliver_logs(L);
        if (prog.raised) {
            lua_pushvalue(L, prog.err_slot);
            return lua_error(L); /* the callback's own error, as it raised it */
        }
        return kvl_raise_status(L, &err);
    }
    kvl_deliver_logs(L);
    return 1;
}

static int model_close(lua_State *L) {
    lmodel *m = kvl_check_udata(L, 1, MODEL_MT);
    kvgen_model_unload(m->model); /* sessions keep their own reference */
    m->model = NULL;
    return 0;
}

static int model_tostring(lua_State *L) {
    lmodel *m = kvl_check_udata(L, 1, MODEL_MT);
    if (!m->model) {
        lua_pushliteral(L, MODEL_MT " (closed)");
    } else {
        kvgen_model_info info = kvl_model_info(m->model);
        lua_pushfstring(L, MODEL_MT " (%s, %s) (%p)", info.name, info.backend, (void *)m);
    }
    return 1;
}

static const char *tokenizer_name(kvgen_tokenizer_kind k) {
    return k == KVGEN_TOKENIZER_BPE ? "bpe" : k == KVGEN_TOKENIZER_SPM ? "spm" : k == KVGEN_TOKENIZER_WPM ? "wpm"
                                                                                                   : "unknown";
}

/* model.<field> and model:info(): kvgen_model_info with the tokenizer kind as its name */
typedef struct lmodel_info {
    kvgen_model_info i;
    const char *tokenizer;
} lmodel_info;

static lmodel_info model_fields(const kvgen_model *model) {
    lmodel_info mi = {.i = kvl_model_info(model)};
    mi.tokenizer = tokenizer_name(mi.i.tokenizer);
    return mi;
}

#define MI(name, type, field) {name, type, offsetof(lmodel_info, field)}
static const out_field model_info_fields[] = {
    MI("name", F_STR, i.name),
    MI("architecture", F_STR, i.architecture),
    MI("backend", F_STR, i.backend),
    MI("device", F_STR, i.device),
    MI("kv_type", F_STR, i.kv_type),
    MI("n_layer", F_INT, i.n_layer),
    MI("n_embd", F_INT, i.n_embd),
    MI("n_ff", F_INT, i.n_ff),
    MI("n_head", F_INT, i.n_head),
    MI("n_head_kv", F_INT, i.n_head_kv),
    MI("head_dim", F_INT, i.head_dim),
    MI("n_rot", F_INT, i.n_rot),
    MI("n_ctx", F_INT, i.n_ctx_train),
    MI("vocab_size", F_INT, i.n_vocab),
    MI("n_params", F_U64, i.n_params),
    MI("weight_bytes", F_U64, i.weight_bytes),
    MI("tokenizer", F_STR, tokenizer),
    MI("tokenizer_pre", F_STR, i.tokenizer_pre),
    MI("rope_freq_base", F_FLOAT, i.rope_freq_base),
    MI("rms_norm_eps", F_FLOAT, i.rms_norm_eps),
    MI("tied_embeddings", F_BOOL, i.tied_embeddings),
    MI("bos", F_TOKEN, i.bos),
    MI("eos", F_TOKEN, i.eos),
    MI("eot", F_TOKEN, i.eot),
};
#undef MI

/* model:info() -> table of every field model.<field> answers */
static int model_info_table(lua_State *L) {
    lmodel_info mi = model_fields(kvl_check_model(L, 1)->model);
    kvl_push_fields(L, &mi, model_info_fields, N_FIELDS(model_info_fields));
    return 1;
}

/* methods first (so close() works on a closed model), then info fields */
static int model_index(lua_State *L) {
    lmodel *m = kvl_check_udata(L, 1, MODEL_MT);
    const char *key = kvl_index_key(L);
    if (lua_getfield(L, lua_upvalueindex(1), key) != LUA_TNIL) return 1;
    if (!m->model) return luaL_error(L, "attempt to use a closed " MODEL_MT);
    lmodel_info mi = model_fields(m->model);
    for (size_t i = 0; i < N_FIELDS(model_info_fields); i++)
        if (strcmp(key, model_info_fields[i].name) == 0) {
            kvl_push_field(L, &mi, &model_info_fields[i]);
            return 1;
        }
    lua_pushnil(L);
    return 1;
}

static int model_describe(lua_State *L) {
    lmodel *m = kvl_check_model(L, 1);
    size_t need = kvgen_model_describe(m->model, NULL, 0);
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, need + 1);
    kvgen_model_describe(m->model, p, need + 1);
    luaL_pushresultsize(&b, need);
    return 1;
}

/* model:tokenize(text [, {special=, bos=}]) -> {ids} */
static int model_tokenize(lua_State *L) {
    lmodel *m = kvl_check_model(L, 1);
    size_t len;
    if (lua_type(L, 2) != LUA_TSTRING) kvl_type_error(L, 2, "text", "string");
    const char *text = lua_tolstring(L, 2, &len);
    unsigned flags = kvl_tokenize_flags(L, 3, TOKENIZE_BOS);
    size_t n = 0;
    const int32_t *ids = kvl_tokenize(L, m->model, text, len, flags, &n);
    kvl_push_ids(L, ids, n);
    return 1;
}

/* ---- embeddings ---------------------------------------------------------------------------- */

typedef struct embed_opts {
    int pooling;   /* KVGEN_POOLING_* (OPT_CHOICE index = the enum's value) */
    int normalize; /* 1 unless {normalize = false} */
    int max_tokens;
} embed_opts;

static const char *const pooling_names[] = {"default", "mean", "cls", "last", NULL}; /* kvgen_pooling order */

static const opt_spec embed_specs[] = {
    {.key = "pooling", .type = OPT_CHOICE, .off = offsetof(embed_opts, pooling), .names = pooling_names},
    {.key = "normalize", .type = OPT_BOOL, .off = offsetof(embed_opts, normalize)},
    {.key = "max_tokens", .type = OPT_INT, .off = offsetof(embed_opts, max_tokens), .lo = 0, .hi = INT_MAX},
};

/* model:embed(text [, opts]) -> {numbers}; model:embed({texts} [, opts]) -> { {numbers}, ... }.
 * opts: {pooling = "mean"|"cls"|"last", normalize = true, max_tokens = N}. Vectors are plain
 * lists of numbers: what memory:add and memory:search take, what game code indexes and saves;
 * a vector object would only save the table, and an embedding is computed far less often than
 * it is searched with. All texts of a list run in one batched kvgen_embed call. */
static int model_embed(lua_State *L) {
    lmodel *m = kvl_check_model(L, 1);
    int list = lua_type(L, 2) == LUA_TTABLE;
    if (!list && lua_type(L, 2) != LUA_TSTRING) kvl_type_error(L, 2, "text", "string or list of strings");
    embed_opts o = {.normalize = 1};
    kvl_read_options(L, 3, embed_specs, N_SPECS(embed_specs), 0, &o, 0, NULL);
    lua_Unsigned n = list ? kvl_check_sequence(L, 2, 2, "texts") : 1;
    if (n > (lua_Unsigned)(INT_MAX / 2)) kvl_arg_error(L, 2, "texts: too many");
    const char **texts = lua_newuserdatauv(L, (n ? n : 1) * sizeof *texts, 0);
    size_t *lens = lua_newuserdatauv(L, (n ? n : 1) * sizeof *lens, 0);
    for (lua_Unsigned i = 0; i < n; i++) {
        if (list) {
            lua_rawgeti(L, 2, (lua_Integer)i + 1);
            if (lua_type(L, -1) != LUA_TSTRING)
                kvl_arg_error(L, 2, lua_pushfstring(L, "texts[%d]: string expected, got %s", (int)i + 1,
                                                    kvl_push_got(L, -1)));
            texts[i] = lua_tolstring(L, -1, &lens[i]); /* the list holds the string */
            lua_pop(L, 1);
        } else {
            texts[i] = lua_tolstring(L, 2, &lens[i]);
        }
    }
    kvgen_model_info info;
    kvgen_model_get_info(m->model, &info);
    size_t D = info.n_embd > 0 ? (size_t)info.n_embd : 1;
    float *out = lua_newuserdatauv(L, (n ? n : 1) * D * sizeof *out, 0);
    kvgen_embed_desc d = {.pooling = (kvgen_pooling)o.pooling, .no_normalize = !o.normalize,
                          .max_tokens = o.max_tokens};
    kvgen_error err = {0};
    if (kvgen_embed(m->model, texts, lens, (size_t)n, &d, out, (size_t)n * D, &err) != KVGEN_OK)
        kvl_raise_status(L, &err);
    if (list) lua_createtable(L, (int)n, 0);
    for (lua_Unsigned i = 0; i < n; i++) {
        lua_createtable(L, (int)D, 0);
        for (size_t k = 0; k < D; k++) {
            lua_pushnumber(L, (lua_Number)out[i * D + k]);
            lua_rawseti(L, -2, (lua_Integer)k + 1);
        }
        if (list) lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* model:detokenize(ids [, {special=}]) -> text */
static int model_detokenize(lua_State *L) {
    lmodel *m = kvl_check_model(L, 1);
    unsigned flags = kvl_tokenize_flags(L, 3, 0); /* before kvl_check_ids pushes its buffer */
    size_t n = 0;
    const int32_t *ids = kvl_check_ids(L, 2, "ids", m->model, &n);
    size_t need = kvgen_detokenize(m->model, ids, n, flags, NULL, 0);
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, need + 1);
    kvgen_detokenize(m->model, ids, n, flags, p, need + 1);
    luaL_pushresultsize(&b, need);
    return 1;
}

/* model:piece(id [, {special=}]) -> the raw bytes of one token */
static int model_piece(lua_State *L) {
    lmodel *m = kvl_check_model(L, 1);
    int32_t id = kvl_check_token(L, 2, "id", m->model);
    unsigned flags = kvl_tokenize_flags(L, 3, 0);
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
    lmodel *m = kvl_check_model(L, 1);
    lua_pushboolean(L, kvgen_token_is_eog(m->model, kvl_check_token(L, 2, "id", m->model)));
    return 1;
}

static int model_is_control(lua_State *L) {
    lmodel *m = kvl_check_model(L, 1);
    lua_pushboolean(L, kvgen_token_is_control(m->model, kvl_check_token(L, 2, "id", m->model)));
    return 1;
}

/* model:token(text) -> id of the token whose text is exactly `text`, or nil */
static int model_token(lua_State *L) {
    lmodel *m = kvl_check_model(L, 1);
    int32_t id = kvgen_token_find(m->model, kvl_check_cstring_arg(L, 2, "text"));
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
    kvl_check_model(L, 1);
    unsigned flags = kvl_tokenize_flags(L, 2, 0);
    ldetok *d = lua_newuserdatauv(L, sizeof *d, 1);
    kvgen_detok_init(&d->state);
    d->flags = flags;
    luaL_setmetatable(L, DETOK_MT);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1);
    return 1;
}

static int detok_push(lua_State *L) {
    ldetok *d = kvl_check_udata(L, 1, DETOK_MT);
    lua_getiuservalue(L, 1, 1);
    lmodel *m = kvl_check_model(L, lua_gettop(L));
    int32_t id = kvl_check_token(L, 2, "id", m->model);
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
    ldetok *d = kvl_check_udata(L, 1, DETOK_MT);
    char buf[64];
    size_t n = kvgen_detok_flush(&d->state, buf, sizeof buf);
    lua_pushlstring(L, buf, n < sizeof buf ? n : sizeof buf - 1);
    return 1;
}

static int detok_tostring(lua_State *L) {
    lua_pushfstring(L, DETOK_MT " (%p)", kvl_check_udata(L, 1, DETOK_MT));
    return 1;
}

/* model:pool_info() -> the KV page pool's accounting (all sessions of the model) */
static int model_pool_info(lua_State *L) {
#define PI(name) {#name, F_SIZE, offsetof(kvgen_pool_info, name)}
    static const out_field fields[] = {
        PI(page_size),      PI(pages_total),    PI(pages_used), PI(pages_free), PI(pages_cached), PI(bytes_per_token),
        PI(bytes_per_page), PI(bytes_total),    PI(bytes_used), PI(bytes_committed), PI(sessions),
        PI(window),         PI(window_bytes_per_page), PI(window_pages_used), PI(window_pages_cached),
    };
#undef PI
    kvgen_pool_info pi;
    kvgen_model_pool_info(kvl_check_model(L, 1)->model, &pi);
    kvl_push_fields(L, &pi, fields, N_FIELDS(fields));
    return 1;
}

static const luaL_Reg model_methods[] = {
    {"close", model_close},
    {"info", model_info_table},
    {"describe", model_describe},
    {"tokenize", model_tokenize},
    {"embed", model_embed},
    {"detokenize", model_detokenize},
    {"piece", model_piece},
    {"is_eog", model_is_eog},
    {"is_control", model_is_control},
    {"token", model_token},
    {"detokenizer", model_detokenizer},
    {"pool_info", model_pool_info},
    {NULL, NULL},
};

static const luaL_Reg *const model_method_lists[] = {model_methods, kvl_model_session_methods, kvl_model_adapter_methods,
                                                               NULL};
const kvl_type kvl_model_type = {MODEL_MT, model_method_lists, model_index, model_close, model_tostring, NULL};

static const luaL_Reg detok_methods[] = {
    {"push", detok_push},
    {"flush", detok_flush},
    {NULL, NULL},
};

static const luaL_Reg *const detok_method_lists[] = {detok_methods, NULL};
const kvl_type kvl_detok_type = {DETOK_MT, detok_method_lists, NULL, NULL, detok_tostring, NULL};
