/* samples/host/main.c: how a game engine embeds kvgen and Lua. A fixed 60 Hz frame loop calls
 * the script's update(dt); the script drives several NPC conversations at once through
 * kvgen's jobs API (generation runs on kvgen's worker thread; the frame only submits and
 * polls). At the end it prints frame times while generation ran versus idle, each NPC's time
 * to first token and the aggregate tokens/s.
 *
 *   kvgen_host [samples/npc_village.lua] [MODEL.gguf]
 *
 * MODEL defaults to $KVGEN_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf; the backend to
 * $KVGEN_BACKEND (reference or vulkan). The reference backend gets cores - 1 threads so the
 * frame loop keeps a core of its own (docs/jobs.md, "CPU budget").
 *
 * Stopgap: until the kvgen Lua module binds the jobs API, this host gives its Lua state a
 * tiny `host` table of its own (npc, say, poll); it uses only the public C API. */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "kvgen.h"

#define MAX_NPCS 32
#define MAX_FRAMES (60 * 600)

typedef struct npc {
    kvgen_session *session;
    kvgen_job *job; /* the reply being generated, or NULL */
    double ttft_ms; /* of the last reply */
} npc;

typedef struct host {
    kvgen_model *model;
    npc npcs[MAX_NPCS];
    int n_npcs;
    uint64_t tokens;
} host;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static host *get_host(lua_State *L) { return lua_touserdata(L, lua_upvalueindex(1)); }

/* host.npc(persona) -> id: a session with the persona as its system turn (load time: blocks) */
static int l_npc(lua_State *L) {
    host *h = get_host(L);
    const char *persona = luaL_checkstring(L, 1);
    if (h->n_npcs == MAX_NPCS) return luaL_error(L, "host.npc: at most %d NPCs", MAX_NPCS);
    npc *n = &h->npcs[h->n_npcs];
    kvgen_error err = {0};
    kvgen_session_desc sd = {.n_ctx = 1024, .seed = 1000 + (uint64_t)h->n_npcs, .temperature = 0.7f, .top_p = 0.9f};
    if (kvgen_session_create(h->model, &sd, &n->session, &err) != KVGEN_OK ||
        kvgen_chat_add(n->session, "system", persona, &err) != KVGEN_OK)
        return luaL_error(L, "host.npc: %s", err.message);
    lua_pushinteger(L, ++h->n_npcs);
    return 1;
}

static npc *check_npc(lua_State *L, host *h, int arg) {
    lua_Integer i = luaL_checkinteger(L, arg);
    luaL_argcheck(L, i >= 1 && i <= h->n_npcs, arg, "not an NPC id");
    return &h->npcs[i - 1];
}

/* host.say(id, text [, priority]): the player speaks; the NPC's reply is generated in the background */
static int l_say(lua_State *L) {
    host *h = get_host(L);
    npc *n = check_npc(L, h, 1);
    const char *text = luaL_checkstring(L, 2);
    int priority = (int)luaL_optinteger(L, 3, 0);
    if (n->job) return luaL_error(L, "host.say: NPC %d is still answering", (int)luaL_checkinteger(L, 1));
    static const char *const stops[] = {"\n"};
    kvgen_job_desc d = {.prompt = KVGEN_PROMPT_CHAT, .role = "user", .text = text, .priority = priority,
                        .gen = {.max_tokens = 40, .stop = stops, .n_stop = 1}, .user_data = n};
    kvgen_error err = {0};
    if (kvgen_job_submit(n->session, &d, &n->job, &err) != KVGEN_OK) return luaL_error(L, "host.say: %s", err.message);
    return 0;
}

/* host.poll() -> { {npc=id, text=piece, finished=bool, ttft_ms=, tokens=, tokens_per_s=}, ... } */
static int l_poll(lua_State *L) {
    host *h = get_host(L);
    kvgen_event ev[MAX_NPCS];
    int k = kvgen_poll(h->model, NULL, ev, MAX_NPCS);
    lua_createtable(L, k, 0);
    for (int i = 0; i < k; i++) {
        npc *n = ev[i].user_data;
        lua_createtable(L, 0, 6);
        lua_pushinteger(L, (lua_Integer)(n - h->npcs) + 1);
        lua_setfield(L, -2, "npc");
        lua_pushlstring(L, ev[i].text, ev[i].len);
        lua_setfield(L, -2, "text");
        lua_pushboolean(L, ev[i].finished);
        lua_setfield(L, -2, "finished");
        if (ev[i].finished) {
            kvgen_job_info ji;
            kvgen_job_get_info(n->job, &ji);
            n->ttft_ms = ji.first_token_ms;
            h->tokens += (uint64_t)ji.n_tokens;
            lua_pushnumber(L, ji.first_token_ms);
            lua_setfield(L, -2, "ttft_ms");
            lua_pushinteger(L, ji.n_tokens);
            lua_setfield(L, -2, "tokens");
            lua_pushnumber(L, ji.tokens_per_s);
            lua_setfield(L, -2, "tokens_per_s");
            lua_pushstring(L, kvgen_finish_name(ev[i].finish));
            lua_setfield(L, -2, "finish");
            kvgen_job_release(n->job);
            n->job = NULL;
        }
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *v, int n) {
    if (n == 0) {
        printf("  %-34s no frames\n", what);
        return;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int p99 = (int)(0.99 * (n - 1) + 0.5);
    printf("  %-34s %5d frames  median %7.3f  p99 %7.3f  max %7.3f ms\n", what, n, v[n / 2], v[p99], v[n - 1]);
}

int main(int argc, char **argv) {
    const char *script = argc > 1 ? argv[1] : "samples/npc_village.lua";
    const char *path = argc > 2 ? argv[2] : getenv("KVGEN_MODEL");
    if (!path || !*path) path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    host h = {0};
    kvgen_model_desc md = {.path = path, .n_threads = cores > 1 ? (int)cores - 1 : 1};
    kvgen_error err = {0};
    if (kvgen_model_load(&md, &h.model, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen_host: %s\n", err.message);
        return 1;
    }
    kvgen_model_info info;
    kvgen_model_get_info(h.model, &info);
    printf("kvgen %s host: %s on %s (%s), %d reference threads of %ld cores\n", kvgen_version(), info.name,
           info.device, info.backend, md.n_threads, cores);

    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    static const luaL_Reg fns[] = {{"npc", l_npc}, {"say", l_say}, {"poll", l_poll}, {NULL, NULL}};
    luaL_newlibtable(L, fns);
    lua_pushlightuserdata(L, &h);
    luaL_setfuncs(L, fns, 1);
    lua_setglobal(L, "host");
    int rc = 0;
    if (luaL_dofile(L, script) != LUA_OK) {
        fprintf(stderr, "kvgen_host: %s\n", lua_tostring(L, -1));
        rc = 1;
    }

    static double idle[MAX_FRAMES], busy[MAX_FRAMES], idle_gap[MAX_FRAMES], busy_gap[MAX_FRAMES];
    int n_idle = 0, n_busy = 0;
    const double period = 1000.0 / 60.0;
    double start = now_ms(), next = start, prev = start, busy_from = -1, busy_to = -1;
    for (int frame = 0; rc == 0 && frame < MAX_FRAMES; frame++) {
        double t0 = now_ms();
        lua_getglobal(L, "update");
        lua_pushnumber(L, period / 1000.0);
        if (lua_pcall(L, 1, 1, 0) != LUA_OK) {
            fprintf(stderr, "kvgen_host: update: %s\n", lua_tostring(L, -1));
            rc = 1;
            break;
        }
        bool done = lua_toboolean(L, -1) == 0 && !lua_isnil(L, -1);
        lua_pop(L, 1);
        double t1 = now_ms();
        kvgen_jobs_stats st;
        kvgen_jobs_get_stats(h.model, &st);
        /* frame work (update + poll) and the interval since the last frame began: a starved
         * host thread shows up in the second as late wake-ups */
        if (st.jobs_active > 0) {
            if (busy_from < 0) busy_from = t0;
            busy_to = t1;
            busy[n_busy] = t1 - t0;
            busy_gap[n_busy++] = t0 - prev;
        } else {
            idle[n_idle] = t1 - t0;
            idle_gap[n_idle++] = t0 - prev;
        }
        prev = t0;
        if (done) break;
        next += period;
        double wait = next - now_ms();
        if (wait > 0) {
            struct timespec ts = {(time_t)(wait / 1e3), (long)((wait - (double)(time_t)(wait / 1e3) * 1e3) * 1e6)};
            nanosleep(&ts, NULL);
        } else {
            next = now_ms(); /* a missed frame: do not try to catch up */
        }
    }
    if (rc == 0) {
        printf("\nframe times (update + poll; interval = start to start, 16.667 ms ideal):\n");
        report("idle: update", idle, n_idle);
        report("generating: update", busy, n_busy);
        report("idle: interval", idle_gap + (n_idle > 0), n_idle > 0 ? n_idle - 1 : 0);
        report("generating: interval", busy_gap, n_busy);
        printf("time to first token per NPC (submit -> first token):\n");
        for (int i = 0; i < h.n_npcs; i++) printf("  npc %d: %8.1f ms\n", i + 1, h.npcs[i].ttft_ms);
        double secs = (busy_to - busy_from) / 1e3;
        if (secs > 0)
            printf("aggregate: %llu tokens in %.2f s of generation = %.1f tokens/s\n", (unsigned long long)h.tokens,
                   secs, (double)h.tokens / secs);
    }
    lua_close(L);
    for (int i = 0; i < h.n_npcs; i++) {
        kvgen_session_close(h.npcs[i].session); /* cancels a reply still running */
        kvgen_job_release(h.npcs[i].job);
    }
    kvgen_model_unload(h.model); /* joins the worker */
    return rc;
}
