/* choose.c: choice scoring (placeholder until written) */
#include "kvg_model.h"
kvgen_status kvgen_session_choose(kvgen_session *s, const char *const *c, size_t n, kvgen_choice *r, kvgen_error *err) {
    (void)s; (void)c; (void)n; (void)r;
    return kvg_fail(err, KVGEN_E_UNSUPPORTED, "kvgen_session_choose: not yet");
}
