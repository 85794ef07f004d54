/* error.c: status names, the error helper and the version query. */
#include <stdarg.h>
#include <stdio.h>
#include "kvg_error.h"

const char *kvgen_version(void) { return KVGEN_VERSION_STRING; }

const char *kvgen_status_name(kvgen_status status) {
    switch (status) {
    case KVGEN_OK: return "ok";
    case KVGEN_E_INVALID_ARGUMENT: return "invalid_argument";
    case KVGEN_E_IO: return "io";
    case KVGEN_E_FORMAT: return "format";
    case KVGEN_E_UNSUPPORTED: return "unsupported";
    case KVGEN_E_NO_MEMORY: return "no_memory";
    case KVGEN_E_DEVICE: return "device";
    case KVGEN_E_CONTEXT_FULL: return "context_full";
    case KVGEN_E_POOL_FULL: return "pool_full";
    case KVGEN_E_CANCELLED: return "cancelled";
    case KVGEN_E_INTERNAL: return "internal";
    case KVGEN_E_NETWORK: return "network";
    case KVGEN_E_SERVER: return "server";
    case KVGEN_E_RATE_LIMITED: return "rate_limited";
    }
    return "unknown";
}

kvgen_status kvg_fail(kvgen_error *err, kvgen_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}
