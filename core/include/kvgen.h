/*
 * kvgen.h: the one public door into kvgen, an embeddable LLM text-generation engine.
 *
 * kvgen loads llama-family models from GGUF files and runs them either on the CPU
 * reference backend (plain C, the oracle) or on Vulkan compute shaders. A model is
 * loaded once and shared; each session owns its own KV cache, so a game can give
 * every NPC its own conversation.
 *
 * Conventions
 * - Public names start with kvgen_, private ones with kvg_.
 * - Calls that can fail return a kvgen_status and, when `err` is not NULL, write a
 *   message a user can act on into it ("model.gguf: tensor blk.3.attn_q.weight
 *   extends past end of file (...)"). Nothing in kvgen aborts the host process.
 * - Description structs (*_desc) follow sokol: zero-initialise them, and every zero
 *   field means "the default".
 * - Ownership: the caller owns what it creates and releases it with the matching
 *   close/unload call; closing twice is not allowed in C (the Lua binding makes it safe).
 *   A session keeps a reference to its model: a model may be unloaded while sessions
 *   are open; it is freed when the last session closes.
 * - Threads: a model may be used from several threads for read-only queries
 *   (tokenize, info). A session must be used by one thread at a time.
 * - Nothing happens before the host calls kvgen: no static constructors.
 */
#ifndef KVGEN_H
#define KVGEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVGEN_VERSION_MAJOR 0
#define KVGEN_VERSION_MINOR 1
#define KVGEN_VERSION_PATCH 0
#define KVGEN_VERSION_STRING "0.1.0"

/* Runtime version query: returns KVGEN_VERSION_STRING of the library actually linked. */
const char *kvgen_version(void);

/* ---- errors --------------------------------------------------------------------------- */

typedef enum kvgen_status {
    KVGEN_OK = 0,
    KVGEN_E_INVALID_ARGUMENT, /* a bad argument from the caller */
    KVGEN_E_IO,               /* file missing, unreadable, short write */
    KVGEN_E_FORMAT,           /* malformed GGUF or session file */
    KVGEN_E_UNSUPPORTED,      /* valid file, but an architecture/type kvgen does not run */
    KVGEN_E_NO_MEMORY,        /* host allocation failed */
    KVGEN_E_DEVICE,           /* Vulkan error, device lost, no device, out of device memory */
    KVGEN_E_CONTEXT_FULL,     /* the session reached its context limit */
    KVGEN_E_POOL_FULL,        /* the model's KV page pool is exhausted */
    KVGEN_E_CANCELLED,        /* the operation was cancelled */
    KVGEN_E_INTERNAL          /* a bug in kvgen: please report it */
} kvgen_status;

#define KVGEN_ERROR_MESSAGE_SIZE 512

typedef struct kvgen_error {
    kvgen_status status;
    char message[KVGEN_ERROR_MESSAGE_SIZE];
} kvgen_error;

/* A short stable name for a status ("ok", "io", "format", "context_full", ...). */
const char *kvgen_status_name(kvgen_status status);

/* ---- models --------------------------------------------------------------------------- */

typedef struct kvgen_model kvgen_model;
typedef struct kvgen_session kvgen_session;

typedef enum kvgen_backend {
    KVGEN_BACKEND_DEFAULT = 0, /* KVGEN_BACKEND env var, else vulkan when available, else reference */
    KVGEN_BACKEND_REFERENCE,   /* plain C f32 CPU forward pass: the oracle */
    KVGEN_BACKEND_VULKAN       /* Vulkan compute shaders */
} kvgen_backend;

typedef struct kvgen_model_desc {
    const char *path;      /* GGUF file (required) */
    kvgen_backend backend; /* 0: default */
    const char *device;    /* Vulkan device: index or name substring; NULL: KVGEN_DEVICE env or auto */
    int force_f32;         /* Vulkan: use the f32 shader variants even where fp16 is available */
    int n_threads;         /* reference backend threads; 0: all cores */
} kvgen_model_desc;

typedef enum kvgen_tokenizer_kind {
    KVGEN_TOKENIZER_BPE = 1, /* byte-level BPE (tokenizer.ggml.model = gpt2) */
    KVGEN_TOKENIZER_SPM = 2  /* SentencePiece-style (tokenizer.ggml.model = llama) */
} kvgen_tokenizer_kind;

typedef struct kvgen_model_info {
    const char *name;         /* general.name or the file name */
    const char *architecture; /* "llama" */
    const char *backend;      /* "reference" or "vulkan" */
    const char *device;       /* device name ("cpu" for the reference backend) */
    int n_layer, n_embd, n_ff, n_head, n_head_kv, head_dim, n_rot;
    int n_ctx_train; /* llama.context_length */
    int n_vocab;
    float rope_freq_base, rms_norm_eps;
    int tied_embeddings; /* no output.weight: logits use token_embd */
    kvgen_tokenizer_kind tokenizer;
    const char *tokenizer_pre; /* "smollm", "gpt2", "llama-bpe", "default", ... */
    int32_t bos, eos, eot;     /* -1 where the model has none */
    uint64_t n_params;
    uint64_t weight_bytes;     /* bytes of all tensors as stored */
} kvgen_model_info;

kvgen_status kvgen_model_load(const kvgen_model_desc *desc, kvgen_model **out, kvgen_error *err);
/* Drops the caller's reference; the model is freed when no session holds it. NULL is ignored. */
void kvgen_model_unload(kvgen_model *model);
void kvgen_model_get_info(const kvgen_model *model, kvgen_model_info *info);

/* Writes a multi-line human-readable description (hyperparameters, tensor type counts,
 * tokenizer) as printed by `kvgen info`. Returns the length it needed (like snprintf). */
size_t kvgen_model_describe(const kvgen_model *model, char *buf, size_t size);

/* ---- tokenizer ------------------------------------------------------------------------ */

enum {
    KVGEN_TOKENIZE_SPECIAL = 1, /* recognise control-token text such as <|im_start|> */
    KVGEN_TOKENIZE_ADD_BOS = 2  /* prepend BOS when the model's metadata asks for it */
};

/* Tokenizes `len` bytes of `text`. Writes up to `cap` ids to `out` and the full count to
 * *n_tokens; returns KVGEN_E_INVALID_ARGUMENT with *n_tokens set when `cap` is too small
 * (call again with a bigger buffer). `out` may be NULL when cap is 0. */
kvgen_status kvgen_tokenize(const kvgen_model *model, const char *text, size_t len, unsigned flags,
                            int32_t *out, size_t cap, size_t *n_tokens, kvgen_error *err);

/* The raw bytes of one token (may be a fragment of a UTF-8 character). Control tokens
 * give their text only with KVGEN_TOKENIZE_SPECIAL in flags, else nothing.
 * Returns the number of bytes the piece has (like snprintf); writes at most `size`. */
size_t kvgen_token_piece(const kvgen_model *model, int32_t token, unsigned flags, char *buf, size_t size);

/* Detokenizes a whole sequence into `buf` (NUL-terminated when size > 0); returns the
 * length needed. Invalid UTF-8 at the end is kept as is. */
size_t kvgen_detokenize(const kvgen_model *model, const int32_t *tokens, size_t n, unsigned flags,
                        char *buf, size_t size);

/* True for end-of-generation tokens (EOS, EOT, <|im_end|>, <|eot_id|>, ...). */
int kvgen_token_is_eog(const kvgen_model *model, int32_t token);
/* True for control tokens (never shown to users). */
int kvgen_token_is_control(const kvgen_model *model, int32_t token);
/* Finds a token by its exact text; -1 when absent. */
int32_t kvgen_token_find(const kvgen_model *model, const char *text);

/* Streaming detokenizer: feed tokens one at a time and receive only complete UTF-8.
 * A multi-byte character split across tokens is held back until it is complete. */
typedef struct kvgen_detok {
    unsigned char pending[8];
    int n_pending;
    int first; /* internal: strips SentencePiece's leading space on the first piece when asked */
} kvgen_detok;

void kvgen_detok_init(kvgen_detok *d);
/* Appends the text that is now complete to buf (NUL-terminated); returns its length.
 * `size` of 64 bytes plus the longest token is always enough. */
size_t kvgen_detok_push(const kvgen_model *model, kvgen_detok *d, int32_t token, unsigned flags, char *buf,
                        size_t size);
/* Flushes what is held back (an incomplete sequence is emitted as U+FFFD). */
size_t kvgen_detok_flush(kvgen_detok *d, char *buf, size_t size);

/* ---- sessions ------------------------------------------------------------------------- */

typedef struct kvgen_session_desc {
    int n_ctx;          /* context limit in tokens; 0: min(model's context_length, 4096) */
    int no_cache;       /* 1: recompute the whole sequence on every decode (the O(N^2) baseline) */
    uint64_t seed;      /* sampler seed; 0: 0x5eed */
    float temperature;  /* <= 0: greedy */
    int top_k;          /* 0: off */
    float top_p;        /* 0 or >= 1: off */
} kvgen_session_desc;

kvgen_status kvgen_session_create(kvgen_model *model, const kvgen_session_desc *desc, kvgen_session **out,
                                  kvgen_error *err);
void kvgen_session_close(kvgen_session *session); /* NULL is ignored */

/* Appends `n` tokens to the session (prefill), computing their K/V into the cache and the
 * logits of the last one. When `all_logits` is not NULL it receives n * n_vocab floats, the
 * logits at every appended position (teacher forcing). */
kvgen_status kvgen_session_prefill(kvgen_session *session, const int32_t *tokens, size_t n, float *all_logits,
                                   kvgen_error *err);
/* Appends exactly one token (decode) and computes the next-token logits. */
kvgen_status kvgen_session_decode(kvgen_session *session, int32_t token, kvgen_error *err);
/* Logits after the last prefill/decode (n_vocab floats, valid until the next call); NULL before any. */
const float *kvgen_session_logits(const kvgen_session *session);
/* Chooses the next token from the current logits with the session's sampler (greedy
 * when temperature <= 0). Returns -1 when there are no logits yet. */
int32_t kvgen_session_sample(kvgen_session *session);
/* Tokens held in the cache. */
size_t kvgen_session_length(const kvgen_session *session);
const int32_t *kvgen_session_tokens(const kvgen_session *session);
/* Forgets everything: length 0, sampler re-seeded. */
void kvgen_session_reset(kvgen_session *session);

/* The KV cache as the seed sees past_key_values: per layer K and V of shape
 * (kv_heads, length, head_dim). */
typedef struct kvgen_cache_info {
    int n_layer, n_head_kv, head_dim;
    size_t length, capacity;
    size_t bytes;           /* bytes the cache holds for this session */
    size_t bytes_per_token; /* K+V, all layers */
} kvgen_cache_info;

void kvgen_session_cache_info(const kvgen_session *session, kvgen_cache_info *info);
/* Copies layer `layer`'s K (which = 0) or V (which = 1) as floats, shape
 * (kv_heads, length, head_dim), into `out` (capacity `n_floats`). */
kvgen_status kvgen_session_read_cache(const kvgen_session *session, int layer, int which, float *out,
                                      size_t n_floats, kvgen_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVGEN_H */
