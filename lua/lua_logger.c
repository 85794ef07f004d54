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

/* Takes the oldest queued message, or the note of how many were dropped; 0 when none is left. */
static int take_log(log_queue *q, kvgen_log_level *level, char text[LOG_TEXT]) {
    int got = 0;
    pthread_mutex_lock(&q->lock);
    if (q->n) {
        *level = q->slot[q->head].level;
        memcpy(text, q->slot[q->head].text, LOG_TEXT);
        q->head = (q->head + 1) % LOG_SLOTS;
        q->n--;
        got = 1;
    } else if (q->dropped) {
        *level = KVGEN_LOG_WARNING;
        snprintf(text, LOG_TEXT, "%d log messages dropped (more than %d between deliveries)", q->dropped, LOG_SLOTS);
        q->dropped = 0;
        got = 1;
    }
    pthread_mutex_unlock(&q->lock);
    return got;
}

/* Puts a message back at the front of the queue (one a function did not take). */
static void untake_log(log_queue *q, kvgen_log_level level, const char *text) {
    pthread_mutex_lock(&q->lock);
    if (q->n == LOG_SLOTS) {
        q->dropped++;
    } else {
        q->head = (q->head + LOG_SLOTS - 1) % LOG_SLOTS;
        q->n++;
        q->slot[q->head].level = level;
        snprintf(q->slot[q->head].text, LOG_TEXT, "%s", text);
    }
    pthread_mutex_unlock(&q->lock);
}

/* Hands the queued messages, in order, to the function at stack index fn (0: to stderr, as
 * kvgen's default logger does: warnings and errors). Unprotected, an error the function raises
 * propagates and the messages after the one it raised on stay queued; protected, the call
 * returns the status with the error on the stack. */
static int deliver(lua_State *L, log_queue *q, int fn, int protect) {
    kvgen_log_level level;
    char text[LOG_TEXT];
    while (take_log(q, &level, text)) {
        if (!fn) {
            if (level <= KVGEN_LOG_WARNING) fprintf(stderr, "kvgen: %s\n", text);
            continue;
        }
        lua_pushvalue(L, fn);
        lua_pushstring(L, kvgen_log_level_name(level));
        lua_pushstring(L, text);
        if (!protect) {
            lua_call(L, 2, 0);
            continue;
        }
        int st = lua_pcall(L, 2, 0, 0);
        if (st != LUA_OK) return st;
    }
    return LUA_OK;
}

/* The queue and the script's function of this state, pushed (2 values), or 0 with nothing
 * pushed where no logger was ever set. */
static log_queue *push_logger(lua_State *L) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, LOGGER_KEY) != LUA_TTABLE) {
        lua_pop(L, 1);
        return NULL;
    }
    lua_rawgeti(L, -1, 1);
    log_queue *q = lua_touserdata(L, -1);
    lua_pop(L, 1);
    lua_rawgeti(L, -1, 2);
    return q;
}

/* Hands the queued messages to the script's function (errors it raises propagate). */
void kvl_deliver_logs(lua_State *L) {
    log_queue *q = push_logger(L);
    if (!q) return;
    int fn = lua_gettop(L);
    if (lua_isfunction(L, fn)) deliver(L, q, fn, 0);
    lua_pop(L, 2);
}

/* kvgen.set_logger(function(level, message) ... end | nil): level is "error", "warning",
 * "info" or "debug". nil gives the messages back to kvgen's default (stderr). The previous
 * function first gets what it has not seen yet; if it raises, the new logger is installed all
 * the same and takes the rest, after a warning that quotes the error: removing a logger that
 * raises never raises. */
int kvl_set_logger(lua_State *L) {
    if (!lua_isnoneornil(L, 1) && !lua_isfunction(L, 1))
        kvl_arg_error(L, 1, lua_pushfstring(L, "function expected, got %s", luaL_typename(L, 1)));
    lua_settop(L, 1);
    log_queue *q = push_logger(L); /* 2: the table, 3: the previous function */
    if (q && lua_isfunction(L, 3) && deliver(L, q, 3, 1) != LUA_OK) {
        /* 4: its error; it goes first to whoever takes the rest */
        const char *e = lua_tostring(L, 4);
        char note[LOG_TEXT];
        snprintf(note, sizeof note, "the previous logger raised: %s", e ? e : luaL_typename(L, 4));
        untake_log(q, KVGEN_LOG_WARNING, note);
    }
    lua_settop(L, 1);
    if (lua_isnil(L, 1)) {
        if (q && q->installed) kvgen_set_logger(NULL, NULL);
        if (q) {
            q->installed = 0;
            deliver(L, q, 0, 0); /* what is left goes where kvgen's default would put it */
            lua_getfield(L, LUA_REGISTRYINDEX, LOGGER_KEY);
            lua_pushnil(L);
            lua_rawseti(L, -2, 2);
            lua_pop(L, 1);
        }
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
    deliver(L, q, 1, 0); /* what the previous one did not take */
    return 0;
}
