/* test_lua_states: two lua_States share one model through kvgen_lua_push_model. Both generate
 * through jobs at the same time and poll with kvgen.poll(); each must receive exactly its own
 * events (the text of its jobs, each final event once). Then one state is closed while the
 * other still generates: the other finishes unharmed, and everything is freed (ASan/LSan). */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <lualib.h>
#include <string.h>
#include <time.h>

#include "kvgen_lua.h"
#include "testutil.h"

/* Per state: greedy reference texts by s:generate, then the same prompts as jobs; step()
 * polls once and appends each event's text to got[job index]; it returns the number of
 * final events seen so far, and counts events for jobs that are not this state's. */
static const char *script =
    "local kvgen = require('kvgen')\n"
    "local tag, n_jobs, max_tokens = ...\n"
    "want, got, finals, foreign, jobs, sessions = {}, {}, 0, 0, {}, {}\n"
    "local index = {}\n"
    "for i = 1, n_jobs do\n"
    "  local prompt = tag .. ' prompt ' .. i\n"
    "  local r <close> = model:session()\n"
    "  want[i] = r:generate(prompt, { max_tokens = max_tokens, ignore_eog = true })\n"
    "  sessions[i] = model:session()\n"
    "  jobs[i] = sessions[i]:submit(prompt, { max_tokens = max_tokens, ignore_eog = true })\n"
    "  index[jobs[i]] = i\n"
    "  got[i] = ''\n"
    "end\n"
    "function step()\n"
    "  for _, ev in ipairs(kvgen.poll()) do\n"
    "    local i = index[ev.job]\n"
    "    if not i then foreign = foreign + 1 else\n"
    "      got[i] = got[i] .. ev.text\n"
    "      if ev.finished then finals = finals + 1 end\n"
    "    end\n"
    "  end\n"
    "  return finals\n"
    "end\n"
    "function check()\n"
    "  local bad = foreign\n"
    "  for i = 1, n_jobs do if got[i] ~= want[i] then bad = bad + 1 end end\n"
    "  return bad\n"
    "end\n";

static lua_State *new_state(kvgen_model *model, const char *tag, int n_jobs, int max_tokens) {
    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    luaL_requiref(L, "kvgen", luaopen_kvgen, 0);
    lua_pop(L, 1);
    kvgen_lua_push_model(L, model);
    lua_setglobal(L, "model");
    if (luaL_loadstring(L, script) != LUA_OK) {
        fprintf(stderr, "%s\n", lua_tostring(L, -1));
        lua_close(L);
        return NULL;
    }
    lua_pushstring(L, tag);
    lua_pushinteger(L, n_jobs);
    lua_pushinteger(L, max_tokens);
    if (lua_pcall(L, 3, 0, 0) != LUA_OK) {
        fprintf(stderr, "%s: %s\n", tag, lua_tostring(L, -1));
        lua_close(L);
        return NULL;
    }
    return L;
}

/* calls a global function with no arguments and returns its integer result (-1 on error) */
static int call_int(lua_State *L, const char *fn) {
    lua_getglobal(L, fn);
    if (lua_pcall(L, 0, 1, 0) != LUA_OK) {
        fprintf(stderr, "%s: %s\n", fn, lua_tostring(L, -1));
        lua_pop(L, 1);
        return -1;
    }
    int v = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
    return v;
}

static void nap(void) {
    struct timespec ts = {0, 200000}; /* 0.2 ms: let the worker run */
    nanosleep(&ts, NULL);
}

int main(void) {
    char *path = tu_make_model("lua_states.gguf", "--layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 128");
    if (!path) tu_skip("kvgen-mkmodel did not run");
    kvgen_model *model = NULL;
    kvgen_model_desc md = {.path = path, .backend = KVGEN_BACKEND_REFERENCE, .n_threads = 1};
    CHECK_OK(kvgen_model_load(&md, &model, &tu_err_));
    if (!model) return tu_finish("test_lua_states");

    enum { JOBS = 3, TOKENS = 24 };
    lua_State *a = new_state(model, "alpha", JOBS, TOKENS);
    lua_State *b = new_state(model, "beta", JOBS, TOKENS);
    CHECK(a && b);
    /* the states hold their own references: the host's may go at once */
    kvgen_model_unload(model);
    if (!a || !b) return tu_finish("test_lua_states");

    /* both generate at the same time, polled alternately */
    int fa = 0, fb = 0;
    for (long i = 0; i < 2000000 && (fa < JOBS || fb < JOBS) && fa >= 0 && fb >= 0; i++) {
        fa = call_int(a, "step");
        fb = call_int(b, "step");
        nap();
    }
    CHECKF(fa == JOBS && fb == JOBS, "final events: alpha %d, beta %d (want %d each)", fa, fb, JOBS);
    CHECKF(call_int(a, "check") == 0, "alpha: texts differ from s:generate or foreign events");
    CHECKF(call_int(b, "check") == 0, "beta: texts differ from s:generate or foreign events");
    /* no final event twice */
    CHECK(call_int(a, "step") == JOBS && call_int(b, "step") == JOBS);
    lua_close(a);
    lua_close(b);

    /* closing one state while the other generates: a's jobs are cancelled and freed, b's finish */
    enum { LONG = 200 };
    kvgen_model *m2 = NULL;
    CHECK_OK(kvgen_model_load(&md, &m2, &tu_err_));
    if (!m2) return tu_finish("test_lua_states");
    a = new_state(m2, "alpha", JOBS, LONG);
    b = new_state(m2, "beta", JOBS, 16);
    kvgen_model_unload(m2);
    CHECK(a && b);
    if (!a || !b) return tu_finish("test_lua_states");
    call_int(a, "step");
    call_int(b, "step");
    kvgen_jobs_stats st;
    kvgen_jobs_get_stats(m2, &st); /* b's reference keeps m2 alive */
    CHECK(st.worker_running);
    lua_close(a); /* with a's jobs in flight */
    fb = 0;
    for (long i = 0; i < 2000000 && fb >= 0 && fb < JOBS; i++) {
        fb = call_int(b, "step");
        nap();
    }
    CHECKF(fb == JOBS, "beta after alpha closed: %d final events (want %d)", fb, JOBS);
    CHECK(call_int(b, "check") == 0);
    kvgen_jobs_get_stats(m2, &st);
    CHECKF(st.jobs_active == 0, "%zu jobs still active", st.jobs_active);
    lua_close(b); /* the last reference: frees the model and joins its worker */
    free(path);
    return tu_finish("test_lua_states");
}
