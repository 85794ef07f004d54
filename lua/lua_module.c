/*
 * lua_module.c: the module's frame: kvgen's errors raised in Lua (kvgen.last_error), structs
 * handed to Lua as tables (out_field rows), the handle types' metatables, and the two entry
 * points of kvgen_lua.h (luaopen_kvgen, kvgen_lua_push_model).
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
 * Errors: bad arguments raise through kvl_arg_error ("bad argument #1 to 'prefill' (ids[3]:
 * integer expected, got string)"); failures inside kvgen raise the string "kvgen: <message>"
 * and record the status name ("context_full", "io", ...) for kvgen.last_error().
 *
 * The files of the module (one private header, kvgen_lua_internal.h): lua_options.c reads the
 * script's arguments and options tables; lua_model.c the model, its tokenizer and kvgen.load;
 * lua_session.c sessions, their sampler and chat template; lua_generate.c generation (prompt,
 * chat, streams, constraints, choose); lua_jobs.c jobs on the worker and kvgen.poll;
 * lua_logger.c kvgen.set_logger; lua_json.c Lua tables to JSON text and back; lua_memory.c the
 * memory store (kvgen.memory); lua_adapter.c LoRA adapters (model:load_adapter, the sessions'
 * adapters lists).
 */
#include <stddef.h>
#include <string.h>

#include "kvgen_lua_internal.h"

/* ---- errors ----------------------------------------------------------------------------- */

static void set_last_error(lua_State *L, const char *code, const char *message) {
    lua_createtable(L, 0, 2);
    lua_pushstring(L, code);
    lua_setfield(L, -2, "code");
    lua_pushstring(L, message);
    lua_setfield(L, -2, "message");
    lua_setfield(L, LUA_REGISTRYINDEX, LAST_ERROR_KEY);
}

int kvl_raise_status(lua_State *L, const kvgen_error *err) {
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

/* ---- result tables --------------------------------------------------------------------- *
 * Structs the C API fills are handed to Lua as tables, one out_field row per field. */

void kvl_push_field(lua_State *L, const void *base, const out_field *f) {
    const char *p = (const char *)base + f->off;
    switch (f->type) {
    case F_INT: lua_pushinteger(L, *(const int *)(const void *)p); break;
    case F_U32: lua_pushinteger(L, (lua_Integer)*(const uint32_t *)(const void *)p); break;
    case F_U64: lua_pushinteger(L, (lua_Integer)*(const uint64_t *)(const void *)p); break;
    case F_SIZE: lua_pushinteger(L, (lua_Integer)*(const size_t *)(const void *)p); break;
    case F_FLOAT: lua_pushnumber(L, *(const float *)(const void *)p); break;
    case F_DOUBLE: lua_pushnumber(L, *(const double *)(const void *)p); break;
    case F_MS: {
        double ms = *(const double *)(const void *)p;
        if (ms < 0) lua_pushnil(L);
        else lua_pushnumber(L, ms);
        break;
    }
    case F_BOOL: lua_pushboolean(L, *(const int *)(const void *)p != 0); break;
    case F_STR: lua_pushstring(L, *(const char *const *)(const void *)p); break;
    case F_CHARS: lua_pushstring(L, p); break;
    case F_TOKEN: {
        int32_t t = *(const int32_t *)(const void *)p;
        if (t < 0) lua_pushnil(L);
        else lua_pushinteger(L, t);
        break;
    }
    }
}

/* Sets the n fields of the struct at `base` in the table on top of the stack. */
static void set_fields(lua_State *L, const void *base, const out_field *f, size_t n) {
    for (size_t i = 0; i < n; i++) {
        kvl_push_field(L, base, &f[i]);
        lua_setfield(L, -2, f[i].name);
    }
}

void kvl_push_fields(lua_State *L, const void *base, const out_field *f, size_t n) {
    lua_createtable(L, 0, (int)n);
    set_fields(L, base, f, n);
}

void *kvl_push_box(lua_State *L, size_t size, const char *mt, lua_CFunction gc) {
    void *box = lua_newuserdatauv(L, size, 0);
    memset(box, 0, size);
    if (luaL_newmetatable(L, mt)) {
        lua_pushcfunction(L, gc);
        lua_setfield(L, -2, "__gc");
    }
    lua_setmetatable(L, -2);
    return box;
}

/* ---- module ----------------------------------------------------------------------------- */

/* kvgen.type(x) -> "model", "session", "stream", "job", "detokenizer", "closed model",
 * "closed session", "closed stream" (finished), "closed job", "memory", "adapter" (and their
 * closed forms), or nil */
static int l_type(lua_State *L) {
    if (lua_type(L, 1) == LUA_TNONE) kvl_arg_error(L, 1, "value expected");
    lmodel *m = luaL_testudata(L, 1, MODEL_MT);
    lsession *s = luaL_testudata(L, 1, SESSION_MT);
    if (m)
        lua_pushstring(L, m->model ? "model" : "closed model");
    else if (s)
        lua_pushstring(L, s->session ? "session" : "closed session");
    else if (luaL_testudata(L, 1, STREAM_MT))
        lua_pushstring(L, ((lstream *)lua_touserdata(L, 1))->gen ? "stream" : "closed stream");
    else if (luaL_testudata(L, 1, JOB_MT))
        lua_pushstring(L, ((ljob *)lua_touserdata(L, 1))->job ? "job" : "closed job");
    else if (luaL_testudata(L, 1, MEMORY_MT))
        lua_pushstring(L, *(void **)lua_touserdata(L, 1) ? "memory" : "closed memory");
    else if (luaL_testudata(L, 1, ADAPTER_MT))
        lua_pushstring(L, *(void **)lua_touserdata(L, 1) ? "adapter" : "closed adapter");
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
#define DI(name, type, field) {name, type, offsetof(kvgen_device_info, field)}
    static const out_field fields[] = {
        DI("index", F_INT, index),
        DI("name", F_CHARS, name),
        DI("vendor_id", F_U32, vendor_id),
        DI("device_id", F_U32, device_id),
        DI("device_local_bytes", F_U64, device_local_bytes),
        DI("host_visible_device_local", F_BOOL, host_visible_device_local),
        DI("shader_float16", F_BOOL, shader_float16),
        DI("storage_16bit", F_BOOL, storage_16bit),
        DI("storage_8bit", F_BOOL, storage_8bit),
        DI("subgroup_size", F_U32, subgroup_size),
        DI("subgroup_arithmetic", F_BOOL, subgroup_arithmetic),
        DI("max_shared_memory", F_U32, max_shared_memory),
        DI("max_storage_buffer_range", F_U64, max_storage_buffer_range),
        DI("max_allocation_size", F_U64, max_allocation_size),
        DI("compute_units", F_U32, compute_units),
        DI("coopmat_m", F_U32, coopmat_m),
        DI("coopmat_n", F_U32, coopmat_n),
        DI("coopmat_k", F_U32, coopmat_k),
        DI("int_dot", F_BOOL, int_dot),
        DI("int_dot_fast", F_BOOL, int_dot_fast),
        DI("default", F_BOOL, is_default),
    };
#undef DI
    kvgen_error err = {0};
    int count = 0;
    if (kvgen_devices(NULL, 0, &count, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    kvgen_device_info *dev = lua_newuserdatauv(L, (size_t)(count > 0 ? count : 1) * sizeof *dev, 0);
    if (count > 0 && kvgen_devices(dev, count, &count, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    lua_createtable(L, count, 0);
    for (int i = 0; i < count; i++) {
        const kvgen_device_info *d = &dev[i];
        kvl_push_fields(L, d, fields, N_FIELDS(fields));
        lua_pushstring(L, d->type ? d->type : "other");
        lua_setfield(L, -2, "type");
        /* VK_MAKE_API_VERSION packing: variant 3 bits, major 7, minor 10, patch 12 */
        lua_pushfstring(L, "%d.%d.%d", (int)((d->api_version >> 22) & 0x7f), (int)((d->api_version >> 12) & 0x3ff),
                        (int)(d->api_version & 0xfff));
        lua_setfield(L, -2, "api_version");
        lua_rawseti(L, -2, i + 1);
    }
#else
    lua_newtable(L);
#endif
    return 1;
}

/* registry[NAMES_KEY][fn] = "<prefix>.<name>" (kvl_arg_error's names) */
static void name_function(lua_State *L, lua_CFunction fn, const char *prefix, const char *name) {
    luaL_getsubtable(L, LUA_REGISTRYINDEX, NAMES_KEY);
    lua_pushcfunction(L, fn);
    lua_pushfstring(L, "%s.%s", prefix, name);
    lua_rawset(L, -3);
    lua_pop(L, 1);
}

static void name_functions(lua_State *L, const luaL_Reg *fns, const char *prefix) {
    for (; fns->name; fns++) name_function(L, fns->func, prefix, fns->name);
}

/* One metatable per type: __index is a function (upvalue: the methods table) when the type
 * has fields as well as methods, else the methods table itself. */
static void new_type(lua_State *L, const kvl_type *t) {
    /* metamethods first: a method that is also one (close, next) is named as the method */
    if (t->index) name_function(L, t->index, t->name, "__index");
    if (t->close) name_function(L, t->close, t->name, "__close");
    name_function(L, t->tostring, t->name, "__tostring");
    if (t->call) name_function(L, t->call, t->name, "__call");
    for (const luaL_Reg *const *m = t->methods; *m; m++) name_functions(L, *m, t->name);
    luaL_newmetatable(L, t->name);
    lua_createtable(L, 0, 16);
    for (const luaL_Reg *const *m = t->methods; *m; m++) luaL_setfuncs(L, *m, 0);
    if (t->index) {
        lua_pushcclosure(L, t->index, 1);
    }
    lua_setfield(L, -2, "__index");
    if (t->close) {
        lua_pushcfunction(L, t->close);
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, "__gc");
        lua_setfield(L, -2, "__close");
    }
    lua_pushcfunction(L, t->tostring);
    lua_setfield(L, -2, "__tostring");
    if (t->call) {
        lua_pushcfunction(L, t->call);
        lua_setfield(L, -2, "__call");
    }
    lua_pop(L, 1);
}

static const luaL_Reg module_functions[] = {
    {"set_logger", kvl_set_logger},
    {"load", kvl_load},
    {"type", l_type},
    {"devices", l_devices},
    {"last_error", l_last_error},
    {"poll", kvl_poll},
    {"pipeline_cache_path", kvl_pipeline_cache_path},
    {NULL, NULL},
};

/* The metatables and per-state tables; idempotent (luaopen_kvgen and kvgen_lua_push_model). */
static void register_types(lua_State *L) {
    kvl_ensure_state(L);
    if (luaL_getmetatable(L, JOB_MT) != LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    lua_pop(L, 1);
    new_type(L, &kvl_model_type);
    new_type(L, &kvl_session_type);
    new_type(L, &kvl_detok_type);
    new_type(L, &kvl_stream_type);
    new_type(L, &kvl_memory_type);
    new_type(L, &kvl_adapter_type);
    luaL_getmetatable(L, MEMORY_MT); /* #store */
    lua_pushcfunction(L, kvl_memory_count);
    lua_setfield(L, -2, "__len");
    lua_pop(L, 1);
    new_type(L, &kvl_job_type); /* last: its metatable says the others are made */
}

KVGEN_LUA_API void kvgen_lua_push_model(lua_State *L, kvgen_model *model) {
    luaL_checkversion(L);
    register_types(L);
    lmodel *m = lua_newuserdatauv(L, sizeof *m, 0);
    m->model = NULL;
    luaL_setmetatable(L, MODEL_MT);
    kvgen_model_retain(model); /* the handle's own reference, dropped by its close */
    m->model = model;
}

KVGEN_LUA_API int luaopen_kvgen(lua_State *L) {
    luaL_checkversion(L);
    register_types(L);
    name_functions(L, module_functions, "kvgen");
    name_functions(L, kvl_memory_functions, "kvgen");
    luaL_newlib(L, module_functions);
    luaL_setfuncs(L, kvl_memory_functions, 0);
    lua_pushstring(L, kvgen_version());
    lua_setfield(L, -2, "version");
    lua_pushlightuserdata(L, NULL); /* JSON null in schema values (and in schema tables) */
    lua_setfield(L, -2, "null");
    return 1;
}
