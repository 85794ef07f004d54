/* session_ext.c: a session's ties to the layers above it: the state they hang on it
 * (kvg_session_set_ext: the chat layer's conversation), and the jobs that hold it busy
 * (worker.c keeps jobs_active). */
#include <string.h>
#include "kvg_session.h"

/* ---- busy sessions (jobs: worker.c keeps jobs_active) ------------------------------------- */

_Thread_local const struct kvgen_model *kvg_session_worker_thread;

int kvgen_session_busy(const kvgen_session *s) {
    return s && __atomic_load_n(&s->jobs_active, __ATOMIC_ACQUIRE) > 0;
}

kvgen_status kvg_session_check_host(const kvgen_session *s, const char *fn, kvgen_error *err) {
    if (kvg_session_worker_thread && kvg_session_worker_thread == s->model)
        return KVGEN_OK;
    if (!kvgen_session_busy(s)) return KVGEN_OK;
    return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT,
                    "%s: session %p is busy: a job on it is queued or running on the model's worker (poll the job "
                    "until it is final, or cancel it first; kvgen_session_busy tells when it is free)",
                    fn, (const void *)s);
}

/* ---- the layers' state (kvg_session_ext) ---------------------------------------------------- */

void kvg_session_ext_free_all(kvgen_session *s) {
    for (int i = KVG_SESSION_EXTS - 1; i >= 0; i--)
        if (s->ext[i].ops) {
            s->ext[i].ops->free(s->ext[i].state);
            s->ext[i].ops = NULL;
            s->ext[i].state = NULL;
        }
}

void *kvg_session_ext(const kvgen_session *s, const kvg_session_ext_ops *ops) {
    for (int i = 0; i < KVG_SESSION_EXTS; i++)
        if (s->ext[i].ops == ops) return s->ext[i].state;
    return NULL;
}

void *kvg_session_take_ext(kvgen_session *s, const kvg_session_ext_ops *ops) {
    for (int i = 0; i < KVG_SESSION_EXTS; i++)
        if (s->ext[i].ops == ops) {
            void *state = s->ext[i].state;
            s->ext[i].ops = NULL;
            s->ext[i].state = NULL;
            return state;
        }
    return NULL;
}

kvgen_status kvg_session_set_ext(kvgen_session *s, const kvg_session_ext_ops *ops, void *state, kvgen_error *err) {
    int at = -1;
    for (int i = 0; i < KVG_SESSION_EXTS && at < 0; i++)
        if (s->ext[i].ops == ops) at = i;
    if (at >= 0) {
        ops->free(s->ext[at].state);
        s->ext[at].ops = NULL;
        s->ext[at].state = NULL;
    }
    if (!state) return KVGEN_OK;
    for (int i = 0; i < KVG_SESSION_EXTS && at < 0; i++)
        if (!s->ext[i].ops) at = i;
    if (at < 0)
        return kvg_fail(err, KVGEN_E_NO_MEMORY, "session: no room for the %s state (%d kinds at most)", ops->name,
                        KVG_SESSION_EXTS);
    s->ext[at].ops = ops;
    s->ext[at].state = state;
    return KVGEN_OK;
}

kvgen_status kvg_session_ext_clone_all(kvgen_session *dst, const kvgen_session *src, kvgen_error *err) {
    for (int i = 0; i < KVG_SESSION_EXTS; i++) {
        if (!src->ext[i].ops) continue;
        void *copy = NULL;
        kvgen_status st = src->ext[i].ops->clone(&copy, src->ext[i].state, err);
        if (st != KVGEN_OK) return st;
        dst->ext[i].ops = src->ext[i].ops;
        dst->ext[i].state = copy;
    }
    return KVGEN_OK;
}
