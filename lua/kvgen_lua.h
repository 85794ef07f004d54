/*
 * kvgen_lua.h: the Lua 5.4 module `kvgen` for hosts that embed Lua (a game engine), as opposed
 * to scripts that `require("kvgen")` from kvgen.so.
 *
 * Link the static library kvgen_lua_static (CMake target; it carries libkvgen) and register
 * the module in each lua_State:
 *
 *     luaL_requiref(L, "kvgen", luaopen_kvgen, 1);   // also sets the global `kvgen`
 *     lua_pop(L, 1);
 *     kvgen_lua_push_model(L, model);                // a model the host loaded
 *     lua_setglobal(L, "model");
 *
 * Several lua_States may share one model: each gets its own kvgen.Model handle from
 * kvgen_lua_push_model, and kvgen.poll() in one state never returns the jobs of another (each
 * state polls with its own owner key). Closing one state (lua_close) cancels and frees its own
 * sessions and jobs only. Each lua_State must be used by one thread at a time (Lua's rule);
 * the model may be shared by states on different threads.
 */
#ifndef KVGEN_LUA_H
#define KVGEN_LUA_H

#include <lua.h>

#include "kvgen.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVGEN_LUA_API __attribute__((visibility("default")))
#else
#define KVGEN_LUA_API
#endif

/* The module's loader: pushes the kvgen table (as require("kvgen") does). */
KVGEN_LUA_API int luaopen_kvgen(lua_State *L);

/* Pushes a kvgen.Model handle for a model the host loaded. The handle holds its own reference
 * (kvgen_model_retain), dropped when it is closed or collected, so the host may unload its own
 * reference at any time. Registers the module's types in L if luaopen_kvgen has not run yet. */
KVGEN_LUA_API void kvgen_lua_push_model(lua_State *L, kvgen_model *model);

#ifdef __cplusplus
}
#endif
#endif /* KVGEN_LUA_H */
