/* samples/host/main.c: how a game engine embeds kvgen and Lua. A fixed 60 Hz frame loop calls
 * the script's update(dt); the script drives several NPC conversations at once through the
 * kvgen Lua module's jobs (generation runs on kvgen's worker thread; the frame only submits and
 * polls). At the end it prints frame times while generation ran versus idle, each NPC's time
 * to first token (the script's summary()) and the aggregate tokens/s.
 *
 *   kvgen_host [samples/npc_village.lua] [MODEL.gguf]
 *
 * MODEL defaults to $KVGEN_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf; the backend to
 * $KVGEN_BACKEND (vulkan, cpu or reference). A host backend (cpu, reference) gets cores - 1
 * threads so the frame loop keeps a core of its own (docs/jobs.md, "CPU budget").
 *
 * The host loads the model and hands it to Lua as the global `model` (kvgen_lua_push_model);
 * the module is registered with luaL_requiref, so no kvgen.so is needed at run time. */
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
#include "kvgen_lua.h"

#define MAX_FRAMES (60 * 600)

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
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
    /* When the Vulkan device is the CPU (Mesa's lavapipe), its shader threads compete with the
     * frame loop: leave the game one core, as n_threads does for the reference backend. Measured
     * on 2 cores: frame-interval p99 16.75 ms generating vs 16.74 idle with one lavapipe thread,
     * 20.2 vs 16.8 with two. Must be set before the device is created. */
    char lp_threads[24];
    snprintf(lp_threads, sizeof lp_threads, "%ld", cores > 1 ? cores - 1 : 1);
    setenv("LP_NUM_THREADS", lp_threads, 0);
    kvgen_model *model = NULL;
    kvgen_model_desc md = {.path = path, .n_threads = cores > 1 ? (int)cores - 1 : 1};
    kvgen_error err = {0};
    if (kvgen_model_load(&md, &model, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen_host: %s\n", err.message);
        return 1;
    }
    kvgen_model_info info;
    kvgen_model_get_info(model, &info);
    printf("kvgen %s host: %s on %s (%s), %d host-backend threads of %ld cores\n", kvgen_version(), info.name,
           info.device, info.backend, md.n_threads, cores);

    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    luaL_requiref(L, "kvgen", luaopen_kvgen, 0); /* require("kvgen") finds it in package.loaded */
    lua_pop(L, 1);
    kvgen_lua_push_model(L, model); /* the script's handle holds its own reference */
    lua_setglobal(L, "model");
    int rc = 0;
    if (luaL_dofile(L, script) != LUA_OK) {
        fprintf(stderr, "kvgen_host: %s\n", lua_tostring(L, -1));
        rc = 1;
    }

    static double idle[MAX_FRAMES], busy[MAX_FRAMES], idle_gap[MAX_FRAMES], busy_gap[MAX_FRAMES];
    int n_idle = 0, n_busy = 0;
    const double period = 1000.0 / 60.0;
    double start = now_ms(), next = start, prev = start, busy_from = -1, busy_to = -1;
    uint64_t tokens_from = 0;
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
        kvgen_jobs_get_stats(model, &st);
        /* frame work (update + poll) and the interval since the last frame began: a starved
         * host thread shows up in the second as late wake-ups */
        if (st.jobs_active > 0) {
            if (busy_from < 0) {
                busy_from = t0;
                tokens_from = st.decode_tokens;
            }
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
        lua_getglobal(L, "summary"); /* the script reports what it measured per NPC */
        if (lua_isfunction(L, -1) && lua_pcall(L, 0, 0, 0) != LUA_OK) {
            fprintf(stderr, "kvgen_host: summary: %s\n", lua_tostring(L, -1));
            rc = 1;
        }
        lua_settop(L, 0);
        /* the last frame that saw a job active may miss the final tokens: count to the end */
        kvgen_jobs_stats st;
        kvgen_jobs_get_stats(model, &st);
        uint64_t tokens = st.decode_tokens - tokens_from;
        double secs = (busy_to - busy_from) / 1e3;
        if (secs > 0)
            printf("aggregate: %llu tokens in %.2f s of generation = %.1f tokens/s\n", (unsigned long long)tokens,
                   secs, (double)tokens / secs);
    }
    lua_close(L); /* closes the script's sessions and jobs (a reply still running is cancelled) */
    kvgen_model_unload(model); /* the last reference: joins the worker */
    return rc;
}
