/*
 * lua_jobs.c: kvgen.Job and kvgen.poll: generation queued on the model's worker thread, its
 * text delivered and its callbacks run on the script's thread.
 */
#include <limits.h>
#include <string.h>

#include "kvgen_lua_internal.h"

/* ---- jobs: non-blocking generation on the model's worker thread ------------------------- *
 * The worker never touches a lua_State: it only fills the C job's buffers. Text reaches Lua
 * through kvgen.poll() (every job of this state, with callbacks) or job:poll() / the job as an
 * iterator (one job, no callbacks), always on the thread that calls them. Whether a session is
 * the worker's is the C library's to say (kvgen_session_busy): a job closed before it is final
 * is released at once, and its session stays busy until the worker has let go of it. */

static int is_final_state(kvgen_job_state st) { return st >= KVGEN_JOB_DONE; }

/* This state's owner key for kvgen_poll, and its job tables (created on first use). */
void kvl_ensure_state(lua_State *L) {
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
    ljob *j = kvl_check_udata(L, arg, JOB_MT);
    if (!j->job) luaL_error(L, "attempt to use a closed " JOB_MT);
    return j;
}

/* job:close() (also __gc and __close): releases the job, cancelling it if it still runs (the
 * worker lets go of it, and of its session, at its next step). */
static int job_close(lua_State *L) {
    ljob *j = kvl_check_udata(L, 1, JOB_MT);
    if (!j->job) return 0;
    unanchor(L, 1);
    kvgen_job_release(j->job);
    j->job = NULL;
    return 0;
}

static int job_tostring(lua_State *L) {
    ljob *j = kvl_check_udata(L, 1, JOB_MT);
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
ljob *kvl_job_submit(lua_State *L, lsession *s, kvgen_job_desc *d, int cbs, int private_key) {
    kvl_ensure_state(L);
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
        kvl_raise_status(L, &err);
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
        return kvl_raise_status(L, &info.error);
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
    lua_Integer p = kvl_to_integer(L, 2, &isint);
    if (!isint) kvl_type_error(L, 2, "priority", "integer");
    if (p < INT_MIN || p > INT_MAX)
        kvl_arg_error(L, 2,
                      lua_pushfstring(L, "priority: %I is out of range [%d, %d]", (LUAI_UACINT)p, INT_MIN, INT_MAX));
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
    kvl_push_fields(L, &info, fields, N_FIELDS(fields));
    lua_pushstring(L, kvgen_job_state_name(info.state));
    lua_setfield(L, -2, "state");
    lua_pushstring(L, kvgen_finish_name(info.finish));
    lua_setfield(L, -2, "finish");
    push_job_error(L, &info);
    lua_setfield(L, -2, "error");
    return 1;
}

/* fields: state, finish ("none" while running), text (all generated so far: complete once the
 * state is final, kvgen_job_text), error (the message of a failed job, else nil), tool_calls
 * (a "tool_calls" finish), reasoning (a chat reply's, so far), priority, session */
static int job_index(lua_State *L) {
    ljob *j = kvl_check_udata(L, 1, JOB_MT);
    const char *key = kvl_index_key(L);
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
        size_t len = 0;
        const char *text = kvgen_job_text(j->job, &len);
        if (j->schema && info.state == KVGEN_JOB_DONE && info.finish == KVGEN_FINISH_STOP)
            kvl_push_json_value(L, text, len);
        else
            lua_pushnil(L);
    } else if (strcmp(key, "tool_calls") == 0) { /* a "tool_calls" finish: {id =, name =, arguments = table} */
        const kvgen_tool_call *calls = NULL;
        int n = kvgen_job_tool_calls(j->job, &calls);
        if (n == 0) {
            lua_pushnil(L);
            return 1;
        }
        kvl_push_tool_calls(L, calls, n);
    } else if (strcmp(key, "reasoning") == 0) { /* a chat reply's reasoning so far (nil: none) */
        size_t len = 0;
        const char *r = kvgen_job_reasoning(j->job, &len);
        if (r && len > 0) lua_pushlstring(L, r, len);
        else lua_pushnil(L);
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
int kvl_poll(lua_State *L) {
    lua_settop(L, 1);
    kvl_need_stack(L, 24, "kvgen.poll");
    kvl_ensure_state(L);
    kvl_deliver_logs(L);
    const void *owner = state_owner(L, 0);
    lua_getfield(L, LUA_REGISTRYINDEX, JOBS_KEY);
    int jobs = lua_gettop(L);
    lua_newtable(L);
    int list = lua_gettop(L);
    if (!lua_isnil(L, 1)) {
        poll_model(L, kvl_check_model(L, 1)->model, owner, list, jobs);
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

static const luaL_Reg job_methods[] = {
    {"poll", job_poll},
    {"info", job_info},
    {"cancel", job_cancel},
    {"set_priority", job_set_priority},
    {"close", job_close},
    {NULL, NULL},
};

static const luaL_Reg *const job_method_lists[] = {job_methods, NULL};
const kvl_type kvl_job_type = {JOB_MT, job_method_lists, job_index, job_close, job_tostring, job_call};
