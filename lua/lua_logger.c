/*
 * lua_logger.c: kvgen.set_logger: kvgen's log messages, from any thread, queued and handed to
 * the script's function on the script's thread.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kvgen_lua_internal.h"

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
    log_queue *q = kvl_check_udata(L, 1, LOGGER_MT);
    if (q->installed) kvgen_set_logger(NULL, NULL); /* returns once no call is running */
    q->installed = 0;
    pthread_mutex_destroy(&q->lock);
    return 0;
}

/* Hands the queued messages to the script's function (errors it raises propagate). */
void kvl_deliver_logs(lua_State *L) {
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
int kvl_set_logger(lua_State *L) {
    if (!lua_isnoneornil(L, 1) && !lua_isfunction(L, 1))
        kvl_arg_error(L, 1, lua_pushfstring(L, "function expected, got %s", luaL_typename(L, 1)));
    lua_settop(L, 1);
    kvl_deliver_logs(L); /* what the previous function has not seen yet */
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
        q = kvl_push_box(L, sizeof *q, LOGGER_MT, log_queue_gc);
        pthread_mutex_init(&q->lock, NULL);
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
