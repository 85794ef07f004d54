/* kvg_remote_json.h: what remote.c and history.c share in remote builds (private to core/remote/). */
#ifndef KVG_REMOTE_JSON_H
#define KVG_REMOTE_JSON_H
#include <cjson/cJSON.h>
#include "kvg_remote.h"

/* Adds the history to a request body: "messages" (a chat) or "prompt" (text). */
void kvg_rhist_put(const kvg_rhist *h, cJSON *body);
/* The text of a text history (not NUL-terminated). */
const char *kvg_rhist_text(const kvg_rhist *h, size_t *len);

#endif
