/* session_lora.c: the LoRA adapters a session runs with (kvgen_session_set_adapters).
 *
 * A session holds a set of adapters and scales (kvg_lora_set, model/adapter.c) and hands it to
 * the backend with each of its batch sequences (session.c). The set is part of what the K/V
 * of a token mean: the prefix cache keys a session's pages under the set's key, so only
 * sessions with the same adapters at the same scales share pages, and a session whose set
 * changes stops offering the K/V it computed before (clean_len). */
#include <math.h>
#include "kvg_error.h"
#include "kvg_session.h"

void kvg_session_take_lora(kvgen_session *s, kvg_lora_set *set) {
    /* the K/V in the cache were computed under the old set: never offered as the new set's */
    if (s->n_tokens > 0 && kvg_lora_set_key(set) != kvg_lora_set_key(&s->lora)) s->clean_len = 0;
    kvg_lora_set old = s->lora;
    s->lora = *set;
    *set = (kvg_lora_set){0};
    kvg_lora_set_clear(&old);
}

kvgen_status kvg_session_can_lora(const kvgen_session *s, const char *fn, kvgen_error *err) {
    kvgen_status st = kvg_session_local_only(s, fn, err);
    if (st != KVGEN_OK) return st;
    if (!s->model->ops->lora)
        return kvg_fail(err, KVGEN_E_UNSUPPORTED, "%s: the %s backend does not run LoRA adapters (the reference, "
                        "cpu and vulkan backends do)", fn, s->model->ops->name);
    return KVGEN_OK;
}

kvgen_status kvgen_session_set_adapters(kvgen_session *s, const kvgen_adapter *const *adapters, const float *scales,
                                        size_t n, kvgen_error *err) {
    static const char fn[] = "kvgen_session_set_adapters";
    if (!s) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: session is NULL", fn);
    kvgen_status st = kvg_session_check_host(s, fn, err);
    if (st != KVGEN_OK) return st;
    if (n > KVGEN_MAX_ADAPTERS)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: n %zu is over KVGEN_MAX_ADAPTERS (%d)", fn, n,
                        KVGEN_MAX_ADAPTERS);
    if (n > 0 && !adapters)
        return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: adapters is NULL with n %zu", fn, n);
    if (n == 0 && s->lora.n == 0) return KVGEN_OK; /* the base model, as before: any kind of session */
    st = kvg_session_can_lora(s, fn, err);
    if (st != KVGEN_OK) return st;
    for (size_t i = 0; i < n; i++) {
        const kvgen_adapter *a = adapters[i];
        if (!a) return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: adapters[%zu] is NULL", fn, i);
        if (a->model != s->model)
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: adapters[%zu] ('%s') was loaded for another model than "
                            "the session's ('%s')", fn, i, a->name, s->model->name ? s->model->name : "?");
        if (scales && !isfinite(scales[i]))
            return kvg_fail(err, KVGEN_E_INVALID_ARGUMENT, "%s: scales[%zu] is %g, not a finite number", fn, i,
                            (double)scales[i]);
    }
    kvg_lora_set set = {.n = (int)n};
    for (size_t i = 0; i < n; i++) {
        set.adapter[i] = (kvgen_adapter *)adapters[i];
        set.scale[i] = scales ? scales[i] : 1.0f;
        kvg_adapter_retain(set.adapter[i]);
    }
    kvg_session_take_lora(s, &set);
    return KVGEN_OK;
}

size_t kvgen_session_adapters(const kvgen_session *s, const kvgen_adapter **adapters, float *scales, size_t cap) {
    if (!s) return 0;
    for (size_t i = 0; i < (size_t)s->lora.n && i < cap; i++) {
        if (adapters) adapters[i] = s->lora.adapter[i];
        if (scales) scales[i] = s->lora.scale[i];
    }
    return (size_t)s->lora.n;
}
