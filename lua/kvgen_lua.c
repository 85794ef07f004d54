/*
 * kvgen_lua.c: the Lua 5.4 module `kvgen`, a thin layer over core/include/kvgen.h.
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
 * Errors: bad arguments raise through arg_error ("bad argument #1 to 'prefill' (ids[3]:
 * integer expected, got string)"); failures inside kvgen raise the string "kvgen: <message>"
 * and record the status name ("context_full", "io", ...) for kvgen.last_error().
 */
#include <float.h>
#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "kvgen.h"
#include "kvgen_lua.h"

#define MODEL_MT "kvgen.Model"
#define SESSION_MT "kvgen.Session"
#define DETOK_MT "kvgen.Detokenizer"
#define STREAM_MT "kvgen.Stream"
#define JOB_MT "kvgen.Job"
#define LAST_ERROR_KEY "kvgen.last_error"
/* per lua_State (registry): a userdata whose address is this state's owner key for kvgen_poll,
 * the open jobs by address (weak values), and the jobs kept alive for their callbacks */
#define STATE_KEY "kvgen.state"
#define JOBS_KEY "kvgen.jobs"
#define ANCHORED_KEY "kvgen.anchored"
/* per lua_State (registry): the script's logger, {queue userdata, function} (kvgen.set_logger) */
#define LOGGER_KEY "kvgen.logger"
#define LOGGER_MT "kvgen.LogQueue"
/* per lua_State (registry): the module's C functions -> their names, for argument errors */
#define NAMES_KEY "kvgen.names"

typedef struct lmodel {
    kvgen_model *model; /* NULL once closed */
} lmodel;

struct lstream;

/* User values: 1 the model userdata (kept alive), 2 a table with weak values whose [1] is the
 * stream generating on it (s->active), so that closing the session can keep the stream's text
 * while an unreachable stream can still be collected. Whether a job owns the session is the C
 * library's to say (kvgen_session_busy). */
typedef struct lsession {
    kvgen_session *session; /* NULL once closed */
    kvgen_model *model;     /* borrowed: the session holds its own C reference on it */
    struct lstream *active; /* the stream generating on this session, if any (it must be alone) */
} lsession;

/* A kvgen_job (jobs API). User values: 1 the session userdata (kept alive, and with it the
 * model), 2 the callbacks table {on_piece=, on_done=} or nil. */
typedef struct ljob {
    kvgen_job *job;     /* NULL once closed (released) */
    kvgen_model *model; /* valid while open: the job holds a C reference */
    int schema;         /* generated under a schema: job.value decodes the text */
} ljob;

/* A generation in progress (kvgen_gen). User values: 1 the session userdata (kept alive), 2 the
 * final text once finished. */
typedef struct lstream {
    kvgen_gen *gen;      /* NULL once finished or closed */
    lsession *owner;     /* valid while the stream lives: user value 1 holds it */
    kvgen_finish finish; /* KVGEN_FINISH_NONE while running */
    int n_tokens;
    int finish_pending;  /* the last step carried text and a finish: report the end next time */
    int schema;          /* generated under a schema: st.value decodes the text */
} lstream;

typedef struct ldetok {
    kvgen_detok state;
    unsigned flags;
} ldetok;

/* ---- errors ----------------------------------------------------------------------------- */

static void set_last_error(lua_State *L, const char *code, const char *message) {
    lua_createtable(L, 0, 2);
    lua_pushstring(L, code);
    lua_setfield(L, -2, "code");
    lua_pushstring(L, message);
    lua_setfield(L, -2, "message");
    lua_setfield(L, LUA_REGISTRYINDEX, LAST_ERROR_KEY);
}

static int raise_status(lua_State *L, const kvgen_error *err) {
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

/* Pushes what a number is, for messages: "1.5", "nan", "inf", "-inf", "3". */
static const char *push_number_text(lua_State *L, lua_Number v) {
    if (isnan(v)) return lua_pushliteral(L, "nan");
    if (isinf(v)) return v > 0 ? lua_pushliteral(L, "inf") : lua_pushliteral(L, "-inf");
    char buf[64];
    snprintf(buf, sizeof buf, "%.14g", (double)v);
    return lua_pushstring(L, buf);
}

/* Pushes what the value at idx is, for "expected X, got Y" messages: the type, and the value
 * itself when it is a number ("number 1.5", "number nan"), so a bad number is named. */
static const char *push_got(lua_State *L, int idx) {
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) != LUA_TNUMBER) return lua_pushstring(L, luaL_typename(L, idx));
    if (lua_isinteger(L, idx)) return lua_pushfstring(L, "number %I", (LUAI_UACINT)lua_tointeger(L, idx));
    push_number_text(L, lua_tonumber(L, idx));
    lua_pushfstring(L, "number %s", lua_tostring(L, -1));
    lua_remove(L, -2);
    return lua_tostring(L, -1);
}

/* Every argument error of the module goes through here (never luaL_argerror directly), so that
 * it names the function the script called. Lua names a function from the call that made it
 * ('submit' for s:submit(...)), but a function called from C (pcall(s.submit, s, ...), a host's
 * lua_call) has no such name, and luaL_argerror finds only functions of module tables ('?' for
 * every method): kvgen then names it from its own table ('kvgen.Session.submit'). */
static int arg_error(lua_State *L, int arg, const char *msg) {
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
static void *check_udata(lua_State *L, int arg, const char *tname) {
    void *p = luaL_testudata(L, arg, tname);
    if (!p) {
        const char *got = luaL_getmetafield(L, arg, "__name") == LUA_TSTRING ? lua_tostring(L, -1)
                          : lua_type(L, arg) == LUA_TLIGHTUSERDATA      ? "light userdata"
                                                                         : luaL_typename(L, arg);
        arg_error(L, arg, lua_pushfstring(L, "%s expected, got %s", tname, got));
    }
    return p;
}

/* luaL_checkoption without a default, with arg_error's function names */
static int check_option(lua_State *L, int arg, const char *const names[]) {
    if (lua_type(L, arg) != LUA_TSTRING)
        arg_error(L, arg, lua_pushfstring(L, "string expected, got %s", luaL_typename(L, arg)));
    const char *name = lua_tostring(L, arg);
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0) return i;
    return arg_error(L, arg, lua_pushfstring(L, "invalid option '%s'", name));
}

static int type_error(lua_State *L, int arg, const char *name, const char *expected) {
    return arg_error(L, arg, lua_pushfstring(L, "%s: %s expected, got %s", name, expected, push_got(L, arg)));
}

/* Strings that reach the C API without their length (NUL-terminated: chat text, stop strings,
 * choices, paths, ...) must not contain a NUL byte, which would silently cut them: refused
 * here, the one place that checks it. `what` names the argument in the message. Text that
 * goes in with its length (prompts, tokenize) may hold any byte and is not checked. */
static const char *check_cstring(lua_State *L, int idx, int arg, const char *what) {
    size_t len = 0;
    const char *s = lua_tolstring(L, idx, &len);
    const char *nul = s ? memchr(s, 0, len) : NULL;
    if (nul)
        arg_error(L, arg,
                  lua_pushfstring(L, "%s: contains a NUL byte at position %I (not allowed in this string)", what,
                                  (LUAI_UACINT)(nul - s + 1)));
    return s;
}

/* A string argument for the C API (see check_cstring): type and NUL checked. */
static const char *check_cstring_arg(lua_State *L, int arg, const char *what) {
    if (lua_type(L, arg) != LUA_TSTRING) type_error(L, arg, what, "string");
    return check_cstring(L, arg, arg, what);
}

/* Pushes a table key for messages: 'name' for strings, the value for numbers, else the type. */
static const char *push_key_text(lua_State *L, int idx) {
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) == LUA_TSTRING) return lua_pushfstring(L, "'%s'", lua_tostring(L, idx));
    if (lua_type(L, idx) == LUA_TNUMBER) {
        if (lua_isinteger(L, idx)) return lua_pushfstring(L, "%I", (LUAI_UACINT)lua_tointeger(L, idx));
        return push_number_text(L, lua_tonumber(L, idx));
    }
    return lua_pushstring(L, luaL_typename(L, idx));
}

/* The length of the list at idx, which must be a sequence: keys exactly 1..n. A map such as
 * {first = "a"} is refused rather than read as an empty list. */
static lua_Unsigned check_sequence(lua_State *L, int idx, int arg, const char *what) {
    idx = lua_absindex(L, idx);
    lua_Unsigned n = lua_rawlen(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int isint = 0;
        lua_Integer k = lua_type(L, -1) == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
        if (!isint || k < 1 || (lua_Unsigned)k > n)
            arg_error(L, arg,
                      lua_pushfstring(L, "%s: a list (keys 1..n) expected, got a table with the key %s", what,
                                      push_key_text(L, -1)));
    }
    return n;
}

/* Room for n more values on the stack: a C function is only promised LUA_MINSTACK (20), and
 * Lua does not check pushes beyond what it has (they would overwrite the heap). Every reader
 * of a script's tables asks for what it needs at its entry; the recursive JSON writer at each
 * level. */
static void need_stack(lua_State *L, int n, const char *what) { luaL_checkstack(L, n, what); }

/* Integers only: unlike lua_tointegerx, strings such as "2" are refused (an id passed as text is
 * almost always a bug in the caller). Floats with an integral value are accepted. */
static lua_Integer to_integer(lua_State *L, int idx, int *isint) {
    *isint = 0;
    if (lua_type(L, idx) != LUA_TNUMBER) return 0;
    return lua_tointegerx(L, idx, isint);
}

/* ---- result tables --------------------------------------------------------------------- *
 * Structs the C API fills are handed to Lua as tables, one out_field row per field. */

typedef enum field_type {
    F_INT,    /* int */
    F_U32,    /* uint32_t */
    F_U64,    /* uint64_t */
    F_SIZE,   /* size_t */
    F_FLOAT,  /* float */
    F_DOUBLE, /* double */
    F_MS,     /* double milliseconds: nil when < 0 (not reached yet) */
    F_BOOL,   /* int: true when not 0 */
    F_STR,    /* const char * (NULL: nil) */
    F_CHARS,  /* char[]: a NUL-terminated array */
    F_TOKEN   /* int32_t token id: nil when < 0 (the model has none) */
} field_type;

typedef struct out_field {
    const char *name;
    field_type type;
    size_t off;
} out_field;

static void push_field(lua_State *L, const void *base, const out_field *f) {
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
        push_field(L, base, &f[i]);
        lua_setfield(L, -2, f[i].name);
    }
}

/* Pushes a new table with the n fields of the struct at `base`. */
static void push_fields(lua_State *L, const void *base, const out_field *f, size_t n) {
    lua_createtable(L, 0, (int)n);
    set_fields(L, base, f, n);
}

#define N_FIELDS(t) (sizeof(t) / sizeof((t)[0]))

/* ---- options tables --------------------------------------------------------------------- *
 * Every call that takes an options table describes it with one table of opt_spec rows (name,
 * type, range or choices, destination), and read_options does all the checking: unknown keys,
 * types, ranges, NUL bytes, with messages that name the option and the value ("option
 * 'top_p': 1.5 is out of range [0, 1]"); arg_error adds the function. Absent options keep
 * the value the caller put in the destination (the default). */

/* True when the value at idx is the string `name` exactly (a key "top_k\0x" is not "top_k"). */
static int is_name(lua_State *L, int idx, const char *name) {
    size_t len = 0;
    const char *k = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, &len) : NULL;
    return k && len == strlen(name) && memcmp(k, name, len) == 0;
}

/* Field names read by the __index functions: one holding a NUL byte names no field. */
static const char *index_key(lua_State *L) {
    size_t len = 0;
    if (lua_type(L, 2) != LUA_TSTRING && lua_type(L, 2) != LUA_TNUMBER)
        arg_error(L, 2, lua_pushfstring(L, "string expected, got %s", luaL_typename(L, 2)));
    const char *key = lua_tolstring(L, 2, &len);
    return strlen(key) == len ? key : "";
}

static int option_error(lua_State *L, int arg, const char *key, const char *what) {
    return arg_error(L, arg, lua_pushfstring(L, "option '%s': %s", key, what));
}

/* "<v> is out of range [lo, hi]" (also for NaN and infinities: "nan is out of range ...") */
static int range_error(lua_State *L, int arg, const char *key, double v, double lo, double hi) {
    push_number_text(L, v);
    push_number_text(L, lo);
    push_number_text(L, hi);
    return option_error(L, arg, key,
                        lua_pushfstring(L, "%s is out of range [%s, %s]", lua_tostring(L, -3), lua_tostring(L, -2),
                                        lua_tostring(L, -1)));
}

typedef enum opt_type {
    OPT_BOOL,     /* int: 0 or 1 */
    OPT_FLAG,     /* unsigned: `flag` or-ed in when true */
    OPT_INT,      /* int in [lo, hi] */
    OPT_SIZE,     /* size_t in [lo, hi] */
    OPT_U64,      /* uint64_t: any Lua integer (a seed) */
    OPT_FLOAT,    /* float in [flo, fhi] (NaN never is) */
    OPT_STRING,   /* const char *, without NUL bytes; valid while the options table is */
    OPT_CHOICE,   /* int: the index of the string in `names` */
    OPT_FUNCTION, /* int: 1 when given (the caller reads the function from the table) */
    OPT_CUSTOM    /* `read` checks the value and fills the destination */
} opt_type;

/* What a reader needs besides the value: the options argument (for messages), a table that
 * keeps arrays and strings alive while the destination is used (luaL_ref), the model (token
 * ids). */
typedef struct opt_ctx {
    lua_State *L;
    int arg, anchor;
    const kvgen_model *model;
} opt_ctx;

typedef struct opt_spec opt_spec;
/* reads the value at `vi` (not nil) into `field` */
typedef void (*opt_reader)(const opt_ctx *c, const opt_spec *o, int vi, void *field);

struct opt_spec {
    const char *key;
    opt_type type;
    size_t off;                /* destination field, from the start of the caller's struct */
    lua_Integer lo, hi;        /* OPT_INT, OPT_SIZE */
    double flo, fhi;           /* OPT_FLOAT */
    const char *const *names;  /* OPT_CHOICE */
    unsigned flag;             /* OPT_FLAG */
    unsigned need;             /* mode bits the option needs: a call whose mode lacks one does
                                  not know it ("unknown option") */
    opt_reader read;           /* OPT_CUSTOM */
};

#define N_SPECS(t) (sizeof(t) / sizeof((t)[0]))

static int spec_active(const opt_spec *o, unsigned mode) { return (o->need & ~mode) == 0; }

static const char *read_string(const opt_ctx *c, const opt_spec *o, int vi) {
    lua_State *L = c->L;
    if (lua_type(L, vi) != LUA_TSTRING)
        option_error(L, c->arg, o->key, lua_pushfstring(L, "string expected, got %s", push_got(L, vi)));
    const char *v = check_cstring(L, vi, c->arg, lua_pushfstring(L, "option '%s'", o->key));
    lua_pop(L, 1);
    return v;
}

static lua_Integer read_integer(const opt_ctx *c, const opt_spec *o, int vi) {
    lua_State *L = c->L;
    int isint = 0;
    lua_Integer v = to_integer(L, vi, &isint);
    if (!isint) option_error(L, c->arg, o->key, lua_pushfstring(L, "integer expected, got %s", push_got(L, vi)));
    if (v < o->lo || v > o->hi)
        option_error(L, c->arg, o->key,
                     lua_pushfstring(L, "%I is out of range [%I, %I]", (LUAI_UACINT)v, (LUAI_UACINT)o->lo,
                                     (LUAI_UACINT)o->hi));
    return v;
}

static void read_value(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    switch (o->type) {
    case OPT_BOOL:
    case OPT_FLAG:
        if (lua_type(L, vi) != LUA_TBOOLEAN)
            option_error(L, c->arg, o->key, lua_pushfstring(L, "boolean expected, got %s", push_got(L, vi)));
        if (o->type == OPT_BOOL) *(int *)field = lua_toboolean(L, vi);
        else if (lua_toboolean(L, vi)) *(unsigned *)field |= o->flag;
        break;
    case OPT_INT: *(int *)field = (int)read_integer(c, o, vi); break;
    case OPT_SIZE: *(size_t *)field = (size_t)read_integer(c, o, vi); break;
    case OPT_U64: {
        opt_spec any = *o;
        any.lo = LUA_MININTEGER;
        any.hi = LUA_MAXINTEGER;
        *(uint64_t *)field = (uint64_t)read_integer(c, &any, vi);
        break;
    }
    case OPT_FLOAT: {
        if (lua_type(L, vi) != LUA_TNUMBER)
            option_error(L, c->arg, o->key, lua_pushfstring(L, "number expected, got %s", push_got(L, vi)));
        double v = (double)lua_tonumber(L, vi);
        if (!(v >= o->flo && v <= o->fhi)) range_error(L, c->arg, o->key, v, o->flo, o->fhi); /* also NaN */
        *(float *)field = (float)v;
        break;
    }
    case OPT_STRING: *(const char **)field = read_string(c, o, vi); break;
    case OPT_CHOICE: {
        const char *s = read_string(c, o, vi);
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
        option_error(L, c->arg, o->key, lua_pushfstring(L, "'%s' is not one of %s", s, lua_tostring(L, -1)));
        break;
    }
    case OPT_FUNCTION:
        if (!lua_isfunction(L, vi))
            option_error(L, c->arg, o->key, lua_pushfstring(L, "function expected, got %s", luaL_typename(L, vi)));
        *(int *)field = 1;
        break;
    case OPT_CUSTOM: o->read(c, o, vi, field); break;
    }
}

/* Reads the options table at `arg` (none or nil: every default) into `dest` with the rows of
 * `specs` that `mode` has; any other key is refused, so a typo ("temprature") is an error and
 * not a silent default. `anchor` (0: none) is the table custom readers keep their arrays in. */
static void read_options(lua_State *L, int arg, const opt_spec *specs, size_t n, unsigned mode, void *dest,
                         int anchor, const kvgen_model *model) {
    if (lua_isnoneornil(L, arg)) return;
    if (!lua_istable(L, arg)) type_error(L, arg, "options", "table");
    need_stack(L, 24, "reading an options table");
    lua_pushnil(L);
    while (lua_next(L, arg)) {
        lua_pop(L, 1);
        int ok = 0;
        for (size_t i = 0; i < n && !ok; i++) ok = spec_active(&specs[i], mode) && is_name(L, -1, specs[i].key);
        if (ok) continue;
        if (lua_type(L, -1) == LUA_TSTRING) {
            check_cstring(L, lua_gettop(L), arg, "option name");
            arg_error(L, arg, lua_pushfstring(L, "unknown option '%s'", lua_tostring(L, -1)));
        }
        arg_error(L, arg, lua_pushfstring(L, "unknown option [%s] (options are named fields)", push_key_text(L, -1)));
    }
    opt_ctx c = {L, arg, anchor ? lua_absindex(L, anchor) : 0, model};
    for (size_t i = 0; i < n; i++) {
        if (!spec_active(&specs[i], mode)) continue;
        int top = lua_gettop(L);
        if (lua_getfield(L, arg, specs[i].key) != LUA_TNIL) read_value(&c, &specs[i], top + 1, (char *)dest + specs[i].off);
        lua_settop(L, top);
    }
}

/* Keeps the value on top of the stack alive in the anchor table (pops it). */
static void anchor_top(const opt_ctx *c) { luaL_ref(c->L, c->anchor); }

/* ---- handles ---------------------------------------------------------------------------- */

static lmodel *check_model(lua_State *L, int arg) {
    lmodel *m = check_udata(L, arg, MODEL_MT);
    if (!m->model) luaL_error(L, "attempt to use a closed " MODEL_MT);
    return m;
}

static lsession *check_session_open(lua_State *L, int arg) {
    lsession *s = check_udata(L, arg, SESSION_MT);
    if (!s->session) luaL_error(L, "attempt to use a closed " SESSION_MT);
    return s;
}

/* An open session, for calls that only read it: allowed while a stream generates (same
 * thread), not while a job is not final (the worker thread owns the session then). */
static lsession *check_session_read(lua_State *L, int arg) {
    lsession *s = check_session_open(L, arg);
    if (kvgen_session_busy(s->session))
        luaL_error(L, SESSION_MT " is busy: a kvgen.Job is running on it (poll it to the end, or cancel it and "
                      "poll until it is final)");
    return s;
}

static lsession *check_no_stream(lua_State *L, lsession *s) {
    if (s->active) luaL_error(L, SESSION_MT " is busy: a kvgen.Stream is generating on it (finish or close it first)");
    return s;
}

/* An open session that no stream or job is generating on (kvgen_gen_begin wants it to itself). */
static lsession *check_session(lua_State *L, int arg) { return check_no_stream(L, check_session_read(L, arg)); }

static kvgen_model_info model_info(const kvgen_model *model) {
    kvgen_model_info info;
    kvgen_model_get_info(model, &info);
    return info;
}

/* ---- token arrays ----------------------------------------------------------------------- */

static int32_t check_token(lua_State *L, int arg, const char *name, const kvgen_model *model) {
    int isint = 0;
    lua_Integer id = to_integer(L, arg, &isint);
    if (!isint) type_error(L, arg, name, "integer token id");
    int n_vocab = model_info(model).n_vocab;
    if (id < 0 || id >= n_vocab)
        arg_error(L, arg,
                  lua_pushfstring(L, "%s: %I is outside the vocabulary [0, %d)", name, (LUAI_UACINT)id, n_vocab));
    return (int32_t)id;
}

/* Reads a Lua array of token ids into a userdata it leaves on the stack. */
static int32_t *check_ids(lua_State *L, int arg, const char *name, const kvgen_model *model, size_t *n) {
    if (!lua_istable(L, arg)) type_error(L, arg, name, "table of token ids");
    need_stack(L, 8, name);
    lua_Unsigned len = check_sequence(L, arg, arg, name);
    if (len > (lua_Unsigned)(SIZE_MAX / sizeof(int32_t) - 1))
        arg_error(L, arg, lua_pushfstring(L, "%s: too many tokens", name));
    int32_t *ids = lua_newuserdatauv(L, (size_t)(len ? len : 1) * sizeof *ids, 0);
    int n_vocab = model_info(model).n_vocab;
    for (lua_Unsigned i = 0; i < len; i++) {
        int isint = 0;
        lua_rawgeti(L, arg, (lua_Integer)(i + 1));
        lua_Integer id = to_integer(L, -1, &isint);
        if (!isint)
            arg_error(L, arg,
                      lua_pushfstring(L, "%s[%I]: integer expected, got %s", name, (LUAI_UACINT)(i + 1),
                                      push_got(L, -1)));
        if (id < 0 || (n_vocab > 0 && id >= n_vocab)) /* 0: a remote model, whose calls refuse ids */
            arg_error(L, arg,
                      lua_pushfstring(L, "%s[%I]: %I is outside the vocabulary [0, %d)", name,
                                      (LUAI_UACINT)(i + 1), (LUAI_UACINT)id, n_vocab));
        ids[i] = (int32_t)id;
        lua_pop(L, 1);
    }
    *n = (size_t)len;
    return ids;
}

/* Tokenizes into a userdata it leaves on the stack. */
static int32_t *tokenize(lua_State *L, const kvgen_model *model, const char *text, size_t len, unsigned flags,
                         size_t *n) {
    kvgen_error err = {0};
    size_t need = 0;
    kvgen_status st = kvgen_tokenize(model, text, len, flags, NULL, 0, &need, &err);
    /* with cap 0 a non-empty result reports INVALID_ARGUMENT and the size it needs */
    if (st != KVGEN_OK && !(st == KVGEN_E_INVALID_ARGUMENT && need > 0)) raise_status(L, &err);
    int32_t *ids = lua_newuserdatauv(L, (need ? need : 1) * sizeof *ids, 0);
    if (need > 0 && kvgen_tokenize(model, text, len, flags, ids, need, n, &err) != KVGEN_OK) raise_status(L, &err);
    *n = need;
    return ids;
}

static void push_ids(lua_State *L, const int32_t *ids, size_t n) {
    lua_createtable(L, n < INT_MAX ? (int)n : 0, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

enum { TOKENIZE_BOS = 1 }; /* mode: the call takes `bos` */

static const opt_spec tokenize_specs[] = {
    {.key = "special", .type = OPT_FLAG, .flag = KVGEN_TOKENIZE_SPECIAL},
    {.key = "bos", .type = OPT_FLAG, .flag = KVGEN_TOKENIZE_ADD_BOS, .need = TOKENIZE_BOS},
};

/* {special=, bos=} (mode TOKENIZE_BOS) or {special=} (0) as KVGEN_TOKENIZE_* flags */
static unsigned tokenize_flags(lua_State *L, int arg, unsigned mode) {
    unsigned flags = 0;
    read_options(L, arg, tokenize_specs, N_SPECS(tokenize_specs), mode, &flags, 0, NULL);
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
        *(const char **)field = read_string(c, o, vi);
        return;
    }
    int isint = 0;
    lua_Integer d = to_integer(L, vi, &isint);
    if (!isint || d < 0) option_error(L, c->arg, o->key, "a device index must be an integer >= 0");
    lua_pushfstring(L, "%I", (LUAI_UACINT)d); /* the index as text, as kvgen_model_desc wants it */
    *(const char **)field = lua_tostring(L, -1);
    anchor_top(c);
}

/* pipeline_cache = a path, false (none) or true (the default) */
static void read_pipeline_cache(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    load_opts *lo = field; /* the row's destination is the whole struct */
    if (lua_type(L, vi) == LUA_TSTRING) {
        lo->d.pipeline_cache_path = read_string(c, o, vi);
        if (!*lo->d.pipeline_cache_path)
            option_error(L, c->arg, o->key, "empty path (false turns the pipeline cache off)");
        lo->pc_given = 1;
    } else if (lua_type(L, vi) == LUA_TBOOLEAN) {
        lo->pc_given = !lua_toboolean(L, vi); /* false: no cache (path NULL); true: the default */
    } else {
        const char *type = luaL_typename(L, vi);
        const char *value = luaL_tolstring(L, vi, NULL);
        option_error(L, c->arg, o->key, lua_pushfstring(L, "path (string) or false expected, got %s (%s)", type, value));
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
static int l_pipeline_cache_path(lua_State *L) {
    push_default_pipeline_cache(L);
    return 1;
}

/* kvgen.load(path [, {backend=, device=, threads=, force_f32=, pool_bytes=, pool_tokens=, page_size=,
 * pipeline_cache=, progress=}]) -> model. pipeline_cache: a file path, false (none) or true / absent
 * (the default: push_default_pipeline_cache). */
static void deliver_logs(lua_State *L);

static int l_load(lua_State *L) {
    if (lua_type(L, 1) != LUA_TSTRING) type_error(L, 1, "path", "string");
    lua_settop(L, 2);
    lua_newtable(L); /* 3: anchor */
    load_opts o = {0};
    o.d.path = check_cstring_arg(L, 1, "path");
    read_options(L, 2, load_specs, N_SPECS(load_specs), 0, &o, 3, NULL);
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
        deliver_logs(L);
        if (prog.raised) {
            lua_pushvalue(L, prog.err_slot);
            return lua_error(L); /* the callback's own error, as it raised it */
        }
        return raise_status(L, &err);
    }
    deliver_logs(L);
    return 1;
}

static int model_close(lua_State *L) {
    lmodel *m = check_udata(L, 1, MODEL_MT);
    kvgen_model_unload(m->model); /* sessions keep their own reference */
    m->model = NULL;
    return 0;
}

static int model_tostring(lua_State *L) {
    lmodel *m = check_udata(L, 1, MODEL_MT);
    if (!m->model) {
        lua_pushliteral(L, MODEL_MT " (closed)");
    } else {
        kvgen_model_info info = model_info(m->model);
        lua_pushfstring(L, MODEL_MT " (%s, %s) (%p)", info.name, info.backend, (void *)m);
    }
    return 1;
}

static const char *tokenizer_name(kvgen_tokenizer_kind k) {
    return k == KVGEN_TOKENIZER_BPE ? "bpe" : k == KVGEN_TOKENIZER_SPM ? "spm" : "unknown";
}

/* model.<field> and model:info(): kvgen_model_info with the tokenizer kind as its name */
typedef struct lmodel_info {
    kvgen_model_info i;
    const char *tokenizer;
} lmodel_info;

static lmodel_info model_fields(const kvgen_model *model) {
    lmodel_info mi = {.i = model_info(model)};
    mi.tokenizer = tokenizer_name(mi.i.tokenizer);
    return mi;
}

#define MI(name, type, field) {name, type, offsetof(lmodel_info, field)}
static const out_field model_info_fields[] = {
    MI("name", F_STR, i.name),
    MI("architecture", F_STR, i.architecture),
    MI("backend", F_STR, i.backend),
    MI("device", F_STR, i.device),
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
    lmodel_info mi = model_fields(check_model(L, 1)->model);
    push_fields(L, &mi, model_info_fields, N_FIELDS(model_info_fields));
    return 1;
}

/* methods first (so close() works on a closed model), then info fields */
static int model_index(lua_State *L) {
    lmodel *m = check_udata(L, 1, MODEL_MT);
    const char *key = index_key(L);
    if (lua_getfield(L, lua_upvalueindex(1), key) != LUA_TNIL) return 1;
    if (!m->model) return luaL_error(L, "attempt to use a closed " MODEL_MT);
    lmodel_info mi = model_fields(m->model);
    for (size_t i = 0; i < N_FIELDS(model_info_fields); i++)
        if (strcmp(key, model_info_fields[i].name) == 0) {
            push_field(L, &mi, &model_info_fields[i]);
            return 1;
        }
    lua_pushnil(L);
    return 1;
}

static int model_describe(lua_State *L) {
    lmodel *m = check_model(L, 1);
    size_t need = kvgen_model_describe(m->model, NULL, 0);
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, need + 1);
    kvgen_model_describe(m->model, p, need + 1);
    luaL_pushresultsize(&b, need);
    return 1;
}

/* model:tokenize(text [, {special=, bos=}]) -> {ids} */
static int model_tokenize(lua_State *L) {
    lmodel *m = check_model(L, 1);
    size_t len;
    if (lua_type(L, 2) != LUA_TSTRING) type_error(L, 2, "text", "string");
    const char *text = lua_tolstring(L, 2, &len);
    unsigned flags = tokenize_flags(L, 3, TOKENIZE_BOS);
    size_t n = 0;
    const int32_t *ids = tokenize(L, m->model, text, len, flags, &n);
    push_ids(L, ids, n);
    return 1;
}

/* model:detokenize(ids [, {special=}]) -> text */
static int model_detokenize(lua_State *L) {
    lmodel *m = check_model(L, 1);
    unsigned flags = tokenize_flags(L, 3, 0); /* before check_ids pushes its buffer */
    size_t n = 0;
    const int32_t *ids = check_ids(L, 2, "ids", m->model, &n);
    size_t need = kvgen_detokenize(m->model, ids, n, flags, NULL, 0);
    luaL_Buffer b;
    char *p = luaL_buffinitsize(L, &b, need + 1);
    kvgen_detokenize(m->model, ids, n, flags, p, need + 1);
    luaL_pushresultsize(&b, need);
    return 1;
}

/* model:piece(id [, {special=}]) -> the raw bytes of one token */
static int model_piece(lua_State *L) {
    lmodel *m = check_model(L, 1);
    int32_t id = check_token(L, 2, "id", m->model);
    unsigned flags = tokenize_flags(L, 3, 0);
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
    lmodel *m = check_model(L, 1);
    lua_pushboolean(L, kvgen_token_is_eog(m->model, check_token(L, 2, "id", m->model)));
    return 1;
}

static int model_is_control(lua_State *L) {
    lmodel *m = check_model(L, 1);
    lua_pushboolean(L, kvgen_token_is_control(m->model, check_token(L, 2, "id", m->model)));
    return 1;
}

/* model:token(text) -> id of the token whose text is exactly `text`, or nil */
static int model_token(lua_State *L) {
    lmodel *m = check_model(L, 1);
    int32_t id = kvgen_token_find(m->model, check_cstring_arg(L, 2, "text"));
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
    check_model(L, 1);
    unsigned flags = tokenize_flags(L, 2, 0);
    ldetok *d = lua_newuserdatauv(L, sizeof *d, 1);
    kvgen_detok_init(&d->state);
    d->flags = flags;
    luaL_setmetatable(L, DETOK_MT);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, 1);
    return 1;
}

static int detok_push(lua_State *L) {
    ldetok *d = check_udata(L, 1, DETOK_MT);
    lua_getiuservalue(L, 1, 1);
    lmodel *m = check_model(L, lua_gettop(L));
    int32_t id = check_token(L, 2, "id", m->model);
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
    ldetok *d = check_udata(L, 1, DETOK_MT);
    char buf[64];
    size_t n = kvgen_detok_flush(&d->state, buf, sizeof buf);
    lua_pushlstring(L, buf, n < sizeof buf ? n : sizeof buf - 1);
    return 1;
}

static int detok_tostring(lua_State *L) {
    lua_pushfstring(L, DETOK_MT " (%p)", check_udata(L, 1, DETOK_MT));
    return 1;
}

/* ---- sessions --------------------------------------------------------------------------- */

static void read_template(lua_State *L, int idx, int arg, kvgen_chat_template *tpl);
static void push_template_name(lua_State *L, lsession *s);
static const char *const on_full_names[] = {"error", "shift", NULL};

/* model:session options; s:set_sampler takes the sampler rows (mode 0) */
enum { SESSION_ONLY = 1 };

typedef struct session_opts {
    kvgen_session_desc d;
    kvgen_sampler_desc sd;
    int on_full;      /* index in on_full_names */
    int prefix_reuse;
    const char *system;
    kvgen_chat_template tpl;
    int has_template;
} session_opts;

/* template = a family name or a table (read_template's messages) */
static void read_session_template(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    (void)o;
    session_opts *so = field; /* the row's destination is the whole struct */
    read_template(c->L, vi, c->arg, &so->tpl);
    so->has_template = 1;
}

/* bias = {[token] = number}: finite floats, or -math.huge to ban a token */
static void read_bias(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_sampler_desc *sd = field;
    if (lua_type(L, vi) != LUA_TTABLE)
        option_error(L, c->arg, o->key, lua_pushfstring(L, "table {[token] = bias} expected, got %s", push_got(L, vi)));
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, vi)) {
        n++;
        lua_pop(L, 1);
    }
    kvgen_logit_bias *bias = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *bias, 0);
    anchor_top(c);
    int n_vocab = model_info(c->model).n_vocab, i = 0;
    lua_pushnil(L);
    while (lua_next(L, vi)) {
        int isint = 0;
        lua_Integer id = to_integer(L, -2, &isint);
        if (!isint || id < 0 || id >= n_vocab)
            option_error(L, c->arg, o->key,
                         lua_pushfstring(L, "keys must be token ids in [0, %d), got %s", n_vocab, push_key_text(L, -2)));
        if (lua_type(L, -1) != LUA_TNUMBER)
            option_error(L, c->arg, o->key,
                         lua_pushfstring(L, "bias of token %I: number expected, got %s", (LUAI_UACINT)id,
                                         push_got(L, -1)));
        lua_Number b = lua_tonumber(L, -1);
        /* a float bias: finite, or -inf to ban (NaN and +inf are meaningless) */
        if (!(b >= -FLT_MAX && b <= FLT_MAX) && !(isinf(b) && b < 0))
            option_error(L, c->arg, o->key,
                         lua_pushfstring(L, "bias of token %I: %s is not allowed (a finite number, or -math.huge to "
                                            "ban the token)",
                                         (LUAI_UACINT)id, push_number_text(L, b)));
        bias[i].token = (int32_t)id;
        bias[i].bias = (float)b;
        i++;
        lua_pop(L, 1);
    }
    sd->bias = bias;
    sd->n_bias = n;
}

#define SO(field) .off = offsetof(session_opts, field)
/* The sampler's ranges are what kvgen_sampler_desc accepts (floats finite as floats), so a bad
 * value is an argument error naming it, never a failure of the C call. */
static const opt_spec session_specs[] = {
    {.key = "context", .type = OPT_INT, SO(d.n_ctx), .lo = 0, .hi = INT_MAX, .need = SESSION_ONLY},
    {.key = "no_cache", .type = OPT_BOOL, SO(d.no_cache), .need = SESSION_ONLY},
    {.key = "on_full", .type = OPT_CHOICE, SO(on_full), .names = on_full_names, .need = SESSION_ONLY},
    {.key = "keep", .type = OPT_INT, SO(d.keep), .lo = 0, .hi = INT_MAX, .need = SESSION_ONLY},
    {.key = "prefix_reuse", .type = OPT_BOOL, SO(prefix_reuse), .need = SESSION_ONLY},
    {.key = "system", .type = OPT_STRING, SO(system), .need = SESSION_ONLY},
    {.key = "template", .type = OPT_CUSTOM, .read = read_session_template, .need = SESSION_ONLY},
    {.key = "seed", .type = OPT_U64, SO(sd.seed)},
    {.key = "temperature", .type = OPT_FLOAT, SO(sd.temperature), .flo = -FLT_MAX, .fhi = FLT_MAX}, /* <= 0: greedy */
    {.key = "top_k", .type = OPT_INT, SO(sd.top_k), .lo = 0, .hi = INT_MAX},
    {.key = "top_p", .type = OPT_FLOAT, SO(sd.top_p), .flo = 0, .fhi = 1},
    {.key = "min_p", .type = OPT_FLOAT, SO(sd.min_p), .flo = 0, .fhi = 1},
    {.key = "repeat_penalty", .type = OPT_FLOAT, SO(sd.repeat_penalty), .flo = 0, .fhi = FLT_MAX},
    {.key = "frequency_penalty", .type = OPT_FLOAT, SO(sd.frequency_penalty), .flo = -FLT_MAX, .fhi = FLT_MAX},
    {.key = "presence_penalty", .type = OPT_FLOAT, SO(sd.presence_penalty), .flo = -FLT_MAX, .fhi = FLT_MAX},
    {.key = "penalty_window", .type = OPT_INT, SO(sd.penalty_window), .lo = -1, .hi = INT_MAX},
    {.key = "bias", .type = OPT_CUSTOM, SO(sd), .read = read_bias},
};
#undef SO

/* Pushes a closed session userdata whose user value is the model userdata at `model_idx`
 * (the session keeps it alive). */
static lsession *new_session(lua_State *L, kvgen_model *model, int model_idx) {
    model_idx = lua_absindex(L, model_idx);
    lsession *s = lua_newuserdatauv(L, sizeof *s, 2);
    memset(s, 0, sizeof *s);
    s->model = model;
    luaL_setmetatable(L, SESSION_MT);
    lua_pushvalue(L, model_idx);
    lua_setiuservalue(L, -2, 1);
    return s;
}

/* model:session([opts]) -> session */
static int model_session(lua_State *L) {
    lmodel *m = check_model(L, 1);
    lua_settop(L, 2);
    lua_newtable(L); /* 3: anchor */
    session_opts o = {.prefix_reuse = 1};
    read_options(L, 2, session_specs, N_SPECS(session_specs), SESSION_ONLY, &o, 3, m->model);
    o.d.on_full = (kvgen_on_full)o.on_full;
    o.d.no_prefix_reuse = !o.prefix_reuse;
    o.d.sampler = &o.sd;

    lsession *s = new_session(L, m->model, 1);
    kvgen_error err = {0};
    if (kvgen_session_create(m->model, &o.d, &s->session, &err) != KVGEN_OK) {
        s->session = NULL;
        return raise_status(L, &err);
    }
    /* on failure below the new session is garbage and its __gc closes it */
    if (o.has_template && kvgen_chat_set_template(s->session, &o.tpl, &err) != KVGEN_OK) return raise_status(L, &err);
    if (o.system && kvgen_chat_add(s->session, "system", o.system, &err) != KVGEN_OK) return raise_status(L, &err);
    return 1;
}

/* s:fork() -> a new session continuing from this one (shares its full pages copy-on-write) */
static int session_fork(lua_State *L) {
    lsession *s = check_session(L, 1);
    lua_getiuservalue(L, 1, 1);
    lsession *child = new_session(L, s->model, lua_gettop(L));
    kvgen_error err = {0};
    if (kvgen_session_fork(s->session, &child->session, &err) != KVGEN_OK) {
        child->session = NULL;
        return raise_status(L, &err);
    }
    return 1;
}

/* s:rewind(n) -> new length: drops the last n tokens */
static int session_rewind(lua_State *L) {
    lsession *s = check_session(L, 1);
    int isint = 0;
    lua_Integer n = to_integer(L, 2, &isint);
    if (!isint) type_error(L, 2, "n", "integer");
    size_t len = kvgen_session_length(s->session);
    if (n < 0 || (lua_Unsigned)n > len)
        arg_error(L, 2, lua_pushfstring(L, "n: %I is out of range [0, %d]", (LUAI_UACINT)n, (int)len));
    kvgen_error err = {0};
    if (kvgen_session_rewind(s->session, (size_t)n, &err) != KVGEN_OK) return raise_status(L, &err);
    lua_pushinteger(L, (lua_Integer)kvgen_session_length(s->session));
    return 1;
}

static void stream_stop(lstream *st, kvgen_finish finish);

static void stream_finish(lua_State *L, int idx, lstream *st, kvgen_finish finish);

static int session_close(lua_State *L) {
    lsession *s = check_udata(L, 1, SESSION_MT);
    if (s->active) { /* the generator must go first; the stream keeps the text it delivered */
        int top = lua_gettop(L);
        if (lua_getiuservalue(L, 1, 2) == LUA_TTABLE && lua_rawgeti(L, -1, 1) == LUA_TUSERDATA &&
            lua_touserdata(L, -1) == (void *)s->active)
            stream_finish(L, -1, s->active, KVGEN_FINISH_CANCELLED);
        else /* (being collected with the session: nobody can read its text) */
            stream_stop(s->active, KVGEN_FINISH_CANCELLED);
        lua_settop(L, top);
    }
    /* cancels the session's jobs and waits for at most the worker step that holds the session */
    kvgen_session_close(s->session);
    s->session = NULL;
    return 0;
}

static int session_tostring(lua_State *L) {
    lsession *s = check_udata(L, 1, SESSION_MT);
    if (!s->session)
        lua_pushliteral(L, SESSION_MT " (closed)");
    else if (kvgen_session_busy(s->session))
        lua_pushfstring(L, SESSION_MT " (busy: jobs running) (%p)", (void *)s);
    else
        lua_pushfstring(L, SESSION_MT " (%d tokens) (%p)", (int)kvgen_session_length(s->session), (void *)s);
    return 1;
}

static int session_index(lua_State *L) {
    lsession *s = check_udata(L, 1, SESSION_MT);
    const char *key = index_key(L);
    if (lua_getfield(L, lua_upvalueindex(1), key) != LUA_TNIL) return 1;
    if (!s->session) return luaL_error(L, "attempt to use a closed " SESSION_MT);
    if (strcmp(key, "model") == 0) {
        lua_getiuservalue(L, 1, 1);
        return 1;
    }
    check_session_read(L, 1);
    if (strcmp(key, "length") == 0) {
        lua_pushinteger(L, (lua_Integer)kvgen_session_length(s->session));
    } else if (strcmp(key, "template") == 0) {
        push_template_name(L, s);
    } else if (strcmp(key, "context") == 0) {
        kvgen_cache_info ci;
        kvgen_session_cache_info(s->session, &ci);
        lua_pushinteger(L, (lua_Integer)ci.capacity);
    } else {
        lua_pushnil(L);
    }
    return 1;
}

/* s:prefill(text_or_ids [, {special=, bos=}]) -> number of tokens appended */
static int session_prefill(lua_State *L) {
    lsession *s = check_session(L, 1);
    size_t n = 0;
    const int32_t *ids;
    if (lua_type(L, 2) == LUA_TSTRING) {
        size_t len;
        const char *text = lua_tolstring(L, 2, &len);
        unsigned flags = tokenize_flags(L, 3, TOKENIZE_BOS);
        ids = tokenize(L, s->model, text, len, flags, &n);
    } else if (lua_istable(L, 2)) {
        if (tokenize_flags(L, 3, TOKENIZE_BOS))
            arg_error(L, 3, "options 'special' and 'bos' apply to text, not to token ids");
        ids = check_ids(L, 2, "ids", s->model, &n);
    } else {
        return type_error(L, 2, "input", "string or table of token ids");
    }
    kvgen_error err = {0};
    if (kvgen_session_prefill(s->session, ids, n, NULL, &err) != KVGEN_OK) return raise_status(L, &err);
    lua_pushinteger(L, (lua_Integer)n);
    return 1;
}

/* s:sample() -> the next token chosen by the session's sampler, or nil before any logits */
static int session_sample(lua_State *L) {
    lsession *s = check_session(L, 1);
    int32_t t = kvgen_session_sample(s->session);
    if (t < 0)
        lua_pushnil(L);
    else
        lua_pushinteger(L, t);
    return 1;
}

/* s:decode(id) -> the next token the sampler chooses after appending `id` */
static int session_decode(lua_State *L) {
    lsession *s = check_session(L, 1);
    int32_t id = check_token(L, 2, "id", s->model);
    kvgen_error err = {0};
    if (kvgen_session_decode(s->session, id, &err) != KVGEN_OK) return raise_status(L, &err);
    lua_pushinteger(L, kvgen_session_sample(s->session));
    return 1;
}

typedef struct scored {
    float logit;
    int32_t id;
} scored;

static int by_logit_desc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* s:logits([k]) -> the k (default 10) most likely next tokens, best first:
 * {{id=, logit=, p=}, ...}, where p is the softmax over the whole vocabulary. */
static int session_logits(lua_State *L) {
    lsession *s = check_session(L, 1);
    int n_vocab = model_info(s->model).n_vocab;
    lua_Integer k = 10;
    if (!lua_isnoneornil(L, 2)) {
        int isint = 0;
        k = to_integer(L, 2, &isint); /* "3" is refused like every integer given as text */
        if (!isint) type_error(L, 2, "k", "integer");
    }
    if (k < 1 || k > n_vocab)
        arg_error(L, 2, lua_pushfstring(L, "k: %I is out of range [1, %d]", (LUAI_UACINT)k, n_vocab));
    const float *logits = kvgen_session_logits(s->session);
    if (!logits) {
        lua_pushnil(L);
        return 1;
    }
    scored *all = lua_newuserdatauv(L, (size_t)n_vocab * sizeof *all, 0);
    float max = -INFINITY;
    for (int i = 0; i < n_vocab; i++) {
        all[i].logit = isnan(logits[i]) ? -INFINITY : logits[i];
        all[i].id = i;
        if (all[i].logit > max) max = all[i].logit;
    }
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)all[i].logit - max);
    qsort(all, (size_t)n_vocab, sizeof *all, by_logit_desc);
    lua_createtable(L, (int)k, 0);
    for (int i = 0; i < (int)k; i++) {
        lua_createtable(L, 0, 3);
        lua_pushinteger(L, all[i].id);
        lua_setfield(L, -2, "id");
        lua_pushnumber(L, all[i].logit);
        lua_setfield(L, -2, "logit");
        lua_pushnumber(L, exp((double)all[i].logit - max) / sum);
        lua_setfield(L, -2, "p");
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int session_tokens(lua_State *L) {
    lsession *s = check_session_read(L, 1);
    const int32_t *ids = kvgen_session_tokens(s->session);
    size_t n = kvgen_session_length(s->session);
    if (!ids && n > 0) { /* a remote model's session: its history is text */
        kvgen_error e = {.status = KVGEN_E_UNSUPPORTED};
        snprintf(e.message, sizeof e.message,
                 "s:tokens: the session is on a remote model: its token ids are the server's (docs/remote.md)");
        return raise_status(L, &e);
    }
    push_ids(L, ids, n);
    return 1;
}

static int session_reset(lua_State *L) {
    kvgen_session_reset(check_session(L, 1)->session);
    return 0;
}

/* s:cache_info() -> {layers, kv_heads, head_dim, length, capacity, bytes, bytes_per_token, ...} */
static int session_cache_info(lua_State *L) {
#define CI(name, type, field) {name, type, offsetof(kvgen_cache_info, field)}
    static const out_field fields[] = {
        CI("layers", F_INT, n_layer),          CI("kv_heads", F_INT, n_head_kv),
        CI("head_dim", F_INT, head_dim),       CI("length", F_SIZE, length),
        CI("capacity", F_SIZE, capacity),      CI("bytes", F_SIZE, bytes),
        CI("bytes_per_token", F_SIZE, bytes_per_token), CI("page_size", F_SIZE, page_size),
        CI("pages", F_SIZE, pages),            CI("pages_shared", F_SIZE, pages_shared),
        CI("bytes_held", F_SIZE, bytes_held),  CI("tokens_reused", F_SIZE, tokens_reused),
        CI("shifts", F_SIZE, shifts),          CI("window", F_SIZE, window),
        CI("window_pages", F_SIZE, window_pages),
    };
#undef CI
    lsession *s = check_session_read(L, 1);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s->session, &ci);
    push_fields(L, &ci, fields, N_FIELDS(fields));
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
    kvgen_model_pool_info(check_model(L, 1)->model, &pi);
    push_fields(L, &pi, fields, N_FIELDS(fields));
    return 1;
}

/* s:read_cache(layer, "k"|"v") -> flat array of kv_heads * length * head_dim floats;
 * element (h, t, d) (all 0-based) is at index (h * length + t) * head_dim + d + 1. */
static int session_read_cache(lua_State *L) {
    static const char *const which_names[] = {"k", "v", NULL};
    lsession *s = check_session_read(L, 1);
    kvgen_cache_info ci;
    kvgen_session_cache_info(s->session, &ci);
    int isint = 0;
    lua_Integer layer = to_integer(L, 2, &isint);
    if (!isint) type_error(L, 2, "layer", "integer");
    if (layer < 0 || layer >= ci.n_layer)
        arg_error(L, 2, lua_pushfstring(L, "layer: %I is out of range [0, %d)", (LUAI_UACINT)layer, ci.n_layer));
    if (lua_type(L, 3) == LUA_TSTRING) check_cstring(L, 3, 3, "which");
    int which = check_option(L, 3, which_names);
    size_t n = (size_t)ci.n_head_kv * ci.length * (size_t)ci.head_dim;
    float *out = lua_newuserdatauv(L, (n ? n : 1) * sizeof *out, 0);
    kvgen_error err = {0};
    if (kvgen_session_read_cache(s->session, (int)layer, which, out, n, &err) != KVGEN_OK)
        return raise_status(L, &err);
    lua_createtable(L, n < INT_MAX ? (int)n : 0, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushnumber(L, out[i]);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* ---- sampler settings ------------------------------------------------------------------- */

/* s:set_sampler(opts): changes the given settings, keeps the others; a seed re-seeds the RNG,
 * without one the RNG continues its stream */
static int session_set_sampler(lua_State *L) {
    lsession *s = check_session(L, 1);
    lua_settop(L, 2);
    session_opts o = {0};
    kvgen_session_get_sampler(s->session, &o.sd);
    /* the current bias array points into the session: copy it before it is replaced (3) */
    kvgen_logit_bias *old = lua_newuserdatauv(L, (size_t)(o.sd.n_bias > 0 ? o.sd.n_bias : 1) * sizeof *old, 0);
    if (o.sd.n_bias > 0) memcpy(old, o.sd.bias, (size_t)o.sd.n_bias * sizeof *old);
    o.sd.bias = old;
    o.sd.seed = 0;
    lua_newtable(L); /* 4: anchor */
    read_options(L, 2, session_specs, N_SPECS(session_specs), 0, &o, 4, s->model);
    kvgen_error err = {0};
    if (kvgen_session_set_sampler(s->session, &o.sd, &err) != KVGEN_OK) return raise_status(L, &err);
    return 0;
}

/* s:sampler() -> the settings in force: the sampler rows of session_specs, read back */
static int session_sampler(lua_State *L) {
    lsession *s = check_session_read(L, 1);
    session_opts o;
    kvgen_session_get_sampler(s->session, &o.sd);
    lua_createtable(L, 0, 10);
    for (size_t i = 0; i < N_SPECS(session_specs); i++) {
        const opt_spec *r = &session_specs[i];
        const void *p = (const char *)&o + r->off;
        if (r->need) continue; /* a session option, not the sampler's */
        if (r->type == OPT_U64) {
            lua_pushinteger(L, (lua_Integer)*(const uint64_t *)p);
        } else if (r->type == OPT_INT) {
            lua_pushinteger(L, *(const int *)p);
        } else if (r->type == OPT_FLOAT) {
            lua_pushnumber(L, *(const float *)p);
        } else { /* bias: {[token] = bias} */
            lua_createtable(L, 0, o.sd.n_bias > 0 ? o.sd.n_bias : 0);
            for (int b = 0; b < o.sd.n_bias; b++) {
                lua_pushnumber(L, o.sd.bias[b].bias);
                lua_rawseti(L, -2, o.sd.bias[b].token);
            }
        }
        lua_setfield(L, -2, r->key);
    }
    return 1;
}

/* ---- chat templates --------------------------------------------------------------------- */

/* Reads a template given as a family name, a Jinja template (a string with "{{" or "{%"), or a
 * table of prefixes/suffixes or { jinja = source }. */
static void read_template(lua_State *L, int idx, int arg, kvgen_chat_template *tpl) {
    static const char *const keys[] = {"name",        "system_prefix",    "system_suffix",    "user_prefix",
                                       "user_suffix", "assistant_prefix", "assistant_suffix", "jinja",
                                       "system_in_user", NULL};
    memset(tpl, 0, sizeof *tpl);
    need_stack(L, 8, "template");
    if (lua_type(L, idx) == LUA_TSTRING) {
        const char *v = check_cstring(L, idx, arg, "template");
        if (strstr(v, "{{") || strstr(v, "{%")) tpl->jinja = v;
        else tpl->name = v;
        return;
    }
    if (!lua_istable(L, idx)) {
        arg_error(L, arg, lua_pushfstring(L, "template: string or table expected, got %s", luaL_typename(L, idx)));
        return;
    }
    const char **fields[] = {&tpl->name,        &tpl->system_prefix,    &tpl->system_suffix, &tpl->user_prefix,
                             &tpl->user_suffix, &tpl->assistant_prefix, &tpl->assistant_suffix, &tpl->jinja};
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        int k = -1;
        for (int i = 0; keys[i] && k < 0; i++)
            if (is_name(L, -1, keys[i])) k = i;
        if (k < 0 && lua_type(L, -1) == LUA_TSTRING) check_cstring(L, lua_gettop(L), arg, "template field name");
        if (k < 0) arg_error(L, arg, lua_pushfstring(L, "template: unknown field %s", push_key_text(L, -1)));
    }
    for (int i = 0; i < 8; i++) {
        int t = lua_getfield(L, idx, keys[i]);
        if (t != LUA_TNIL && t != LUA_TSTRING)
            arg_error(L, arg,
                      lua_pushfstring(L, "template.%s: string expected, got %s", keys[i], push_got(L, -1)));
        int vi = lua_gettop(L);
        /* stays valid: the table holds the string */
        *fields[i] = t == LUA_TNIL ? NULL : check_cstring(L, vi, arg, lua_pushfstring(L, "template.%s", keys[i]));
        lua_settop(L, vi - 1);
    }
    int t = lua_getfield(L, idx, "system_in_user");
    if (t != LUA_TNIL && t != LUA_TBOOLEAN)
        arg_error(L, arg,
                  lua_pushfstring(L, "template.system_in_user: boolean expected, got %s", luaL_typename(L, -1)));
    tpl->system_in_user = lua_toboolean(L, -1);
    lua_pop(L, 1);
}

/* s:set_template(name_or_table | nil): nil returns to the model's own template */
static int session_set_template(lua_State *L) {
    lsession *s = check_session(L, 1);
    kvgen_error err = {0};
    kvgen_status st;
    if (lua_isnoneornil(L, 2)) {
        st = kvgen_chat_set_template(s->session, NULL, &err);
    } else {
        kvgen_chat_template tpl;
        read_template(L, 2, 2, &tpl);
        st = kvgen_chat_set_template(s->session, &tpl, &err);
    }
    if (st != KVGEN_OK) return raise_status(L, &err);
    return 0;
}

static const char *const role_names[] = {"system", "user", "assistant", NULL};

/* s:add(role, text): appends one complete chat turn */
static int session_add(lua_State *L) {
    lsession *s = check_session(L, 1);
    if (lua_type(L, 2) == LUA_TSTRING) check_cstring(L, 2, 2, "role");
    const char *role = role_names[check_option(L, 2, role_names)];
    const char *text = check_cstring_arg(L, 3, "text");
    kvgen_error err = {0};
    if (kvgen_chat_add(s->session, role, text, &err) != KVGEN_OK) return raise_status(L, &err);
    return 0;
}

/* ---- generation ------------------------------------------------------------------------- */

/* Pushes a const char* array of the strings in the list at `idx` (anchored in the table at
 * `anchor`, which also keeps the strings alive). The list must be a sequence of non-empty
 * strings without NUL bytes (the C API takes them NUL-terminated). */
static const char *const *string_list(lua_State *L, int idx, int arg, const char *what, int anchor, int *n_out) {
    idx = lua_absindex(L, idx);
    need_stack(L, 8, what);
    lua_Unsigned n = check_sequence(L, idx, arg, what);
    if (n > INT_MAX / 2) arg_error(L, arg, lua_pushfstring(L, "%s: too many entries", what));
    const char **list = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *list, 0);
    luaL_ref(L, anchor);
    for (lua_Unsigned i = 0; i < n; i++) {
        if (lua_rawgeti(L, idx, (lua_Integer)i + 1) != LUA_TSTRING || lua_rawlen(L, -1) == 0)
            arg_error(L, arg,
                      lua_pushfstring(L, "%s[%I]: non-empty string expected, got %s", what, (LUAI_UACINT)(i + 1),
                                      lua_type(L, -1) == LUA_TSTRING ? "an empty string" : push_got(L, -1)));
        int vi = lua_gettop(L);
        list[i] = check_cstring(L, vi, arg, lua_pushfstring(L, "%s[%I]", what, (LUAI_UACINT)(i + 1)));
        lua_settop(L, vi);
        luaL_ref(L, anchor); /* pops it; the anchor keeps it */
    }
    *n_out = (int)n;
    return list;
}

static const char *const json_type_names[] = {"string", "number", "enum", NULL};

/* json = {{key=, type="string"|"number"|"enum", values={...}, max_len=}, ...}: a list of field
 * tables with only those keys (values for enums, max_len for strings). */
static const kvgen_json_field *json_fields(lua_State *L, int idx, int arg, int anchor, int *n_out) {
    static const char *const field_keys[] = {"key", "type", "values", "max_len", NULL};
    idx = lua_absindex(L, idx);
    need_stack(L, 16, "option 'json'");
    lua_Unsigned n = check_sequence(L, idx, arg, "option 'json'");
    if (n == 0 || n > INT_MAX / 2) arg_error(L, arg, "option 'json': a non-empty list of fields expected");
    kvgen_json_field *f = lua_newuserdatauv(L, (size_t)n * sizeof *f, 0);
    luaL_ref(L, anchor);
    memset(f, 0, (size_t)n * sizeof *f);
    for (lua_Unsigned i = 0; i < n; i++) {
        LUAI_UACINT at = (LUAI_UACINT)(i + 1);
        if (lua_rawgeti(L, idx, (lua_Integer)i + 1) != LUA_TTABLE)
            arg_error(L, arg, lua_pushfstring(L, "json[%I]: table expected, got %s", at, push_got(L, -1)));
        int fi = lua_gettop(L);
        lua_pushnil(L);
        while (lua_next(L, fi)) { /* a misspelt key ("maxlen") is an error, as for options */
            lua_pop(L, 1);
            int ok = 0;
            for (int k = 0; field_keys[k] && !ok; k++) ok = is_name(L, -1, field_keys[k]);
            if (!ok && lua_type(L, -1) == LUA_TSTRING) {
                int ki = lua_gettop(L);
                check_cstring(L, ki, arg, lua_pushfstring(L, "json[%I] field name", at));
                lua_settop(L, ki);
            }
            if (!ok)
                arg_error(L, arg,
                          lua_pushfstring(L, "json[%I]: unknown field %s (key, type, values, max_len)", at,
                                          push_key_text(L, -1)));
        }
        if (lua_getfield(L, fi, "key") != LUA_TSTRING)
            arg_error(L, arg, lua_pushfstring(L, "json[%I].key: string expected, got %s", at, push_got(L, -1)));
        f[i].key = check_cstring(L, fi + 1, arg, lua_pushfstring(L, "json[%I].key", at));
        lua_settop(L, fi);
        const char *type = lua_getfield(L, fi, "type") == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        int ti = -1;
        for (int k = 0; type && json_type_names[k]; k++)
            if (strcmp(type, json_type_names[k]) == 0 && strlen(type) == lua_rawlen(L, -1)) ti = k;
        if (ti < 0)
            arg_error(L, arg,
                      lua_pushfstring(L, "json[%I].type: 'string', 'number' or 'enum' expected, got %s", at,
                                      type ? lua_pushfstring(L, "'%s'", type) : push_got(L, -1)));
        lua_pop(L, 1);
        f[i].type = (kvgen_json_type)(KVGEN_JSON_STRING + ti);
        int t = lua_getfield(L, fi, "values");
        if (f[i].type == KVGEN_JSON_ENUM) {
            if (t != LUA_TTABLE)
                arg_error(L, arg,
                          lua_pushfstring(L, "json[%I].values: list of strings expected, got %s", at, push_got(L, -1)));
            lua_pushfstring(L, "json[%I].values", at);
            f[i].values = string_list(L, fi + 1, arg, lua_tostring(L, -1), anchor, &f[i].n_values);
        } else if (t != LUA_TNIL) {
            arg_error(L, arg, lua_pushfstring(L, "json[%I].values: only for type 'enum'", at));
        }
        lua_settop(L, fi);
        t = lua_getfield(L, fi, "max_len");
        if (t != LUA_TNIL) {
            if (f[i].type != KVGEN_JSON_STRING)
                arg_error(L, arg, lua_pushfstring(L, "json[%I].max_len: only for type 'string'", at));
            int isint = 0;
            lua_Integer ml = to_integer(L, -1, &isint);
            if (!isint || ml < 0 || ml > INT_MAX)
                arg_error(L, arg,
                          lua_pushfstring(L, "json[%I].max_len: integer >= 0 expected, got %s", at, push_got(L, -1)));
            f[i].max_len = (int)ml;
        }
        lua_settop(L, fi - 1);
    }
    *n_out = (int)n;
    return f;
}

/* Generation options, one table for the eight generation calls: a row that needs a mode bit
 * exists only for the calls whose mode has it (s:stream knows no on_piece, s:submit no role). */
enum {
    GEN_CHAT = 1,      /* a chat turn: `role` */
    GEN_JOB = 2,       /* on the worker: `priority` */
    GEN_ON_PIECE = 4,  /* `on_piece` */
    GEN_ON_DONE = 8,   /* `on_done` */
    GEN_RUN = 16,      /* not an option: run to the end here and return text, finish */
    GEN_ITER = 32      /* not an option: return x, nil, nil, x for a generic for */
};

typedef struct gen_opts {
    kvgen_generate_desc gd;
    kvgen_constraint c;
    int role;       /* index in role_names */
    int schema;     /* a schema was given: the parsed value is returned too */
    int priority;
    int on_piece, on_done; /* given (the functions stay in the options table) */
} gen_opts;

/* stop = a string or a list of strings (KVGEN_MAX_STOPS of at most KVGEN_MAX_STOP_LEN bytes) */
static void read_stop(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_generate_desc *gd = field;
    if (lua_type(L, vi) == LUA_TSTRING) {
        if (lua_rawlen(L, vi) == 0) option_error(L, c->arg, o->key, "stop strings must not be empty");
        if (lua_rawlen(L, vi) > KVGEN_MAX_STOP_LEN)
            option_error(L, c->arg, o->key,
                         lua_pushfstring(L, "the stop string is %I bytes, at most %d", (LUAI_UACINT)lua_rawlen(L, vi),
                                         KVGEN_MAX_STOP_LEN));
        const char *one_s = check_cstring(L, vi, c->arg, "option 'stop'");
        const char **one = lua_newuserdatauv(L, sizeof *one, 0);
        one[0] = one_s;
        anchor_top(c);
        gd->stop = one;
        gd->n_stop = 1;
    } else if (lua_type(L, vi) == LUA_TTABLE) {
        check_sequence(L, vi, c->arg, "option 'stop'");
        gd->stop = string_list(L, vi, c->arg, "stop", c->anchor, &gd->n_stop);
        if (gd->n_stop > KVGEN_MAX_STOPS)
            option_error(L, c->arg, o->key,
                         lua_pushfstring(L, "%d stop strings, at most %d", gd->n_stop, KVGEN_MAX_STOPS));
        for (int i = 0; i < gd->n_stop; i++) {
            size_t len = strlen(gd->stop[i]);
            if (len > KVGEN_MAX_STOP_LEN)
                option_error(L, c->arg, o->key,
                             lua_pushfstring(L, "stop[%d] is %I bytes, at most %d", i + 1, (LUAI_UACINT)len,
                                             KVGEN_MAX_STOP_LEN));
        }
    } else {
        option_error(L, c->arg, o->key,
                     lua_pushfstring(L, "string or list of strings expected, got %s", push_got(L, vi)));
    }
}

/* one constraint per generation */
static void one_constraint(const opt_ctx *c, const opt_spec *o, const kvgen_constraint *k) {
    if (k->kind != KVGEN_CONSTRAIN_NONE)
        option_error(c->L, c->arg, o->key, "cannot be combined with another constraint (choices, json, grammar, schema)");
}

/* choices = {"a", "b", ...}: the output is exactly one of them */
static void read_choices(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_constraint *k = field;
    if (lua_type(L, vi) != LUA_TTABLE)
        option_error(L, c->arg, o->key, lua_pushfstring(L, "list of strings expected, got %s", push_got(L, vi)));
    one_constraint(c, o, k);
    k->kind = KVGEN_CONSTRAIN_CHOICE;
    check_sequence(L, vi, c->arg, "option 'choices'");
    k->choices = string_list(L, vi, c->arg, "choices", c->anchor, &k->n_choices);
    if (k->n_choices == 0) option_error(L, c->arg, o->key, "a non-empty list of strings expected");
}

/* json = {{key=, type=, values=, max_len=}, ...}: one flat JSON object */
static void read_json(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_constraint *k = field;
    if (lua_type(L, vi) != LUA_TTABLE)
        option_error(L, c->arg, o->key, lua_pushfstring(L, "list of fields expected, got %s", push_got(L, vi)));
    one_constraint(c, o, k);
    k->kind = KVGEN_CONSTRAIN_JSON;
    k->fields = json_fields(L, vi, c->arg, c->anchor, &k->n_fields);
}

/* ---- JSON for schemas: a Lua table written as JSON text, generated JSON read back --------- */

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
    option_error(L, c->arg, "schema", lua_pushfstring(L, "%s at schema%s", what, path));
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
static void push_json_value(lua_State *L, const char *text) {
    int top = lua_gettop(L);
    const char *p = text;
    if (!json_push(L, &p, 0) || *p) {
        lua_settop(L, top);
        lua_pushnil(L);
    }
}

/* grammar = "root ::= ...": GBNF text */
static void read_grammar(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_constraint *k = field;
    if (lua_type(L, vi) != LUA_TSTRING)
        option_error(L, c->arg, o->key, lua_pushfstring(L, "GBNF text expected, got %s", push_got(L, vi)));
    one_constraint(c, o, k);
    k->kind = KVGEN_CONSTRAIN_GRAMMAR;
    k->grammar = check_cstring(L, vi, c->arg, "option 'grammar'");
}

/* schema = a table (written as JSON) or JSON text */
static void read_schema(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    gen_opts *g = field;
    one_constraint(c, o, &g->c);
    if (lua_type(L, vi) == LUA_TTABLE) {
        lua_pushvalue(L, vi);
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
    } else if (lua_type(L, vi) == LUA_TSTRING) {
        lua_pushvalue(L, vi);
    } else {
        option_error(L, c->arg, o->key,
                     lua_pushfstring(L, "a table or JSON text expected, got %s", push_got(L, vi)));
    }
    g->c.kind = KVGEN_CONSTRAIN_SCHEMA;
    g->c.schema = check_cstring(L, -1, c->arg, "option 'schema'");
    g->schema = 1;
    anchor_top(c);
}

#define GO(field) .off = offsetof(gen_opts, field)
static const opt_spec gen_specs[] = {
    {.key = "max_tokens", .type = OPT_INT, GO(gd.max_tokens), .lo = -1, .hi = INT_MAX},
    {.key = "soft_max_tokens", .type = OPT_INT, GO(gd.soft_max_tokens), .lo = 0, .hi = INT_MAX},
    {.key = "ignore_eog", .type = OPT_BOOL, GO(gd.ignore_eog)},
    {.key = "special", .type = OPT_FLAG, GO(gd.flags), .flag = KVGEN_TOKENIZE_SPECIAL},
    {.key = "stop", .type = OPT_CUSTOM, GO(gd), .read = read_stop},
    {.key = "choices", .type = OPT_CUSTOM, GO(c), .read = read_choices},
    {.key = "json", .type = OPT_CUSTOM, GO(c), .read = read_json},
    {.key = "grammar", .type = OPT_CUSTOM, GO(c), .read = read_grammar},
    {.key = "schema", .type = OPT_CUSTOM, .off = 0, .read = read_schema},
    {.key = "priority", .type = OPT_INT, GO(priority), .lo = INT_MIN, .hi = INT_MAX, .need = GEN_JOB},
    {.key = "on_piece", .type = OPT_FUNCTION, GO(on_piece), .need = GEN_ON_PIECE},
    {.key = "on_done", .type = OPT_FUNCTION, GO(on_done), .need = GEN_ON_DONE},
    {.key = "role", .type = OPT_CHOICE, GO(role), .names = role_names, .need = GEN_CHAT},
};
#undef GO

/* Reads the generation options at `arg` for a call of `mode`; strings and arrays the desc
 * points into are anchored in the table at `anchor`, which also holds the options table (so
 * the strings it holds stay alive). Everything the C library would refuse is refused here, as
 * an argument error, before the caller touches the session (kvgen_generate_check has the last
 * word on the constraint's rules). */
static void read_generate(lua_State *L, int arg, unsigned mode, int anchor, gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->role = 1; /* "user" */
    if (lua_istable(L, arg)) {
        lua_pushvalue(L, arg);
        luaL_ref(L, anchor);
    }
    read_options(L, arg, gen_specs, N_SPECS(gen_specs), mode, o, anchor, NULL);
    if (o->c.kind != KVGEN_CONSTRAIN_NONE) o->gd.constraint = &o->c;
    kvgen_error err = {0};
    if (kvgen_generate_check(&o->gd, &err) != KVGEN_OK) {
        static const char *const opt_of[] = {NULL, "choices", "json", "grammar", "schema"};
        const char *opt = (unsigned)o->c.kind < 5 ? opt_of[o->c.kind] : NULL;
        if (opt) option_error(L, arg, opt, err.message);
        arg_error(L, arg, err.message);
    }
}

/* Ends the generator and frees the session for other calls. */
static void stream_stop(lstream *st, kvgen_finish finish) {
    if (!st->gen) return;
    if (st->finish == KVGEN_FINISH_NONE) st->finish = finish;
    st->n_tokens = kvgen_gen_n_tokens(st->gen);
    kvgen_gen_end(st->gen);
    st->gen = NULL;
    if (st->owner && st->owner->active == st) st->owner->active = NULL;
}

/* Keeps the text (user value 2: everything delivered) and ends the generator; the session
 * no longer refers to the stream. */
static void stream_finish(lua_State *L, int idx, lstream *st, kvgen_finish finish) {
    if (!st->gen) return;
    idx = lua_absindex(L, idx);
    int top = lua_gettop(L);
    size_t len = 0;
    const char *text = kvgen_gen_text(st->gen, &len);
    lua_pushlstring(L, text ? text : "", text ? len : 0);
    lua_setiuservalue(L, idx, 2);
    stream_stop(st, finish);
    if (lua_getiuservalue(L, idx, 1) == LUA_TUSERDATA && lua_getiuservalue(L, -1, 2) == LUA_TTABLE) {
        lua_pushnil(L);
        lua_rawseti(L, -2, 1);
    }
    lua_settop(L, top);
}

/* Makes the stream at `idx` the session's (at index 1) active one: s->active, and [1] of the
 * session's weak table (user value 2), so that closing the session can keep its text. */
static void stream_attach(lua_State *L, lsession *s, lstream *st, int idx) {
    st->owner = s;
    s->active = st;
    if (lua_getiuservalue(L, 1, 2) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_createtable(L, 1, 0);
        lua_createtable(L, 0, 1);
        lua_pushliteral(L, "v");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
        lua_pushvalue(L, -1);
        lua_setiuservalue(L, 1, 2);
    }
    lua_pushvalue(L, idx);
    lua_rawseti(L, -2, 1);
    lua_pop(L, 1);
}

/* The next non-empty piece of text, or NULL (nothing pushed) at the end. */
static int stream_step(lua_State *L, int idx, lstream *st) {
    if (!st->gen) return 0;
    if (st->finish_pending) {
        stream_finish(L, idx, st, kvgen_gen_finish(st->gen));
        return 0;
    }
    for (;;) {
        kvgen_gen_step step;
        kvgen_error err = {0};
        if (kvgen_gen_next(st->gen, &step, &err) != KVGEN_OK) {
            stream_finish(L, idx, st, KVGEN_FINISH_ERROR);
            raise_status(L, &err);
        }
        if (step.len > 0) {
            lua_pushlstring(L, step.text, step.len);
            lua_pushinteger(L, step.token);
            if (step.finish != KVGEN_FINISH_NONE) st->finish_pending = 1;
            return 2;
        }
        if (step.finish != KVGEN_FINISH_NONE) {
            stream_finish(L, idx, st, step.finish);
            return 0;
        }
    }
}

/* st() / st:next() -> piece, token; nil at the end (so `for piece in st do` works) */
static int stream_call(lua_State *L) {
    lstream *st = check_udata(L, 1, STREAM_MT);
    int n = stream_step(L, 1, st);
    if (n == 0) {
        lua_pushnil(L);
        return 1;
    }
    return n;
}

/* st:cancel(): the generation finishes with "cancelled" at the next step */
static int stream_cancel(lua_State *L) {
    lstream *st = check_udata(L, 1, STREAM_MT);
    if (st->gen) kvgen_gen_cancel(st->gen);
    return 0;
}

static int stream_close(lua_State *L) {
    lstream *st = check_udata(L, 1, STREAM_MT);
    stream_finish(L, 1, st, KVGEN_FINISH_CANCELLED);
    return 0;
}

static int stream_tostring(lua_State *L) {
    lstream *st = check_udata(L, 1, STREAM_MT);
    if (st->gen)
        lua_pushfstring(L, STREAM_MT " (generating) (%p)", (void *)st);
    else
        lua_pushfstring(L, STREAM_MT " (%s) (%p)", kvgen_finish_name(st->finish), (void *)st);
    return 1;
}

/* fields: finish ("none" while running), text (so far), n_tokens, session */
static int stream_index(lua_State *L) {
    lstream *st = check_udata(L, 1, STREAM_MT);
    const char *key = index_key(L);
    if (lua_getfield(L, lua_upvalueindex(1), key) != LUA_TNIL) return 1;
    if (strcmp(key, "finish") == 0) {
        lua_pushstring(L, kvgen_finish_name(st->gen ? KVGEN_FINISH_NONE : st->finish));
    } else if (strcmp(key, "n_tokens") == 0) {
        lua_pushinteger(L, st->gen ? kvgen_gen_n_tokens(st->gen) : st->n_tokens);
    } else if (strcmp(key, "text") == 0) {
        if (st->gen) {
            size_t len = 0;
            const char *text = kvgen_gen_text(st->gen, &len);
            lua_pushlstring(L, text ? text : "", text ? len : 0);
        } else if (lua_getiuservalue(L, 1, 2) != LUA_TSTRING) {
            lua_pop(L, 1);
            lua_pushliteral(L, "");
        }
    } else if (strcmp(key, "value") == 0) { /* a schema stream's text, parsed, once it completed */
        if (!st->gen && st->schema && st->finish == KVGEN_FINISH_STOP && lua_getiuservalue(L, 1, 2) == LUA_TSTRING)
            push_json_value(L, lua_tostring(L, -1));
        else
            lua_pushnil(L);
    } else if (strcmp(key, "session") == 0) {
        lua_getiuservalue(L, 1, 1);
    } else {
        lua_pushnil(L);
    }
    return 1;
}

/* Runs the stream at `idx` to its end, calling on_piece (at `cb`, 0: none)
 * with each piece; pushes text, finish. A Lua error in the callback ends the generation
 * (the session keeps what was generated) and is raised again unchanged. */
static int run_to_end(lua_State *L, int idx, int cb) {
    lstream *st = lua_touserdata(L, idx);
    for (;;) {
        int n = stream_step(L, idx, st);
        if (n == 0) break;
        if (cb) {
            lua_pushvalue(L, cb);
            lua_insert(L, -3);
            if (lua_pcall(L, 2, 1, 0) != LUA_OK) {
                stream_finish(L, idx, st, KVGEN_FINISH_CANCELLED);
                return lua_error(L);
            }
            if (lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1)) kvgen_gen_cancel(st->gen);
            lua_pop(L, 1);
        } else {
            lua_pop(L, n);
        }
    }
    lua_getiuservalue(L, idx, 2);
    lua_pushstring(L, kvgen_finish_name(st->finish));
    return 2;
}

/* s:choose(candidates [, {by = "sum"|"mean"}]) -> best index, log-probs, details
 * Scores each candidate as a continuation of the session's text; the session is unchanged. */
static int session_choose(lua_State *L) {
    static const char *const by_names[] = {"sum", "mean", NULL};
    static const opt_spec choose_specs[] = {{.key = "by", .type = OPT_CHOICE, .names = by_names}};
    lsession *s = check_session(L, 1);
    lua_settop(L, 3);
    if (!lua_istable(L, 2)) type_error(L, 2, "candidates", "list of strings");
    int by_mean = 0;
    read_options(L, 3, choose_specs, N_SPECS(choose_specs), 0, &by_mean, 0, NULL);
    lua_newtable(L);
    int anchor = lua_gettop(L);
    int n = 0;
    const char *const *cands = string_list(L, 2, 2, "candidates", anchor, &n);
    if (n == 0) arg_error(L, 2, "candidates: a non-empty list of strings expected");
    kvgen_choice *res = lua_newuserdatauv(L, (size_t)n * sizeof *res, 0);
    kvgen_error err = {0};
    if (kvgen_session_choose(s->session, cands, (size_t)n, res, &err) != KVGEN_OK) return raise_status(L, &err);
    int best = 0;
    for (int i = 1; i < n; i++) {
        double a = by_mean ? res[i].logprob_mean : res[i].logprob;
        double b = by_mean ? res[best].logprob_mean : res[best].logprob;
        if (a > b) best = i;
    }
    lua_pushinteger(L, best + 1);
    lua_createtable(L, n, 0);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushnumber(L, res[i].logprob);
        lua_rawseti(L, -3, i + 1);
        lua_createtable(L, 0, 3);
        lua_pushnumber(L, res[i].logprob);
        lua_setfield(L, -2, "logprob");
        lua_pushnumber(L, res[i].logprob_mean);
        lua_setfield(L, -2, "logprob_mean");
        lua_pushinteger(L, res[i].n_tokens);
        lua_setfield(L, -2, "n_tokens");
        lua_rawseti(L, -2, i + 1);
    }
    return 3;
}

/* s.template -> "jinja" (a Jinja template runs), the family in use, "custom", or nil when the
 * model has no usable template */
static void push_template_name(lua_State *L, lsession *s) {
    kvgen_error err = {0};
    const char *name = kvgen_chat_template_name(s->session, &err);
    if (name)
        lua_pushstring(L, name);
    else
        lua_pushnil(L);
}

/* ---- save / restore --------------------------------------------------------------------- */

/* s:save(path) */
static int session_save(lua_State *L) {
    lsession *s = check_session(L, 1);
    const char *path = check_cstring_arg(L, 2, "path");
    kvgen_error err = {0};
    if (kvgen_session_save(s->session, path, &err) != KVGEN_OK) return raise_status(L, &err);
    return 0;
}

/* model:restore(path) -> session saved by s:save */
static int model_restore(lua_State *L) {
    lmodel *m = check_model(L, 1);
    const char *path = check_cstring_arg(L, 2, "path");
    lsession *s = new_session(L, m->model, 1);
    kvgen_error err = {0};
    if (kvgen_session_restore(m->model, path, &s->session, &err) != KVGEN_OK) {
        s->session = NULL;
        return raise_status(L, &err);
    }
    return 1;
}

/* ---- jobs: non-blocking generation on the model's worker thread ------------------------- *
 * The worker never touches a lua_State: it only fills the C job's buffers. Text reaches Lua
 * through kvgen.poll() (every job of this state, with callbacks) or job:poll() / the job as an
 * iterator (one job, no callbacks), always on the thread that calls them. Whether a session is
 * the worker's is the C library's to say (kvgen_session_busy): a job closed before it is final
 * is released at once, and its session stays busy until the worker has let go of it. */

static int is_final_state(kvgen_job_state st) { return st >= KVGEN_JOB_DONE; }

/* This state's owner key for kvgen_poll, and its job tables (created on first use). */
static void ensure_state(lua_State *L) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, STATE_KEY) == LUA_TUSERDATA) {
        lua_pop(L, 1);
        return;
    }
    lua_pop(L, 1);
    lua_newuserdatauv(L, 2, 0); /* two addresses: two owner keys (see state_owner) */
    lua_setfield(L, LUA_REGISTRYINDEX, STATE_KEY);
    lua_newtable(L); /* jobs by address: weak values, so a dropped job can be collected */
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_setfield(L, LUA_REGISTRYINDEX, JOBS_KEY);
    lua_newtable(L);
    lua_setfield(L, LUA_REGISTRYINDEX, ANCHORED_KEY);
}

/* The kvgen_poll owner of this state's jobs: kvgen.poll() takes the events of the public one;
 * the private one is for jobs read only by their own iterator (stream_async), so kvgen.poll()
 * never takes their text away from the coroutine that reads them. */
static const void *state_owner(lua_State *L, int private_key) {
    lua_getfield(L, LUA_REGISTRYINDEX, STATE_KEY);
    const char *key = lua_touserdata(L, -1);
    lua_pop(L, 1);
    return key + (private_key ? 1 : 0);
}

/* registry[ANCHORED_KEY][job at idx] = nil: a job with callbacks no longer needs keeping
 * (it is final, or closed) */
static void unanchor(lua_State *L, int idx) {
    idx = lua_absindex(L, idx);
    if (lua_getfield(L, LUA_REGISTRYINDEX, ANCHORED_KEY) == LUA_TTABLE) {
        lua_pushvalue(L, idx);
        lua_pushnil(L);
        lua_rawset(L, -3);
    }
    lua_pop(L, 1);
}

static ljob *check_job(lua_State *L, int arg) {
    ljob *j = check_udata(L, arg, JOB_MT);
    if (!j->job) luaL_error(L, "attempt to use a closed " JOB_MT);
    return j;
}

/* job:close() (also __gc and __close): releases the job, cancelling it if it still runs (the
 * worker lets go of it, and of its session, at its next step). */
static int job_close(lua_State *L) {
    ljob *j = check_udata(L, 1, JOB_MT);
    if (!j->job) return 0;
    unanchor(L, 1);
    kvgen_job_release(j->job);
    j->job = NULL;
    return 0;
}

static int job_tostring(lua_State *L) {
    ljob *j = check_udata(L, 1, JOB_MT);
    if (!j->job) {
        lua_pushliteral(L, JOB_MT " (closed)");
    } else {
        kvgen_job_info info;
        kvgen_job_get_info(j->job, &info);
        lua_pushfstring(L, JOB_MT " (%s) (%p)", kvgen_job_state_name(info.state), (void *)j);
    }
    return 1;
}

/* Submits the request and pushes the kvgen.Job. The session is at index 1, the callbacks
 * table (or nil) at `cbs`; `private_key`: kvgen.poll() does not see the job. */
static ljob *job_submit(lua_State *L, lsession *s, kvgen_job_desc *d, int cbs, int private_key) {
    ensure_state(L);
    ljob *j = lua_newuserdatauv(L, sizeof *j, 2);
    memset(j, 0, sizeof *j);
    luaL_setmetatable(L, JOB_MT);
    int idx = lua_gettop(L);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, idx, 1);
    d->owner = state_owner(L, private_key);
    d->user_data = j;
    kvgen_error err = {0};
    if (kvgen_job_submit(s->session, d, &j->job, &err) != KVGEN_OK) {
        j->job = NULL;
        raise_status(L, &err);
    }
    j->model = s->model;
    lua_getfield(L, LUA_REGISTRYINDEX, JOBS_KEY);
    lua_pushlightuserdata(L, j);
    lua_pushvalue(L, idx);
    lua_rawset(L, -3);
    lua_pop(L, 1);
    if (!lua_isnil(L, cbs)) {
        lua_pushvalue(L, cbs);
        lua_setiuservalue(L, idx, 2);
        /* kept alive until final, so fire-and-forget requests still get their callbacks */
        lua_getfield(L, LUA_REGISTRYINDEX, ANCHORED_KEY);
        lua_pushvalue(L, idx);
        lua_pushboolean(L, 1);
        lua_rawset(L, -3);
        lua_pop(L, 1);
    }
    lua_settop(L, idx);
    return j;
}

/* ---- the generation calls: one starter for prompt or chat x blocking, stream or job -------- */

/* What to append before generating: a chat turn (role NULL: only the assistant header), text
 * (tokenized plainly, never parsing control tokens), token ids, or nothing. */
typedef struct gen_prompt {
    kvgen_prompt_kind kind;
    const char *text; /* TEXT: the prompt (any bytes); CHAT: the message */
    size_t len;
    const char *role;
    const int32_t *ids; /* TOKENS: a userdata left on the stack */
    size_t n;
} gen_prompt;

/* The prompt (or, with GEN_CHAT, the message) at index 2; nothing is appended yet. */
static void read_gen_prompt(lua_State *L, lsession *s, unsigned mode, const gen_opts *o, gen_prompt *p) {
    memset(p, 0, sizeof *p);
    if (mode & GEN_CHAT) {
        p->kind = KVGEN_PROMPT_CHAT;
        p->role = role_names[o->role];
        if (lua_type(L, 2) == LUA_TSTRING) {
            p->text = check_cstring(L, 2, 2, "message");
            p->len = lua_rawlen(L, 2);
        } else if (lua_isnil(L, 2)) {
            p->role = NULL; /* no turn: only the assistant header */
        } else {
            type_error(L, 2, "message", "string or nil");
        }
    } else if (lua_type(L, 2) == LUA_TSTRING) {
        p->text = lua_tolstring(L, 2, &p->len);
        p->kind = p->len > 0 ? KVGEN_PROMPT_TEXT : KVGEN_PROMPT_NONE;
    } else if (lua_istable(L, 2)) {
        p->kind = KVGEN_PROMPT_TOKENS;
        p->ids = check_ids(L, 2, "prompt", s->model, &p->n);
    } else if (!lua_isnil(L, 2)) {
        type_error(L, 2, "prompt", "string, table of token ids or nil");
    }
}

/* s:generate / s:stream / s:chat / s:chat_stream: a kvgen_gen run on this thread. The C call
 * that appends the prompt or chat turn and starts the generation is all or nothing: when it
 * fails, nothing was appended and the chat state is as it was. */
static int start_stream(lua_State *L, lsession *s, unsigned mode, gen_opts *o, gen_prompt *p) {
    lstream *st = lua_newuserdatauv(L, sizeof *st, 2);
    memset(st, 0, sizeof *st);
    st->schema = o->schema;
    luaL_setmetatable(L, STREAM_MT);
    int idx = lua_gettop(L);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, idx, 1);
    kvgen_error err = {0};
    kvgen_status rc = p->kind == KVGEN_PROMPT_CHAT ? kvgen_chat_gen_begin(s->session, p->role, p->text, &o->gd, &st->gen, &err)
                      : p->kind == KVGEN_PROMPT_TEXT
                          ? kvgen_gen_begin_text(s->session, p->text, p->len, &o->gd, &st->gen, &err)
                          : kvgen_gen_begin_prompt(s->session, p->ids, p->n, &o->gd, &st->gen, &err);
    if (rc != KVGEN_OK) {
        st->gen = NULL;
        return raise_status(L, &err);
    }
    stream_attach(L, s, st, idx);
    if (mode & GEN_RUN) {
        int cb = 0;
        if (o->on_piece) {
            lua_getfield(L, 3, "on_piece");
            lua_insert(L, idx); /* below the stream, which run_to_end keeps on top */
            cb = idx++;
        }
        int n = run_to_end(L, idx, cb);
        if (!o->schema) return n;
        /* with a schema: text, finish, and the text's value (nil unless it is complete) */
        if (strcmp(lua_tostring(L, -1), "stop") == 0) push_json_value(L, lua_tostring(L, -2));
        else lua_pushnil(L);
        return n + 1;
    }
    lua_pushnil(L);
    lua_pushnil(L);
    lua_pushvalue(L, idx);
    return 4;
}

/* s:submit / s:submit_chat / s:stream_async / s:chat_stream_async: a kvgen_job, queued on the
 * worker; returns at once. Callbacks ({on_piece=, on_done=}) are kept by the job. */
static int start_job(lua_State *L, lsession *s, unsigned mode, gen_opts *o, const gen_prompt *p) {
    kvgen_job_desc d = {.prompt = p->kind, .text = p->text, .text_len = p->len, .role = p->role,
                        .tokens = p->ids, .n_tokens = p->n, .gen = o->gd, .priority = o->priority};
    if (o->on_piece || o->on_done) {
        static const char *const names[] = {"on_piece", "on_done"};
        lua_newtable(L);
        for (int i = 0; i < 2; i++)
            if (lua_getfield(L, 3, names[i]) == LUA_TNIL) lua_pop(L, 1);
            else lua_setfield(L, -2, names[i]);
    } else {
        lua_pushnil(L);
    }
    ljob *j = job_submit(L, s, &d, lua_gettop(L), (mode & GEN_ITER) != 0);
    j->schema = o->schema;
    if (!(mode & GEN_ITER)) return 1;
    lua_pushnil(L);
    lua_pushnil(L);
    lua_pushvalue(L, -3);
    return 4;
}

/* Checks the session, the options and the prompt (in that order, before anything touches the
 * session), then starts the generation `mode` asks for. A job may be queued behind others of
 * the session; a generation on this thread needs the session to itself. */
static int gen_start(lua_State *L, unsigned mode) {
    lsession *s = (mode & GEN_JOB) ? check_no_stream(L, check_session_open(L, 1)) : check_session(L, 1);
    lua_settop(L, 3);
    lua_newtable(L); /* 4: anchor of the options' strings and arrays, until the C call copied them */
    gen_opts o;
    read_generate(L, 3, mode, 4, &o);
    gen_prompt p;
    read_gen_prompt(L, s, mode, &o, &p);
    return (mode & GEN_JOB) ? start_job(L, s, mode, &o, &p) : start_stream(L, s, mode, &o, &p);
}

/* s:generate([prompt [, opts]]) -> text, finish */
static int session_generate(lua_State *L) { return gen_start(L, GEN_RUN | GEN_ON_PIECE); }
/* s:stream([prompt [, opts]]) -> st, nil, nil, st: `for piece, token in s:stream(p) do ... end`
 * closes the stream when the loop ends or breaks */
static int session_stream(lua_State *L) { return gen_start(L, GEN_ITER); }
/* s:chat(message [, opts]) -> reply, finish: one chat turn in the session's template */
static int session_chat(lua_State *L) { return gen_start(L, GEN_CHAT | GEN_RUN | GEN_ON_PIECE); }
/* s:chat_stream(message [, opts]) -> st, nil, nil, st */
static int session_chat_stream(lua_State *L) { return gen_start(L, GEN_CHAT | GEN_ITER); }
/* s:submit([prompt [, opts]]) -> job: queued on the worker, returns at once */
static int session_submit(lua_State *L) { return gen_start(L, GEN_JOB | GEN_ON_PIECE | GEN_ON_DONE); }
/* s:submit_chat(message [, opts]) -> job: a chat turn then the reply, on the worker */
static int session_submit_chat(lua_State *L) { return gen_start(L, GEN_JOB | GEN_CHAT | GEN_ON_PIECE | GEN_ON_DONE); }
/* s:stream_async([prompt [, opts]]) -> job, nil, nil, job: a generic-for iterator that never
 * waits (it gives "" while nothing new is ready); the job is closed when the loop ends, and
 * kvgen.poll() never reports it (its text is the iterator's alone) */
static int session_stream_async(lua_State *L) { return gen_start(L, GEN_JOB | GEN_ITER); }
/* s:chat_stream_async(message [, opts]) -> job, nil, nil, job */
static int session_chat_stream_async(lua_State *L) { return gen_start(L, GEN_JOB | GEN_CHAT | GEN_ITER); }

/* job:poll() -> new text ("" when none), done, finish (nil while running). Never waits. */
static int job_poll(lua_State *L) {
    ljob *j = check_job(L, 1);
    const char *text = "";
    size_t len = 0;
    kvgen_job_state st = kvgen_job_poll(j->job, &text, &len);
    lua_pushlstring(L, text, len);
    if (!is_final_state(st)) {
        lua_pushboolean(L, 0);
        return 2;
    }
    unanchor(L, 1);
    kvgen_job_info info;
    kvgen_job_get_info(j->job, &info);
    lua_pushboolean(L, 1);
    lua_pushstring(L, kvgen_finish_name(info.finish));
    return 3;
}

/* job() / `for piece in job do`: the next text, "" while nothing new is ready, nil at the end;
 * a failed job raises its error (as a synchronous stream does) */
static int job_call(lua_State *L) {
    ljob *j = check_job(L, 1);
    const char *text = "";
    size_t len = 0;
    kvgen_job_state st = kvgen_job_poll(j->job, &text, &len);
    if (is_final_state(st)) unanchor(L, 1);
    if (len > 0) {
        lua_pushlstring(L, text, len);
        return 1;
    }
    if (!is_final_state(st)) {
        lua_pushliteral(L, "");
        return 1;
    }
    if (st == KVGEN_JOB_FAILED) {
        kvgen_job_info info;
        kvgen_job_get_info(j->job, &info);
        return raise_status(L, &info.error);
    }
    lua_pushnil(L);
    return 1;
}

static int job_cancel(lua_State *L) {
    kvgen_job_cancel(check_job(L, 1)->job);
    return 0;
}

static int job_set_priority(lua_State *L) {
    ljob *j = check_job(L, 1);
    int isint = 0;
    lua_Integer p = to_integer(L, 2, &isint);
    if (!isint) type_error(L, 2, "priority", "integer");
    if (p < INT_MIN || p > INT_MAX)
        arg_error(L, 2, lua_pushfstring(L, "priority: %I is out of range [%d, %d]", (LUAI_UACINT)p, INT_MIN, INT_MAX));
    kvgen_job_set_priority(j->job, (int)p);
    return 0;
}

/* a failed job's message as kvgen raises it ("kvgen: context full ..."), else nil */
static void push_job_error(lua_State *L, const kvgen_job_info *info) {
    if (info->state == KVGEN_JOB_FAILED)
        lua_pushfstring(L, "kvgen: %s", info->error.message[0] ? info->error.message
                                                               : kvgen_status_name(info->error.status));
    else
        lua_pushnil(L);
}

/* job:info() -> progress and timing (milliseconds from submit; nil where not reached yet) */
static int job_info(lua_State *L) {
#define JI(name, type) {#name, type, offsetof(kvgen_job_info, name)}
    static const out_field fields[] = {
        JI(priority, F_INT), JI(prompt_tokens, F_SIZE), JI(prompt_done, F_SIZE), JI(n_tokens, F_INT),
        JI(queue_ms, F_MS),  JI(first_token_ms, F_MS),  JI(total_ms, F_MS),     JI(tokens_per_s, F_DOUBLE),
    };
#undef JI
    ljob *j = check_job(L, 1);
    kvgen_job_info info;
    kvgen_job_get_info(j->job, &info);
    push_fields(L, &info, fields, N_FIELDS(fields));
    lua_pushstring(L, kvgen_job_state_name(info.state));
    lua_setfield(L, -2, "state");
    lua_pushstring(L, kvgen_finish_name(info.finish));
    lua_setfield(L, -2, "finish");
    push_job_error(L, &info);
    lua_setfield(L, -2, "error");
    return 1;
}

/* fields: state, finish ("none" while running), text (all generated so far: complete once the
 * state is final, kvgen_job_text), error (the message of a failed job, else nil), priority,
 * session */
static int job_index(lua_State *L) {
    ljob *j = check_udata(L, 1, JOB_MT);
    const char *key = index_key(L);
    if (lua_getfield(L, lua_upvalueindex(1), key) != LUA_TNIL) return 1;
    if (!j->job) return luaL_error(L, "attempt to use a closed " JOB_MT);
    kvgen_job_info info;
    kvgen_job_get_info(j->job, &info);
    if (strcmp(key, "state") == 0) {
        lua_pushstring(L, kvgen_job_state_name(info.state));
    } else if (strcmp(key, "finish") == 0) {
        lua_pushstring(L, kvgen_finish_name(info.finish));
    } else if (strcmp(key, "text") == 0) {
        size_t len = 0;
        const char *text = kvgen_job_text(j->job, &len);
        lua_pushlstring(L, text ? text : "", text ? len : 0);
    } else if (strcmp(key, "error") == 0) {
        push_job_error(L, &info);
    } else if (strcmp(key, "value") == 0) { /* a schema job's text, parsed, once it completed */
        if (j->schema && info.state == KVGEN_JOB_DONE && info.finish == KVGEN_FINISH_STOP)
            push_json_value(L, kvgen_job_text(j->job, NULL));
        else
            lua_pushnil(L);
    } else if (strcmp(key, "priority") == 0) {
        lua_pushinteger(L, info.priority);
    } else if (strcmp(key, "session") == 0) {
        lua_getiuservalue(L, 1, 1);
    } else {
        lua_pushnil(L);
    }
    return 1;
}

/* Polls one model for this state's jobs and appends one event table per job with news to the
 * list at `list` ({job=, text=, state=, finished=, finish=}). Text is copied at once: a
 * callback run later may release jobs and with them the C buffers. */
static void poll_model(lua_State *L, kvgen_model *model, const void *owner, int list, int jobs) {
    enum { BATCH = 64 };
    kvgen_event ev[BATCH];
    int k;
    do {
        k = kvgen_poll(model, owner, ev, BATCH);
        for (int i = 0; i < k; i++) {
            lua_pushlightuserdata(L, ev[i].user_data);
            if (lua_rawget(L, jobs) != LUA_TUSERDATA) { /* collected: being finalized, nobody to tell */
                lua_pop(L, 1);
                continue;
            }
            lua_createtable(L, 0, 5);
            lua_pushvalue(L, -2);
            lua_setfield(L, -2, "job");
            lua_pushlstring(L, ev[i].text, ev[i].len);
            lua_setfield(L, -2, "text");
            lua_pushstring(L, kvgen_job_state_name(ev[i].state));
            lua_setfield(L, -2, "state");
            lua_pushboolean(L, ev[i].finished);
            lua_setfield(L, -2, "finished");
            lua_pushstring(L, kvgen_finish_name(ev[i].finish));
            lua_setfield(L, -2, "finish");
            lua_rawseti(L, list, (lua_Integer)lua_rawlen(L, list) + 1);
            lua_pop(L, 1);
        }
    } while (k == BATCH);
}

/* Runs one callback (the function and its `nargs` arguments on top) protected. On success its
 * first result is left on the stack; on an error the first one of this poll is kept at err_idx. */
static int run_callback(lua_State *L, int nargs, int err_idx, int *failed) {
    if (lua_pcall(L, nargs, 1, 0) == LUA_OK) return 0;
    if (!*failed) lua_replace(L, err_idx);
    *failed = 1;
    return 1;
}

/* kvgen.poll([model]) -> list of events of this lua_State's jobs (on `model`, or on every
 * model it has jobs on). Never waits. Callbacks run here, after every event was collected. */
static int l_poll(lua_State *L) {
    lua_settop(L, 1);
    need_stack(L, 24, "kvgen.poll");
    ensure_state(L);
    deliver_logs(L);
    const void *owner = state_owner(L, 0);
    lua_getfield(L, LUA_REGISTRYINDEX, JOBS_KEY);
    int jobs = lua_gettop(L);
    lua_newtable(L);
    int list = lua_gettop(L);
    if (!lua_isnil(L, 1)) {
        poll_model(L, check_model(L, 1)->model, owner, list, jobs);
    } else {
        /* the distinct models of the open jobs not yet reported final (usually one) */
        int n = 0;
        lua_pushnil(L);
        while (lua_next(L, jobs)) {
            n++;
            lua_pop(L, 1);
        }
        kvgen_model **models = lua_newuserdatauv(L, (size_t)(n ? n : 1) * sizeof *models, 0);
        int n_models = 0;
        lua_pushnil(L);
        while (lua_next(L, jobs)) {
            ljob *j = luaL_testudata(L, -1, JOB_MT);
            lua_pop(L, 1);
            if (!j || !j->job || n_models == n) continue;
            int seen = 0;
            for (int i = 0; i < n_models && !seen; i++) seen = models[i] == j->model;
            if (!seen) models[n_models++] = j->model;
        }
        for (int i = 0; i < n_models; i++) poll_model(L, models[i], owner, list, jobs);
    }
    /* callbacks: on_piece(piece, job) (false cancels), on_done(text, finish, job) */
    int n_events = (int)lua_rawlen(L, list);
    lua_pushnil(L);
    int err_idx = lua_gettop(L), failed = 0;
    for (int i = 1; i <= n_events; i++) {
        lua_rawgeti(L, list, i);
        int ev = lua_gettop(L);
        lua_getfield(L, ev, "job");
        int jidx = lua_gettop(L);
        ljob *j = lua_touserdata(L, jidx);
        lua_getfield(L, ev, "finished");
        int finished = lua_toboolean(L, -1);
        lua_pop(L, 1);
        if (j->job && lua_getiuservalue(L, jidx, 2) == LUA_TTABLE) {
            int cbs = lua_gettop(L);
            int bad = 0;
            lua_getfield(L, ev, "text");
            if (lua_rawlen(L, -1) > 0 && lua_getfield(L, cbs, "on_piece") == LUA_TFUNCTION) {
                lua_insert(L, -2);
                lua_pushvalue(L, jidx);
                bad = run_callback(L, 2, err_idx, &failed);
                if (!bad && lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1) && j->job)
                    kvgen_job_cancel(j->job);
            }
            lua_settop(L, cbs);
            if (!bad && finished && j->job && lua_getfield(L, cbs, "on_done") == LUA_TFUNCTION) {
                size_t len = 0;
                const char *text = kvgen_job_text(j->job, &len);
                lua_pushlstring(L, text ? text : "", text ? len : 0);
                lua_getfield(L, ev, "finish");
                lua_pushvalue(L, jidx);
                bad = run_callback(L, 3, err_idx, &failed);
            }
            if (bad) {
                /* the job ends (as a synchronous generation whose callback raised) and gets no
                 * more callbacks; the first error is raised again once every event is handled */
                if (j->job) kvgen_job_cancel(j->job);
                lua_pushnil(L);
                lua_setiuservalue(L, jidx, 2);
                unanchor(L, jidx);
            }
        }
        if (finished) unanchor(L, jidx);
        lua_settop(L, err_idx);
    }
    if (failed) {
        lua_pushvalue(L, err_idx);
        return lua_error(L);
    }
    lua_pushvalue(L, list);
    return 1;
}

/* ---- module ----------------------------------------------------------------------------- */

/* kvgen.type(x) -> "model", "session", "stream", "job", "detokenizer", "closed model",
 * "closed session", "closed stream" (finished), "closed job", or nil */
static int l_type(lua_State *L) {
    if (lua_type(L, 1) == LUA_TNONE) arg_error(L, 1, "value expected");
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
        DI("default", F_BOOL, is_default),
    };
#undef DI
    kvgen_error err = {0};
    int count = 0;
    if (kvgen_devices(NULL, 0, &count, &err) != KVGEN_OK) return raise_status(L, &err);
    kvgen_device_info *dev = lua_newuserdatauv(L, (size_t)(count > 0 ? count : 1) * sizeof *dev, 0);
    if (count > 0 && kvgen_devices(dev, count, &count, &err) != KVGEN_OK) return raise_status(L, &err);
    lua_createtable(L, count, 0);
    for (int i = 0; i < count; i++) {
        const kvgen_device_info *d = &dev[i];
        push_fields(L, d, fields, N_FIELDS(fields));
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

static const luaL_Reg model_methods[] = {
    {"close", model_close},
    {"info", model_info_table},
    {"describe", model_describe},
    {"tokenize", model_tokenize},
    {"detokenize", model_detokenize},
    {"piece", model_piece},
    {"is_eog", model_is_eog},
    {"is_control", model_is_control},
    {"token", model_token},
    {"detokenizer", model_detokenizer},
    {"session", model_session},
    {"pool_info", model_pool_info},
    {"restore", model_restore},
    {NULL, NULL},
};

static const luaL_Reg session_methods[] = {
    {"close", session_close},
    {"prefill", session_prefill},
    {"decode", session_decode},
    {"sample", session_sample},
    {"logits", session_logits},
    {"tokens", session_tokens},
    {"reset", session_reset},
    {"cache_info", session_cache_info},
    {"read_cache", session_read_cache},
    {"fork", session_fork},
    {"rewind", session_rewind},
    {"save", session_save},
    {"set_sampler", session_set_sampler},
    {"sampler", session_sampler},
    {"set_template", session_set_template},
    {"add", session_add},
    {"generate", session_generate},
    {"stream", session_stream},
    {"chat", session_chat},
    {"chat_stream", session_chat_stream},
    {"choose", session_choose},
    {"submit", session_submit},
    {"submit_chat", session_submit_chat},
    {"stream_async", session_stream_async},
    {"chat_stream_async", session_chat_stream_async},
    {NULL, NULL},
};

static const luaL_Reg stream_methods[] = {
    {"next", stream_call},
    {"cancel", stream_cancel},
    {"close", stream_close},
    {NULL, NULL},
};

static const luaL_Reg job_methods[] = {
    {"poll", job_poll},
    {"info", job_info},
    {"cancel", job_cancel},
    {"set_priority", job_set_priority},
    {"close", job_close},
    {NULL, NULL},
};

static const luaL_Reg detok_methods[] = {
    {"push", detok_push},
    {"flush", detok_flush},
    {NULL, NULL},
};

/* registry[NAMES_KEY][fn] = "<prefix>.<name>" (arg_error's names) */
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
static void new_type(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction index,
                     lua_CFunction close, lua_CFunction tostring) {
    /* metamethods first: a method that is also one (close) is named as the method */
    if (index) name_function(L, index, name, "__index");
    if (close) name_function(L, close, name, "__close");
    name_function(L, tostring, name, "__tostring");
    name_functions(L, methods, name);
    luaL_newmetatable(L, name);
    lua_createtable(L, 0, 16);
    luaL_setfuncs(L, methods, 0);
    if (index) {
        lua_pushcclosure(L, index, 1);
    }
    lua_setfield(L, -2, "__index");
    if (close) {
        lua_pushcfunction(L, close);
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, "__gc");
        lua_setfield(L, -2, "__close");
    }
    lua_pushcfunction(L, tostring);
    lua_setfield(L, -2, "__tostring");
    lua_pop(L, 1);
}

/* ---- the logger ---------------------------------------------------------------------------
 * kvgen calls its logger from any thread (the worker's too), so the C logger only queues the
 * message; the script's function gets the queued messages on the script's thread, in order, at
 * the end of kvgen.load, in kvgen.poll and in kvgen.set_logger. The queue is a userdata (no C
 * global): a fixed ring of messages, the ones that did not fit counted and reported. */
#define LOG_SLOTS 64
#define LOG_TEXT 512
typedef struct log_queue {
    pthread_mutex_t lock;
    int head, n, dropped, installed;
    struct {
        kvgen_log_level level;
        char text[LOG_TEXT];
    } slot[LOG_SLOTS];
} log_queue;

static void queue_log(void *user, kvgen_log_level level, const char *message) {
    log_queue *q = user;
    pthread_mutex_lock(&q->lock);
    if (q->n == LOG_SLOTS) {
        q->dropped++;
    } else {
        int i = (q->head + q->n++) % LOG_SLOTS;
        q->slot[i].level = level;
        snprintf(q->slot[i].text, LOG_TEXT, "%s", message);
    }
    pthread_mutex_unlock(&q->lock);
}

static int log_queue_gc(lua_State *L) {
    log_queue *q = check_udata(L, 1, LOGGER_MT);
    if (q->installed) kvgen_set_logger(NULL, NULL); /* returns once no call is running */
    q->installed = 0;
    pthread_mutex_destroy(&q->lock);
    return 0;
}

/* Hands the queued messages to the script's function (errors it raises propagate). */
static void deliver_logs(lua_State *L) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, LOGGER_KEY) != LUA_TTABLE) {
        lua_pop(L, 1);
        return;
    }
    int t = lua_gettop(L);
    lua_rawgeti(L, t, 1);
    log_queue *q = lua_touserdata(L, -1);
    lua_pop(L, 1);
    for (;;) {
        kvgen_log_level level = KVGEN_LOG_WARNING;
        int dropped = 0, have = 0;
        char text[LOG_TEXT];
        pthread_mutex_lock(&q->lock);
        if (q->n) {
            level = q->slot[q->head].level;
            memcpy(text, q->slot[q->head].text, LOG_TEXT);
            q->head = (q->head + 1) % LOG_SLOTS;
            q->n--;
            have = 1;
        } else if (q->dropped) {
            dropped = q->dropped;
            q->dropped = 0;
        }
        pthread_mutex_unlock(&q->lock);
        if (!have && !dropped) break;
        lua_rawgeti(L, t, 2);
        lua_pushstring(L, kvgen_log_level_name(level));
        if (have) lua_pushstring(L, text);
        else lua_pushfstring(L, "%d log messages dropped (more than %d between deliveries)", dropped, LOG_SLOTS);
        lua_call(L, 2, 0);
    }
    lua_pop(L, 1);
}

/* kvgen.set_logger(function(level, message) ... end | nil): level is "error", "warning",
 * "info" or "debug". nil gives the messages back to kvgen's default (stderr). */
static int l_set_logger(lua_State *L) {
    if (!lua_isnoneornil(L, 1) && !lua_isfunction(L, 1))
        arg_error(L, 1, lua_pushfstring(L, "function expected, got %s", luaL_typename(L, 1)));
    lua_settop(L, 1);
    deliver_logs(L); /* what the previous function has not seen yet */
    log_queue *q = NULL;
    if (lua_getfield(L, LUA_REGISTRYINDEX, LOGGER_KEY) == LUA_TTABLE) {
        lua_rawgeti(L, -1, 1);
        q = lua_touserdata(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    if (lua_isnil(L, 1)) {
        if (q && q->installed) kvgen_set_logger(NULL, NULL);
        if (q) q->installed = 0;
        return 0;
    }
    if (!q) {
        lua_createtable(L, 2, 0);
        q = lua_newuserdatauv(L, sizeof *q, 0);
        memset(q, 0, sizeof *q);
        pthread_mutex_init(&q->lock, NULL);
        if (luaL_newmetatable(L, LOGGER_MT)) {
            lua_pushcfunction(L, log_queue_gc);
            lua_setfield(L, -2, "__gc");
        }
        lua_setmetatable(L, -2);
        lua_rawseti(L, -2, 1);
        lua_setfield(L, LUA_REGISTRYINDEX, LOGGER_KEY);
    }
    lua_getfield(L, LUA_REGISTRYINDEX, LOGGER_KEY);
    lua_pushvalue(L, 1);
    lua_rawseti(L, -2, 2);
    lua_pop(L, 1);
    q->installed = 1;
    kvgen_set_logger(queue_log, q);
    return 0;
}

static const luaL_Reg module_functions[] = {
    {"set_logger", l_set_logger},
    {"load", l_load},
    {"type", l_type},
    {"devices", l_devices},
    {"last_error", l_last_error},
    {"poll", l_poll},
    {"pipeline_cache_path", l_pipeline_cache_path},
    {NULL, NULL},
};

/* The metatables and per-state tables; idempotent (luaopen_kvgen and kvgen_lua_push_model). */
static void register_types(lua_State *L) {
    ensure_state(L);
    if (luaL_getmetatable(L, JOB_MT) != LUA_TNIL) {
        lua_pop(L, 1);
        return;
    }
    lua_pop(L, 1);
    new_type(L, MODEL_MT, model_methods, model_index, model_close, model_tostring);
    new_type(L, SESSION_MT, session_methods, session_index, session_close, session_tostring);
    new_type(L, DETOK_MT, detok_methods, NULL, NULL, detok_tostring);
    new_type(L, STREAM_MT, stream_methods, stream_index, stream_close, stream_tostring);
    luaL_getmetatable(L, STREAM_MT);
    lua_pushcfunction(L, stream_call);
    lua_setfield(L, -2, "__call");
    lua_pop(L, 1);
    new_type(L, JOB_MT, job_methods, job_index, job_close, job_tostring);
    luaL_getmetatable(L, JOB_MT);
    lua_pushcfunction(L, job_call);
    lua_setfield(L, -2, "__call");
    lua_pop(L, 1);
    name_function(L, job_call, JOB_MT, "__call");
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
    luaL_newlib(L, module_functions);
    lua_pushstring(L, kvgen_version());
    lua_setfield(L, -2, "version");
    lua_pushlightuserdata(L, NULL); /* JSON null in schema values (and in schema tables) */
    lua_setfield(L, -2, "null");
    return 1;
}
