/*
 * lua_memory.c: kvgen.memory and kvgen.memory_load, the kvgen.Memory handle over kvgen.h's
 * memory store: texts with string fields and embedding vectors (Lua lists of numbers), searched
 * by cosine. Vectors and fields are checked here, so a bad one is an argument error naming the
 * element ("vector[3]: number expected, got string"); the C library's refusals raise
 * "kvgen: <message>".
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "kvgen_lua_internal.h"

typedef struct lmemory {
    kvgen_memory *mem; /* NULL once closed */
    int dim;
} lmemory;

static lmemory *check_memory(lua_State *L, int arg) {
    lmemory *m = kvl_check_udata(L, arg, MEMORY_MT);
    if (!m->mem) luaL_error(L, "attempt to use a closed " MEMORY_MT);
    return m;
}

static const char *const storage_names[] = {"f32", "f16", NULL};

typedef struct memory_opts {
    int dim, storage;
    uint64_t embedding_id;
} memory_opts;

static const opt_spec memory_specs[] = {
    {.key = "dim", .type = OPT_INT, .off = offsetof(memory_opts, dim), .lo = 1, .hi = 65536, .need = 1},
    {.key = "storage", .type = OPT_CHOICE, .off = offsetof(memory_opts, storage), .names = storage_names, .need = 1},
    {.key = "embedding_id", .type = OPT_U64, .off = offsetof(memory_opts, embedding_id)},
    {.key = "dim", .type = OPT_INT, .off = offsetof(memory_opts, dim), .lo = 0, .hi = 65536, .need = 2},
};

static lmemory *new_handle(lua_State *L) {
    lmemory *m = lua_newuserdatauv(L, sizeof *m, 0);
    m->mem = NULL;
    m->dim = 0;
    luaL_setmetatable(L, MEMORY_MT);
    return m;
}

/* kvgen.memory{dim = 384, storage = "f16", embedding_id = n} -> a kvgen.Memory */
static int l_memory(lua_State *L) {
    if (lua_type(L, 1) != LUA_TTABLE) kvl_type_error(L, 1, "options", "table");
    memory_opts o = {0};
    kvl_read_options(L, 1, memory_specs, N_SPECS(memory_specs), 1, &o, 0, NULL);
    if (o.dim == 0) kvl_option_error(L, 1, "dim", "required (the vectors' length, 1 to 65536)");
    lmemory *m = new_handle(L);
    kvgen_error err = {0};
    kvgen_memory_desc d = {.dim = o.dim, .storage = (kvgen_memory_storage)o.storage, .embedding_id = o.embedding_id};
    if (kvgen_memory_create(&d, &m->mem, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    m->dim = o.dim;
    return 1;
}

/* kvgen.memory_load(path [, {dim =, embedding_id =}]) -> a kvgen.Memory */
static int l_memory_load(lua_State *L) {
    const char *path = kvl_check_cstring_arg(L, 1, "path");
    memory_opts o = {0};
    kvl_read_options(L, 2, memory_specs, N_SPECS(memory_specs), 2, &o, 0, NULL);
    lmemory *m = new_handle(L);
    kvgen_error err = {0};
    kvgen_memory_desc d = {.dim = o.dim, .embedding_id = o.embedding_id};
    if (kvgen_memory_load(path, &d, &m->mem, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    kvgen_memory_info info;
    kvgen_memory_get_info(m->mem, &info);
    m->dim = info.dim;
    return 1;
}

/* The list of dim numbers at arg into a userdata left on the stack: finite, not all zero. */
static float *check_vector(lua_State *L, int arg, const lmemory *m) {
    if (lua_type(L, arg) != LUA_TTABLE) kvl_type_error(L, arg, "vector", "list of numbers");
    lua_Unsigned n = kvl_check_sequence(L, arg, arg, "vector");
    if (n != (lua_Unsigned)m->dim)
        kvl_arg_error(L, arg, lua_pushfstring(L, "vector: %I numbers, the store's dim is %d", (LUAI_UACINT)n, m->dim));
    float *v = lua_newuserdatauv(L, (size_t)m->dim * sizeof *v, 0);
    bool nonzero = false;
    for (int i = 0; i < m->dim; i++) {
        int t = lua_rawgeti(L, arg, i + 1);
        if (t != LUA_TNUMBER)
            kvl_arg_error(L, arg, lua_pushfstring(L, "vector[%d]: number expected, got %s", i + 1, kvl_push_got(L, -1)));
        lua_Number x = lua_tonumber(L, -1);
        if (!isfinite(x) || !isfinite((float)x))
            kvl_arg_error(L, arg,
                          lua_pushfstring(L, "vector[%d]: %s is not allowed (finite numbers only)", i + 1,
                                          kvl_push_number_text(L, x)));
        v[i] = (float)x;
        nonzero |= v[i] != 0;
        lua_pop(L, 1);
    }
    if (!nonzero) kvl_arg_error(L, arg, "vector: the zero vector has no direction");
    return v;
}

/* m:add(text, vector [, fields]) -> id; fields: {key = "value", ...} (string or number values) */
static int memory_add(lua_State *L) {
    lua_settop(L, 4); /* what the call pushes goes above its arguments */
    lmemory *m = check_memory(L, 1);
    const char *text = kvl_check_cstring_arg(L, 2, "text");
    float *v = check_vector(L, 3, m);
    size_t nf = 0;
    kvgen_memory_field *f = NULL;
    if (!lua_isnoneornil(L, 4)) {
        if (lua_type(L, 4) != LUA_TTABLE) kvl_type_error(L, 4, "fields", "table");
        lua_pushnil(L);
        while (lua_next(L, 4)) {
            nf++;
            lua_pop(L, 1);
        }
        if (nf > 64) kvl_arg_error(L, 4, lua_pushfstring(L, "fields: %d keys, at most 64", (int)nf));
        f = lua_newuserdatauv(L, (nf ? nf : 1) * sizeof *f, 0);
        lua_createtable(L, (int)nf, 0); /* keeps the values' texts alive */
        int keep = lua_gettop(L);
        size_t i = 0;
        lua_pushnil(L);
        while (lua_next(L, 4)) {
            if (lua_type(L, -2) != LUA_TSTRING || lua_rawlen(L, -2) == 0)
                kvl_arg_error(L, 4, lua_pushfstring(L, "fields: non-empty string keys expected, got the key %s",
                                                    kvl_push_key_text(L, -2)));
            int kt = lua_gettop(L) - 1; /* key at kt, value at kt + 1 */
            const char *key = kvl_check_cstring(L, kt, 4, "fields key");
            if (lua_type(L, kt + 1) != LUA_TSTRING && lua_type(L, kt + 1) != LUA_TNUMBER)
                kvl_arg_error(L, 4,
                              lua_pushfstring(L, "fields.%s: string expected, got %s", key, kvl_push_got(L, kt + 1)));
            lua_pushvalue(L, kt + 1); /* a number becomes its text on this copy, kept in `keep` */
            const char *what = lua_pushfstring(L, "fields.%s", key);
            const char *value = kvl_check_cstring(L, kt + 2, 4, what);
            lua_pushvalue(L, kt + 2);
            lua_rawseti(L, keep, (lua_Integer)i + 1);
            f[i].key = key;
            f[i].value = value;
            i++;
            lua_settop(L, kt);
        }
    }
    kvgen_error err = {0};
    uint64_t id = 0;
    if (kvgen_memory_add(m->mem, text, f, nf, v, (size_t)m->dim, &id, &err) != KVGEN_OK)
        return kvl_raise_status(L, &err);
    lua_pushinteger(L, (lua_Integer)id);
    return 1;
}

static uint64_t check_id(lua_State *L, int arg) {
    int isint = 0;
    lua_Integer id = lua_type(L, arg) == LUA_TNUMBER ? kvl_to_integer(L, arg, &isint) : 0;
    if (!isint) kvl_type_error(L, arg, "id", "integer");
    if (id < 1) kvl_arg_error(L, arg, lua_pushfstring(L, "id: %I is not an id (ids start at 1)", (LUAI_UACINT)id));
    return (uint64_t)id;
}

/* m:remove(id) -> true, or false when the store holds no such memory */
static int memory_remove(lua_State *L) {
    lmemory *m = check_memory(L, 1);
    uint64_t id = check_id(L, 2);
    lua_pushboolean(L, kvgen_memory_remove(m->mem, id, NULL) == KVGEN_OK);
    return 1;
}

int kvl_memory_count(lua_State *L) {
    lmemory *m = check_memory(L, 1);
    lua_pushinteger(L, (lua_Integer)kvgen_memory_count(m->mem));
    return 1;
}

static void push_entry(lua_State *L, const kvgen_memory_entry *e) {
    lua_createtable(L, 0, 4);
    lua_pushinteger(L, (lua_Integer)e->id);
    lua_setfield(L, -2, "id");
    lua_pushstring(L, e->text);
    lua_setfield(L, -2, "text");
    lua_createtable(L, 0, (int)e->n_fields);
    for (size_t i = 0; i < e->n_fields; i++) {
        lua_pushstring(L, e->fields[i].value);
        lua_setfield(L, -2, e->fields[i].key);
    }
    lua_setfield(L, -2, "fields");
}

/* m:get(id) -> {id=, text=, fields=, vector=} or nil */
static int memory_get(lua_State *L) {
    lua_settop(L, 2);
    lmemory *m = check_memory(L, 1);
    uint64_t id = check_id(L, 2);
    float *v = lua_newuserdatauv(L, (size_t)m->dim * sizeof *v, 0);
    kvgen_memory_entry e;
    if (kvgen_memory_get(m->mem, id, &e, v, (size_t)m->dim, NULL) != KVGEN_OK) {
        lua_pushnil(L);
        return 1;
    }
    push_entry(L, &e);
    lua_createtable(L, m->dim, 0);
    for (int i = 0; i < m->dim; i++) {
        lua_pushnumber(L, (lua_Number)v[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "vector");
    return 1;
}

typedef struct search_opts {
    size_t k;
    int where;
} search_opts;

static void read_where(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    if (lua_type(L, vi) != LUA_TTABLE)
        kvl_field_error(c, o, lua_pushfstring(L, "table {key = value} expected, got %s", kvl_push_got(L, vi)));
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, vi)) {
        n++;
        if (lua_type(L, -2) != LUA_TSTRING || lua_rawlen(L, -2) == 0)
            kvl_field_error(c, o, lua_pushfstring(L, "non-empty string key expected, got the key %s",
                                                  kvl_push_key_text(L, -2)));
        if (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER)
            kvl_field_error(c, o, lua_pushfstring(L, "value of '%s': string expected, got %s", lua_tostring(L, -2),
                                                  kvl_push_got(L, -1)));
        lua_pop(L, 1);
    }
    if (n != 1)
        kvl_field_error(c, o, lua_pushfstring(L, "exactly one key = value expected, got %d", n));
    *(int *)field = vi;
}

static const opt_spec search_specs[] = {
    {.key = "k", .type = OPT_SIZE, .off = offsetof(search_opts, k), .lo = 1, .hi = 1 << 20},
    {.key = "where", .type = OPT_CUSTOM, .off = offsetof(search_opts, where), .read = read_where},
};

/* m:search(vector [, {k = 5, where = {key = value}}]) -> { {id=, text=, score=, fields=}, ... } */
static int memory_search(lua_State *L) {
    lua_settop(L, 3);
    lmemory *m = check_memory(L, 1);
    float *q = check_vector(L, 2, m);
    (void)q;
    search_opts o = {.k = 5, .where = 0};
    kvl_read_options(L, 3, search_specs, N_SPECS(search_specs), 0, &o, 0, NULL);
    kvgen_memory_field where = {0};
    if (o.where) {
        lua_getfield(L, 3, "where");
        int wt = lua_gettop(L);
        lua_pushnil(L);
        lua_next(L, wt);          /* the one pair: key at wt + 1, value at wt + 2 */
        lua_pushvalue(L, wt + 2); /* a number becomes its text on this copy (wt + 3) */
        where.key = kvl_check_cstring(L, wt + 1, 3, "where key");
        where.value = kvl_check_cstring(L, wt + 3, 3, "where value");
    }
    kvgen_memory_hit *hits = lua_newuserdatauv(L, o.k * sizeof *hits, 0);
    size_t n = 0;
    kvgen_error err = {0};
    if (kvgen_memory_search(m->mem, q, (size_t)m->dim, o.k, o.where ? &where : NULL, hits, &n, &err) != KVGEN_OK)
        return kvl_raise_status(L, &err);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        kvgen_memory_entry e;
        if (kvgen_memory_get(m->mem, hits[i].id, &e, NULL, 0, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
        push_entry(L, &e);
        lua_pushnumber(L, (lua_Number)hits[i].score);
        lua_setfield(L, -2, "score");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* m:save(path): atomic (a failed save leaves the old file as it was) */
static int memory_save(lua_State *L) {
    lmemory *m = check_memory(L, 1);
    const char *path = kvl_check_cstring_arg(L, 2, "path");
    kvgen_error err = {0};
    if (kvgen_memory_save(m->mem, path, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    return 0;
}

static int memory_info(lua_State *L) {
    lmemory *m = check_memory(L, 1);
    kvgen_memory_info info;
    kvgen_memory_get_info(m->mem, &info);
    lua_createtable(L, 0, 7);
    lua_pushinteger(L, info.dim);
    lua_setfield(L, -2, "dim");
    lua_pushstring(L, storage_names[info.storage == KVGEN_MEMORY_F16]);
    lua_setfield(L, -2, "storage");
    lua_pushinteger(L, (lua_Integer)info.embedding_id);
    lua_setfield(L, -2, "embedding_id");
    lua_pushinteger(L, (lua_Integer)info.count);
    lua_setfield(L, -2, "count");
    lua_pushinteger(L, (lua_Integer)info.next_id);
    lua_setfield(L, -2, "next_id");
    lua_pushinteger(L, (lua_Integer)info.vector_bytes);
    lua_setfield(L, -2, "vector_bytes");
    lua_pushstring(L, info.isa);
    lua_setfield(L, -2, "isa");
    return 1;
}

static int memory_close(lua_State *L) {
    lmemory *m = kvl_check_udata(L, 1, MEMORY_MT);
    kvgen_memory_free(m->mem);
    m->mem = NULL;
    return 0;
}

static int memory_tostring(lua_State *L) {
    lmemory *m = kvl_check_udata(L, 1, MEMORY_MT);
    if (!m->mem)
        lua_pushliteral(L, MEMORY_MT " (closed)");
    else
        lua_pushfstring(L, MEMORY_MT " (%d memories of dim %d) (%p)", (int)kvgen_memory_count(m->mem), m->dim,
                        (void *)m);
    return 1;
}

static const luaL_Reg memory_methods[] = {
    {"add", memory_add},       {"remove", memory_remove}, {"count", kvl_memory_count}, {"get", memory_get},
    {"search", memory_search}, {"save", memory_save},     {"info", memory_info},   {"close", memory_close},
    {NULL, NULL},
};
static const luaL_Reg *const memory_method_lists[] = {memory_methods, NULL};
const kvl_type kvl_memory_type = {MEMORY_MT, memory_method_lists, NULL, memory_close, memory_tostring, NULL};

const luaL_Reg kvl_memory_functions[] = {
    {"memory", l_memory},
    {"memory_load", l_memory_load},
    {NULL, NULL},
};
