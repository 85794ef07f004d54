/*
 * kvgen.h: the one public door into kvgen, an embeddable LLM text-generation engine.
 *
 * kvgen loads llama-family models from GGUF files and runs them on one of three backends:
 * Vulkan compute shaders (the default where a GPU is usable), the fast native CPU backend
 * `cpu` (quantized dot products, AVX2/AVX-512/NEON; the default without a GPU) or the plain-C
 * `reference` backend, the oracle the others are tested against (kvgen_backend). It can also
 * drive a model served by an OpenAI-compatible HTTP server (a URL instead of a path; see
 * docs/remote.md). A model is loaded once and shared; each session owns its own KV cache, so
 * a game can give every NPC its own conversation.
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
 *   (tokenize, info) and kvgen_embed. A session must be used by one thread at a time.
 * - Nothing happens before the host calls kvgen: no static constructors.
 */
#ifndef KVGEN_H
#define KVGEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* KVGEN_API marks the public functions: the only symbols a shared libkvgen exports
 * (-DKVGEN_SHARED=ON builds it with hidden visibility). A Windows program that links the DLL
 * defines KVGEN_SHARED before including this header. */
#if defined(_WIN32)
#if defined(KVGEN_BUILDING_SHARED)
#define KVGEN_API __declspec(dllexport)
#elif defined(KVGEN_SHARED)
#define KVGEN_API __declspec(dllimport)
#else
#define KVGEN_API
#endif
#elif defined(__GNUC__)
#define KVGEN_API __attribute__((visibility("default")))
#else
#define KVGEN_API
#endif

#define KVGEN_VERSION_MAJOR 0
#define KVGEN_VERSION_MINOR 1
#define KVGEN_VERSION_PATCH 0
#define KVGEN_VERSION_STRING "0.1.0"

/* Runtime version query: returns KVGEN_VERSION_STRING of the library actually linked. */
KVGEN_API const char *kvgen_version(void);

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
    KVGEN_E_INTERNAL,         /* a bug in kvgen: please report it */
    /* remote models (docs/remote.md) */
    KVGEN_E_NETWORK,          /* the server cannot be reached, or the connection dropped or timed out */
    KVGEN_E_SERVER,           /* the server answered with an error (4xx/5xx); its message is in the error */
    KVGEN_E_RATE_LIMITED      /* the server refused for load (HTTP 429, or 503 after the retries) */
} kvgen_status;

#define KVGEN_ERROR_MESSAGE_SIZE 512

typedef struct kvgen_error {
    kvgen_status status;
    char message[KVGEN_ERROR_MESSAGE_SIZE];
} kvgen_error;

/* A short stable name for a status ("ok", "io", "format", "context_full", ...). */
KVGEN_API const char *kvgen_status_name(kvgen_status status);

/* ---- host hooks: logger and allocator ---------------------------------------------------
 * Process-wide, like the C library's own allocator: set them at start-up, before the first
 * model is loaded. kvgen writes to stdout or stderr only through the logger: everything it has
 * to say outside an error (a file it ignores, a fallback to another backend, validation
 * messages) goes to the logger, whose default writes warnings and errors to stderr and which
 * the host replaces with kvgen_set_logger. */

typedef enum kvgen_log_level {
    KVGEN_LOG_ERROR = 1, /* something failed that no call returns (a cache file not written) */
    KVGEN_LOG_WARNING,   /* kvgen did something else than asked or expected (a file ignored, a fallback) */
    KVGEN_LOG_INFO,      /* what a user asked to see (KVGEN_VK_PROFILE) */
    KVGEN_LOG_DEBUG
} kvgen_log_level;

/* Receives one message (no trailing newline), from any thread kvgen runs on (the worker
 * thread too), one call at a time: it must not call back into kvgen. */
typedef void (*kvgen_log_fn)(void *user, kvgen_log_level level, const char *message);

/* Installs the host's logger; it receives every message, at every level. fn NULL restores the
 * default: "kvgen: <message>" lines on stderr for warnings and errors ($KVGEN_LOG_LEVEL:
 * error, warning, info or debug changes that threshold). Thread-safe; once it returns, the
 * previous logger is not running and is never called again. */
KVGEN_API void kvgen_set_logger(kvgen_log_fn fn, void *user);
/* "error", "warning", "info", "debug" */
KVGEN_API const char *kvgen_log_level_name(kvgen_log_level level);

/* The host's memory functions for kvgen's host allocations: models, sessions, their pools'
 * bookkeeping, tokenizers (PCRE2 included), samplers, generation and jobs state, and the
 * backends' host memory (docs/c-api.md lists what is covered). All three are required; each gets `user` first. realloc(user, NULL, n) must act as
 * malloc, and free(user, NULL) must be harmless. */
typedef struct kvgen_allocator {
    void *(*malloc)(void *user, size_t size);
    void *(*realloc)(void *user, void *ptr, size_t size);
    void (*free)(void *user, void *ptr);
    void *user;
} kvgen_allocator;

/* Installs the allocator (NULL: the C library's). KVGEN_E_INVALID_ARGUMENT when a function is
 * missing or while any model is loaded (memory from one allocator must go back to it). Not
 * thread-safe: call it when no other kvgen call is running. */
KVGEN_API kvgen_status kvgen_set_allocator(const kvgen_allocator *allocator, kvgen_error *err);

/* ---- models --------------------------------------------------------------------------- */

typedef struct kvgen_model kvgen_model;
typedef struct kvgen_session kvgen_session;

typedef enum kvgen_backend {
    KVGEN_BACKEND_DEFAULT = 0, /* KVGEN_BACKEND env var, else vulkan when a GPU is usable (a device that
                                  is not the CPU itself, as lavapipe is), else cpu */
    KVGEN_BACKEND_REFERENCE,   /* plain C f32 CPU forward pass: the oracle */
    KVGEN_BACKEND_VULKAN,      /* Vulkan compute shaders */
    KVGEN_BACKEND_CPU          /* the fast CPU forward pass: quantized dot products, AVX2/AVX-512 */
} kvgen_backend;

/* The host's vkGetInstanceProcAddr, cast to this type (kvgen.h does not include vulkan.h):
 * (kvgen_vk_get_instance_proc_addr)vkGetInstanceProcAddr. */
typedef void (*kvgen_vk_void_function)(void);
typedef kvgen_vk_void_function (*kvgen_vk_get_instance_proc_addr)(void *instance, const char *name);

/* The stages of a load a progress callback sees, in this order (a backend reports only those
 * it has: the reference backend reads only; cpu reads and repacks; vulkan reads, uploads and
 * builds pipelines). */
typedef enum kvgen_load_stage {
    KVGEN_LOAD_READ = 1,  /* the file's tensor data read into memory (bytes) */
    KVGEN_LOAD_UPLOAD,    /* weights prepared by the backend: repacked (cpu), uploaded (vulkan) (bytes) */
    KVGEN_LOAD_PIPELINES  /* Vulkan compute pipelines built or taken from the cache (pipelines; total 0
                             while the count is not known, done == total on the last call) */
} kvgen_load_stage;

/* Called on the loading thread, inside kvgen_model_load: `done` of `total`, rising within a
 * stage (done <= total where total is not 0), each stage ending with a call where
 * done == total; at most about once per tensor, layer or MiB. Returning 0 cancels the load:
 * kvgen_model_load frees everything it made and returns KVGEN_E_CANCELLED (a default-backend
 * load does not fall back to another backend then). The callback must not call kvgen on the
 * model being loaded; the model keeps no pointer to it after the load. */
typedef int (*kvgen_load_progress_fn)(void *user, kvgen_load_stage stage, uint64_t done, uint64_t total);

typedef struct kvgen_model_desc {
    const char *path;      /* GGUF file (required) */
    kvgen_backend backend; /* 0: default */
    const char *device;    /* Vulkan device: index or name substring; NULL: KVGEN_DEVICE env or auto */
    int force_f32;         /* Vulkan: use the f32 shader variants even where fp16 is available */
    int n_threads;         /* cpu and reference backend threads; 0: all cores */
    /* KV page pool (see "sessions" below). The pool holds every session's keys and values in
     * fixed-size pages; its size is fixed at load. kv_pool_bytes wins over kv_pool_tokens;
     * both 0: 16 sessions of min(context_length, 8192) tokens, at most a quarter of the
     * host's RAM (reference backend; storage is committed page by page as it is first used). */
    size_t kv_pool_bytes;  /* pool size in bytes (rounded down to whole pages) */
    size_t kv_pool_tokens; /* pool size in tokens (rounded up to whole pages) */
    int kv_page_size;      /* tokens per page: a power of two in [16, 256]; 0: 32 */
    /* What the pages hold, by name; NULL or "": the backend's default. "f16" (the cpu and
     * Vulkan default); "q8_0" or "q4_0" (cpu and Vulkan backends): each head's row of keys and values in
     * blocks of 32 with one f16 scale, 0.53x and 0.28x the bytes of f16, so a pool of the same
     * bytes holds about 1.9x and 3.6x the tokens (logits move slightly: docs/architecture.md);
     * "f32": the reference backend's only type (the oracle keeps K/V as it computed them). A
     * name no backend knows: KVGEN_E_INVALID_ARGUMENT; one the backend does not store, or a
     * quantized type on a model whose head_dim is not a multiple of 32: KVGEN_E_UNSUPPORTED.
     * Sessions, forks, the prefix cache and saved sessions (kvgen_session_save stores f32, so a
     * file loads into pages of any type) work alike on every type. */
    const char *kv_type;
    /* Vulkan: run on a device the host already owns (a game's). Give all four handles
     * (VkInstance, VkPhysicalDevice, VkDevice, VkQueue cast to void*) and the queue's family,
     * which must support compute; kvgen then creates and destroys no instance or device, needs
     * no device features or extensions, and uses the queue only inside kvgen calls (the host
     * must not use it at the same time). NULL: kvgen creates its own. */
    void *vk_instance, *vk_physical_device, *vk_device, *vk_queue;
    uint32_t vk_queue_family;
    /* Vulkan: the host's vkGetInstanceProcAddr, through which kvgen resolves every entry point
     * (for a host that links a Vulkan loader statically or ships its own). NULL: kvgen opens the
     * system's loader at run time (libvulkan.so.1, vulkan-1.dll; $KVGEN_VULKAN_LOADER: another
     * path, or "none" to hide it); libkvgen never links libvulkan. One loader per process: the
     * first one kvgen uses stays. */
    kvgen_vk_get_instance_proc_addr vk_get_instance_proc_addr;
    /* Vulkan: a file for kvgen's VkPipelineCache, so a later load skips shader compilation on
     * drivers whose cache holds compiled code. "{device}" in it becomes the device's vendor and
     * device id in hex ("10de-2684"). Read at load when present and valid for this device
     * (anything else, e.g. a stale or damaged file, is ignored: never a load error); written
     * back atomically, its folder created, when pipelines were compiled that it lacked (a
     * failed write is no load error: the logger gets a warning). NULL: no cache (the Lua module and the CLI default
     * to $KVGEN_PIPELINE_CACHE, else a file under $XDG_CACHE_HOME/kvgen). The reference backend
     * ignores it. */
    const char *pipeline_cache_path;
    /* Load progress (NULL: none). With a callback the load also reads every tensor's bytes
     * once, up front (KVGEN_LOAD_READ), so the file's pages are in memory before the backend
     * starts; without one they are read as the backend first touches them. */
    kvgen_load_progress_fn progress;
    void *progress_user; /* passed to progress */
    /* The longest context the model's sessions will run, for a file with LongRoPE long factors
     * (phi3: rope_factors_long): above the file's rope.scaling.original_context_length, every
     * session of this model runs the long factors and may be as long as this; 0 (or at most the
     * original context): the short factors run and sessions stop at the original context. Other
     * files ignore it. At most 1 << 20 (KVGEN_E_INVALID_ARGUMENT past that or below 0). */
    int n_ctx;
    /* cpu backend: the precision of the activations its quantized matrix products take. 0 or
     * 16: 16-bit (15 bits for the types the path runs in row groups: docs/c-api.md), within
     * ~0.2% of the reference's logit range (the default); 8: 8-bit, as llama.cpp's CPU backend,
     * where the path has such kernels (its row groups: the 32-element and K types on AVX-512
     * VNNI, AVX2, AVX-VNNI and AArch64, the K types on AVX-512 without VNNI), about twice
     * the prompt speed on AVX-512 VNNI and on AVX2, and ~1-4% of the logit range from the
     * reference (near-tied top-1 choices flip). vulkan: 8 takes the integer types' decode
     * mat-vecs and prefill GEMMs by 8-bit integer dot products where the device reports them
     * accelerated (VK_KHR_shader_integer_dot_product; docs/vulkan.md); 16 and other devices
     * keep f32 activations. Other values: KVGEN_E_INVALID_ARGUMENT. The reference backend
     * ignores it. */
    int activation_bits;
    /* ---- remote models (docs/remote.md): a path that starts with http:// or https:// is the
     * base URL of an OpenAI-compatible server ("http://127.0.0.1:8080/v1"); the fields above
     * that describe weights, backends and pages are then ignored. */
    const char *remote_model;  /* the server's model name (the "model" of each request); NULL: the
                                  first one GET /models lists */
    const char *api_key;       /* sent as "Authorization: Bearer <key>"; NULL: none */
    int remote_max_requests;   /* concurrent requests of the jobs' worker; 0: 32 */
    int remote_timeout_ms;     /* a request that receives nothing for this long fails
                                  (KVGEN_E_NETWORK), and the load, retries included, ends
                                  within it; 0: 60000 */
} kvgen_model_desc;

typedef enum kvgen_tokenizer_kind {
    KVGEN_TOKENIZER_BPE = 1, /* byte-level BPE (tokenizer.ggml.model = gpt2) */
    KVGEN_TOKENIZER_SPM = 2, /* SentencePiece-style (tokenizer.ggml.model = llama) */
    KVGEN_TOKENIZER_WPM = 3  /* BERT's WordPiece (tokenizer.ggml.model = bert) */
} kvgen_tokenizer_kind;

typedef struct kvgen_model_info {
    const char *name;         /* general.name or the file name */
    const char *architecture; /* the architecture table row ("llama", ...) */
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
    const char *kv_type;       /* what its K/V pages hold: "f16", "q8_0", "q4_0", "f32" (NULL: a remote model) */
} kvgen_model_info;

KVGEN_API kvgen_status kvgen_model_load(const kvgen_model_desc *desc, kvgen_model **out, kvgen_error *err);
/* Drops the caller's reference; the model is freed when no session holds it. NULL is ignored. */
KVGEN_API void kvgen_model_unload(kvgen_model *model);
/* Adds a reference for another owner (e.g. a second lua_State given the same model): the model
 * is freed after one more kvgen_model_unload. Thread-safe. NULL is ignored. */
KVGEN_API void kvgen_model_retain(kvgen_model *model);
KVGEN_API void kvgen_model_get_info(const kvgen_model *model, kvgen_model_info *info);

/* Writes a multi-line human-readable description (hyperparameters, tensor type counts,
 * tokenizer) as printed by `kvgen info`. Returns the length it needed (like snprintf). */
KVGEN_API size_t kvgen_model_describe(const kvgen_model *model, char *buf, size_t size);

/* ---- devices ------------------------------------------------------------------------- */

/* A Vulkan device as kvgen sees it, with the features its shaders can use. */
typedef struct kvgen_device_info {
    int index;                     /* what desc.device / KVGEN_DEVICE accept */
    char name[256];
    const char *type;              /* "discrete", "integrated", "virtual", "cpu", "other" */
    uint32_t vendor_id, device_id;
    uint32_t api_version;          /* VK_MAKE_API_VERSION packing */
    uint64_t device_local_bytes;   /* size of the largest device-local heap */
    int host_visible_device_local; /* UMA or ReBAR: weights are written in place, no staging */
    int shader_float16;            /* fp16 arithmetic */
    int storage_16bit, storage_8bit;
    uint32_t subgroup_size;
    int subgroup_arithmetic;
    uint32_t max_shared_memory;        /* bytes per workgroup */
    uint64_t max_storage_buffer_range; /* larger buffers are split over several bindings */
    uint64_t max_allocation_size;
    int is_default;                /* the device kvgen picks when none is named */
    uint32_t compute_units;        /* streaming multiprocessors or compute units, where the driver
                                      says (VK_NV_shader_sm_builtins, VK_AMD_shader_core_properties);
                                      0: not reported */
    uint32_t coopmat_m, coopmat_n, coopmat_k; /* the shape (M x N x K) of the cooperative matrices
                                      (VK_KHR_cooperative_matrix: f16 x f16 + f32, subgroup scope)
                                      this build's prefill GEMM can run on with this device; 0:
                                      none (the device offers none kvgen can use, a driver's offer
                                      known to be broken, or a build without that kernel) */
    int int_dot;                   /* 8-bit integer dot products (VK_KHR_shader_integer_dot_product),
                                      which the mat-vecs and GEMMs of 8-bit activations run on */
    int int_dot_fast;              /* the driver reports the 4x8-bit packed signed dot product as
                                      accelerated: a model loaded with activation_bits 8 takes that
                                      path then (on a GPU with subgroup arithmetic) */
} kvgen_device_info;

/* Lists the Vulkan devices: writes up to `cap` entries to `out` (may be NULL when cap is 0)
 * and the number of devices to *count. No Vulkan driver at all is not an error: *count is 0.
 * Builds without the Vulkan backend (KVGEN_VULKAN=OFF) have it too and answer the same way:
 * KVGEN_OK with *count 0 (they can run on no device). */
KVGEN_API kvgen_status kvgen_devices(kvgen_device_info *out, int cap, int *count, kvgen_error *err);

/* ---- backends and device probe -------------------------------------------------------- */

/* A backend kvgen knows. */
typedef struct kvgen_backend_info {
    kvgen_backend backend; /* the value for kvgen_model_desc.backend */
    const char *name;      /* "vulkan", "cpu", "reference": as KVGEN_BACKEND, `--backend` and
                              kvgen_model_info.backend spell it */
    int available;         /* 1: built into this kvgen; 0: known, but this build lacks it (loading
                              it fails with KVGEN_E_UNSUPPORTED) */
    const char *missing;   /* available 0: why ("KVGEN_VULKAN=OFF or no Vulkan SDK"); else NULL */
    int uses_device;       /* runs on a Vulkan device (desc.device / KVGEN_DEVICE apply) */
    int uses_threads;      /* runs on the host's cores (desc.n_threads applies) */
} kvgen_backend_info;

/* Lists the backends kvgen knows, in the order a load with KVGEN_BACKEND_DEFAULT (and no
 * KVGEN_BACKEND) tries the available ones: writes up to `cap` entries to `out` (may be NULL
 * when cap is 0) and returns how many there are. The names are static strings. */
KVGEN_API int kvgen_backends(kvgen_backend_info *out, int cap);

/* What a device can do at best, measured with probe shaders, so a benchmark can report decode
 * speed as a share of "weight bytes / read bandwidth": a ceiling that means the same on a GPU
 * and on lavapipe. Zero fields: the defaults. */
typedef struct kvgen_probe_desc {
    const char *device; /* index or name substring, as kvgen_model_desc.device; NULL: KVGEN_DEVICE or the default */
    int read_mib;       /* buffer read per repetition, MiB; 0: 64 (at most the device's largest storage buffer) */
    int reps;           /* repetitions; the best one counts; 0: 5 */
    int dispatches;     /* empty dispatches timed in one command buffer; 0: 1000 */
} kvgen_probe_desc;

typedef struct kvgen_probe_result {
    char device[256];   /* the device's name */
    double read_gbps;   /* streaming-read bandwidth, GB/s (1e9 bytes), best repetition */
    double dispatch_us; /* one empty dispatch plus a barrier, microseconds, best repetition */
    uint64_t bytes;     /* bytes read per repetition */
} kvgen_probe_result;

/* Runs the probes on a device of the first available backend that uses one (Vulkan); creates
 * and destroys its own device, blocks for about a second on a GPU (longer on lavapipe).
 * KVGEN_E_UNSUPPORTED in builds with no device backend; KVGEN_E_DEVICE when no device runs.
 * desc NULL: the defaults. *out is zeroed first. */
KVGEN_API kvgen_status kvgen_device_probe(const kvgen_probe_desc *desc, kvgen_probe_result *out, kvgen_error *err);

/* ---- tokenizer ------------------------------------------------------------------------ */

enum {
    KVGEN_TOKENIZE_SPECIAL = 1, /* recognise control-token text such as <|im_start|> */
    KVGEN_TOKENIZE_ADD_BOS = 2  /* prepend BOS when the model's metadata asks for it */
};

/* Tokenizes `len` bytes of `text`. Writes up to `cap` ids to `out` and the full count to
 * *n_tokens; returns KVGEN_E_INVALID_ARGUMENT with *n_tokens set when `cap` is too small
 * (call again with a bigger buffer). `out` may be NULL when cap is 0. */
KVGEN_API kvgen_status kvgen_tokenize(const kvgen_model *model, const char *text, size_t len, unsigned flags,
                            int32_t *out, size_t cap, size_t *n_tokens, kvgen_error *err);

/* The raw bytes of one token (may be a fragment of a UTF-8 character). Control tokens
 * give their text only with KVGEN_TOKENIZE_SPECIAL in flags, else nothing.
 * Returns the number of bytes the piece has (like snprintf); writes at most `size`. */
KVGEN_API size_t kvgen_token_piece(const kvgen_model *model, int32_t token, unsigned flags, char *buf, size_t size);

/* Detokenizes a whole sequence into `buf` (NUL-terminated when size > 0); returns the
 * length needed. Invalid UTF-8 at the end is kept as is. */
KVGEN_API size_t kvgen_detokenize(const kvgen_model *model, const int32_t *tokens, size_t n, unsigned flags,
                        char *buf, size_t size);

/* True for end-of-generation tokens (EOS, EOT, <|im_end|>, <|eot_id|>, ...). */
KVGEN_API int kvgen_token_is_eog(const kvgen_model *model, int32_t token);
/* True for control tokens (never shown to users). */
KVGEN_API int kvgen_token_is_control(const kvgen_model *model, int32_t token);
/* Finds a token by its exact text; -1 when absent. */
KVGEN_API int32_t kvgen_token_find(const kvgen_model *model, const char *text);

/* Streaming detokenizer: feed tokens one at a time and receive only complete UTF-8.
 * A multi-byte character split across tokens is held back until it is complete. */
typedef struct kvgen_detok {
    unsigned char pending[8];
    int n_pending;
    int first; /* internal: strips SentencePiece's leading space on the first piece when asked */
} kvgen_detok;

KVGEN_API void kvgen_detok_init(kvgen_detok *d);
/* Appends the text that is now complete to buf (NUL-terminated); returns its length.
 * `size` of 64 bytes plus the longest token is always enough. */
KVGEN_API size_t kvgen_detok_push(const kvgen_model *model, kvgen_detok *d, int32_t token, unsigned flags, char *buf,
                        size_t size);
/* Flushes what is held back (an incomplete sequence is emitted as U+FFFD). */
KVGEN_API size_t kvgen_detok_flush(kvgen_detok *d, char *buf, size_t size);

/* ---- sessions ------------------------------------------------------------------------- */

/* What an append does when it would pass the session's n_ctx. */
typedef enum kvgen_on_full {
    KVGEN_ON_FULL_ERROR = 0, /* KVGEN_E_CONTEXT_FULL "context full (used/max)"; session unchanged */
    KVGEN_ON_FULL_SHIFT = 1  /* keep the first `keep` tokens, drop the oldest of the rest (at least
                                half of them, more if the append needs it) and re-rotate the cached
                                keys to their new positions (RoPE): no recomputation */
} kvgen_on_full;

typedef struct kvgen_session_desc {
    int n_ctx;          /* context limit in tokens; 0: min(model's context_length, 4096), and at most
                           the original context of a file with LongRoPE long factors (phi3)
                           loaded without a longer kvgen_model_desc.n_ctx */
    int no_cache;       /* 1: recompute the whole sequence on every decode (the O(N^2) baseline) */
    uint64_t seed;      /* sampler seed; 0: 0x5eed */
    float temperature;  /* <= 0: greedy */
    int top_k;          /* 0: off */
    float top_p;        /* 0 or >= 1: off */
    kvgen_on_full on_full; /* 0: error */
    int keep;              /* KVGEN_ON_FULL_SHIFT: tokens at the start never dropped (the system prompt) */
    int no_prefix_reuse;   /* 1: never take pages computed by other sessions (and never offer own) */
    /* The full sampler settings (see "generation" below); when not NULL they replace seed,
     * temperature, top_k and top_p above. Copied at creation. */
    const struct kvgen_sampler_desc *sampler;
} kvgen_session_desc;

KVGEN_API kvgen_status kvgen_session_create(kvgen_model *model, const kvgen_session_desc *desc, kvgen_session **out,
                                  kvgen_error *err);
KVGEN_API void kvgen_session_close(kvgen_session *session); /* NULL is ignored */

/* Appends `n` tokens to the session (prefill), computing their K/V into the cache and the
 * logits of the last one. When `all_logits` is not NULL it receives n * n_vocab floats, the
 * logits at every appended position (teacher forcing). */
KVGEN_API kvgen_status kvgen_session_prefill(kvgen_session *session, const int32_t *tokens, size_t n, float *all_logits,
                                   kvgen_error *err);
/* Appends exactly one token (decode) and computes the next-token logits. */
KVGEN_API kvgen_status kvgen_session_decode(kvgen_session *session, int32_t token, kvgen_error *err);
/* Logits after the last prefill/decode (n_vocab floats, valid until the next call); NULL before any. */
KVGEN_API const float *kvgen_session_logits(const kvgen_session *session);
/* Chooses the next token from the current logits with the session's sampler (greedy
 * when temperature <= 0). Returns -1 when there are no logits yet, or when a job owns the
 * session (kvgen_session_busy). */
KVGEN_API int32_t kvgen_session_sample(kvgen_session *session);
/* Tokens held in the cache. */
KVGEN_API size_t kvgen_session_length(const kvgen_session *session);
KVGEN_API const int32_t *kvgen_session_tokens(const kvgen_session *session);
/* Forgets everything: length 0, sampler re-seeded. A session a job owns (kvgen_session_busy)
 * is left as it is. */
KVGEN_API void kvgen_session_reset(kvgen_session *session);

/* The KV cache as the seed sees past_key_values: per layer K and V of shape
 * (kv_heads, length, head_dim). */
typedef struct kvgen_cache_info {
    int n_layer, n_head_kv, head_dim;
    size_t length, capacity;
    size_t bytes;           /* bytes of K/V data this session's tokens take (length * bytes_per_token) */
    size_t bytes_per_token; /* K+V, all layers */
    /* paged KV */
    size_t page_size;       /* tokens per page */
    size_t pages;           /* pages in this session's page table */
    size_t pages_shared;    /* of those, pages other sessions (or the prefix cache) also hold */
    size_t bytes_held;      /* pages * bytes per page: what the session keeps alive, shared pages included */
    size_t tokens_reused;   /* tokens whose K/V came from pages other sessions computed (prefix reuse),
                               since creation or the last reset */
    size_t shifts;          /* context shifts done (KVGEN_ON_FULL_SHIFT) */
    /* sliding-window layers (a model with local layers, on a backend that keeps their pages
     * apart): their K/V pages below what the window can still see are released. 0 otherwise */
    size_t window;          /* positions a local layer sees */
    size_t window_pages;    /* pages the local layers hold; bytes_held counts them too */
} kvgen_cache_info;

KVGEN_API void kvgen_session_cache_info(const kvgen_session *session, kvgen_cache_info *info);
/* Copies layer `layer`'s K (which = 0) or V (which = 1) as floats, shape
 * (kv_heads, length, head_dim), into `out` (capacity `n_floats`). A sliding-window layer's
 * positions whose pages were released (cache_info.window) read as zeros. */
KVGEN_API kvgen_status kvgen_session_read_cache(const kvgen_session *session, int layer, int which, float *out,
                                      size_t n_floats, kvgen_error *err);

/* Drops the last `n` tokens (undo a reply, regenerate) without recomputing the rest: only the
 * new last token runs once more, to give its logits back (so sample() works right away). The
 * sampler state is not rewound. n > length is KVGEN_E_INVALID_ARGUMENT and changes nothing;
 * rewinding to 0 leaves no logits. */
KVGEN_API kvgen_status kvgen_session_rewind(kvgen_session *session, size_t n, kvgen_error *err);

/* A new session continuing from `session`: same tokens, logits, options and sampler state (the
 * same seed/state draws the same next samples in both). It shares the parent's full pages
 * copy-on-write and copies only the partly filled last page, so many NPCs forked from one
 * persona prompt hold that prompt once. Parent and child are independent afterwards; either
 * may be closed first. KVGEN_E_POOL_FULL when no page is left for the copy. */
KVGEN_API kvgen_status kvgen_session_fork(kvgen_session *session, kvgen_session **child, kvgen_error *err);

/* Writes the session to `path`: a versioned header, a hash identifying the model, options,
 * token ids, sampler state, last logits, and K/V of the used positions only (f32), with a
 * checksum. Restoring it gives the same next-token logits and samples. The file is written
 * under a temporary name in the same folder, synced and renamed over `path`, so `path` holds
 * either its previous contents or the whole new file: a save that fails (disk full, file-size
 * limit) leaves the previous file as it was and removes its temporary file. A symbolic link
 * is followed: the file it points to is replaced, the link stays. A `path` that exists and is
 * not a regular file (device, FIFO, folder), or that the caller may not write, is refused
 * (KVGEN_E_IO) and left alone. Errors name the function, the path and the cause. */
KVGEN_API kvgen_status kvgen_session_save(const kvgen_session *session, const char *path, kvgen_error *err);
/* Creates a session from a file written by kvgen_session_save (in this or another process).
 * Refuses, with a message naming the function and the file: another model
 * (KVGEN_E_INVALID_ARGUMENT), a truncated or corrupted file (KVGEN_E_FORMAT, checksum), a
 * newer format version (KVGEN_E_UNSUPPORTED), not a session file (KVGEN_E_FORMAT), a missing
 * file or one that is not a regular file, such as /dev/zero or a FIFO (KVGEN_E_IO, before any
 * read). It reads the fixed-size header first and never more than the header's declared
 * size, which must equal the file's; nothing is allocated from the header before its sizes
 * match the file and the model. */
KVGEN_API kvgen_status kvgen_session_restore(kvgen_model *model, const char *path, kvgen_session **out, kvgen_error *err);

/* ---- LoRA adapters ----------------------------------------------------------------------
 * An adapter is a GGUF file in llama.cpp's LoRA format: general.type = "adapter",
 * adapter.type = "lora", adapter.lora.alpha (optional; 0 when absent), general.architecture
 * (the model's), and for each matrix W it changes (W: "blk.<i>.attn_q.weight" and the other
 * attention and feed-forward matrices of a layer; [n_in] -> [n_out]) the tensors
 * "<W>.lora_a" (ne0 = n_in, ne1 = rank) and "<W>.lora_b" (ne0 = rank, ne1 = n_out), of any type
 * the backends dequantize (F32, F16, BF16, Q8_0, ...). A session running it at scale s computes
 * every such product as y = W x + s' * B (A x), s' = s * alpha / rank (alpha != 0) or s: the
 * weights stay shared, each session adds its own low-rank product (in f32, on the activations),
 * so sessions with different adapters, or none, run in one batch. */
typedef struct kvgen_adapter kvgen_adapter;
#define KVGEN_MAX_ADAPTERS 8 /* adapters one session runs with at once */

/* Loads the adapter at `path` for `model`. Refuses, naming the file, and changes nothing:
 * another architecture than the model's (KVGEN_E_INVALID_ARGUMENT, both named), a file that
 * is not a LoRA adapter (KVGEN_E_FORMAT), a "<W>.lora_a" or "<W>.lora_b" without its other half
 * (KVGEN_E_FORMAT, naming the tensor missing), a matrix the model does not have or whose shape
 * differs (KVGEN_E_INVALID_ARGUMENT, naming the tensor and both shapes), a matrix kvgen does
 * not adapt, such as the embeddings (KVGEN_E_UNSUPPORTED), a truncated or malformed file
 * (KVGEN_E_FORMAT), a type no backend dequantizes (KVGEN_E_UNSUPPORTED). The adapter holds a
 * reference on the model (the model is freed after its last adapter and session). Thread-safe. */
KVGEN_API kvgen_status kvgen_adapter_load(kvgen_model *model, const char *path, kvgen_adapter **out,
                                          kvgen_error *err);
/* Drops the caller's reference; sessions running the adapter keep it alive until they let go
 * of it (set_adapters, close). NULL is ignored. */
KVGEN_API void kvgen_adapter_free(kvgen_adapter *adapter);
/* Takes another reference (each kvgen_adapter_free drops one), as kvgen_model_retain does for a
 * model: a host that hands an adapter to two owners (a binding's handle and its caller). */
KVGEN_API void kvgen_adapter_retain(kvgen_adapter *adapter);

typedef struct kvgen_adapter_info {
    const char *name;   /* general.name, else the file's name; valid while the adapter lives */
    const char *path;
    float alpha;        /* adapter.lora.alpha (0: absent) */
    int max_rank;       /* the largest rank of its pairs */
    int n_matrices;     /* the matrices it changes */
    uint64_t hash;      /* its content hash (what session files record) */
} kvgen_adapter_info;
KVGEN_API void kvgen_adapter_get_info(const kvgen_adapter *adapter, kvgen_adapter_info *info);

/* Sets the adapters `session` runs with from now on: adapters[i] at scales[i] (scales NULL:
 * every scale 1), n <= KVGEN_MAX_ADAPTERS; n = 0 runs the base model again. The session takes a
 * reference on each. The K/V already in the session stay as they were computed (rewind or
 * reset to recompute them); they are no longer offered to other sessions through the prefix
 * cache, which only ever shares pages between sessions with the same adapters and scales.
 * Forks inherit the adapters; kvgen_session_save records them (by content hash, with their
 * scales) and kvgen_session_restore finds them among the model's loaded adapters. Refuses,
 * changing nothing: an adapter of another model, n above the limit, a non-finite scale
 * (KVGEN_E_INVALID_ARGUMENT); a backend that does not run adapters (every local one does) or a
 * remote session (KVGEN_E_UNSUPPORTED, naming it). */
KVGEN_API kvgen_status kvgen_session_set_adapters(kvgen_session *session, const kvgen_adapter *const *adapters,
                                                  const float *scales, size_t n, kvgen_error *err);
/* The session's adapters and scales: fills up to `cap` of each (either may be NULL) and returns
 * how many it has. The pointers stay valid while the session holds them. */
KVGEN_API size_t kvgen_session_adapters(const kvgen_session *session, const kvgen_adapter **adapters, float *scales,
                                        size_t cap);

/* The model's KV page pool: memory accounting. */
typedef struct kvgen_pool_info {
    size_t page_size;       /* tokens per page */
    size_t pages_total;     /* pages the pool may hold */
    size_t pages_used;      /* held by at least one session */
    size_t pages_free;      /* available: never used, released, or cached */
    size_t pages_cached;    /* of the free ones: released pages kept for prefix reuse, reclaimed
                               least recently used first when the pool runs out */
    size_t bytes_per_token; /* K+V, all layers */
    size_t bytes_per_page;  /* of the pages_* above: all layers, or the global ones when window > 0 */
    size_t bytes_total;     /* the bytes_* count every pool: pages_total * bytes_per_page (+ the local pool's) */
    size_t bytes_used;      /* pages_used * bytes_per_page (+ window_pages_used * window_bytes_per_page) */
    size_t bytes_committed; /* storage actually allocated so far (the high-water mark) */
    size_t sessions;        /* open sessions of the model */
    /* a model with sliding-window layers on a backend that keeps their pages apart: those layers'
     * pages are a pool of their own (as many pages as the one above); else all 0 */
    size_t window;                /* positions a local layer sees */
    size_t window_bytes_per_page; /* K+V of the local layers */
    size_t window_pages_used, window_pages_cached;
} kvgen_pool_info;

KVGEN_API void kvgen_model_pool_info(const kvgen_model *model, kvgen_pool_info *info);

/* ---- generation ------------------------------------------------------------------------ *
 * Sampling, generation with stop conditions, chat templates, choice scoring and constrained
 * output. See docs/generation.md for the full contract and the defaults. */

/* Adds `bias` to one token's logit before sampling; bias = -INFINITY bans the token. */
typedef struct kvgen_logit_bias {
    int32_t token;
    float bias;
} kvgen_logit_bias;

/* The sampler chain, applied in this order to the current logits:
 *   logit bias / bans -> repetition, frequency, presence penalties (over the last
 *   `penalty_window` tokens of the session) -> greedy (temperature <= 0) or
 *   temperature -> top-k -> top-p -> min-p -> draw with the session's RNG.
 * Zero fields mean the default given after each field. */
typedef struct kvgen_sampler_desc {
    uint64_t seed;           /* RNG seed; 0: 0x5eed (kvgen_session_set_sampler: 0 keeps the RNG stream) */
    float temperature;       /* <= 0: greedy (argmax after bias and penalties); default 0 */
    int top_k;               /* keep the k most likely; 0: off */
    float top_p;             /* keep the smallest set reaching probability p; 0 or >= 1: off */
    float min_p;             /* drop tokens below min_p * p(most likely); 0: off */
    float repeat_penalty;    /* > 1: logit/penalty (positive) or logit*penalty (negative) for seen tokens; 0 or 1: off */
    float frequency_penalty; /* subtracts count * f from a seen token's logit; 0: off */
    float presence_penalty;  /* subtracts p once from a seen token's logit; 0: off */
    int penalty_window;      /* tokens looked back for penalties; 0: 64; -1: the whole session */
    const kvgen_logit_bias *bias; /* copied; NULL: none */
    int n_bias;
} kvgen_sampler_desc;

/* Replaces the session's sampler settings. The RNG is re-seeded when desc->seed != 0,
 * otherwise it continues its current stream. NULL desc restores every default. */
KVGEN_API kvgen_status kvgen_session_set_sampler(kvgen_session *session, const kvgen_sampler_desc *desc, kvgen_error *err);
/* The settings in force (bias points into the session; valid until the next set_sampler). */
KVGEN_API void kvgen_session_get_sampler(const kvgen_session *session, kvgen_sampler_desc *desc);

/* Why a generation ended. */
typedef enum kvgen_finish {
    KVGEN_FINISH_NONE = 0,     /* still generating */
    KVGEN_FINISH_STOP,         /* an end-of-generation token (EOS/EOT/end of turn), or a constraint completed */
    KVGEN_FINISH_STOP_STRING,  /* one of the stop strings appeared (it is not part of the text) */
    KVGEN_FINISH_LENGTH,       /* max_tokens reached */
    KVGEN_FINISH_CANCELLED,    /* kvgen_gen_cancel was called */
    KVGEN_FINISH_CONTEXT_FULL, /* the session's context is full */
    KVGEN_FINISH_ERROR,        /* a backend error; kvgen_gen_next returned it */
    KVGEN_FINISH_DEAD_END,     /* a constraint allows no token of the vocabulary here (the text
                                  so far is a prefix it accepts, but cannot be completed) */
    KVGEN_FINISH_SENTENCE,     /* past soft_max_tokens, the text ended a sentence */
    KVGEN_FINISH_TOOL_CALLS,   /* the reply called tools (kvgen_gen_tool_calls); its text is what came
                                  before the calls */
    KVGEN_FINISH_BAD_TOOL_CALL /* the reply began a tool call that names no tool given or whose
                                  arguments its schema refuses; no call is reported */
} kvgen_finish;

/* "none", "stop", "stop_string", "length", "cancelled", "context_full", "error", "dead_end",
 * "sentence", "tool_calls", "bad_tool_call" */
KVGEN_API const char *kvgen_finish_name(kvgen_finish finish);

/* Constrained output: generation may only produce text the constraint accepts; tokens that
 * would leave it are masked before sampling. Supported shapes (anything else is refused with
 * KVGEN_E_INVALID_ARGUMENT):
 *  - KVGEN_CONSTRAIN_CHOICE: exactly one of `choices` (non-empty strings, any bytes), byte for
 *    byte, picked by the scores kvgen_session_choose gives them (greedy: the best; with
 *    temperature T: drawn with p ~ exp(logprob / T)), then generated as the tokens scored.
 *    A choice the vocabulary cannot spell is refused (docs/generation.md, "Choices").
 *  - KVGEN_CONSTRAIN_JSON: one flat JSON object with exactly `fields`, in that order, written
 *    compactly: {"key":value,"key2":value2}. Values: a string without escapes or control
 *    characters (at most max_len bytes), a number -?(0|[1-9][0-9]*)(\.[0-9]+)? (at most 16
 *    characters), or one of the given enum strings (written as a JSON string).
 *  - KVGEN_CONSTRAIN_GRAMMAR: text of the GBNF grammar `grammar` (rules `name ::= ...`, the
 *    text matches rule `root`; docs/generation.md, "Grammars"). A grammar that matches no text,
 *    uses an undefined rule or is left-recursive is refused, naming the rule and its line.
 *  - KVGEN_CONSTRAIN_SCHEMA: compact JSON valid against the JSON schema `schema` (text; the
 *    subset in docs/generation.md, "JSON schemas"), compiled to a grammar. An unsupported
 *    keyword is refused, naming the schema path and the keyword.
 * End-of-generation tokens are allowed only where the text is complete. Generation ends with
 * KVGEN_FINISH_STOP as soon as the text is complete and nothing can follow, and with
 * KVGEN_FINISH_DEAD_END when no token of the vocabulary continues it. */
typedef enum kvgen_constraint_kind {
    KVGEN_CONSTRAIN_NONE = 0,
    KVGEN_CONSTRAIN_CHOICE,
    KVGEN_CONSTRAIN_JSON,
    KVGEN_CONSTRAIN_GRAMMAR,
    KVGEN_CONSTRAIN_SCHEMA
} kvgen_constraint_kind;

typedef enum kvgen_json_type {
    KVGEN_JSON_STRING = 1,
    KVGEN_JSON_NUMBER,
    KVGEN_JSON_ENUM
} kvgen_json_type;

typedef struct kvgen_json_field {
    const char *key;            /* printable ASCII without '"' or '\\' */
    kvgen_json_type type;
    const char *const *values;  /* KVGEN_JSON_ENUM: the allowed strings */
    int n_values;
    int max_len;                /* KVGEN_JSON_STRING: longest value in bytes; 0: 64 */
} kvgen_json_field;

typedef struct kvgen_constraint {
    kvgen_constraint_kind kind;
    const char *const *choices; /* KVGEN_CONSTRAIN_CHOICE */
    int n_choices;
    const kvgen_json_field *fields; /* KVGEN_CONSTRAIN_JSON */
    int n_fields;
    const char *grammar; /* KVGEN_CONSTRAIN_GRAMMAR: GBNF text */
    const char *schema;  /* KVGEN_CONSTRAIN_SCHEMA: JSON schema text */
} kvgen_constraint;

/* Tools a chat reply may call (docs/generation.md, "Tools"), as OpenAI's API and Hugging Face's
 * apply_chat_template take them. The model writes a call in its own format, recognised from
 * the chat template's text (Hermes/Qwen2.5 <tool_call> blocks, Llama 3.1/3.2 JSON, Mistral
 * [TOOL_CALLS]); a template with none of them refuses tools (KVGEN_E_UNSUPPORTED). */
typedef enum kvgen_tool_choice {
    KVGEN_TOOL_AUTO = 0,  /* the model decides: free text, and calls where it writes them (Hermes:
                             from its <tool_call> on, the tools' grammar constrains the rest) */
    KVGEN_TOOL_NONE,      /* the tools are not shown to the template (the model answers in
                             words, the conversation's earlier calls stay), and a call it
                             writes anyway is not accepted */
    KVGEN_TOOL_REQUIRED,  /* one call, forced from the first token by the tools' grammar */
    KVGEN_TOOL_NAMED      /* one call of the tool named `name`, forced likewise */
} kvgen_tool_choice;

typedef struct kvgen_tool {
    const char *name;        /* [A-Za-z0-9_.-]{1,64} */
    const char *description; /* NULL: none */
    const char *parameters;  /* JSON schema (text) of the arguments object; NULL: {"type":"object"}.
                                The subset of docs/generation.md, "JSON schemas" */
} kvgen_tool;

typedef struct kvgen_tools_desc {
    const kvgen_tool *tools; /* copied at begin */
    int n_tools;             /* 1..KVGEN_MAX_TOOLS */
    kvgen_tool_choice choice;
    const char *name;        /* KVGEN_TOOL_NAMED: the tool */
} kvgen_tools_desc;

#define KVGEN_MAX_TOOLS 64

/* A call the reply made: arguments valid against the tool's schema (compact JSON text). */
typedef struct kvgen_tool_call {
    const char *id;        /* "call_<n>_<i>", unique in the conversation */
    const char *name;
    const char *arguments; /* a JSON object */
} kvgen_tool_call;

#define KVGEN_MAX_STOPS 64      /* stop strings per generation */
#define KVGEN_MAX_STOP_LEN 1024 /* bytes per stop string */

typedef struct kvgen_generate_desc {
    int max_tokens;             /* 0: 256 (no limit with a constraint); < 0: no limit, i.e. until the
                                   context is full, or with KVGEN_ON_FULL_SHIFT (never full) at most
                                   the session's n_ctx tokens (finish LENGTH) */
    const char *const *stop;    /* stop strings (non-empty); matched across token boundaries */
    int n_stop;                 /* 0..KVGEN_MAX_STOPS, each at most KVGEN_MAX_STOP_LEN bytes */
    int ignore_eog;             /* 1: do not stop at end-of-generation tokens */
    unsigned flags;             /* KVGEN_TOKENIZE_SPECIAL: include control tokens' text in the output */
    const kvgen_constraint *constraint; /* NULL: free text; copied at begin */
    int soft_max_tokens;        /* > 0: once this many tokens are out, end (finish SENTENCE) where the
                                   text ends a sentence; max_tokens stays the hard limit. 0: off.
                                   Not with a constraint. See docs/generation.md, "Ending replies" */
    int thinking_budget;        /* a chat reply under a template with think tags (kvgen_gen_reasoning):
                                   > 0: after this many tokens of reasoning the closing tag is forced
                                   and the reply goes on; 0: no limit */
    const kvgen_tools_desc *tools; /* NULL: none. kvgen_chat_gen_begin and chat jobs (KVGEN_PROMPT_CHAT)
                                      only (other calls give KVGEN_E_UNSUPPORTED, other jobs
                                      KVGEN_E_INVALID_ARGUMENT); not with a constraint or soft_max_tokens */
} kvgen_generate_desc;

/* Step-wise generation. kvgen_gen_begin starts from the session's current logits (prefill a
 * prompt, or use kvgen_chat_begin, first). Each kvgen_gen_next samples one token, appends it
 * to the session (decode) and returns the text that is now final: complete UTF-8, with text
 * that might begin a stop string held back until decided. After any finish the session's
 * cache holds exactly the sampled tokens, the end-of-generation token included (so a next
 * chat turn continues the template correctly); a token refused for lack of context is not in
 * it, nor is the token sampled after a sentence's end that a SENTENCE finish drops (its step
 * has token -1). The session must outlive the generator and must not be used by other calls between
 * begin and end (reading its length/tokens is fine). */
typedef struct kvgen_gen kvgen_gen;

typedef struct kvgen_gen_step {
    const char *text;    /* NUL-terminated, may be ""; valid until the next kvgen_gen_* call */
    size_t len;
    int32_t token;       /* the token sampled in this step; -1 when none was */
    kvgen_finish finish; /* KVGEN_FINISH_NONE while generation goes on */
    /* A chat reply under a template with think tags (kvgen_gen_reasoning): the reasoning this
     * step made final, apart from `text` (NUL-terminated, may be ""; valid as `text`). The tags
     * and the spaces around the reasoning are in neither, however the tokens split them: the
     * steps' reasoning adds up to kvgen_gen_reasoning and their text to kvgen_gen_text. Always
     * "" elsewhere. */
    const char *reasoning;
    size_t reasoning_len;
} kvgen_gen_step;

/* Checks a desc the way kvgen_gen_begin and kvgen_job_submit do (stop strings, flags, the
 * constraint) without a session: KVGEN_E_INVALID_ARGUMENT naming the field, or KVGEN_OK (also
 * for NULL). Call it before appending a prompt that the generation is meant to follow. */
KVGEN_API kvgen_status kvgen_generate_check(const kvgen_generate_desc *desc, kvgen_error *err);

/* Fails (changing nothing) when desc is invalid or the session has no logits. */
KVGEN_API kvgen_status kvgen_gen_begin(kvgen_session *session, const kvgen_generate_desc *desc, kvgen_gen **out,
                             kvgen_error *err);
/* All or nothing: checks desc and builds the generator, then prefills `prompt` (n tokens; 0:
 * none, the session must have logits) and returns the generator. On any failure the session
 * is exactly as it was: the prompt is not appended. */
KVGEN_API kvgen_status kvgen_gen_begin_prompt(kvgen_session *session, const int32_t *prompt, size_t n,
                                    const kvgen_generate_desc *desc, kvgen_gen **out, kvgen_error *err);
/* All or nothing, as kvgen_gen_begin_prompt, with the prompt given as text (appended as is,
 * tokenized as plain text: control tokens are not parsed; len 0 and text NULL: no prompt). On
 * a remote model's session the text is sent as it is (docs/remote.md). */
KVGEN_API kvgen_status kvgen_gen_begin_text(kvgen_session *session, const char *text, size_t len,
                                  const kvgen_generate_desc *desc, kvgen_gen **out, kvgen_error *err);

/* One token. Returns KVGEN_OK (also for the step that finishes) or the error that ended the
 * generation (finish = KVGEN_FINISH_ERROR). After the finish it keeps returning empty steps
 * with the same finish reason. */
KVGEN_API kvgen_status kvgen_gen_next(kvgen_gen *gen, kvgen_gen_step *step, kvgen_error *err);
/* Asks the generator to stop: the next kvgen_gen_next samples nothing and finishes with
 * KVGEN_FINISH_CANCELLED. Safe to call from another thread while kvgen_gen_next runs. */
KVGEN_API void kvgen_gen_cancel(kvgen_gen *gen);
/* All text emitted so far (NUL-terminated; valid until the next kvgen_gen_* call). */
KVGEN_API const char *kvgen_gen_text(const kvgen_gen *gen, size_t *len);
KVGEN_API int kvgen_gen_n_tokens(const kvgen_gen *gen);   /* tokens sampled so far */
KVGEN_API kvgen_finish kvgen_gen_finish(const kvgen_gen *gen);
/* A chat reply under a template that writes think tags (<think> ... </think>: Qwen3,
 * DeepSeek-R1; docs/generation.md, "Reasoning"): after the finish, what the model thought
 * (trimmed; NUL-terminated, valid until kvgen_gen_end), which kvgen_gen_text leaves out; NULL
 * when the reply had none, or before the finish. */
KVGEN_API const char *kvgen_gen_reasoning(const kvgen_gen *gen, size_t *len);
/* After a KVGEN_FINISH_TOOL_CALLS finish: the calls (*calls valid until kvgen_gen_end), their
 * count returned; 0 otherwise. */
KVGEN_API int kvgen_gen_tool_calls(const kvgen_gen *gen, const kvgen_tool_call **calls);
KVGEN_API void kvgen_gen_end(kvgen_gen *gen);             /* NULL is ignored */

/* One-shot generation: runs kvgen_gen_* to the end, writes the text into out (truncated,
 * NUL-terminated when size > 0) and its full length into *len (NULL allowed). */
KVGEN_API kvgen_status kvgen_generate(kvgen_session *session, const kvgen_generate_desc *desc, char *out, size_t size,
                            size_t *len, kvgen_finish *finish, kvgen_error *err);

/* ---- chat ---- *
 * The model's tokenizer.chat_template (Jinja) is run by kvgen's own interpreter with the
 * conversation (role, content), add_generation_prompt, bos_token and eos_token, as Hugging
 * Face's apply_chat_template renders it (default system prompts included). A file without a
 * template, or with one the interpreter rejects (the reason goes to the logger once, as a warning), uses a
 * built-in family: "chatml" (SmolLM2, Qwen), "llama3", "llama2", "zephyr", "gemma", "phi3",
 * recognised from the template's control strings or the vocabulary. Template text is tokenized
 * with KVGEN_TOKENIZE_SPECIAL, message content never is, so a user cannot inject template
 * tokens. */
typedef struct kvgen_chat_template {
    const char *name; /* a built-in family name: the other fields are ignored; NULL: custom */
    const char *system_prefix, *system_suffix;
    const char *user_prefix, *user_suffix;
    const char *assistant_prefix, *assistant_suffix; /* assistant_prefix starts every reply */
    int system_in_user; /* 1: the user turn after a system turn omits user_prefix (llama2, gemma) */
    const char *jinja;  /* name NULL: a Jinja chat template (the strings above are ignored); copied */
} kvgen_chat_template;

/* Chooses the session's template: NULL returns to the model's; a template with `name`
 * selects a built-in family; `jinja` a template of the caller's (a syntax error gives
 * KVGEN_E_INVALID_ARGUMENT with its line and column); otherwise the strings are copied.
 * Unknown names give KVGEN_E_UNSUPPORTED. The conversation so far carries over. */
KVGEN_API kvgen_status kvgen_chat_set_template(kvgen_session *session, const kvgen_chat_template *tpl, kvgen_error *err);
/* What renders the session's chat: "jinja" (the model's template or the caller's), a family
 * name ("chatml", ...), "custom"; or NULL with *err set (KVGEN_E_UNSUPPORTED) when the model
 * has no usable template, no family matches and none was set. */
KVGEN_API const char *kvgen_chat_template_name(kvgen_session *session, kvgen_error *err);
/* Appends one complete turn (role "system", "user", "assistant" or, under a Jinja template,
 * "tool") and prefills it; an open assistant reply is closed first. On an empty session the model's BOS comes first.
 * Under a Jinja template the whole conversation is rendered and only the tokens past what the
 * cache already holds are prefilled; where the rendering changes earlier text (or the reply
 * tokenizes differently than generated) the cache is rewound to the common prefix first. A
 * rewind below a turn's tokens (kvgen_session_rewind, an undo) takes that turn out of the
 * conversation. A template error (raise_exception, a conversation it refuses) gives
 * KVGEN_E_UNSUPPORTED with the template's line and column. */
KVGEN_API kvgen_status kvgen_chat_add(kvgen_session *session, const char *role, const char *text, kvgen_error *err);
/* Appends a turn like kvgen_chat_add (text NULL: no turn) and then the assistant header, so
 * that kvgen_gen_begin produces the reply. Only the new tokens are prefilled. */
KVGEN_API kvgen_status kvgen_chat_begin(kvgen_session *session, const char *role, const char *text, kvgen_error *err);
/* All or nothing: kvgen_chat_begin(role, text) followed by kvgen_gen_begin(desc), with desc
 * checked and the generator built before the turn is appended. On any failure the session's
 * tokens and chat state are exactly as they were (no user turn is left behind). Chat calls
 * that fail on their own (kvgen_chat_add, kvgen_chat_begin) change nothing either. */
KVGEN_API kvgen_status kvgen_chat_gen_begin(kvgen_session *session, const char *role, const char *text,
                                  const kvgen_generate_desc *desc, kvgen_gen **out, kvgen_error *err);
/* The tool-call format the session's chat template writes: "hermes" (<tool_call> blocks,
 * Qwen2.5), "llama3" (a JSON object with "parameters"), "mistral" ([TOOL_CALLS] list), "phi4"
 * (Phi-4-mini's <|tool_call|> list); NULL when it writes none kvgen knows, under a built-in
 * family, or on a remote session. */
KVGEN_API const char *kvgen_chat_tool_format(kvgen_session *session);
/* With desc->tools (a Jinja template only; a built-in family or a remote session gives
 * KVGEN_E_UNSUPPORTED): the tools become the template's "tools" variable from this turn on
 * (kvgen_chat_set_vars; the other variables stay), and the reply's end is read for calls in
 * the template's format. A reply that called tools finishes with KVGEN_FINISH_TOOL_CALLS: its
 * text (kvgen_gen_text) is what came before the calls, kvgen_gen_tool_calls gives them, and
 * the conversation holds the assistant message with its tool_calls (the cache re-rendered from
 * where it differs), so the host adds each result with kvgen_chat_add_message (role "tool",
 * tool_call_id the call's id) and begins the next reply. A call that names no tool or whose
 * arguments its schema refuses finishes with KVGEN_FINISH_BAD_TOOL_CALL and reaches the host
 * as no call (the reply stays in the conversation as text). The steps never stream call markup
 * (what may begin a call waits until decided). A reply cut by max_tokens, a stop string or a
 * cancel inside a call keeps its finish, has no calls, and the conversation keeps the text
 * before the call, never a broken call. */

/* Tool use, as Hugging Face's apply_chat_template passes it to a template (docs/generation.md,
 * "Tools"): a message with what tool use adds. Under a Jinja template only: a built-in family
 * or a remote session gives KVGEN_E_UNSUPPORTED. */
typedef struct kvgen_chat_message {
    const char *role;              /* "system", "user", "assistant" or "tool" */
    const char *content;           /* NULL: "" (with tool_calls: the template sees content none) */
    const char *tool_calls;        /* assistant: NULL, or a JSON array of {"id": ..., "type": "function",
                                      "function": {"name": ..., "arguments": {...} or JSON text}} */
    const char *tool_call_id;      /* tool: NULL, or the id of the call this message answers */
    const char *reasoning_content; /* assistant: NULL, or its reasoning (Qwen3's templates render it) */
} kvgen_chat_message;

/* Appends one complete message as kvgen_chat_add does (role "tool": a tool's result; an
 * assistant message: its tool calls and reasoning), for the template to render. Malformed
 * tool_calls JSON, or a field on a role it does not belong to, gives KVGEN_E_INVALID_ARGUMENT
 * naming it and changes nothing. kvgen_chat_add takes role "tool" too (without an id). */
KVGEN_API kvgen_status kvgen_chat_add_message(kvgen_session *session, const kvgen_chat_message *msg, kvgen_error *err);
/* The chat template's further variables from now on: a JSON object, such as {"tools": [...],
 * "enable_thinking": false} ("tools": JSON-schema function descriptions, as Hugging Face
 * takes them); json NULL or "{}" removes them. Every later rendering of the conversation
 * passes them (a change that alters text already in the cache rewinds to where it differs);
 * they are kept by fork and session files. messages, add_generation_prompt, bos_token and
 * eos_token are the chat's own and refused. Their strings count as message content: never
 * parsed for control tokens. */
KVGEN_API kvgen_status kvgen_chat_set_vars(kvgen_session *session, const char *json, kvgen_error *err);
/* The variables set, as compact JSON text, or NULL when none are; valid until the next chat call. */
KVGEN_API const char *kvgen_chat_vars(kvgen_session *session);

/* The conversation read back: the session's messages in order, as kvgen_chat_message values
 * (role, content, tool_calls as compact JSON text, tool_call_id, reasoning_content; NULL where a
 * message has none; content NULL only where tool calls were given without it). A system prompt
 * given as a turn is a message (a template's default system prompt is not); a reply generated
 * since the last turn is the last message (assistant, its text without control tokens); a
 * message whose tokens a rewind or a context shift took out is not there. *out is one
 * allocation, the array and its strings together, a copy the caller frees with
 * kvgen_chat_messages_free; no messages: *out NULL and *n 0. On a remote session: the messages
 * of its history (role and content). */
KVGEN_API kvgen_status kvgen_chat_messages(kvgen_session *session, kvgen_chat_message **out, size_t *n,
                                           kvgen_error *err);
KVGEN_API void kvgen_chat_messages_free(kvgen_chat_message *msgs); /* NULL is ignored */
/* Takes the last n messages, as kvgen_chat_messages counts them, out of the conversation, the
 * system prompt too when n reaches it, and rewinds the cache to where the first of them starts:
 * the end of the message before it (all of them: an empty session). No reply is open after it;
 * the next turn renders the conversation and prefills only what differs from the cache. n 0
 * changes nothing; n < 0 or more than the messages held gives KVGEN_E_INVALID_ARGUMENT naming
 * n and the count, and changes nothing. On a remote session the history loses its last n
 * messages. */
KVGEN_API kvgen_status kvgen_chat_undo(kvgen_session *session, int n, kvgen_error *err);

/* ---- choice scoring ---- */
typedef struct kvgen_choice {
    double logprob;      /* sum of the candidate's token log-probabilities */
    double logprob_mean; /* logprob / n_tokens */
    int n_tokens;
} kvgen_choice;

/* Scores each candidate continuation (tokenized without special tokens or BOS) of the
 * session's current text, which must have logits (prefill it first). The session is left
 * exactly as it was. results receives n entries. */
KVGEN_API kvgen_status kvgen_session_choose(kvgen_session *session, const char *const *candidates, size_t n,
                                  kvgen_choice *results, kvgen_error *err);


/* ---- jobs: non-blocking generation on the engine's worker thread ----------------------- *
 * For game loops: the host submits a request and, once per frame, pumps the results; it never
 * waits on the model. See docs/jobs.md for the scheduling and the CPU budget.
 *
 * - The model owns one worker thread, started by the first kvgen_job_submit and stopped
 *   (joined) when the model is freed, i.e. when its last reference (the loaded handle,
 *   sessions, unreleased jobs) is gone; any work left is cancelled and freed then.
 * - Every step the worker advances all sessions that have work: the decodes of all
 *   generating jobs run as ONE batched forward pass where the backend supports it
 *   (reference: each weight row is dequantized once for the whole batch), and at most one
 *   prompt is prefilled by one chunk (desc.prefill_chunk tokens), so a long prompt never
 *   stalls the other streams. Higher priority first, round robin among equals.
 * - Jobs of one session run one after another in submission order. From submit until the
 *   job is final (done, cancelled, failed) the session belongs to the worker, and
 *   kvgen_session_busy says so. Allowed meanwhile: further kvgen_job_submit calls (queued in
 *   order) and kvgen_session_close, which cancels its jobs safely (it waits for at most the
 *   one worker step that may be using the session). Refused from any thread but the worker:
 *   kvgen_session_prefill, _decode, _rewind, _fork, _read_cache, _set_sampler, _choose and
 *   _save, kvgen_chat_add, _begin, _gen_begin, _set_template, _messages and _undo,
 *   kvgen_gen_begin and _begin_prompt fail with KVGEN_E_INVALID_ARGUMENT ("kvgen_session_prefill: session 0x...
 *   is busy: a job on it is queued or running ...") and change nothing;
 *   kvgen_session_sample returns -1 and kvgen_session_reset does nothing. The getters answer,
 *   but their answers are stale at once: check kvgen_session_busy first.
 * - kvgen_poll / kvgen_job_poll / kvgen_job_get_info never wait for the model: they take a
 *   lock the worker holds only for bookkeeping, never during a forward pass. There are no
 *   callbacks; the worker never calls into the host. Poll a given job from one thread at a
 *   time; submit, cancel and release may be called from any thread.
 * - A job cancelled (or failed) before its first generated token leaves the session as it
 *   was before the job (prompt and chat turn taken back); after that, the session keeps
 *   the prompt and the tokens generated so far, as with kvgen_gen_*. */

typedef struct kvgen_job kvgen_job;

typedef enum kvgen_job_state {
    KVGEN_JOB_QUEUED = 0,   /* waiting for the worker */
    KVGEN_JOB_PREFILLING,   /* its prompt is being prefilled, chunk by chunk */
    KVGEN_JOB_GENERATING,   /* producing tokens */
    KVGEN_JOB_DONE,         /* finished normally (see finish: stop, stop_string, length, context_full, sentence,
                               tool_calls, bad_tool_call) */
    KVGEN_JOB_CANCELLED,    /* kvgen_job_cancel / kvgen_job_release / session closed */
    KVGEN_JOB_FAILED        /* an error; kvgen_job_get_info gives the message */
} kvgen_job_state;

/* "queued", "prefilling", "generating", "done", "cancelled", "failed" */
KVGEN_API const char *kvgen_job_state_name(kvgen_job_state state);

typedef enum kvgen_prompt_kind {
    KVGEN_PROMPT_NONE = 0, /* no prompt: generate from the session's current logits */
    KVGEN_PROMPT_TEXT,     /* `text` appended as is, tokenized with `tokenize_flags` */
    KVGEN_PROMPT_CHAT,     /* a chat turn (`role`, `text`) then the assistant header, as
                              kvgen_chat_begin (role NULL: only open the reply) */
    KVGEN_PROMPT_TOKENS    /* `tokens` appended as is */
} kvgen_prompt_kind;

typedef struct kvgen_job_desc {
    kvgen_prompt_kind prompt;
    const char *text;        /* TEXT, CHAT; copied */
    size_t text_len;         /* 0: strlen(text) */
    unsigned tokenize_flags; /* TEXT: KVGEN_TOKENIZE_SPECIAL / KVGEN_TOKENIZE_ADD_BOS */
    const char *role;        /* CHAT: "system", "user", "assistant" or "tool"; copied */
    const char *chat_vars;   /* CHAT: NULL (the session's stay), or the template's variables from this
                                turn on, a JSON object as kvgen_chat_set_vars takes ("{}": none);
                                checked and copied at submit, set when the job starts (see below) */
    const int32_t *tokens;   /* TOKENS; copied */
    size_t n_tokens;
    kvgen_generate_desc gen; /* as for kvgen_gen_begin (zero: defaults); a CHAT job's as for
                                kvgen_chat_gen_begin (tools, thinking_budget). Stop strings, the
                                constraint and the tools are copied at submit */
    int priority;            /* higher runs first; 0: normal. Change it with kvgen_job_set_priority */
    const void *owner;       /* kvgen_poll(model, owner, ...) returns only this owner's jobs
                                (e.g. one per lua_State); NULL is an owner like any other */
    void *user_data;         /* returned in events */
} kvgen_job_desc;

/* Queues a request on `session` (desc NULL: no prompt, default generation) and returns at
 * once. Arguments (stop strings, constraint, prompt kind) are checked here; errors found on
 * the worker (e.g. context full) make the job FAILED. The job holds a model reference until
 * released. */
KVGEN_API kvgen_status kvgen_job_submit(kvgen_session *session, const kvgen_job_desc *desc, kvgen_job **out,
                              kvgen_error *err);
/* Asks the job to stop: a queued job is cancelled at once, a running one at the worker's
 * next step. Final jobs are left alone. NULL is ignored. */
KVGEN_API void kvgen_job_cancel(kvgen_job *job);
/* Cancels the job if it is not final and frees the handle (the worker lets go of it at its
 * next step). Every submitted job must be released once. NULL is ignored. */
KVGEN_API void kvgen_job_release(kvgen_job *job);
KVGEN_API void kvgen_job_set_priority(kvgen_job *job, int priority);

/* Non-blocking: hands out the text the worker produced since this job's last poll and
 * returns the job's state (a final state comes with the last text). *text / *len (either may
 * be NULL) receive the new bytes (NUL-terminated, "" when none), valid until the job's next
 * poll, kvgen_job_text or release. */
KVGEN_API kvgen_job_state kvgen_job_poll(kvgen_job *job, const char **text, size_t *len);
/* All text the worker has produced so far, delivered by a poll or not yet (NUL-terminated;
 * valid until the job's next poll, kvgen_job_text or release). Once the job reads final
 * (kvgen_job_get_info, kvgen_job_poll, an event) this is the whole text. */
KVGEN_API const char *kvgen_job_text(const kvgen_job *job, size_t *len);

typedef struct kvgen_job_info {
    kvgen_job_state state;
    kvgen_finish finish;    /* final states: why generation ended (NONE before) */
    kvgen_error error;      /* FAILED: what went wrong (status KVGEN_OK otherwise) */
    int priority;
    size_t prompt_tokens;   /* tokens of the prompt (0 until the worker built it) */
    size_t prompt_done;     /* of those, prefilled so far */
    int n_tokens;           /* tokens generated so far */
    /* timing in milliseconds from submit; -1 where the event has not happened */
    double queue_ms;        /* submit -> the worker started the job */
    double first_token_ms;  /* submit -> first generated token (time to first token) */
    double total_ms;        /* submit -> final state */
    double tokens_per_s;    /* generated tokens after the first / time since the first */
} kvgen_job_info;

/* A chat job (KVGEN_PROMPT_CHAT) is read as kvgen_chat_gen_begin reads its reply: gen.tools
 * offers tools (copied at submit, checked there as far as no template is needed; a session
 * whose template writes no call format fails the job, its turn taken back), and under a
 * template with think tags the reasoning stays out of the job's text. desc.chat_vars are the
 * turn's template variables (enable_thinking, say) for a session that may be busy: the worker
 * sets them as kvgen_chat_set_vars would (replacing the session's; gen.tools then joins them as
 * "tools") when the job starts, after the session's earlier jobs and before the turn is rendered.
 * They stay in force after the turn, as after kvgen_chat_set_vars and a synchronous chat; a job
 * cancelled or failed before its first token puts the session's variables back with its turn. */
/* The reasoning the worker has produced so far (NUL-terminated, "" when none; once the job
 * reads final, all of it, equal to kvgen_gen_reasoning's), a copy valid until the job's next
 * kvgen_job_reasoning or release; NULL for NULL or when memory runs out. */
KVGEN_API const char *kvgen_job_reasoning(const kvgen_job *job, size_t *len);
/* A job that reads final with finish KVGEN_FINISH_TOOL_CALLS: its calls (*calls valid until
 * release), their count returned; 0 otherwise. */
KVGEN_API int kvgen_job_tool_calls(const kvgen_job *job, const kvgen_tool_call **calls);

/* A snapshot of the job's progress (non-blocking; does not consume text). */
KVGEN_API void kvgen_job_get_info(const kvgen_job *job, kvgen_job_info *info);

/* 1 while the session has a job that is not final, queued or running on the model's worker
 * (a released job counts until the worker has let go of it, at its next step), else 0; 0 for
 * NULL. Thread-safe and non-blocking (an atomic read of the session's count of jobs that are
 * not final): it never waits for the model and starts no worker. A session that is not busy is the host's again: nothing of the
 * worker's touches it before the next submit. */
KVGEN_API int kvgen_session_busy(const kvgen_session *session);

/* One job's news since its last poll. */
typedef struct kvgen_event {
    kvgen_job *job;
    void *user_data;       /* desc.user_data */
    kvgen_job_state state; /* the job's state now */
    const char *text;      /* new text ("" when none); valid until the job's next poll,
                              kvgen_job_text or release */
    size_t len;
    int finished;          /* 1 exactly once: the job became final (its last event) */
    kvgen_finish finish;
} kvgen_event;

/* The per-frame pump: writes up to `cap` events, one per job of `owner` on this model with
 * new text or that just became final, and returns how many. Jobs left over (more than cap)
 * come first in the next call. Never blocks on the worker; returns 0 when nothing is new. */
KVGEN_API int kvgen_poll(kvgen_model *model, const void *owner, kvgen_event *events, int cap);

/* Worker settings (zero fields: defaults). May be called at any time; applies from the
 * worker's next step. */
typedef struct kvgen_jobs_desc {
    int prefill_chunk; /* prompt tokens prefilled per worker step; 0: 32. Prompts (or a long
                          prompt's last piece) that fit what is left of it run in the same
                          forward pass as the step's decodes, many sessions' at once */
    int max_batch;     /* decodes batched into one forward pass; 0: 64 */
    int nice;          /* Linux: added to the worker thread's nice value when it starts, so the
                          host thread wins the CPU; 0: 5; < 0: leave it unchanged */
} kvgen_jobs_desc;

KVGEN_API kvgen_status kvgen_jobs_configure(kvgen_model *model, const kvgen_jobs_desc *desc, kvgen_error *err);

/* Counters since load (for tests and benchmarks). */
typedef struct kvgen_jobs_stats {
    int worker_running;      /* the worker thread has been started */
    size_t jobs_active;      /* submitted and not final */
    uint64_t steps;          /* worker steps run */
    uint64_t batches;        /* batched decode passes (one backend forward each) */
    uint64_t batched_tokens; /* decodes that went through them */
    int max_batch_seen;      /* largest batch so far */
    uint64_t prefill_chunks; /* prefill slices run */
    uint64_t prompts_batched; /* of those, the ones that ran in a batch with the decodes */
    uint64_t decode_tokens;  /* tokens generated by jobs */
} kvgen_jobs_stats;

KVGEN_API void kvgen_jobs_get_stats(kvgen_model *model, kvgen_jobs_stats *stats);

/* ---- embeddings: a vector per text ------------------------------------------------------------ */

/* How a text's per-token hidden states become one vector. */
typedef enum kvgen_pooling {
    KVGEN_POOLING_DEFAULT = 0, /* the model's <arch>.pooling_type; where the file has none: mean for an
                                  encoder (bert), last for a decoder (its last token has read the whole text) */
    KVGEN_POOLING_MEAN = 1,    /* the average over every token ([CLS] and [SEP] included, as sentence-transformers) */
    KVGEN_POOLING_CLS = 2,     /* the first token's */
    KVGEN_POOLING_LAST = 3     /* the last token's */
} kvgen_pooling;

typedef struct kvgen_embed_desc {
    kvgen_pooling pooling;
    int no_normalize; /* 0: vectors of length 1 (L2); else as pooled */
    int max_tokens;   /* texts longer are cut to their first max_tokens tokens (an encoder keeps its closing
                         [SEP]); 0 or above the model's: the model's n_ctx_train (kvgen_model_info) */
} kvgen_embed_desc;

/* Embeds n texts in one call: out gets n vectors of kvgen_model_info.n_embd floats, text i's at
 * out + i * n_embd (out_floats must be at least n * n_embd). lens[i] is text i's length in bytes
 * (lens NULL: NUL-terminated); a text may be empty or hold NUL bytes (dropped, as control
 * characters are) and is tokenized as plain text (control-token names are not matched). desc
 * NULL: all defaults. An encoder runs the texts batched, on every backend (every weight read
 * once per batch of texts); a decoder (llama, qwen, ...) runs each text through a session of its
 * own on the reference and cpu backends and returns its final hidden states (after the output norm)
 * pooled. A text that has no token (a decoder without BOS given "") is refused, naming it. The
 * model's tokenizer adds [CLS]/[SEP] or BOS as it asks. Thread-safe as kvgen_tokenize is. */
KVGEN_API kvgen_status kvgen_embed(kvgen_model *model, const char *const *texts, const size_t *lens, size_t n,
                                   const kvgen_embed_desc *desc, float *out, size_t out_floats, kvgen_error *err);

/* ---- memory store: texts with their embedding vectors, searched by cosine ------------------ */

/* An NPC's memories: each a text, optional string fields (key/value pairs) and an embedding
 * vector of the store's dimension (computed by the caller). Vectors are normalized when added,
 * so a search is a dot product over packed rows (the cpu backend's SIMD paths) with a partial
 * top-k selection. Ids start at 1 and are never reused. A store is used by one thread at a
 * time (searches may run on several threads at once while nothing changes it). docs/c-api.md,
 * "Memory store". */
typedef struct kvgen_memory kvgen_memory;

typedef enum kvgen_memory_storage {
    KVGEN_MEMORY_F32 = 0, /* 4 bytes per element */
    KVGEN_MEMORY_F16 = 1  /* IEEE halves: half the memory and bandwidth; scores within ~1e-3 */
} kvgen_memory_storage;

typedef struct kvgen_memory_desc {
    int dim;                      /* vector length, 1 .. 65536 (load: 0 accepts the file's) */
    kvgen_memory_storage storage; /* load: ignored (the file's) */
    uint64_t embedding_id;        /* opaque identity of the embedding model, saved in the file;
                                     load: 0 accepts any, else the file's must be equal */
} kvgen_memory_desc;

typedef struct kvgen_memory_field {
    const char *key, *value; /* NUL-terminated; keys of one memory distinct, non-empty */
} kvgen_memory_field;

typedef struct kvgen_memory_entry {
    uint64_t id;
    const char *text;
    const kvgen_memory_field *fields; /* n_fields, in the order they were added */
    size_t n_fields;
} kvgen_memory_entry;

typedef struct kvgen_memory_hit {
    uint64_t id;
    float score; /* cosine similarity, in [-1, 1] up to rounding */
} kvgen_memory_hit;

typedef struct kvgen_memory_info {
    int dim;
    kvgen_memory_storage storage;
    uint64_t embedding_id;
    size_t count;        /* memories held */
    uint64_t next_id;    /* the id the next add gets */
    size_t vector_bytes; /* bytes of the packed vectors */
    const char *isa;     /* the instruction set searches run ("avx2", "portable", ...) */
} kvgen_memory_info;

KVGEN_API kvgen_status kvgen_memory_create(const kvgen_memory_desc *desc, kvgen_memory **out, kvgen_error *err);
KVGEN_API void kvgen_memory_free(kvgen_memory *mem);
KVGEN_API void kvgen_memory_get_info(const kvgen_memory *mem, kvgen_memory_info *info);
KVGEN_API size_t kvgen_memory_count(const kvgen_memory *mem);
/* Adds a memory: text (may be ""), n_fields fields (NULL when 0), vec of `dim` floats (finite,
 * not all zero; normalized, then stored). *id gets its id. Refused: nothing is added. */
KVGEN_API kvgen_status kvgen_memory_add(kvgen_memory *mem, const char *text, const kvgen_memory_field *fields,
                                        size_t n_fields, const float *vec, size_t dim, uint64_t *id,
                                        kvgen_error *err);
/* KVGEN_E_INVALID_ARGUMENT for an id the store does not hold */
KVGEN_API kvgen_status kvgen_memory_remove(kvgen_memory *mem, uint64_t id, kvgen_error *err);
/* The memory `id`: its strings stay valid until the memory is removed or the store freed.
 * vec (optional, `dim` floats): the stored unit vector (f16 storage: as rounded). */
KVGEN_API kvgen_status kvgen_memory_get(const kvgen_memory *mem, uint64_t id, kvgen_memory_entry *out, float *vec,
                                        size_t dim, kvgen_error *err);
/* The k memories most similar to `query` (dim floats, finite, not all zero) by cosine, best
 * first, ties by lower id; only those whose field where->key equals where->value when `where`
 * is not NULL. out holds k hits; *n_out gets how many were found (at most k, count). */
KVGEN_API kvgen_status kvgen_memory_search(const kvgen_memory *mem, const float *query, size_t dim, size_t k,
                                           const kvgen_memory_field *where, kvgen_memory_hit *out, size_t *n_out,
                                           kvgen_error *err);
/* Atomic save (as kvgen_session_save: a temporary file in the target's folder, synced and
 * renamed over it; a failed save leaves the old file as it was). */
KVGEN_API kvgen_status kvgen_memory_save(const kvgen_memory *mem, const char *path, kvgen_error *err);
/* A store from a file made by kvgen_memory_save. expect (NULL: anything) may require a dim and
 * an embedding identity. Refused by name: not a memory file, a newer version, truncated,
 * corrupted (checksum), another dim, another embedding identity. */
KVGEN_API kvgen_status kvgen_memory_load(const char *path, const kvgen_memory_desc *expect, kvgen_memory **out,
                                         kvgen_error *err);

#ifdef __cplusplus
}
#endif
#endif /* KVGEN_H */
