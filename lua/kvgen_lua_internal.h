/*
 * kvgen_lua_internal.h: what the files of the Lua module share (never installed, never included
 * by a host): the handle types, the registry keys, and the helpers one file defines for the
 * others. Every name shared across files has the prefix kvl_ (the static library
 * kvgen_lua_static is linked into hosts, whose own names must not meet the module's).
 */
#ifndef KVGEN_LUA_INTERNAL_H
#define KVGEN_LUA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <lauxlib.h>
#include <lua.h>

#include "kvgen.h"
#include "kvgen_lua.h"

#define MODEL_MT "kvgen.Model"
#define SESSION_MT "kvgen.Session"
#define DETOK_MT "kvgen.Detokenizer"
#define STREAM_MT "kvgen.Stream"
#define JOB_MT "kvgen.Job"
#define MEMORY_MT "kvgen.Memory"
#define ADAPTER_MT "kvgen.Adapter"
/* per lua_State (registry): C adapter (light userdata) -> its kvgen.Adapter handle, weak values */
#define ADAPTERS_KEY "kvgen.adapters"
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

/* A handle type (lua_module.c makes its metatable): methods from the lists of the files that
 * implement them; `index` a function when the type has fields as well as methods; `close`
 * serves as __gc and __close; `call` as __call. */
typedef struct kvl_type {
    const char *name;
    const luaL_Reg *const *methods; /* NULL-terminated */
    lua_CFunction index, close, tostring, call;
} kvl_type;

extern const kvl_type kvl_model_type, kvl_detok_type; /* lua_model.c */
extern const kvl_type kvl_session_type;               /* lua_session.c */
extern const kvl_type kvl_stream_type;                /* lua_generate.c */
extern const kvl_type kvl_job_type;                   /* lua_jobs.c */
extern const kvl_type kvl_memory_type;                /* lua_memory.c */
extern const luaL_Reg kvl_memory_functions[];         /* lua_memory.c: kvgen.memory, kvgen.memory_load */
int kvl_memory_count(lua_State *L);                   /* lua_memory.c: kvgen.Memory's __len */
extern const kvl_type kvl_adapter_type;               /* lua_adapter.c */
extern const luaL_Reg kvl_model_adapter_methods[];    /* lua_adapter.c: model:load_adapter */
extern const luaL_Reg kvl_session_adapter_methods[];  /* lua_adapter.c: s:set_adapters, s:adapters */
/* lua_adapter.c: the adapters list at idx ({adapter, ...} or {{adapter, scale}, ...}) read into
 * KVGEN_MAX_ADAPTERS-long arrays; returns how many; argument errors name `what` and the entry. */
size_t kvl_read_adapters(lua_State *L, int idx, int arg, const char *what, const kvgen_adapter **adapters,
                         float *scales);
extern const luaL_Reg kvl_model_session_methods[];    /* lua_session.c: model:session, model:restore */
extern const luaL_Reg kvl_session_gen_methods[];      /* lua_generate.c: s:generate, s:chat, ... */

/* ---- lua_module.c: kvgen's errors, result tables ---------------------------------------- */

/* Raises "kvgen: <message>" and records the status name for kvgen.last_error(). */
int kvl_raise_status(lua_State *L, const kvgen_error *err);

/* Structs the C API fills are handed to Lua as tables, one out_field row per field. */
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

#define N_FIELDS(t) (sizeof(t) / sizeof((t)[0]))

void kvl_push_field(lua_State *L, const void *base, const out_field *f);
/* Pushes a new table with the n fields of the struct at `base`. */
void kvl_push_fields(lua_State *L, const void *base, const out_field *f, size_t n);

/* Pushes a zeroed userdata of `size` bytes whose __gc is `gc` (metatable `mt`, made on first use):
 * C memory that must be freed even when a Lua error is raised while it is held. */
void *kvl_push_box(lua_State *L, size_t size, const char *mt, lua_CFunction gc);

/* ---- lua_options.c: arguments ----------------------------------------------------------- */

const char *kvl_push_number_text(lua_State *L, lua_Number v);
const char *kvl_push_got(lua_State *L, int idx);
int kvl_arg_error(lua_State *L, int arg, const char *msg);
void *kvl_check_udata(lua_State *L, int arg, const char *tname);
int kvl_check_option(lua_State *L, int arg, const char *const names[]);
int kvl_type_error(lua_State *L, int arg, const char *name, const char *expected);
const char *kvl_check_cstring(lua_State *L, int idx, int arg, const char *what);
const char *kvl_check_cstring_arg(lua_State *L, int arg, const char *what);
const char *kvl_push_key_text(lua_State *L, int idx);
lua_Unsigned kvl_check_sequence(lua_State *L, int idx, int arg, const char *what);
void kvl_need_stack(lua_State *L, int n, const char *what);
lua_Integer kvl_to_integer(lua_State *L, int idx, int *isint);
const char *kvl_index_key(lua_State *L);
const char *const *kvl_string_list(lua_State *L, int idx, int arg, const char *what, int anchor, int *n_out);

/* ---- lua_options.c: tables with named fields -------------------------------------------- *
 * Every call that takes an options table describes it with one table of opt_spec rows (name,
 * type, range or choices, destination), and kvl_read_options does all the checking: unknown
 * keys, types, ranges, NUL bytes, with messages that name the option and the value ("option
 * 'top_p': 1.5 is out of range [0, 1]"); kvl_arg_error adds the function. Absent options keep
 * the value the caller put in the destination (the default). A table inside an argument (a
 * chat template, a JSON field) is read by the same rows through kvl_read_fields, its messages
 * naming it ("template.user_prefix: string expected, got number 1"). */

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

/* What a reader needs besides the value: the argument (for messages), a table that keeps
 * arrays and strings alive while the destination is used (luaL_ref), the model (token ids),
 * and the name of the table when it is not an options table. */
typedef struct opt_ctx {
    lua_State *L;
    int arg, anchor;
    const kvgen_model *model;
    const char *table; /* NULL: an options table ("option 'k'"); else its name ("template": "template.k") */
    int list_keys;     /* an unknown field's message lists the known ones */
} opt_ctx;

typedef struct opt_spec opt_spec;
/* reads the value at `vi` (not nil, unless the row is `required`) into `field` */
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
    int required;              /* read also when absent (nil): the reader refuses or allows it */
    opt_reader read;           /* OPT_CUSTOM */
};

#define N_SPECS(t) (sizeof(t) / sizeof((t)[0]))

/* Reads the options table at `arg` (none or nil: every default) into `dest` with the rows of
 * `specs` that `mode` has; any other key is refused, so a typo ("temprature") is an error and
 * not a silent default. `anchor` (0: none) is the table custom readers keep their arrays in. */
void kvl_read_options(lua_State *L, int arg, const opt_spec *specs, size_t n, unsigned mode, void *dest, int anchor,
                      const kvgen_model *model);
/* Reads the table at `idx` (checked to be one by the caller) with c's naming: every row of
 * `specs`, and no other key. */
void kvl_read_fields(const opt_ctx *c, int idx, const opt_spec *specs, size_t n, void *dest);
/* "option 'k': <what>", the argument error of a bad option */
int kvl_option_error(lua_State *L, int arg, const char *key, const char *what);
/* The same for the row `o` of the table c reads ("template.k: <what>" for a named table). */
int kvl_field_error(const opt_ctx *c, const opt_spec *o, const char *what);
/* Pushes how messages name the row `o` ("option 'k'", "template.k"). */
const char *kvl_push_field_name(const opt_ctx *c, const opt_spec *o);
const char *kvl_read_string(const opt_ctx *c, const opt_spec *o, int vi);
/* Keeps the value on top of the stack alive in the anchor table (pops it). */
void kvl_anchor_top(const opt_ctx *c);

/* ---- lua_model.c ------------------------------------------------------------------------ */

lmodel *kvl_check_model(lua_State *L, int arg);
kvgen_model_info kvl_model_info(const kvgen_model *model);
int32_t kvl_check_token(lua_State *L, int arg, const char *name, const kvgen_model *model);
/* Reads a Lua array of token ids into a userdata it leaves on the stack. */
int32_t *kvl_check_ids(lua_State *L, int arg, const char *name, const kvgen_model *model, size_t *n);
/* Tokenizes into a userdata it leaves on the stack. */
int32_t *kvl_tokenize(lua_State *L, const kvgen_model *model, const char *text, size_t len, unsigned flags,
                      size_t *n);
void kvl_push_ids(lua_State *L, const int32_t *ids, size_t n);
enum { TOKENIZE_BOS = 1 }; /* mode: the call takes `bos` */
/* {special=, bos=} (mode TOKENIZE_BOS) or {special=} (0) as KVGEN_TOKENIZE_* flags */
unsigned kvl_tokenize_flags(lua_State *L, int arg, unsigned mode);
int kvl_load(lua_State *L);
int kvl_pipeline_cache_path(lua_State *L);

/* ---- lua_session.c ---------------------------------------------------------------------- */

lsession *kvl_check_session_open(lua_State *L, int arg);
lsession *kvl_check_no_stream(lua_State *L, lsession *s);
/* An open session that no stream or job is generating on (kvgen_gen_begin wants it to itself). */
lsession *kvl_check_session(lua_State *L, int arg);
extern const char *const kvl_role_names[]; /* "system", "user", "assistant", "tool" */
/* The value at idx (a table, written as JSON, or JSON text) as JSON text on top of the stack;
 * anything else raises an error naming `name` at argument c->arg. */
const char *kvl_json_arg(const opt_ctx *c, int idx, const char *name);

/* ---- lua_generate.c --------------------------------------------------------------------- */

/* Ends the generator and frees the session for other calls. */
void kvl_stream_stop(lstream *st, kvgen_finish finish);
/* Keeps the text (user value 2) and ends the generator of the stream at idx. */
void kvl_stream_finish(lua_State *L, int idx, lstream *st, kvgen_finish finish);

/* ---- lua_jobs.c ------------------------------------------------------------------------- */

/* This state's owner key for kvgen_poll, and its job tables (created on first use). */
void kvl_ensure_state(lua_State *L);
ljob *kvl_job_submit(lua_State *L, lsession *s, kvgen_job_desc *d, int cbs, int private_key);
int kvl_poll(lua_State *L);

/* ---- lua_logger.c ----------------------------------------------------------------------- */

/* Hands the queued log messages to the script's function (errors it raises propagate). */
void kvl_deliver_logs(lua_State *L);
int kvl_set_logger(lua_State *L);

/* ---- lua_json.c ------------------------------------------------------------------------- */

/* Replaces the table on top of the stack by its JSON text (errors name the option 'schema' and
 * the path in the table). */
void kvl_schema_to_json(const opt_ctx *c);
/* The same for any table (tools, template variables, tool calls): errors name `name` (an
 * option, or with c->table set, an argument) and the path in the table. */
void kvl_table_to_json(const opt_ctx *c, const char *name);
/* Pushes the value of a whole JSON text (generated under a schema), or nil. */
void kvl_push_json_value(lua_State *L, const char *text, size_t len);
/* Pushes a "tool_calls" finish's calls as a list of {id =, name =, arguments = table}. */
void kvl_push_tool_calls(lua_State *L, const kvgen_tool_call *calls, int n);

#endif /* KVGEN_LUA_INTERNAL_H */
