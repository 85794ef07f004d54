/*
 * lua_json.c: JSON for schemas: a Lua table written as JSON text (key order, kvgen.null, a depth
 * bound and cycle detection), and generated JSON text read back as Lua values.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvgen_lua_internal.h"

/* How deep a schema table may nest, and a JSON value read back: as deep as kvgen takes a schema
 * given as JSON text (core/generate/schema.c). Each level holds a few stack slots of the
 * writer (checked with lua_checkstack) and one C frame. */
#define JSON_MAX_DEPTH 64

/* JSON text as pieces in a Lua table (at t), concatenated at the end: the stack stays free for
 * the values being written, and an error leaves nothing to free. `seen` (a table index): the
 * tables being written, each with its path, so that a table inside itself is refused by name. */
typedef struct jbuf {
    lua_State *L;
    int t, seen;
    lua_Integer n;
} jbuf;

static void jb_add(jbuf *b, const char *s, size_t n) {
    lua_pushlstring(b->L, s, n);
    lua_rawseti(b->L, b->t, ++b->n);
}
static void jb_str(jbuf *b, const char *s) { jb_add(b, s, strlen(s)); }
static void jb_char(jbuf *b, char ch) { jb_add(b, &ch, 1); }

static void json_error(lua_State *L, const opt_ctx *c, const char *path, const char *what) {
    kvl_option_error(L, c->arg, "schema", lua_pushfstring(L, "%s at schema%s", what, path));
}

static void json_string(jbuf *b, const char *s, size_t n) {
    jb_char(b, '"');
    size_t from = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch != '"' && ch != '\\' && ch >= 0x20) continue;
        jb_add(b, s + from, i - from);
        char e[8];
        if (ch < 0x20) snprintf(e, sizeof e, "\\u%04x", ch);
        else snprintf(e, sizeof e, "\\%c", ch);
        jb_str(b, e);
        from = i + 1;
    }
    jb_add(b, s + from, n - from);
    jb_char(b, '"');
}

/* keys of the table at idx whose values are to be written as an array when the table is empty */
static int empty_is_array(const char *key) {
    static const char *const k[] = {"required", "enum", "anyOf", "oneOf", "examples", "type", NULL};
    for (int i = 0; key && k[i]; i++)
        if (strcmp(key, k[i]) == 0) return 1;
    return 0;
}

static int key_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Writes the value at idx as JSON into b (kept at the top of the stack by the caller's
 * luaL_Buffer discipline: values are pushed and popped around each add). `path` names the
 * value in messages; `order` (a table index, or 0): the keys to write first, in its order. */
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
            json_error(L, c, path, lua_pushfstring(L, "a %s key cannot be JSON", luaL_typename(L, -2)));
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
            json_error(L, c, path, "a table mixing list items and named keys cannot be JSON");
        }
        const char *name = lua_tostring(L, -1);
        if (strlen(name) != lua_rawlen(L, -1))
            json_error(L, c, path,
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
        json_error(L, c, path,
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
        json_error(L, c, path,
                   lua_pushfstring(L, "nested deeper than %d levels (the most kvgen takes)", JSON_MAX_DEPTH));
    if (!lua_checkstack(L, 16)) json_error(L, c, path, "nested too deep for the Lua stack");
    switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN: jb_str(b, lua_toboolean(L, idx) ? "true" : "false"); break;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx)) {
            char t[32];
            snprintf(t, sizeof t, "%lld", (long long)lua_tointeger(L, idx));
            jb_str(b, t);
        } else {
            double v = lua_tonumber(L, idx);
            if (v != v || v == HUGE_VAL || v == -HUGE_VAL) json_error(L, c, path, "a NaN or infinity cannot be JSON");
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
    default: json_error(L, c, path, lua_pushfstring(L, "a %s cannot be JSON", luaL_typename(L, idx)));
    }
}

void kvl_schema_to_json(const opt_ctx *c) {
    lua_State *L = c->L;
    int t = lua_gettop(L);
    lua_newtable(L);
    lua_newtable(L);
    jbuf b = {L, t + 1, t + 2, 0};
    lua_to_json(L, c, t, &b, "", NULL, 0, 0);
    luaL_Buffer out;
    luaL_buffinit(L, &out);
    for (lua_Integer i = 1; i <= b.n; i++) {
        lua_rawgeti(L, b.t, i);
        luaL_addvalue(&out);
    }
    luaL_pushresult(&out);
    lua_replace(L, t);
    lua_settop(L, t);
}

/* ---- JSON text read back ------------------------------------------------------------------ */

/* Pushes the value of the JSON text at *p (generated under a schema: valid); nil when it is
 * not. Objects become tables with string keys, arrays lists, null kvgen.null. */
static int json_push(lua_State *L, const char **p, int depth) {
    const char *s = *p;
    while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
    if (depth > JSON_MAX_DEPTH || !lua_checkstack(L, 8)) return 0;
    if (*s == '{' || *s == '[') {
        int obj = *s == '{';
        s++;
        lua_newtable(L);
        lua_Integer i = 0;
        while (*s == ' ') s++;
        if (*s == (obj ? '}' : ']')) {
            *p = s + 1;
            return 1;
        }
        for (;;) {
            if (obj) {
                if (!json_push(L, &s, depth + 1) || lua_type(L, -1) != LUA_TSTRING) return 0;
                while (*s == ' ') s++;
                if (*s++ != ':') return 0;
            }
            if (!json_push(L, &s, depth + 1)) return 0;
            if (obj) lua_rawset(L, -3);
            else lua_rawseti(L, -2, ++i);
            while (*s == ' ') s++;
            if (*s == ',') {
                s++;
                continue;
            }
            if (*s != (obj ? '}' : ']')) return 0;
            *p = s + 1;
            return 1;
        }
    }
    if (*s == '"') {
        luaL_Buffer b;
        luaL_buffinit(L, &b);
        for (s++; *s != '"'; s++) {
            if (!*s) return 0;
            if (*s != '\\') {
                luaL_addchar(&b, *s);
                continue;
            }
            s++;
            switch (*s) {
            case 'n': luaL_addchar(&b, '\n'); break;
            case 't': luaL_addchar(&b, '\t'); break;
            case 'r': luaL_addchar(&b, '\r'); break;
            case 'b': luaL_addchar(&b, '\b'); break;
            case 'f': luaL_addchar(&b, '\f'); break;
            case 'u': {
                unsigned v = 0;
                for (int k = 1; k <= 4; k++) {
                    char h = s[k];
                    v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                                     : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 0);
                    if (!h) return 0;
                }
                s += 4;
                char u[4];
                int n = v < 0x80 ? 1 : v < 0x800 ? 2 : 3;
                if (n == 1) u[0] = (char)v;
                else if (n == 2) {
                    u[0] = (char)(0xc0 | (v >> 6));
                    u[1] = (char)(0x80 | (v & 0x3f));
                } else {
                    u[0] = (char)(0xe0 | (v >> 12));
                    u[1] = (char)(0x80 | ((v >> 6) & 0x3f));
                    u[2] = (char)(0x80 | (v & 0x3f));
                }
                luaL_addlstring(&b, u, (size_t)n);
                break;
            }
            case 0: return 0;
            default: luaL_addchar(&b, *s);
            }
        }
        luaL_pushresult(&b);
        *p = s + 1;
        return 1;
    }
    if (strncmp(s, "true", 4) == 0 || strncmp(s, "false", 5) == 0) {
        lua_pushboolean(L, *s == 't');
        *p = s + (*s == 't' ? 4 : 5);
        return 1;
    }
    if (strncmp(s, "null", 4) == 0) {
        lua_pushlightuserdata(L, NULL);
        *p = s + 4;
        return 1;
    }
    const char *e = s;
    while (*e == '-' || *e == '+' || *e == '.' || *e == 'e' || *e == 'E' || (*e >= '0' && *e <= '9')) e++;
    if (e == s || e - s > 64) return 0;
    char num[80];
    memcpy(num, s, (size_t)(e - s));
    num[e - s] = 0;
    if (lua_stringtonumber(L, num) == 0) return 0;
    *p = e;
    return 1;
}

/* Pushes the value of a whole JSON text, or nil. */
void kvl_push_json_value(lua_State *L, const char *text) {
    int top = lua_gettop(L);
    const char *p = text;
    if (!json_push(L, &p, 0) || *p) {
        lua_settop(L, top);
        lua_pushnil(L);
    }
}

