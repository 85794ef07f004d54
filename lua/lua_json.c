/*
 * lua_json.c: JSON for schemas: a Lua table written as JSON text, and generated JSON text read
 * back as Lua values, both through kvgen's JSON codec (kvg_json.h). What is the module's own:
 * the walk of the script's table (raw reads only, the key order, kvgen.null, a depth bound, a
 * table inside itself refused naming both paths, messages naming the option and the path), and
 * numbers read back as Lua integers where their text is one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvg_json.h"
#include "kvgen_lua_internal.h"

/* How deep a schema table may nest, and a JSON value read back: as deep as kvgen takes a schema
 * given as JSON text (core/generate/schema.c). Each level holds a few stack slots of the
 * writer (checked with lua_checkstack) and one C frame. */
#define JSON_MAX_DEPTH 64

#define JSON_BOX_MT "kvgen.JsonBox"

/* The codec's memory while Lua code may raise (a bad value in the script's table, Lua running
 * out of memory): held by a userdata whose __gc frees it, so an error leaves nothing behind. */
typedef struct json_box {
    kvg_buf text;   /* the JSON text being written */
    kvg_json *tree; /* the value being read back */
} json_box;

static void json_box_free(json_box *x) {
    kvg_free(x->text.p);
    kvg_json_free(x->tree);
    memset(x, 0, sizeof *x);
}

static int json_box_gc(lua_State *L) {
    json_box_free(lua_touserdata(L, 1));
    return 0;
}

static json_box *push_box(lua_State *L) { return kvl_push_box(L, sizeof(json_box), JSON_BOX_MT, json_box_gc); }

/* The text being written (in a box on the stack) and `seen` (a table index): the tables being
 * written, each with its path, so that a table inside itself is refused by name. */
typedef struct jbuf {
    lua_State *L;
    kvg_buf *out;
    int seen;
    const char *name; /* the option or argument written, for messages */
} jbuf;

/* the codec's writers' status: out of memory raises Lua's memory error */
static void jb_ok(jbuf *b, int ok) {
    if (!ok) luaL_error(b->L, "not enough memory");
}
static void jb_str(jbuf *b, const char *s) { jb_ok(b, kvg_buf_add(b->out, s, strlen(s))); }
static void jb_char(jbuf *b, char ch) { jb_ok(b, kvg_buf_add(b->out, &ch, 1)); }

static void json_error(jbuf *b, const opt_ctx *c, const char *path, const char *what) {
    if (c->table) kvl_arg_error(b->L, c->arg, lua_pushfstring(b->L, "%s at %s%s", what, b->name, path));
    kvl_option_error(b->L, c->arg, b->name, lua_pushfstring(b->L, "%s at %s%s", what, b->name, path));
}

static void json_string(jbuf *b, const char *s, size_t n) { jb_ok(b, kvg_json_write_string(b->out, s, n) == 0); }

/* keys of the table at idx whose values are to be written as an array when the table is empty */
static int empty_is_array(const char *key) {
    static const char *const k[] = {"required", "enum", "anyOf", "oneOf", "examples", "type", NULL};
    for (int i = 0; key && k[i]; i++)
        if (strcmp(key, k[i]) == 0) return 1;
    return 0;
}

static int key_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Writes the value at idx as JSON into b; every level leaves the stack as it found it. `path`
 * names the value in messages; `order` (a table index, or 0): the keys to write first, in its
 * order. */
static void lua_to_json(lua_State *L, const opt_ctx *c, int idx, jbuf *b, const char *path, const char *key,
                        int order, int depth);

/* The table at idx (not being written already), as a JSON array or object. Only raw accesses:
 * no metamethod of the script's runs while the table is walked. */
static void json_table_items(lua_State *L, const opt_ctx *c, int idx, jbuf *b, const char *path, const char *key,
                             int order, int depth) {
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx), count = 0;
    int is_array = 1;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        count++;
        if (!lua_isinteger(L, -2) || lua_tointeger(L, -2) < 1 || lua_tointeger(L, -2) > n) is_array = 0;
        else if (lua_type(L, -2) != LUA_TNUMBER) is_array = 0;
        if (lua_type(L, -2) != LUA_TSTRING && !(lua_isinteger(L, -2)))
            json_error(b, c, path, lua_pushfstring(L, "a %s key cannot be JSON", luaL_typename(L, -2)));
        lua_pop(L, 1);
    }
    if (count == 0) is_array = empty_is_array(key);
    if (is_array && count == n && count > 0) {
        jb_char(b, '[');
        for (lua_Integer i = 1; i <= n; i++) {
            if (i > 1) jb_char(b, ',');
            lua_rawgeti(L, idx, i);
            const char *sub = lua_pushfstring(L, "%s[%I]", path, (LUAI_UACINT)i);
            lua_insert(L, -2);
            lua_to_json(L, c, lua_gettop(L), b, sub, NULL, 0, depth + 1);
            lua_pop(L, 2);
        }
        jb_char(b, ']');
        return;
    }
    if (count == 0) {
        jb_str(b, is_array ? "[]" : "{}");
        return;
    }
    /* an object: keys from `order` first (a schema's required list), then the others sorted */
    const char **keys = lua_newuserdatauv(L, (size_t)count * sizeof *keys, 0);
    int keys_idx = lua_gettop(L);
    lua_Integer k = 0, first = 0;
    if (order)
        for (lua_Integer i = 1; i <= (lua_Integer)lua_rawlen(L, order); i++) {
            if (lua_rawgeti(L, order, i) == LUA_TSTRING) {
                lua_pushvalue(L, -1);
                int present = lua_rawget(L, idx) != LUA_TNIL;
                lua_pop(L, 1);
                int dup = 0;
                for (lua_Integer j = 0; j < k; j++) dup |= strcmp(keys[j], lua_tostring(L, -1)) == 0;
                if (present && !dup) keys[k++] = lua_tostring(L, -1); /* the string stays in `order` */
            }
            lua_pop(L, 1);
        }
    first = k;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING) {
            lua_pop(L, 1);
            json_error(b, c, path, "a table mixing list items and named keys cannot be JSON");
        }
        const char *name = lua_tostring(L, -1);
        if (strlen(name) != lua_rawlen(L, -1))
            json_error(b, c, path,
                       lua_pushfstring(L, "the key '%s' holds a NUL byte (not allowed in a schema key)", name));
        int seen = 0;
        for (lua_Integer j = 0; j < first; j++) seen |= strcmp(keys[j], name) == 0;
        if (!seen) keys[k++] = name; /* the key stays in the table */
    }
    qsort(keys + first, (size_t)(k - first), sizeof *keys, key_cmp);
    int req = 0;
    lua_pushliteral(L, "required");
    if (lua_rawget(L, idx) == LUA_TTABLE) req = lua_gettop(L);
    jb_char(b, '{');
    for (lua_Integer i = 0; i < k; i++) {
        if (i) jb_char(b, ',');
        json_string(b, keys[i], strlen(keys[i]));
        jb_char(b, ':');
        lua_pushstring(L, keys[i]);
        lua_rawget(L, idx);
        const char *sub = lua_pushfstring(L, "%s.%s", path, keys[i]);
        lua_insert(L, -2);
        /* a schema's properties: in the order of its required list */
        int ord = strcmp(keys[i], "properties") == 0 ? req : 0;
        lua_to_json(L, c, lua_gettop(L), b, sub, keys[i], ord, depth + 1);
        lua_pop(L, 2);
    }
    jb_char(b, '}');
    lua_settop(L, keys_idx - 1);
}

/* The table at idx, marked as being written while its items are (b->seen[table] = its path). */
static void json_table(lua_State *L, const opt_ctx *c, int idx, jbuf *b, const char *path, const char *key,
                       int order, int depth) {
    lua_pushvalue(L, idx);
    if (lua_rawget(L, b->seen) == LUA_TSTRING)
        json_error(b, c, path,
                   lua_pushfstring(L, "a table that contains itself cannot be JSON (the table at schema%s)",
                                   lua_tostring(L, -1)));
    lua_pop(L, 1);
    lua_pushvalue(L, idx);
    lua_pushstring(L, path);
    lua_rawset(L, b->seen);
    json_table_items(L, c, idx, b, path, key, order, depth);
    lua_pushvalue(L, idx);
    lua_pushnil(L);
    lua_rawset(L, b->seen);
}

static void lua_to_json(lua_State *L, const opt_ctx *c, int idx, jbuf *b, const char *path, const char *key,
                        int order, int depth) {
    if (depth > JSON_MAX_DEPTH)
        json_error(b, c, path,
                   lua_pushfstring(L, "nested deeper than %d levels (the most kvgen takes)", JSON_MAX_DEPTH));
    if (!lua_checkstack(L, 16)) json_error(b, c, path, "nested too deep for the Lua stack");
    switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN: jb_str(b, lua_toboolean(L, idx) ? "true" : "false"); break;
    case LUA_TNUMBER:
        /* Numbers keep their own format, not kvg_json_write_number's: the schema compiler writes
         * a const's or enum's number as its text, so this text is what the model generates
         * (0.1 as 0.10000000000000001), and an integer keeps all 64 bits. */
        if (lua_isinteger(L, idx)) {
            char t[32];
            snprintf(t, sizeof t, "%lld", (long long)lua_tointeger(L, idx));
            jb_str(b, t);
        } else {
            double v = lua_tonumber(L, idx);
            if (v != v || v == HUGE_VAL || v == -HUGE_VAL) json_error(b, c, path, "a NaN or infinity cannot be JSON");
            char t[40];
            snprintf(t, sizeof t, "%.17g", v);
            jb_str(b, t);
        }
        break;
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        json_string(b, s, n);
        break;
    }
    case LUA_TTABLE: json_table(L, c, idx, b, path, key, order, depth); break;
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, idx) == NULL) { /* kvgen.null */
            jb_str(b, "null");
            break;
        }
        /* fall through */
    default: json_error(b, c, path, lua_pushfstring(L, "a %s cannot be JSON", luaL_typename(L, idx)));
    }
}

void kvl_schema_to_json(const opt_ctx *c) { kvl_table_to_json(c, "schema"); }

void kvl_table_to_json(const opt_ctx *c, const char *name) {
    lua_State *L = c->L;
    int t = lua_gettop(L);
    json_box *x = push_box(L);
    lua_newtable(L);
    jbuf b = {L, &x->text, t + 2, name};
    lua_to_json(L, c, t, &b, "", NULL, 0, 0);
    lua_pushlstring(L, x->text.p, x->text.n);
    lua_replace(L, t);
    json_box_free(x);
    lua_settop(L, t);
}

/* ---- JSON text read back ------------------------------------------------------------------ */

/* Pushes the value v (0: the Lua stack is full). Objects become tables with string keys, arrays
 * lists, null kvgen.null; a number is read from its text as Lua reads one, so "3" is the integer
 * 3 and "3.0" a float. */
static int push_value(lua_State *L, const kvg_json *v) {
    if (!lua_checkstack(L, 8)) return 0;
    switch (v->type) {
    case KVG_JSON_NULL: lua_pushlightuserdata(L, NULL); break;
    case KVG_JSON_FALSE:
    case KVG_JSON_TRUE: lua_pushboolean(L, v->type == KVG_JSON_TRUE); break;
    case KVG_JSON_NUMBER: /* the text (KVG_JSON_NUMBER_TEXT); Lua reads at most 200 bytes of one */
        if (lua_stringtonumber(L, v->str) == 0) lua_pushnumber(L, v->number);
        break;
    case KVG_JSON_STRING: lua_pushlstring(L, v->str, v->len); break;
    case KVG_JSON_ARRAY:
    case KVG_JSON_OBJECT: {
        int obj = v->type == KVG_JSON_OBJECT;
        lua_createtable(L, obj ? 0 : (int)v->n, obj ? (int)v->n : 0);
        lua_Integer i = 0;
        for (const kvg_json *item = v->child; item; item = item->next) {
            if (obj) lua_pushlstring(L, item->key, item->key_len);
            if (!push_value(L, item)) return 0;
            if (obj) lua_rawset(L, -3);
            else lua_rawseti(L, -2, ++i);
        }
        break;
    }
    }
    return 1;
}

/* Pushes the value of the JSON text (generated under a schema: valid, its strings as the model
 * wrote them), or nil when it is not one. */
void kvl_push_json_value(lua_State *L, const char *text, size_t len) {
    int top = lua_gettop(L);
    json_box *x = push_box(L);
    x->tree = kvg_json_parse_ex(text, len, JSON_MAX_DEPTH, KVG_JSON_ANY_BYTES | KVG_JSON_NUMBER_TEXT, NULL, NULL,
                                NULL, 0);
    if (!x->tree || !push_value(L, x->tree)) {
        json_box_free(x);
        lua_settop(L, top);
        lua_pushnil(L);
        return;
    }
    json_box_free(x);
    lua_replace(L, top + 1);
}

void kvl_push_tool_calls(lua_State *L, const kvgen_tool_call *calls, int n) {
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_createtable(L, 0, 3);
        lua_pushstring(L, calls[i].id);
        lua_setfield(L, -2, "id");
        lua_pushstring(L, calls[i].name);
        lua_setfield(L, -2, "name");
        kvl_push_json_value(L, calls[i].arguments, strlen(calls[i].arguments));
        lua_setfield(L, -2, "arguments");
        lua_rawseti(L, -2, i + 1);
    }
}

const char *kvl_json_arg(const opt_ctx *c, int idx, const char *name) {
    lua_State *L = c->L;
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) == LUA_TTABLE) {
        lua_pushvalue(L, idx);
        kvl_table_to_json(c, name);
    } else if (lua_type(L, idx) == LUA_TSTRING) {
        lua_pushvalue(L, idx);
    } else {
        const char *what = lua_pushfstring(L, "a table or JSON text expected, got %s", kvl_push_got(L, idx));
        if (c->table) kvl_arg_error(L, c->arg, lua_pushfstring(L, "%s: %s", name, what));
        kvl_option_error(L, c->arg, name, what);
    }
    return kvl_check_cstring(L, -1, c->arg, name);
}
