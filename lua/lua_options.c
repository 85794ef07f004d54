/*
 * lua_options.c: reading the script's arguments: argument errors that name the function,
 * strings without NUL bytes, lists, and the one reader of tables with named fields (options
 * tables, and tables inside arguments such as a chat template or a JSON field).
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kvgen_lua_internal.h"

/* Pushes what a number is, for messages: "1.5", "nan", "inf", "-inf", "3". */
const char *kvl_push_number_text(lua_State *L, lua_Number v) {
    if (isnan(v)) return lua_pushliteral(L, "nan");
    if (isinf(v)) return v > 0 ? lua_pushliteral(L, "inf") : lua_pushliteral(L, "-inf");
    char buf[64];
    snprintf(buf, sizeof buf, "%.14g", (double)v);
    return lua_pushstring(L, buf);
}

/* Pushes what the value at idx is, for "expected X, got Y" messages: the type, and the value
 * itself when it is a number ("number 1.5", "number nan"), so a bad number is named. */
const char *kvl_push_got(lua_State *L, int idx) {
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) != LUA_TNUMBER) return lua_pushstring(L, luaL_typename(L, idx));
    if (lua_isinteger(L, idx)) return lua_pushfstring(L, "number %I", (LUAI_UACINT)lua_tointeger(L, idx));
    kvl_push_number_text(L, lua_tonumber(L, idx));
    lua_pushfstring(L, "number %s", lua_tostring(L, -1));
    lua_remove(L, -2);
    return lua_tostring(L, -1);
}

/* Every argument error of the module goes through here (never luaL_argerror directly), so that
 * it names the function the script called. Lua names a function from the call that made it
 * ('submit' for s:submit(...)), but a function called from C (pcall(s.submit, s, ...), a host's
 * lua_call) has no such name, and luaL_argerror finds only functions of module tables ('?' for
 * every method): kvgen then names it from its own table ('kvgen.Session.submit'). */
int kvl_arg_error(lua_State *L, int arg, const char *msg) {
    lua_Debug ar;
    if (lua_getstack(L, 0, &ar) && lua_getinfo(L, "n", &ar) && ar.name == NULL && lua_checkstack(L, 4)) {
        lua_getinfo(L, "f", &ar); /* pushes the running function */
        if (lua_getfield(L, LUA_REGISTRYINDEX, NAMES_KEY) == LUA_TTABLE) {
            lua_pushvalue(L, -2);
            if (lua_rawget(L, -2) == LUA_TSTRING)
                return luaL_error(L, "bad argument #%d to '%s' (%s)", arg, lua_tostring(L, -1), msg);
        }
    }
    return luaL_argerror(L, arg, msg);
}

/* luaL_checkudata, with arg_error's function names */
void *kvl_check_udata(lua_State *L, int arg, const char *tname) {
    void *p = luaL_testudata(L, arg, tname);
    if (!p) {
        const char *got = luaL_getmetafield(L, arg, "__name") == LUA_TSTRING ? lua_tostring(L, -1)
                          : lua_type(L, arg) == LUA_TLIGHTUSERDATA      ? "light userdata"
                                                                         : luaL_typename(L, arg);
        kvl_arg_error(L, arg, lua_pushfstring(L, "%s expected, got %s", tname, got));
    }
    return p;
}

/* luaL_checkoption without a default, with arg_error's function names */
int kvl_check_option(lua_State *L, int arg, const char *const names[]) {
    if (lua_type(L, arg) != LUA_TSTRING)
        kvl_arg_error(L, arg, lua_pushfstring(L, "string expected, got %s", luaL_typename(L, arg)));
    const char *name = lua_tostring(L, arg);
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0) return i;
    return kvl_arg_error(L, arg, lua_pushfstring(L, "invalid option '%s'", name));
}

int kvl_type_error(lua_State *L, int arg, const char *name, const char *expected) {
    return kvl_arg_error(L, arg, lua_pushfstring(L, "%s: %s expected, got %s", name, expected, kvl_push_got(L, arg)));
}

/* Strings that reach the C API without their length (NUL-terminated: chat text, stop strings,
 * choices, paths, ...) must not contain a NUL byte, which would silently cut them: refused
 * here, the one place that checks it. `what` names the argument in the message. Text that
 * goes in with its length (prompts, tokenize) may hold any byte and is not checked. */
const char *kvl_check_cstring(lua_State *L, int idx, int arg, const char *what) {
    size_t len = 0;
    const char *s = lua_tolstring(L, idx, &len);
    const char *nul = s ? memchr(s, 0, len) : NULL;
    if (nul)
        kvl_arg_error(L, arg,
                      lua_pushfstring(L, "%s: contains a NUL byte at position %I (not allowed in this string)", what,
                                      (LUAI_UACINT)(nul - s + 1)));
    return s;
}

/* A string argument for the C API (see kvl_check_cstring): type and NUL checked. */
const char *kvl_check_cstring_arg(lua_State *L, int arg, const char *what) {
    if (lua_type(L, arg) != LUA_TSTRING) kvl_type_error(L, arg, what, "string");
    return kvl_check_cstring(L, arg, arg, what);
}

/* Pushes a table key for messages: 'name' for strings, the value for numbers, else the type. */
const char *kvl_push_key_text(lua_State *L, int idx) {
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) == LUA_TSTRING) return lua_pushfstring(L, "'%s'", lua_tostring(L, idx));
    if (lua_type(L, idx) == LUA_TNUMBER) {
        if (lua_isinteger(L, idx)) return lua_pushfstring(L, "%I", (LUAI_UACINT)lua_tointeger(L, idx));
        return kvl_push_number_text(L, lua_tonumber(L, idx));
    }
    return lua_pushstring(L, luaL_typename(L, idx));
}

/* The length of the list at idx, which must be a sequence: keys exactly 1..n. A map such as
 * {first = "a"} is refused rather than read as an empty list. */
lua_Unsigned kvl_check_sequence(lua_State *L, int idx, int arg, const char *what) {
    idx = lua_absindex(L, idx);
    lua_Unsigned n = lua_rawlen(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int isint = 0;
        lua_Integer k = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
        if (!isint || k < 1 || (lua_Unsigned)k > n)
            kvl_arg_error(L, arg,
                          lua_pushfstring(L, "%s: a list (keys 1..n) expected, got a table with the key %s", what,
                                          kvl_push_key_text(L, -1)));
    }
    return n;
}

/* Room for n more values on the stack: a C function is only promised LUA_MINSTACK (20), and
 * Lua does not check pushes beyond what it has (they would overwrite the heap). Every reader
 * of a script's tables asks for what it needs at its entry; the recursive JSON writer at each
 * level. */
void kvl_need_stack(lua_State *L, int n, const char *what) { luaL_checkstack(L, n, what); }

/* Integers only: unlike lua_tointegerx, strings such as "2" are refused (an id passed as text is
 * almost always a bug in the caller). Floats with an integral value are accepted. */
lua_Integer kvl_to_integer(lua_State *L, int idx, int *isint) {
    *isint = 0;
    if (lua_type(L, idx) != LUA_TNUMBER) return 0;
    return lua_tointegerx(L, idx, isint);
}

/* ---- tables with named fields (kvgen_lua_internal.h) ------------------------------------ */

/* True when the value at idx is the string `name` exactly (a key "top_k\0x" is not "top_k"). */
static int is_name(lua_State *L, int idx, const char *name) {
    size_t len = 0;
    const char *k = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, &len) : NULL;
    return k && len == strlen(name) && memcmp(k, name, len) == 0;
}

/* Field names read by the __index functions: one holding a NUL byte names no field. */
const char *kvl_index_key(lua_State *L) {
    size_t len = 0;
    if (lua_type(L, 2) != LUA_TSTRING && lua_type(L, 2) != LUA_TNUMBER)
        kvl_arg_error(L, 2, lua_pushfstring(L, "string expected, got %s", luaL_typename(L, 2)));
    const char *key = lua_tolstring(L, 2, &len);
    return strlen(key) == len ? key : "";
}

int kvl_option_error(lua_State *L, int arg, const char *key, const char *what) {
    return kvl_arg_error(L, arg, lua_pushfstring(L, "option '%s': %s", key, what));
}

const char *kvl_push_field_name(const opt_ctx *c, const opt_spec *o) {
    if (c->table) return lua_pushfstring(c->L, "%s.%s", c->table, o->key);
    return lua_pushfstring(c->L, "option '%s'", o->key);
}

int kvl_field_error(const opt_ctx *c, const opt_spec *o, const char *what) {
    const char *name = kvl_push_field_name(c, o);
    return kvl_arg_error(c->L, c->arg, lua_pushfstring(c->L, "%s: %s", name, what));
}

/* "<v> is out of range [lo, hi]" (also for NaN and infinities: "nan is out of range ...") */
static int range_error(const opt_ctx *c, const opt_spec *o, double v) {
    lua_State *L = c->L;
    kvl_push_number_text(L, v);
    kvl_push_number_text(L, o->flo);
    kvl_push_number_text(L, o->fhi);
    return kvl_field_error(c, o,
                           lua_pushfstring(L, "%s is out of range [%s, %s]", lua_tostring(L, -3), lua_tostring(L, -2),
                                           lua_tostring(L, -1)));
}

static int spec_active(const opt_spec *o, unsigned mode) { return (o->need & ~mode) == 0; }

const char *kvl_read_string(const opt_ctx *c, const opt_spec *o, int vi) {
    lua_State *L = c->L;
    if (lua_type(L, vi) != LUA_TSTRING)
        kvl_field_error(c, o, lua_pushfstring(L, "string expected, got %s", kvl_push_got(L, vi)));
    const char *v = kvl_check_cstring(L, vi, c->arg, kvl_push_field_name(c, o));
    lua_pop(L, 1);
    return v;
}

static lua_Integer read_integer(const opt_ctx *c, const opt_spec *o, int vi, lua_Integer lo, lua_Integer hi) {
    lua_State *L = c->L;
    int isint = 0;
    lua_Integer v = kvl_to_integer(L, vi, &isint);
    if (!isint) kvl_field_error(c, o, lua_pushfstring(L, "integer expected, got %s", kvl_push_got(L, vi)));
    if (v < lo || v > hi)
        kvl_field_error(c, o,
                        lua_pushfstring(L, "%I is out of range [%I, %I]", (LUAI_UACINT)v, (LUAI_UACINT)lo,
                                        (LUAI_UACINT)hi));
    return v;
}

static void read_value(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    switch (o->type) {
    case OPT_BOOL:
    case OPT_FLAG:
        if (lua_type(L, vi) != LUA_TBOOLEAN)
            kvl_field_error(c, o, lua_pushfstring(L, "boolean expected, got %s", kvl_push_got(L, vi)));
        if (o->type == OPT_BOOL) *(int *)field = lua_toboolean(L, vi);
        else if (lua_toboolean(L, vi)) *(unsigned *)field |= o->flag;
        break;
    case OPT_INT: *(int *)field = (int)read_integer(c, o, vi, o->lo, o->hi); break;
    case OPT_SIZE: *(size_t *)field = (size_t)read_integer(c, o, vi, o->lo, o->hi); break;
    case OPT_U64: *(uint64_t *)field = (uint64_t)read_integer(c, o, vi, LUA_MININTEGER, LUA_MAXINTEGER); break;
    case OPT_FLOAT: {
        if (lua_type(L, vi) != LUA_TNUMBER)
            kvl_field_error(c, o, lua_pushfstring(L, "number expected, got %s", kvl_push_got(L, vi)));
        double v = (double)lua_tonumber(L, vi);
        if (!(v >= o->flo && v <= o->fhi)) range_error(c, o, v); /* also NaN */
        *(float *)field = (float)v;
        break;
    }
    case OPT_STRING: *(const char **)field = kvl_read_string(c, o, vi); break;
    case OPT_CHOICE: {
        const char *s = kvl_read_string(c, o, vi);
        for (int i = 0; o->names[i]; i++)
            if (strcmp(o->names[i], s) == 0) {
                *(int *)field = i;
                return;
            }
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        for (int i = 0; o->names[i]; i++) {
            if (i) luaL_addstring(&b, ", ");
            luaL_addchar(&b, '\'');
            luaL_addstring(&b, o->names[i]);
            luaL_addchar(&b, '\'');
        }
        luaL_pushresult(&b);
        kvl_field_error(c, o, lua_pushfstring(L, "'%s' is not one of %s", s, lua_tostring(L, -1)));
        break;
    }
    case OPT_FUNCTION:
        if (!lua_isfunction(L, vi))
            kvl_field_error(c, o, lua_pushfstring(L, "function expected, got %s", luaL_typename(L, vi)));
        *(int *)field = 1;
        break;
    case OPT_CUSTOM: o->read(c, o, vi, field); break;
    }
}

/* Refuses a key of the table at idx that no row of `specs` active in `mode` has. */
static void check_keys(const opt_ctx *c, int idx, const opt_spec *specs, size_t n, unsigned mode) {
    lua_State *L = c->L;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int ok = 0;
        for (size_t i = 0; i < n && !ok; i++) ok = spec_active(&specs[i], mode) && is_name(L, -1, specs[i].key);
        if (ok) continue;
        if (!c->table) {
            if (lua_type(L, -1) == LUA_TSTRING) {
                kvl_check_cstring(L, lua_gettop(L), c->arg, "option name");
                kvl_arg_error(L, c->arg, lua_pushfstring(L, "unknown option '%s'", lua_tostring(L, -1)));
            }
            kvl_arg_error(L, c->arg,
                          lua_pushfstring(L, "unknown option [%s] (options are named fields)",
                                          kvl_push_key_text(L, -1)));
        }
        if (lua_type(L, -1) == LUA_TSTRING) {
            int ki = lua_gettop(L);
            kvl_check_cstring(L, ki, c->arg, lua_pushfstring(L, "%s field name", c->table));
            lua_settop(L, ki);
        }
        int ki = lua_gettop(L);
        const char *key = kvl_push_key_text(L, ki);
        luaL_Buffer b; /* " (a, b, c)": the known fields, when c lists them */
        luaL_buffinit(L, &b);
        for (size_t i = 0; i < n && c->list_keys; i++) {
            luaL_addstring(&b, i ? ", " : " (");
            luaL_addstring(&b, specs[i].key);
        }
        if (c->list_keys) luaL_addchar(&b, ')');
        luaL_pushresult(&b);
        kvl_arg_error(L, c->arg, lua_pushfstring(L, "%s: unknown field %s%s", c->table, key, lua_tostring(L, -1)));
    }
}

/* Checks the keys, then reads the rows in their order (so the first bad one is reported). */
static void read_table(const opt_ctx *c, int idx, const opt_spec *specs, size_t n, unsigned mode, void *dest) {
    lua_State *L = c->L;
    check_keys(c, idx, specs, n, mode);
    for (size_t i = 0; i < n; i++) {
        if (!spec_active(&specs[i], mode)) continue;
        int top = lua_gettop(L);
        if (lua_getfield(L, idx, specs[i].key) != LUA_TNIL || specs[i].required)
            read_value(c, &specs[i], top + 1, (char *)dest + specs[i].off);
        lua_settop(L, top);
    }
}

void kvl_read_options(lua_State *L, int arg, const opt_spec *specs, size_t n, unsigned mode, void *dest, int anchor,
                      const kvgen_model *model) {
    if (lua_isnoneornil(L, arg)) return;
    if (!lua_istable(L, arg)) kvl_type_error(L, arg, "options", "table");
    kvl_need_stack(L, 24, "reading an options table");
    opt_ctx c = {L, arg, anchor ? lua_absindex(L, anchor) : 0, model, NULL, 0};
    read_table(&c, arg, specs, n, mode, dest);
}

void kvl_read_fields(const opt_ctx *c, int idx, const opt_spec *specs, size_t n, void *dest) {
    kvl_need_stack(c->L, 24, c->table);
    read_table(c, lua_absindex(c->L, idx), specs, n, 0, dest);
}

void kvl_anchor_top(const opt_ctx *c) { luaL_ref(c->L, c->anchor); }

/* ---- lists of strings ------------------------------------------------------------------- */

/* Pushes a const char* array of the strings in the list at `idx` (anchored in the table at
 * `anchor`, which also keeps the strings alive). The list must be a sequence of non-empty
 * strings without NUL bytes (the C API takes them NUL-terminated). */
const char *const *kvl_string_list(lua_State *L, int idx, int arg, const char *what, int anchor, int *n_out) {
    idx = lua_absindex(L, idx);
    kvl_need_stack(L, 8, what);
    lua_Unsigned n = kvl_check_sequence(L, idx, arg, what);
    if (n > INT_MAX / 2) kvl_arg_error(L, arg, lua_pushfstring(L, "%s: too many entries", what));
    const char **list = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *list, 0);
    luaL_ref(L, anchor);
    for (lua_Unsigned i = 0; i < n; i++) {
        if (lua_rawgeti(L, idx, (lua_Integer)i + 1) != LUA_TSTRING || lua_rawlen(L, -1) == 0)
            kvl_arg_error(L, arg,
                          lua_pushfstring(L, "%s[%I]: non-empty string expected, got %s", what, (LUAI_UACINT)(i + 1),
                                          lua_type(L, -1) == LUA_TSTRING ? "an empty string" : kvl_push_got(L, -1)));
        int vi = lua_gettop(L);
        list[i] = kvl_check_cstring(L, vi, arg, lua_pushfstring(L, "%s[%I]", what, (LUAI_UACINT)(i + 1)));
        lua_settop(L, vi);
        luaL_ref(L, anchor); /* pops it; the anchor keeps it */
    }
    *n_out = (int)n;
    return list;
}
