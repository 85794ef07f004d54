/* fuzz_schema_lua: JSON schemas given as Lua tables, the way a script passes them
 * (`schema = { type = "object", ... }`): the module writes the table as JSON (key order, lists
 * as arrays, kvgen.null, nesting and self-containing tables refused) and kvgen compiles it. The
 * input is a small program that builds the table on a stack (below, DECODE); the schema then
 * goes to s:stream(..., { schema = t, max_tokens = 1 }) on a small random model in one Lua state
 * with the kvgen module. Errors raised to the script are fine; a crash, a sanitizer report or a
 * leak is a finding. Built where Lua 5.4 is (the module's kvgen_lua_static). Seeds:
 * corpus/schema_lua/. */
#include "fuzz_util.h"
#include <lauxlib.h>
#include <lualib.h>
#include "kvgen_lua.h"

/* Each byte is an op (low 3 bits) with an argument (the next bytes as needed):
 * 0 a new table; 1 a string (the next byte: its length below 16 from the input, or with 0x80 a
 * schema keyword); 2 an integer (the next byte, signed); 3 a number (the next byte / 4);
 * 4 true/false; 5 kvgen.null, or with the next byte odd the table at the bottom (a cycle);
 * 6 t[k] = v (v, k popped; t the table below them); 7 append v (popped) to the table below it.
 * The table at the bottom is the schema. */
static const char DECODE[] =
    "local kvgen, s, data = ...\n"
    "local words = { 'type', 'object', 'array', 'string', 'integer', 'number', 'boolean', 'null',\n"
    "  'properties', 'required', 'items', 'enum', 'const', 'anyOf', 'oneOf', 'minimum', 'maximum',\n"
    "  'minLength', 'maxLength', 'minItems', 'maxItems', 'additionalProperties', '$ref', '$defs',\n"
    "  '#/$defs/a', 'a', 'b', 'prefixItems', 'pattern', 'format', 'exclusiveMinimum', 'allOf',\n"
    "  'description', 'title', 'default', 'examples', 'exclusiveMaximum', '' }\n"
    "local st, i, n = {}, 1, #data\n"
    "local function byte() local b = data:byte(i) or 0; i = i + 1; return b end\n"
    "while i <= n and #st < 200 do\n"
    "  local b = byte(); local op = b & 7\n"
    "  if op == 0 then st[#st + 1] = {}\n"
    "  elseif op == 1 then\n"
    "    local a = byte()\n"
    "    if a & 0x80 ~= 0 then st[#st + 1] = words[(a & 0x7f) % #words + 1]\n"
    "    else local len = a & 15; st[#st + 1] = data:sub(i, i + len - 1); i = i + len end\n"
    "  elseif op == 2 then local a = byte(); st[#st + 1] = a < 128 and a or a - 256\n"
    "  elseif op == 3 then st[#st + 1] = byte() / 4\n"
    "  elseif op == 4 then st[#st + 1] = b & 8 ~= 0\n"
    "  elseif op == 5 then\n"
    "    if byte() & 1 == 1 and type(st[1]) == 'table' then st[#st + 1] = st[1] else st[#st + 1] = kvgen.null end\n"
    "  elseif op == 6 then\n"
    "    if #st >= 3 and type(st[#st - 2]) == 'table' then\n"
    "      local v, k = st[#st], st[#st - 1]; st[#st] = nil; st[#st] = nil\n"
    "      if k == k then st[#st][k] = v end\n"
    "    end\n"
    "  elseif op == 7 then\n"
    "    if #st >= 2 and type(st[#st - 1]) == 'table' then\n"
    "      local v = st[#st]; st[#st] = nil; local t = st[#st]; t[#t + 1] = v\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local schema = st[1]\n"
    "if schema == nil then return end\n"
    "local ok, stream = pcall(s.stream, s, 'x', { schema = schema, max_tokens = 1 })\n"
    "if ok then stream:close() end\n";

static lua_State *L;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    kvgen_model *m = fuzz_random_model(NULL);
    L = luaL_newstate();
    luaL_openlibs(L);
    luaL_requiref(L, "kvgen", luaopen_kvgen, 1);
    lua_pop(L, 1);
    /* kvgen, a session of the model (the state keeps both), the decoder */
    if (luaL_loadbuffer(L, DECODE, sizeof DECODE - 1, "decode") != LUA_OK) {
        fprintf(stderr, "fuzz_schema_lua: %s\n", lua_tostring(L, -1));
        exit(1);
    }
    lua_setglobal(L, "decode");
    kvgen_lua_push_model(L, m);
    kvgen_model_unload(m); /* the Lua handle holds its own reference */
    lua_getfield(L, -1, "session");
    lua_insert(L, -2);
    if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
        fprintf(stderr, "fuzz_schema_lua: %s\n", lua_tostring(L, -1));
        exit(1);
    }
    lua_setglobal(L, "session");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    lua_getglobal(L, "decode");
    lua_getglobal(L, "kvgen");
    lua_getglobal(L, "session");
    lua_pushlstring(L, (const char *)data, size);
    if (lua_pcall(L, 3, 0, 0) != LUA_OK) lua_pop(L, 1); /* an error raised to the script */
    lua_gc(L, LUA_GCCOLLECT);
    return 0;
}
