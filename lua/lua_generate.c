/*
 * lua_generate.c: generation on a session: the generation options (stop strings and the
 * constraints: choices, json fields, grammar, schema), the eight generation calls (prompt or
 * chat x blocking, stream or job), kvgen.Stream, and s:choose.
 */
#include <limits.h>
#include <string.h>

#include "kvg_host.h"
#include "kvg_json.h"
#include "kvgen_lua_internal.h"

/* ---- generation options ----------------------------------------------------------------- */

static const char *const json_type_names[] = {"string", "number", "enum", NULL};

/* json[i].type = "string", "number" or "enum" */
static void read_json_type(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    const char *type = lua_type(L, vi) == LUA_TSTRING ? lua_tostring(L, vi) : NULL;
    int ti = -1;
    for (int k = 0; type && json_type_names[k]; k++)
        if (strcmp(type, json_type_names[k]) == 0 && strlen(type) == lua_rawlen(L, vi)) ti = k;
    if (ti < 0)
        kvl_field_error(c, o,
                        lua_pushfstring(L, "'string', 'number' or 'enum' expected, got %s",
                                        type ? lua_pushfstring(L, "'%s'", type) : kvl_push_got(L, vi)));
    *(kvgen_json_type *)field = (kvgen_json_type)(KVGEN_JSON_STRING + ti);
}

/* json[i].values = the strings an enum allows (only for one) */
static void read_json_values(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_json_field *f = field;
    if (f->type != KVGEN_JSON_ENUM) {
        if (!lua_isnil(L, vi)) kvl_field_error(c, o, "only for type 'enum'");
        return;
    }
    if (lua_type(L, vi) != LUA_TTABLE)
        kvl_field_error(c, o, lua_pushfstring(L, "list of strings expected, got %s", kvl_push_got(L, vi)));
    f->values = kvl_string_list(L, vi, c->arg, kvl_push_field_name(c, o), c->anchor, &f->n_values);
}

/* json[i].max_len = the longest string value in bytes (only for a string) */
static void read_json_max_len(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_json_field *f = field;
    if (f->type != KVGEN_JSON_STRING) kvl_field_error(c, o, "only for type 'string'");
    int isint = 0;
    lua_Integer ml = kvl_to_integer(L, vi, &isint);
    if (!isint || ml < 0 || ml > INT_MAX)
        kvl_field_error(c, o, lua_pushfstring(L, "integer >= 0 expected, got %s", kvl_push_got(L, vi)));
    f->max_len = (int)ml;
}

/* the fields of one json[i] table: key and type always, values for enums, max_len for strings */
static const opt_spec json_field_specs[] = {
    {.key = "key", .type = OPT_STRING, .off = offsetof(kvgen_json_field, key), .required = 1},
    {.key = "type", .type = OPT_CUSTOM, .off = offsetof(kvgen_json_field, type), .required = 1, .read = read_json_type},
    {.key = "values", .type = OPT_CUSTOM, .required = 1, .read = read_json_values},
    {.key = "max_len", .type = OPT_CUSTOM, .read = read_json_max_len},
};

/* json = {{key=, type="string"|"number"|"enum", values={...}, max_len=}, ...}: a list of field
 * tables with only those keys (a misspelt key, "maxlen", is an error, as for options). */
static const kvgen_json_field *json_fields(lua_State *L, int idx, int arg, int anchor, int *n_out) {
    idx = lua_absindex(L, idx);
    kvl_need_stack(L, 16, "option 'json'");
    lua_Unsigned n = kvl_check_sequence(L, idx, arg, "option 'json'");
    if (n == 0 || n > INT_MAX / 2) kvl_arg_error(L, arg, "option 'json': a non-empty list of fields expected");
    kvgen_json_field *f = lua_newuserdatauv(L, (size_t)n * sizeof *f, 0);
    luaL_ref(L, anchor);
    memset(f, 0, (size_t)n * sizeof *f);
    for (lua_Unsigned i = 0; i < n; i++) {
        int top = lua_gettop(L);
        LUAI_UACINT at = (LUAI_UACINT)(i + 1);
        if (lua_rawgeti(L, idx, (lua_Integer)i + 1) != LUA_TTABLE)
            kvl_arg_error(L, arg, lua_pushfstring(L, "json[%I]: table expected, got %s", at, kvl_push_got(L, -1)));
        opt_ctx c = {.L = L, .arg = arg, .anchor = anchor, .table = lua_pushfstring(L, "json[%I]", at), .list_keys = 1};
        kvl_read_fields(&c, top + 1, json_field_specs, N_SPECS(json_field_specs), &f[i]);
        lua_settop(L, top);
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
    int role;       /* index in kvl_role_names */
    int schema;     /* a schema was given: the parsed value is returned too */
    int priority;
    int on_piece, on_done; /* given (the functions stay in the options table) */
    const char *tools, *template_vars; /* JSON text (anchored), or NULL */
    const char *tool_choice;           /* NULL: auto */
    int thinking;                      /* 0: not given; 1: false; 2: true (enable_thinking) */
    kvgen_tools_desc td;               /* tools the reply may call (a chat on this thread whose
                                          template has a call format) */
    kvgen_tool tool[KVGEN_MAX_TOOLS];
} gen_opts;

/* stop = a string or a list of strings (KVGEN_MAX_STOPS of at most KVGEN_MAX_STOP_LEN bytes) */
static void read_stop(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_generate_desc *gd = field;
    if (lua_type(L, vi) == LUA_TSTRING) {
        if (lua_rawlen(L, vi) == 0) kvl_field_error(c, o, "stop strings must not be empty");
        if (lua_rawlen(L, vi) > KVGEN_MAX_STOP_LEN)
            kvl_field_error(c, o,
                            lua_pushfstring(L, "the stop string is %I bytes, at most %d",
                                            (LUAI_UACINT)lua_rawlen(L, vi), KVGEN_MAX_STOP_LEN));
        const char *one_s = kvl_check_cstring(L, vi, c->arg, "option 'stop'");
        const char **one = lua_newuserdatauv(L, sizeof *one, 0);
        one[0] = one_s;
        kvl_anchor_top(c);
        gd->stop = one;
        gd->n_stop = 1;
    } else if (lua_type(L, vi) == LUA_TTABLE) {
        kvl_check_sequence(L, vi, c->arg, "option 'stop'");
        gd->stop = kvl_string_list(L, vi, c->arg, "stop", c->anchor, &gd->n_stop);
        if (gd->n_stop > KVGEN_MAX_STOPS)
            kvl_field_error(c, o,
                            lua_pushfstring(L, "%d stop strings, at most %d", gd->n_stop, KVGEN_MAX_STOPS));
        for (int i = 0; i < gd->n_stop; i++) {
            size_t len = strlen(gd->stop[i]);
            if (len > KVGEN_MAX_STOP_LEN)
                kvl_field_error(c, o,
                                lua_pushfstring(L, "stop[%d] is %I bytes, at most %d", i + 1, (LUAI_UACINT)len,
                                                KVGEN_MAX_STOP_LEN));
        }
    } else {
        kvl_field_error(c, o,
                        lua_pushfstring(L, "string or list of strings expected, got %s", kvl_push_got(L, vi)));
    }
}

/* one constraint per generation */
static void one_constraint(const opt_ctx *c, const opt_spec *o, const kvgen_constraint *k) {
    if (k->kind != KVGEN_CONSTRAIN_NONE)
        kvl_field_error(c, o, "cannot be combined with another constraint (choices, json, grammar, schema)");
}

/* choices = {"a", "b", ...}: the output is exactly one of them */
static void read_choices(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_constraint *k = field;
    if (lua_type(L, vi) != LUA_TTABLE)
        kvl_field_error(c, o, lua_pushfstring(L, "list of strings expected, got %s", kvl_push_got(L, vi)));
    one_constraint(c, o, k);
    k->kind = KVGEN_CONSTRAIN_CHOICE;
    kvl_check_sequence(L, vi, c->arg, "option 'choices'");
    k->choices = kvl_string_list(L, vi, c->arg, "choices", c->anchor, &k->n_choices);
    if (k->n_choices == 0) kvl_field_error(c, o, "a non-empty list of strings expected");
}

/* json = {{key=, type=, values=, max_len=}, ...}: one flat JSON object */
static void read_json(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_constraint *k = field;
    if (lua_type(L, vi) != LUA_TTABLE)
        kvl_field_error(c, o, lua_pushfstring(L, "list of fields expected, got %s", kvl_push_got(L, vi)));
    one_constraint(c, o, k);
    k->kind = KVGEN_CONSTRAIN_JSON;
    k->fields = json_fields(L, vi, c->arg, c->anchor, &k->n_fields);
}

/* grammar = "root ::= ...": GBNF text */
static void read_grammar(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    kvgen_constraint *k = field;
    if (lua_type(L, vi) != LUA_TSTRING)
        kvl_field_error(c, o, lua_pushfstring(L, "GBNF text expected, got %s", kvl_push_got(L, vi)));
    one_constraint(c, o, k);
    k->kind = KVGEN_CONSTRAIN_GRAMMAR;
    k->grammar = kvl_check_cstring(L, vi, c->arg, "option 'grammar'");
}

/* schema = a table (written as JSON) or JSON text */
static void read_schema(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    lua_State *L = c->L;
    gen_opts *g = field;
    one_constraint(c, o, &g->c);
    if (lua_type(L, vi) == LUA_TTABLE) {
        lua_pushvalue(L, vi);
        kvl_schema_to_json(c);
    } else if (lua_type(L, vi) == LUA_TSTRING) {
        lua_pushvalue(L, vi);
    } else {
        kvl_field_error(c, o,
                        lua_pushfstring(L, "a table or JSON text expected, got %s", kvl_push_got(L, vi)));
    }
    g->c.kind = KVGEN_CONSTRAIN_SCHEMA;
    g->c.schema = kvl_check_cstring(L, -1, c->arg, "option 'schema'");
    g->schema = 1;
    kvl_anchor_top(c);
}

/* tools = a list of function descriptions, template_vars = a table of variables (or JSON text) */
static void read_json_opt(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    *(const char **)field = kvl_json_arg(c, vi, o->key);
    kvl_anchor_top(c);
}

/* thinking = true/false: the template's enable_thinking */
static void read_thinking(const opt_ctx *c, const opt_spec *o, int vi, void *field) {
    if (!lua_isboolean(c->L, vi)) kvl_option_error(c->L, c->arg, o->key, "a boolean expected");
    *(int *)field = lua_toboolean(c->L, vi) ? 2 : 1;
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
    {.key = "role", .type = OPT_CHOICE, GO(role), .names = kvl_role_names, .need = GEN_CHAT},
    {.key = "tools", .type = OPT_CUSTOM, GO(tools), .read = read_json_opt, .need = GEN_CHAT},
    {.key = "template_vars", .type = OPT_CUSTOM, GO(template_vars), .read = read_json_opt, .need = GEN_CHAT},
    {.key = "tool_choice", .type = OPT_STRING, GO(tool_choice), .need = GEN_CHAT},
    {.key = "thinking_budget", .type = OPT_INT, GO(gd.thinking_budget), .lo = 0, .hi = INT_MAX, .need = GEN_CHAT},
    {.key = "thinking", .type = OPT_CUSTOM, GO(thinking), .read = read_thinking, .need = GEN_CHAT},
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
    kvl_read_options(L, arg, gen_specs, N_SPECS(gen_specs), mode, o, anchor, NULL);
    if (o->c.kind != KVGEN_CONSTRAIN_NONE) o->gd.constraint = &o->c;
    kvgen_error err = {0};
    if (kvgen_generate_check(&o->gd, &err) != KVGEN_OK) {
        static const char *const opt_of[] = {NULL, "choices", "json", "grammar", "schema"};
        const char *opt = (unsigned)o->c.kind < 5 ? opt_of[o->c.kind] : NULL;
        if (opt) kvl_option_error(L, arg, opt, err.message);
        kvl_arg_error(L, arg, err.message);
    }
}

/* ---- streams: a generation on the script's thread ---------------------------------------- */

void kvl_stream_stop(lstream *st, kvgen_finish finish) {
    if (!st->gen) return;
    if (st->finish == KVGEN_FINISH_NONE) st->finish = finish;
    st->n_tokens = kvgen_gen_n_tokens(st->gen);
    kvgen_gen_end(st->gen);
    st->gen = NULL;
    if (st->owner && st->owner->active == st) st->owner->active = NULL;
}

/* The session no longer refers to the stream. */
void kvl_stream_finish(lua_State *L, int idx, lstream *st, kvgen_finish finish) {
    if (!st->gen) return;
    idx = lua_absindex(L, idx);
    int top = lua_gettop(L);
    size_t len = 0;
    const char *text = kvgen_gen_text(st->gen, &len);
    lua_pushlstring(L, text ? text : "", text ? len : 0);
    lua_setiuservalue(L, idx, 2);
    const kvgen_tool_call *calls = NULL;
    int n = kvgen_gen_tool_calls(st->gen, &calls);
    if (n > 0) { /* {id =, name =, arguments = table}, kept as user value 3 */
        kvl_push_tool_calls(L, calls, n);
        lua_setiuservalue(L, idx, 3);
    }
    size_t rlen = 0;
    const char *reasoning = kvgen_gen_reasoning(st->gen, &rlen);
    if (reasoning) { /* user value 4 */
        lua_pushlstring(L, reasoning, rlen);
        lua_setiuservalue(L, idx, 4);
    }
    kvl_stream_stop(st, finish);
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

/* The next step with text or reasoning: pushes its text ("" when it only reasoned), token and,
 * when it has some, its reasoning; returns how many it pushed (0 at the end). */
static int stream_step(lua_State *L, int idx, lstream *st) {
    if (!st->gen) return 0;
    if (st->finish_pending) {
        kvl_stream_finish(L, idx, st, kvgen_gen_finish(st->gen));
        return 0;
    }
    for (;;) {
        kvgen_gen_step step;
        kvgen_error err = {0};
        if (kvgen_gen_next(st->gen, &step, &err) != KVGEN_OK) {
            kvl_stream_finish(L, idx, st, KVGEN_FINISH_ERROR);
            kvl_raise_status(L, &err);
        }
        if (step.len > 0 || step.reasoning_len > 0) { /* a reply's reasoning comes third, apart */
            lua_pushlstring(L, step.text, step.len);
            lua_pushinteger(L, step.token);
            if (step.finish != KVGEN_FINISH_NONE) st->finish_pending = 1;
            if (step.reasoning_len == 0) return 2;
            lua_pushlstring(L, step.reasoning, step.reasoning_len);
            return 3;
        }
        if (step.finish != KVGEN_FINISH_NONE) {
            kvl_stream_finish(L, idx, st, step.finish);
            return 0;
        }
    }
}

/* st() / st:next() -> piece, token[, reasoning]; nil at the end (so `for piece in st do` works) */
static int stream_call(lua_State *L) {
    lstream *st = kvl_check_udata(L, 1, STREAM_MT);
    int n = stream_step(L, 1, st);
    if (n == 0) {
        lua_pushnil(L);
        return 1;
    }
    return n;
}

/* st:cancel(): the generation finishes with "cancelled" at the next step */
static int stream_cancel(lua_State *L) {
    lstream *st = kvl_check_udata(L, 1, STREAM_MT);
    if (st->gen) kvgen_gen_cancel(st->gen);
    return 0;
}

static int stream_close(lua_State *L) {
    lstream *st = kvl_check_udata(L, 1, STREAM_MT);
    kvl_stream_finish(L, 1, st, KVGEN_FINISH_CANCELLED);
    return 0;
}

static int stream_tostring(lua_State *L) {
    lstream *st = kvl_check_udata(L, 1, STREAM_MT);
    if (st->gen)
        lua_pushfstring(L, STREAM_MT " (generating) (%p)", (void *)st);
    else
        lua_pushfstring(L, STREAM_MT " (%s) (%p)", kvgen_finish_name(st->finish), (void *)st);
    return 1;
}

/* fields: finish ("none" while running), text (so far), n_tokens, session */
static int stream_index(lua_State *L) {
    lstream *st = kvl_check_udata(L, 1, STREAM_MT);
    const char *key = kvl_index_key(L);
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
            kvl_push_json_value(L, lua_tostring(L, -1), lua_rawlen(L, -1));
        else
            lua_pushnil(L);
    } else if (strcmp(key, "tool_calls") == 0) { /* the calls of a "tool_calls" finish */
        if (st->gen || lua_getiuservalue(L, 1, 3) != LUA_TTABLE) lua_pushnil(L);
    } else if (strcmp(key, "reasoning") == 0) { /* what a reply thought, once finished */
        if (st->gen || lua_getiuservalue(L, 1, 4) != LUA_TSTRING) lua_pushnil(L);
    } else if (strcmp(key, "session") == 0) {
        lua_getiuservalue(L, 1, 1);
    } else {
        lua_pushnil(L);
    }
    return 1;
}

/* Runs the stream at `idx` to its end, calling on_piece (at `cb`, 0: none)
 * with each piece, token and reasoning piece; pushes text, finish. A Lua error in the callback ends the generation
 * (the session keeps what was generated) and is raised again unchanged. */
static int run_to_end(lua_State *L, int idx, int cb) {
    lstream *st = lua_touserdata(L, idx);
    for (;;) {
        int n = stream_step(L, idx, st);
        if (n == 0) break;
        if (cb) {
            lua_pushvalue(L, cb);
            lua_insert(L, -1 - n);
            if (lua_pcall(L, n, 1, 0) != LUA_OK) {
                kvl_stream_finish(L, idx, st, KVGEN_FINISH_CANCELLED);
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
    bool reasoning = lua_getiuservalue(L, idx, 4) == LUA_TSTRING;
    lua_pop(L, 1);
    if (st->finish != KVGEN_FINISH_TOOL_CALLS && !reasoning) return 2;
    if (st->finish == KVGEN_FINISH_TOOL_CALLS) lua_getiuservalue(L, idx, 3);
    else lua_pushnil(L);
    if (!reasoning) return 3;
    lua_getiuservalue(L, idx, 4);
    return 4;
}

/* ---- choose ----------------------------------------------------------------------------- */

/* s:choose(candidates [, {by = "sum"|"mean"}]) -> best index, log-probs, details
 * Scores each candidate as a continuation of the session's text; the session is unchanged. */
static int session_choose(lua_State *L) {
    static const char *const by_names[] = {"sum", "mean", NULL};
    static const opt_spec choose_specs[] = {{.key = "by", .type = OPT_CHOICE, .names = by_names}};
    lsession *s = kvl_check_session(L, 1);
    lua_settop(L, 3);
    if (!lua_istable(L, 2)) kvl_type_error(L, 2, "candidates", "list of strings");
    int by_mean = 0;
    kvl_read_options(L, 3, choose_specs, N_SPECS(choose_specs), 0, &by_mean, 0, NULL);
    lua_newtable(L);
    int anchor = lua_gettop(L);
    int n = 0;
    const char *const *cands = kvl_string_list(L, 2, 2, "candidates", anchor, &n);
    if (n == 0) kvl_arg_error(L, 2, "candidates: a non-empty list of strings expected");
    kvgen_choice *res = lua_newuserdatauv(L, (size_t)n * sizeof *res, 0);
    kvgen_error err = {0};
    if (kvgen_session_choose(s->session, cands, (size_t)n, res, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
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
        p->role = kvl_role_names[o->role];
        if (lua_type(L, 2) == LUA_TSTRING) {
            p->text = kvl_check_cstring(L, 2, 2, "message");
            p->len = lua_rawlen(L, 2);
        } else if (lua_isnil(L, 2)) {
            p->role = NULL; /* no turn: only the assistant header */
        } else {
            kvl_type_error(L, 2, "message", "string or nil");
        }
    } else if (lua_type(L, 2) == LUA_TSTRING) {
        p->text = lua_tolstring(L, 2, &p->len);
        p->kind = p->len > 0 ? KVGEN_PROMPT_TEXT : KVGEN_PROMPT_NONE;
    } else if (lua_istable(L, 2)) {
        p->kind = KVGEN_PROMPT_TOKENS;
        p->ids = kvl_check_ids(L, 2, "prompt", s->model, &p->n);
    } else if (!lua_isnil(L, 2)) {
        kvl_type_error(L, 2, "prompt", "string, table of token ids or nil");
    }
}

/* The chat's variables as the options `tools` and `template_vars` make them: template_vars (an
 * object) with "tools" set to the tools given. Pushes the JSON text. */
static const char *push_chat_vars(lua_State *L, const gen_opts *o) {
    /* refused by the chat as by kvgen_chat_set_vars, but named here as the option that gave them */
    static const char *const own[] = {"messages", "add_generation_prompt", "bos_token", "eos_token"};
    char why[160];
    kvg_json *v = o->template_vars ? kvg_json_parse_ex(o->template_vars, strlen(o->template_vars), 64,
                                                       KVG_JSON_NUMBER_TEXT, NULL, NULL, why, sizeof why)
                                   : kvg_json_new(KVG_JSON_OBJECT);
    if (o->template_vars && !v) kvl_option_error(L, 3, "template_vars", why);
    if (!v) luaL_error(L, "not enough memory");
    if (v->type != KVG_JSON_OBJECT) {
        kvg_json_free(v);
        kvl_option_error(L, 3, "template_vars", "not a table of variables (a JSON object)");
    }
    for (size_t i = 0; i < sizeof own / sizeof *own; i++)
        if (kvg_json_get(v, own[i])) {
            kvg_json_free(v);
            kvl_option_error(L, 3, "template_vars",
                             lua_pushfstring(L, "\"%s\" is the chat's own variable and cannot be set", own[i]));
        }
    if (o->tools && !o->gd.tools) { /* tools a reply may call are made the variable by the C call */
        kvg_json *t = kvg_json_parse_ex(o->tools, strlen(o->tools), 64, KVG_JSON_NUMBER_TEXT, NULL, NULL, why, sizeof why);
        if (!t || t->type != KVG_JSON_ARRAY) {
            kvg_json_free(v);
            kvg_json_free(t);
            kvl_option_error(L, 3, "tools", t ? "not a list of function descriptions (a JSON array)" : why);
        }
        /* "tools" from template_vars gives way to the option */
        kvg_json_remove(v, "tools");
        if (!kvg_json_add(v, "tools", t)) {
            kvg_json_free(v);
            luaL_error(L, "not enough memory");
        }
    }
    if (o->thinking) { /* enable_thinking from the option, in place of template_vars' */
        kvg_json_remove(v, "enable_thinking");
        if (!kvg_json_add(v, "enable_thinking", kvg_json_new_bool(o->thinking == 2))) {
            kvg_json_free(v);
            luaL_error(L, "not enough memory");
        }
    }
    size_t n = 0;
    char *text = kvg_json_print(v, &n);
    kvg_json_free(v);
    if (!text) luaL_error(L, "not enough memory");
    lua_pushlstring(L, text, n);
    kvg_free(text);
    return lua_tostring(L, -1);
}

/* back to the chat's variables before the options changed them (kept in the anchor table) */
static void restore_vars(lua_State *L, lsession *s) {
    kvgen_error ignored = {0};
    lua_getfield(L, 4, "vars_before");
    kvgen_chat_set_vars(s->session, lua_tostring(L, -1), &ignored);
    lua_pop(L, 1);
}

/* The tools the reply may call, from the `tools` option: each {name=, description=,
 * parameters=} or {type="function", ["function"]={...}}. Only for a chat on this thread whose
 * template writes calls in a format kvgen knows; elsewhere the tools are only shown to the
 * template, and tool_choice is refused. Strings are anchored in the table at 4. */
static void read_tools(lua_State *L, lsession *s, unsigned mode, gen_opts *o) {
    static const char *const choices[] = {"auto", "none", "required"};
    /* a job's session may be busy: its template is read only when it is not (a job queued behind
     * another gets the tools, and fails if its template writes no calls then) */
    bool busy = (mode & GEN_JOB) && kvgen_session_busy(s->session);
    bool engaged = o->tools && (mode & GEN_CHAT) && (busy || kvgen_chat_tool_format(s->session));
    if (!engaged) {
        if (o->tool_choice)
            kvl_option_error(L, 3, "tool_choice",
                             o->tools ? "tool calls are read by chat calls and chat jobs under a template that "
                                        "writes them (Hermes <tool_call>, Llama 3 JSON, Mistral [TOOL_CALLS], "
                                        "Phi-4-mini <|tool_call|>)"
                                      : "no tools given");
        return;
    }
    kvg_json *list = kvg_json_parse(o->tools, strlen(o->tools), 64, NULL, NULL, 0);
    if (!list || list->type != KVG_JSON_ARRAY || list->n < 1 || list->n > KVGEN_MAX_TOOLS) {
        kvg_json_free(list);
        kvl_option_error(L, 3, "tools", "a list of 1 to 64 tools expected");
    }
    int i = 0;
    const char *bad = NULL;
    for (const kvg_json *item = list->child; item && !bad; item = item->next, i++) {
        const kvg_json *t = item, *f = kvg_json_get(item, "function");
        if (f && f->type == KVG_JSON_OBJECT) t = f; /* the wrapped form */
        if (t->type != KVG_JSON_OBJECT) {
            bad = "not a table";
            break;
        }
        const char *name = kvg_json_get_string(t, "name", NULL), *desc = kvg_json_get_string(t, "description", NULL);
        const kvg_json *params = kvg_json_get(t, "parameters");
        if (!name) bad = "name: a string expected";
        else if (params && params->type != KVG_JSON_OBJECT) bad = "parameters: a table (a JSON schema) expected";
        if (bad) break;
        lua_pushstring(L, name);
        o->tool[i].name = lua_tostring(L, -1);
        luaL_ref(L, 4);
        if (desc) {
            lua_pushstring(L, desc);
            o->tool[i].description = lua_tostring(L, -1);
            luaL_ref(L, 4);
        }
        if (params) {
            char *text = kvg_json_print(params, NULL);
            if (!text) bad = "out of memory";
            else {
                lua_pushstring(L, text);
                kvg_free(text);
                o->tool[i].parameters = lua_tostring(L, -1);
                luaL_ref(L, 4);
            }
        }
    }
    int n = (int)list->n;
    kvg_json_free(list);
    if (bad) {
        lua_pushfstring(L, "tools[%d]: %s", i + 1, bad);
        kvl_option_error(L, 3, "tools", lua_tostring(L, -1));
    }
    o->td = (kvgen_tools_desc){.tools = o->tool, .n_tools = n, .choice = KVGEN_TOOL_AUTO};
    for (int c = 0; o->tool_choice && c < 3; c++)
        if (strcmp(o->tool_choice, choices[c]) == 0) o->td.choice = (kvgen_tool_choice)c;
    if (o->tool_choice && o->td.choice == KVGEN_TOOL_AUTO && strcmp(o->tool_choice, "auto") != 0) {
        o->td.choice = KVGEN_TOOL_NAMED;
        o->td.name = o->tool_choice;
    }
    o->gd.tools = &o->td;
}

/* s:generate / s:stream / s:chat / s:chat_stream: a kvgen_gen run on this thread. The C call
 * that appends the prompt or chat turn and starts the generation is all or nothing: when it
 * fails, nothing was appended and the chat state is as it was. */
static int start_stream(lua_State *L, lsession *s, unsigned mode, gen_opts *o, gen_prompt *p) {
    lstream *st = lua_newuserdatauv(L, sizeof *st, 4);
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
        if ((o->tools && !o->gd.tools) || o->template_vars || o->thinking) restore_vars(L, s);
        return kvl_raise_status(L, &err);
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
        if (n > 2) { /* a schema's value takes the third place (the reasoning is st.reasoning) */
            lua_pop(L, n - 2);
            n = 2;
        }
        /* with a schema: text, finish, and the text's value (nil unless it is complete) */
        if (strcmp(lua_tostring(L, -1), "stop") == 0) kvl_push_json_value(L, lua_tostring(L, -2), lua_rawlen(L, -2));
        else lua_pushnil(L);
        return n + 1;
    }
    lua_pushnil(L);
    lua_pushnil(L);
    lua_pushvalue(L, idx);
    return 4;
}

/* s:submit / s:submit_chat / s:stream_async / s:chat_stream_async: a kvgen_job, queued on the
 * worker; returns at once. Callbacks ({on_piece=, on_done=}) are kept by the job; the options'
 * chat variables (`vars`, NULL: none) go with it, set by the worker when its turn starts (the
 * session may be busy with earlier jobs until then). */
static int start_job(lua_State *L, lsession *s, unsigned mode, gen_opts *o, const gen_prompt *p, const char *vars) {
    kvgen_job_desc d = {.prompt = p->kind, .text = p->text, .text_len = p->len, .role = p->role, .chat_vars = vars,
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
    ljob *j = kvl_job_submit(L, s, &d, lua_gettop(L), (mode & GEN_ITER) != 0);
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
    lsession *s = (mode & GEN_JOB) ? kvl_check_no_stream(L, kvl_check_session_open(L, 1)) : kvl_check_session(L, 1);
    lua_settop(L, 3);
    lua_newtable(L); /* 4: anchor of the options' strings and arrays, until the C call copied them */
    gen_opts o;
    read_generate(L, 3, mode, 4, &o);
    gen_prompt p;
    read_gen_prompt(L, s, mode, &o, &p);
    read_tools(L, s, mode, &o);
    const char *vars = NULL;
    if ((o.tools && !o.gd.tools) || o.template_vars || o.thinking) {
        /* the options' variables are in force for the turn and after it */
        vars = push_chat_vars(L, &o);
        lua_setfield(L, 4, "vars"); /* anchored until the C call copied them */
    }
    if (vars && !(mode & GEN_JOB)) {
        /* set here, the chat's variables as they were going back when the turn is refused (a
         * job's are set by the worker, which takes them back itself) */
        const char *before = kvgen_chat_vars(s->session);
        if (before) {
            lua_pushstring(L, before);
            lua_setfield(L, 4, "vars_before");
        }
        kvgen_error err = {0};
        if (kvgen_chat_set_vars(s->session, vars, &err) != KVGEN_OK) return kvl_raise_status(L, &err);
    }
    return (mode & GEN_JOB) ? start_job(L, s, mode, &o, &p, vars) : start_stream(L, s, mode, &o, &p);
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

const luaL_Reg kvl_session_gen_methods[] = {
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

static const luaL_Reg *const stream_method_lists[] = {stream_methods, NULL};
const kvl_type kvl_stream_type = {STREAM_MT, stream_method_lists, stream_index, stream_close, stream_tostring,
                                  stream_call};
