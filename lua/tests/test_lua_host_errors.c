/* test_lua_host_errors: a C host that embeds Lua with only the base library and hands a script
 * its model through kvgen_lua_push_model (no require, no package.loaded entry for kvgen) calls
 * the module's methods itself with lua_pcall. Lua knows no name for a function called from C,
 * so the argument errors must still name it ('kvgen.Session.submit'); and schema tables nested
 * past the bound or containing themselves, built by the host, are refused with an error, never
 * a crash or a write past the Lua stack (ASan). */
#include <lauxlib.h>
#include <lualib.h>
#include <string.h>

#include "kvgen_lua.h"
#include "testutil.h"

/* Calls method `name` of the object at obj with the values pushed after it (n of them) through
 * lua_pcall; leaves the error message (or the first result) on the stack and returns the status. */
static int call_method(lua_State *L, int obj, const char *name, int n) {
    int first = lua_gettop(L) - n + 1;
    lua_getfield(L, obj, name);
    lua_pushvalue(L, obj);
    for (int i = 0; i < n; i++) lua_pushvalue(L, first + i);
    int st = lua_pcall(L, n + 1, 1, 0);
    lua_rotate(L, first, 1); /* the result below the arguments, which are dropped */
    lua_settop(L, first);
    return st;
}

static void expect_error(lua_State *L, int st, const char *want, int exact) {
    const char *got = lua_tostring(L, -1);
    CHECKF(st != LUA_OK, "expected an error containing \"%s\"", want);
    if (st == LUA_OK || !got) return;
    if (exact) CHECKF(strcmp(got, want) == 0, "error \"%s\", want \"%s\"", got, want);
    else CHECKF(strstr(got, want) != NULL, "error \"%s\" lacks \"%s\"", got, want);
}

/* pushes {schema = <value on top>} (pops the value) */
static void push_schema_options(lua_State *L) {
    lua_createtable(L, 0, 1);
    lua_rotate(L, -2, 1);
    lua_setfield(L, -2, "schema");
}

int main(void) {
    char *path = tu_make_model("lua_host_errors.gguf", "--layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 128");
    if (!path) tu_skip("kvgen-mkmodel did not run");
    kvgen_model *model = NULL;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1};
    CHECK_OK(kvgen_model_load(&md, &model, &tu_err_));
    if (!model) return tu_finish("test_lua_host_errors");

    lua_State *L = luaL_newstate();
    luaL_requiref(L, "_G", luaopen_base, 1);
    lua_pop(L, 1);
    kvgen_lua_push_model(L, model);
    kvgen_model_unload(model); /* the handle holds its own reference */
    int m = lua_gettop(L);

    /* model:session{bogus = 1}, called by the host */
    lua_createtable(L, 0, 1);
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, "bogus");
    expect_error(L, call_method(L, m, "session", 1),
                 "bad argument #2 to 'kvgen.Model.session' (unknown option 'bogus')", 1);
    lua_pop(L, 1);
    /* a bad self */
    lua_pushinteger(L, 42);
    lua_getfield(L, m, "tokenize");
    lua_pushinteger(L, 42);
    expect_error(L, lua_pcall(L, 1, 0, 0),
                 "bad argument #1 to 'kvgen.Model.tokenize' (kvgen.Model expected, got number)", 1);
    lua_settop(L, m);

    CHECK(call_method(L, m, "session", 0) == LUA_OK);
    int s = lua_gettop(L);

    /* s:submit("p", {stop = 65 strings}) */
    lua_pushliteral(L, "p");
    lua_createtable(L, 0, 1);
    lua_createtable(L, 65, 0);
    for (int i = 1; i <= 65; i++) {
        lua_pushfstring(L, "s%d", i);
        lua_rawseti(L, -2, i);
    }
    lua_setfield(L, -2, "stop");
    expect_error(L, call_method(L, s, "submit", 2),
                 "bad argument #3 to 'kvgen.Session.submit' (option 'stop': 65 stop strings, at most 64)", 1);
    lua_settop(L, s);

    /* a schema list nested 100000 deep (built inside out: the host's stack stays flat) */
    lua_pushliteral(L, "p");
    lua_pushboolean(L, 1);
    for (int i = 0; i < 100000; i++) {
        lua_createtable(L, 1, 0);
        lua_rotate(L, -2, 1);
        lua_rawseti(L, -2, 1);
    }
    push_schema_options(L);
    expect_error(L, call_method(L, s, "generate", 2),
                 "bad argument #3 to 'kvgen.Session.generate' (option 'schema': nested deeper than 64 levels", 0);
    lua_settop(L, s);

    /* {type = "object", properties = {self = <itself>}} */
    lua_pushliteral(L, "p");
    lua_createtable(L, 0, 2);
    lua_pushliteral(L, "object");
    lua_setfield(L, -2, "type");
    lua_createtable(L, 0, 1);
    lua_pushvalue(L, -2);
    lua_setfield(L, -2, "self");
    lua_setfield(L, -2, "properties");
    push_schema_options(L);
    expect_error(L, call_method(L, s, "submit", 2),
                 "(option 'schema': a table that contains itself cannot be JSON (the table at schema) at "
                 "schema.properties.self)",
                 0);
    lua_settop(L, s);

    /* every depth up to the bound works: [[...[true]...]] as a const */
    for (int depth = 1; depth <= 62; depth++) {
        lua_pushliteral(L, "p");
        lua_createtable(L, 0, 2);
        lua_pushboolean(L, 1);
        for (int i = 0; i < depth; i++) {
            lua_createtable(L, 1, 0);
            lua_rotate(L, -2, 1);
            lua_rawseti(L, -2, 1);
        }
        lua_setfield(L, -2, "const");
        push_schema_options(L);
        lua_pushinteger(L, 4 * depth + 8);
        lua_setfield(L, -2, "max_tokens");
        int st = call_method(L, s, "generate", 2);
        CHECKF(st == LUA_OK, "depth %d: %s", depth, lua_tostring(L, -1));
        lua_settop(L, s);
        call_method(L, s, "reset", 0);
        lua_settop(L, s);
    }

    lua_close(L);
    free(path);
    return tu_finish("test_lua_host_errors");
}
