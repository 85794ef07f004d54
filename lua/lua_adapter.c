/*
 * lua_adapter.c: LoRA adapters in Lua: model:load_adapter(path) -> a kvgen.Adapter, the
 * `adapters` lists that model:session{adapters = ...} and s:set_adapters take, and
 * s:adapters(). A list holds adapters, each alone (scale 1) or as {adapter, scale}.
 *
 * One C adapter has one Lua handle while the handle lives: a weak table of the state maps the
 * C adapter to its handle, so s:adapters() gives back the very objects a script passed (and a
 * new handle, with its own C reference, for one whose handle was collected while a session
 * still ran it, as after s:fork() or model:restore()).
 */
#include <math.h>
#include <string.h>

#include "kvgen_lua_internal.h"

typedef struct ladapter {
    kvgen_adapter *adapter; /* NULL once closed */
} ladapter;

static ladapter *check_adapter(lua_State *L, int arg) {
    ladapter *a = kvl_check_udata(L, arg, ADAPTER_MT);
    if (!a->adapter) luaL_error(L, "attempt to use a closed " ADAPTER_MT);
    return a;
}

/* Pushes the state's weak table C adapter -> handle, made on first use. */
static void push_handles(lua_State *L) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, ADAPTERS_KEY) == LUA_TTABLE) return;
    lua_pop(L, 1);
    lua_newtable(L);
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, ADAPTERS_KEY);
}

/* Pushes the handle of `a`. `owned`: the caller gives the handle its reference (a new load),
 * dropped here when a handle already holds one; else a new handle takes its own. */
static void push_adapter(lua_State *L, kvgen_adapter *a, int owned) {
    push_handles(L);
    if (lua_rawgetp(L, -1, a) == LUA_TUSERDATA) {
        lua_remove(L, -2);
        if (owned) kvgen_adapter_free(a);
        return;
    }
    lua_pop(L, 1);
    ladapter *h = lua_newuserdatauv(L, sizeof *h, 0);
    h->adapter = NULL;
    luaL_setmetatable(L, ADAPTER_MT);
    if (!owned) kvgen_adapter_retain(a);
    h->adapter = a;
    lua_pushvalue(L, -1);
    lua_rawsetp(L, -3, a);
    lua_remove(L, -2);
}

/* model:load_adapter(path) -> a kvgen.Adapter */
static int model_load_adapter(lua_State *L) {
    lmodel *m = kvl_check_model(L, 1);
    const char *path = kvl_check_cstring_arg(L, 2, "path");
    kvgen_adapter *a = NULL;
    kvgen_error err = {0};
    if (kvgen_adapter_load(m->model, path, &a, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    push_adapter(L, a, 1);
    return 1;
}

/* Reads the adapters list at `idx` (argument `arg`; `what` names it in messages) into
 * adapters/scales (KVGEN_MAX_ADAPTERS each); returns how many. */
size_t kvl_read_adapters(lua_State *L, int idx, int arg, const char *what, const kvgen_adapter **adapters,
                         float *scales) {
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) != LUA_TTABLE) {
        kvl_arg_error(L, arg, lua_pushfstring(L, "%s: table of adapters expected, got %s", what,
                                              kvl_push_got(L, idx)));
    }
    lua_Unsigned n = kvl_check_sequence(L, idx, arg, what);
    if (n > KVGEN_MAX_ADAPTERS)
        kvl_arg_error(L, arg, lua_pushfstring(L, "%s: %d adapters, at most %d run at once", what, (int)n,
                                              KVGEN_MAX_ADAPTERS));
    for (lua_Unsigned i = 1; i <= n; i++) {
        lua_geti(L, idx, (lua_Integer)i);
        int entry = lua_gettop(L);
        double scale = 1.0;
        if (lua_type(L, entry) == LUA_TTABLE && !luaL_testudata(L, entry, ADAPTER_MT)) {
            lua_geti(L, entry, 2);
            int isnum = 0;
            scale = lua_tonumberx(L, -1, &isnum);
            if (!isnum || !isfinite(scale) || fabs(scale) > 3.0e38)
                kvl_arg_error(L, arg, lua_pushfstring(L, "%s[%d][2] (the scale): finite number expected, got %s", what,
                                                      (int)i, kvl_push_got(L, -1)));
            lua_pop(L, 1);
            lua_geti(L, entry, 1);
            lua_replace(L, entry);
        }
        ladapter *a = luaL_testudata(L, entry, ADAPTER_MT);
        if (!a)
            kvl_arg_error(L, arg, lua_pushfstring(L, "%s[%d]: kvgen.Adapter or {adapter, scale} expected, got %s", what,
                                                  (int)i, kvl_push_got(L, entry)));
        if (!a->adapter)
            kvl_arg_error(L, arg, lua_pushfstring(L, "%s[%d]: the adapter is closed", what, (int)i));
        adapters[i - 1] = a->adapter;
        scales[i - 1] = (float)scale;
        lua_pop(L, 1); /* the session takes its own references before the handles can go */
    }
    return (size_t)n;
}

/* s:set_adapters(list) / s:set_adapters() (none): the adapters the session runs with */
static int session_set_adapters(lua_State *L) {
    lsession *s = kvl_check_session(L, 1);
    const kvgen_adapter *adapters[KVGEN_MAX_ADAPTERS];
    float scales[KVGEN_MAX_ADAPTERS];
    size_t n = lua_isnoneornil(L, 2) ? 0 : kvl_read_adapters(L, 2, 2, "adapters", adapters, scales);
    kvgen_error err = {0};
    if (kvgen_session_set_adapters(s->session, adapters, scales, n, &err) != KVGEN_OK)
        return kvl_raise_status(L, &err);
    return 0;
}

/* s:adapters() -> {{adapter, scale}, ...} */
static int session_adapters(lua_State *L) {
    lsession *s = kvl_check_session_open(L, 1);
    const kvgen_adapter *adapters[KVGEN_MAX_ADAPTERS];
    float scales[KVGEN_MAX_ADAPTERS];
    size_t n = kvgen_session_adapters(s->session, adapters, scales, KVGEN_MAX_ADAPTERS);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_createtable(L, 2, 0);
        push_adapter(L, (kvgen_adapter *)adapters[i], 0);
        lua_rawseti(L, -2, 1);
        lua_pushnumber(L, scales[i]);
        lua_rawseti(L, -2, 2);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* adapter:info() -> {name, path, alpha, max_rank, n_matrices, hash} */
static int adapter_info(lua_State *L) {
    ladapter *a = check_adapter(L, 1);
    kvgen_adapter_info info;
    kvgen_adapter_get_info(a->adapter, &info);
    static const out_field fields[] = {
        {"name", F_STR, offsetof(kvgen_adapter_info, name)},
        {"path", F_STR, offsetof(kvgen_adapter_info, path)},
        {"alpha", F_FLOAT, offsetof(kvgen_adapter_info, alpha)},
        {"max_rank", F_INT, offsetof(kvgen_adapter_info, max_rank)},
        {"n_matrices", F_INT, offsetof(kvgen_adapter_info, n_matrices)},
        {"hash", F_U64, offsetof(kvgen_adapter_info, hash)},
    };
    kvl_push_fields(L, &info, fields, N_FIELDS(fields));
    return 1;
}

/* adapter:close(): drops the handle's reference (sessions running it keep theirs) */
static int adapter_close(lua_State *L) {
    ladapter *a = kvl_check_udata(L, 1, ADAPTER_MT);
    kvgen_adapter *held = a->adapter;
    if (!held) return 0;
    a->adapter = NULL;
    push_handles(L); /* a later s:adapters() makes a new handle */
    if (lua_rawgetp(L, -1, held) == LUA_TUSERDATA && lua_touserdata(L, -1) == (void *)a) {
        lua_pushnil(L);
        lua_rawsetp(L, -3, held);
    }
    lua_pop(L, 2);
    kvgen_adapter_free(held);
    return 0;
}

static int adapter_tostring(lua_State *L) {
    ladapter *a = kvl_check_udata(L, 1, ADAPTER_MT);
    if (!a->adapter) {
        lua_pushliteral(L, ADAPTER_MT " (closed)");
        return 1;
    }
    kvgen_adapter_info info;
    kvgen_adapter_get_info(a->adapter, &info);
    lua_pushfstring(L, ADAPTER_MT " '%s' (%d matrices, rank %d) (%p)", info.name, info.n_matrices, info.max_rank,
                    (void *)a);
    return 1;
}

static const luaL_Reg adapter_methods[] = {
    {"info", adapter_info},
    {"close", adapter_close},
    {NULL, NULL},
};
static const luaL_Reg *const adapter_method_lists[] = {adapter_methods, NULL};
const kvl_type kvl_adapter_type = {ADAPTER_MT, adapter_method_lists, NULL, adapter_close, adapter_tostring, NULL};

const luaL_Reg kvl_model_adapter_methods[] = {
    {"load_adapter", model_load_adapter},
    {NULL, NULL},
};

const luaL_Reg kvl_session_adapter_methods[] = {
    {"set_adapters", session_set_adapters},
    {"adapters", session_adapters},
    {NULL, NULL},
};
