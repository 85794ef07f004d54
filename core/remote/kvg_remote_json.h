/* kvg_remote_json.h: what remote.c and history.c share in remote builds (private to core/remote/):
 * JSON through the codec (kvg_json.h) for request bodies, the server's replies and session files. */
#ifndef KVG_REMOTE_JSON_H
#define KVG_REMOTE_JSON_H
#include "kvg_json.h"
#include "kvg_remote.h"

/* v is a value of type t (false for NULL) */
static inline bool kvg_rjson_is(const kvg_json *v, kvg_json_type t) { return v && v->type == t; }

/* A server's reply or a session file's JSON: a leading byte order mark skipped, strings of any
 * bytes (the server's text is passed on as it came), what follows the value ignored; NULL when
 * it does not parse. */
kvg_json *kvg_rjson_parse(const char *text, size_t len);
/* Adds a member to o; false when out of memory. */
bool kvg_rjson_string(kvg_json *o, const char *key, const char *s);
bool kvg_rjson_number(kvg_json *o, const char *key, double v);

/* Adds the history to a request body: "messages" (a chat) or "prompt" (text); false when out
 * of memory. */
bool kvg_rhist_put(const kvg_rhist *h, kvg_json *body);
/* The text of a text history (not NUL-terminated). */
const char *kvg_rhist_text(const kvg_rhist *h, size_t *len);

#endif
