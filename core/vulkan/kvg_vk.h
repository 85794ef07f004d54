/* kvg_vk.h: the Vulkan backend's device layer (private): instance and device set-up, feature
 * detection, buffers, pipelines and command submission. The backend builds the forward pass on
 * top of it (vk_backend.c and the files it calls, kvg_vk_backend.h); vk_bench.c measures the
 * device's own ceiling with it. */
#ifndef KVG_VK_H
#define KVG_VK_H
#include "kvg_platform.h"
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "kvg_host.h"
#include "kvg_vk_loader.h"
#include "kvgen.h"

/* Specialization-constant ids shared by all kernels (see the shaders in shaders/). */
enum { KVG_SPEC_WG, KVG_SPEC_NCOLS, KVG_SPEC_ROWS, KVG_SPEC_MODE, KVG_SPEC_NORM, KVG_SPEC_KV_F16, KVG_SPEC_DIRECT,
       KVG_SPEC_LANE, KVG_SPEC_GQ, KVG_SPEC_HD, KVG_SPEC_UBO, KVG_SPEC_PAGE, KVG_SPEC_PPS, KVG_SPEC_NSLAB,
       KVG_SPEC_KV_BLOCK, KVG_SPEC_TQ, KVG_SPEC_COUNT };

/* The one descriptor-set layout: bindings 0-7 storage buffers, then two uniform buffers that
 * the lane mat-vec reads its inputs through (lavapipe turns a uniform-buffer load at a
 * workgroup-uniform address into one scalar load, a storage-buffer load into a loop over lanes):
 * 8 a dynamic-offset window of the input activations, 9 the RMSNorm weight; then 10, a storage
 * buffer holding a session's KV page table, and 11, one holding the per-token LoRA delta a
 * mat-mul's epilogue adds (shaders/epilogue.glsl, EPI_F_LORA). Binding 5 is an array of KVG_VK_KV_SLABS storage
 * buffers: the paged KV pool's slabs (the pool split over several buffers, each within
 * maxStorageBufferRange; shaders/kv.glsl). Binding 6 is unused (always the dummy buffer).
 * A kvg_vk_binding array has KVG_VK_BINDINGS slots: slot i < 12 is binding i (element 0 for
 * binding 5), slots 12.. are binding 5's elements 1..KVG_VK_KV_SLABS-1. */
#define KVG_VK_KV_SLABS 8
#define KVG_VK_LAYOUT_BINDINGS 12
#define KVG_VK_BINDINGS (KVG_VK_LAYOUT_BINDINGS + KVG_VK_KV_SLABS - 1)
#define KVG_VK_SSBO_BINDINGS 8
#define KVG_VK_UBO_X 8
#define KVG_VK_UBO_NORM 9
#define KVG_VK_PTAB 10
#define KVG_VK_LORA 11
#define KVG_VK_SLAB_SLOT(j) ((j) == 0 ? 5 : KVG_VK_LAYOUT_BINDINGS + (j) - 1)
/* storage-buffer descriptors per set */
#define KVG_VK_SSBO_DESCRIPTORS (KVG_VK_SSBO_BINDINGS + KVG_VK_KV_SLABS - 1 + 2)
#define KVG_VK_PUSH_BYTES 128 /* push-constant range every kernel shares */

typedef struct kvg_vk_buffer {
    VkBuffer buf;
    VkDeviceMemory mem;
    VkDeviceSize size;
    void *map; /* non-NULL when host-visible (kept mapped) */
} kvg_vk_buffer;

typedef struct kvg_vk_pipeline {
    char name[32];
    uint32_t spec[KVG_SPEC_COUNT];
    VkPipeline pipe;
} kvg_vk_pipeline;

/* kvgen's VkPipelineCache, persisted to a file (vk_pcache.c; file layout and checks there).
 * Tests read these fields to see what a load found and whether it wrote the file. */
enum {
    KVG_VK_PCACHE_OFF,     /* no path: pipelines are created without a cache */
    KVG_VK_PCACHE_ABSENT,  /* no file yet: started empty */
    KVG_VK_PCACHE_LOADED,  /* the file's data was handed to vkCreatePipelineCache */
    KVG_VK_PCACHE_IGNORED  /* a file that failed the checks (`why`): started empty */
};
#define KVG_VK_PCACHE_MAX ((size_t)64 << 20) /* larger files are not read (nor written) */
typedef struct kvg_vk_pcache {
    VkPipelineCache cache; /* VK_NULL_HANDLE: off */
    char *path;            /* the file, "{device}" expanded; NULL: off */
    int state;             /* KVG_VK_PCACHE_* at load */
    char why[96];          /* IGNORED: the check that failed */
    size_t loaded_bytes;   /* driver data handed to vkCreatePipelineCache (0: started empty) */
    size_t file_bytes;     /* the driver data the file holds (read or last written), and its hash */
    uint64_t file_hash;
    int created;           /* pipelines created since the file was last read or written */
    int writes;            /* times this context wrote the file */
} kvg_vk_pcache;

typedef struct kvg_vk_ctx {
    VkInstance instance;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t queue_family;
    bool own_instance, own_device; /* false when the host handed them in */
    /* VK_EXT_subgroup_size_control enabled on a device of kvgen's own (its subgroup sizes for
     * compute shaders, sg_min..sg_max): the one-subgroup mat-vec pipelines then require their
     * workgroup to be one full subgroup of that size */
    bool sg_size_control;
    uint32_t sg_min, sg_max;
    /* shaderIntegerDotProduct enabled on a device of kvgen's own (VK_KHR_shader_integer_dot_product
     * or Vulkan 1.3): the matvec_dot_<type> and gemm_dot_<type> pipelines may be made;
     * int_dot_fast: the device reports 4x8-bit packed signed dot products as accelerated */
    bool int_dot, int_dot_fast;
    /* VK_KHR_cooperative_matrix enabled on a device of kvgen's own, with products of f16
     * matrices into f32 at subgroup scope (M, N, K of 8 or 16), shaderFloat16, the Vulkan memory model and
     * subgroup size control (gemm_cm_<type>, whose workgroup is four full subgroups); only where
     * the build compiled those variants (a glslang that knows GL_KHR_cooperative_matrix) */
    bool coopmat;
    uint32_t cm_m, cm_n, cm_k; /* the matrices' shape gemm_cm_<type> takes: M x K times K x N */
    VkDebugUtilsMessengerEXT messenger;
    atomic_int validation_messages; /* warnings and errors the validation layer reported */
    atomic_int split_dispatches;    /* dispatches recorded as several pieces (maxComputeWorkGroupCount) */

    kvgen_device_info info;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceMemoryProperties mem_props;
    bool force_staging; /* KVGEN_VK_STAGING=1: upload through a staging buffer even on UMA */
    bool kv_f16;        /* false when forced to f32 (option or KVGEN_FORCE_F32=1) */

    VkDescriptorSetLayout set_layout;
    VkPipelineLayout pipe_layout;
    VkCommandPool cmd_pool; /* used under `lock` only */
    VkFence fence;          /* for one-off submissions (uploads) */
    kvg_vk_buffer dummy;    /* bound to unused bindings (ubo_window bytes) */
    uint32_t ubo_window;    /* bytes bound at the uniform-buffer bindings: min(64 KiB, maxUniformBufferRange) */
    size_t max_part;        /* bytes one buffer binding covers (kvg_vk_max_part_bytes), fixed at creation */
    kvg_vk_pipeline *pipes;
    int n_pipes, cap_pipes;
    kvg_vk_pcache pcache; /* every pipeline is created through pcache.cache */
    /* called after each pipeline kvg_vk_pipeline_get creates, with the count so far (the load's
     * progress while a model builds its pipelines); an error it returns is pipeline_get's */
    kvgen_status (*on_pipeline)(void *user, int n_pipes, kvgen_error *err);
    void *on_pipeline_user;
    kvg_mutex lock; /* the queue and the command pool are used by one thread at a time: kvg_vk_lock */
} kvg_vk_ctx;

typedef struct kvg_vk_ctx_desc {
    const char *device; /* index or name substring; NULL: KVGEN_DEVICE env, else the best device */
    int force_f32;
    void *vk_instance, *vk_physical_device, *vk_device, *vk_queue; /* host-owned, all or none */
    uint32_t vk_queue_family;
    kvgen_vk_get_instance_proc_addr vk_get_instance_proc_addr; /* NULL: kvgen's own loader */
    const char *pipeline_cache_path; /* NULL: no pipeline cache (kvgen_model_desc) */
} kvg_vk_ctx_desc;

kvgen_status kvg_vk_ctx_create(const kvg_vk_ctx_desc *desc, kvg_vk_ctx **out, kvgen_error *err);
void kvg_vk_ctx_destroy(kvg_vk_ctx *ctx);

/* The pipeline cache (vk_pcache.c). open: reads and checks the file (an unusable one is
 * ignored, never an error) and creates ctx->pcache.cache; save: writes the driver's data back
 * when pipelines were created since the last read or write and it differs from the file's (temp
 * file + fsync + rename; failures only go to the logger); close: save, then destroy. */
void kvg_vk_pcache_open(kvg_vk_ctx *ctx, const char *path);
void kvg_vk_pcache_save(kvg_vk_ctx *ctx);
void kvg_vk_pcache_close(kvg_vk_ctx *ctx);

/* Checks a VkResult: on failure writes "<what>: <VkResult name>" and returns KVGEN_E_DEVICE. */
kvgen_status kvg_vk_check(VkResult r, kvgen_error *err, const char *what);
const char *kvg_vk_result_name(VkResult r);

enum { KVG_VK_MEM_DEVICE = 0, KVG_VK_MEM_HOST = 1, KVG_VK_MEM_UPLOAD = 2 };
/* DEVICE: device-local (zero-filled); HOST: host-visible (mapped, zero-filled; for readback
 * and per-step parameters); UPLOAD: device-local and, where possible, host-visible too so the
 * weights can be written in place. */
kvgen_status kvg_vk_buffer_create(kvg_vk_ctx *ctx, VkDeviceSize size, int kind, kvg_vk_buffer *out, kvgen_error *err);
void kvg_vk_buffer_destroy(kvg_vk_ctx *ctx, kvg_vk_buffer *b);
/* A buffer the host rewrites before each submission and shaders read throughout it (a step's
 * parameters, a session's page table). Where device-local memory is host-visible (UMA, ReBAR,
 * CPU devices) it is one mapped buffer of that memory; elsewhere the host writes a mapped host
 * buffer and each command buffer copies it to a device-local one before its first dispatch
 * (kvg_vk_cmd_mirror), so the kernels never read host memory across the bus. KVGEN_VK_STAGING=1
 * takes the second form everywhere. `host.map` is always the host's view. */
typedef struct kvg_vk_mirror {
    kvg_vk_buffer host; /* mapped */
    kvg_vk_buffer dev;  /* the device's copy; no buffer when host is device-local */
} kvg_vk_mirror;
kvgen_status kvg_vk_mirror_create(kvg_vk_ctx *ctx, VkDeviceSize size, kvg_vk_mirror *out, kvgen_error *err);
void kvg_vk_mirror_destroy(kvg_vk_ctx *ctx, kvg_vk_mirror *m);
/* the buffer shaders bind */
static inline const kvg_vk_buffer *kvg_vk_mirror_bound(const kvg_vk_mirror *m) { return m->dev.buf ? &m->dev : &m->host; }
/* records the copy host -> dev between barriers (earlier reads of dev before it, the copy
 * before later compute reads); nothing for a single buffer */
void kvg_vk_cmd_mirror(VkCommandBuffer cb, const kvg_vk_mirror *m);
/* Host -> buffer (mapped write, or a staging copy); caller holds no lock. */
kvgen_status kvg_vk_upload(kvg_vk_ctx *ctx, kvg_vk_buffer *b, VkDeviceSize offset, const void *data, size_t size,
                           kvgen_error *err);
/* Buffer -> host through a staging copy when not mapped. */
kvgen_status kvg_vk_download(kvg_vk_ctx *ctx, const kvg_vk_buffer *b, VkDeviceSize offset, void *data, size_t size,
                             kvgen_error *err);

/* A compute pipeline for an embedded shader and specialization constants; created once and
 * cached (never on the per-token path: callers create everything they need at load). */
kvgen_status kvg_vk_pipeline_get(kvg_vk_ctx *ctx, const char *shader, const uint32_t spec[KVG_SPEC_COUNT],
                                 VkPipeline *out, kvgen_error *err);
/* Whether the pipeline of shader and spec requires one full subgroup per workgroup: a
 * one-subgroup mat-vec (matvec_sg_* or matvec_dot_*, its workgroup the device's subgroup size)
 * on a device with subgroup size control enabled (kvg_vk_ctx.sg_size_control) */
bool kvg_vk_one_subgroup(const kvg_vk_ctx *ctx, const char *shader, const uint32_t spec[KVG_SPEC_COUNT]);
/* Pipelines are checked against the device's compute limits (ctx->props.limits, lowered by
 * KVGEN_VK_MAX_SHARED and KVGEN_VK_MAX_INVOCATIONS; docs/vulkan.md) before they are created.
 * shader_limits: the workgroup invocations and shared-memory bytes a shader needs with these
 * specialization constants (a table in vk_device.c; an unknown shader is an error). shader_fits:
 * KVGEN_OK, or KVGEN_E_UNSUPPORTED naming the shader, what it needs and the limit (err may be
 * NULL). fit_wg: halves spec[KVG_SPEC_WG] until the shader fits, not below min_wg; false when
 * it never does (for shaders whose workgroup size is free: argmax, topk). */
kvgen_status kvg_vk_shader_limits(const char *shader, const uint32_t spec[KVG_SPEC_COUNT], uint32_t *invocations,
                                  uint64_t *shared, kvgen_error *err);
kvgen_status kvg_vk_shader_fits(const kvg_vk_ctx *ctx, const char *shader, const uint32_t spec[KVG_SPEC_COUNT],
                                kvgen_error *err);
bool kvg_vk_fit_wg(const kvg_vk_ctx *ctx, const char *shader, uint32_t spec[KVG_SPEC_COUNT], uint32_t min_wg);
/* Finds an already created pipeline; VK_NULL_HANDLE when absent. */
VkPipeline kvg_vk_pipeline_find(const kvg_vk_ctx *ctx, const char *shader, const uint32_t spec[KVG_SPEC_COUNT]);

typedef struct kvg_vk_binding {
    const kvg_vk_buffer *buf; /* NULL: the dummy buffer */
    VkDeviceSize offset, range; /* range 0: to the end of the buffer */
} kvg_vk_binding;

kvgen_status kvg_vk_pool_create(kvg_vk_ctx *ctx, uint32_t max_sets, VkDescriptorPool *out, kvgen_error *err);
kvgen_status kvg_vk_set_create(kvg_vk_ctx *ctx, VkDescriptorPool pool, const kvg_vk_binding b[KVG_VK_BINDINGS],
                               VkDescriptorSet *out, kvgen_error *err);

kvgen_status kvg_vk_cmd_alloc(kvg_vk_ctx *ctx, VkCommandBuffer *out, kvgen_error *err);
/* one_time: recorded for one submission; else recorded once and replayed */
kvgen_status kvg_vk_cmd_begin(VkCommandBuffer cb, bool one_time, kvgen_error *err);
kvgen_status kvg_vk_cmd_end(VkCommandBuffer cb, kvgen_error *err);
/* Every dispatch goes through these: a grid larger than maxComputeWorkGroupCount (lowered by
 * KVGEN_VK_MAX_GROUP_COUNT) in any dimension is recorded as several vkCmdDispatchBase pieces
 * with barriers between them; shaders see the same gl_WorkGroupID either way. */
void kvg_vk_cmd_dispatch(kvg_vk_ctx *ctx, VkCommandBuffer cb, VkPipeline pipe, VkDescriptorSet set, const void *pc,
                         uint32_t pc_size, uint32_t gx, uint32_t gy, uint32_t gz);
/* the same with the dynamic offset (bytes, a multiple of minUniformBufferOffsetAlignment) of
 * the input window at binding KVG_VK_UBO_X */
void kvg_vk_cmd_dispatch_at(kvg_vk_ctx *ctx, VkCommandBuffer cb, VkPipeline pipe, VkDescriptorSet set, const void *pc,
                            uint32_t pc_size, uint32_t ubo_offset, uint32_t gx, uint32_t gy, uint32_t gz);
/* compute writes -> compute reads/writes */
void kvg_vk_cmd_barrier(VkCommandBuffer cb);
/* compute or transfer writes -> transfer reads/writes (before a copy or fill of a buffer the
 * device may have written) */
void kvg_vk_cmd_transfer_barrier(VkCommandBuffer cb);
/* compute writes -> host reads (end of a step whose results are read back) */
void kvg_vk_cmd_host_barrier(VkCommandBuffer cb);
/* Submits an ended command buffer and waits (caller holds ctx->lock). */
kvgen_status kvg_vk_submit_wait(kvg_vk_ctx *ctx, VkCommandBuffer cb, VkFence fence, kvgen_error *err);
/* One-off work: under ctx->lock, a fresh command buffer that record(cb, arg) fills, ended by a
 * host barrier, submitted and waited for, then freed. record's error stops it (nothing is
 * submitted) and is returned. */
kvgen_status kvg_vk_run_once(kvg_vk_ctx *ctx, kvgen_status (*record)(VkCommandBuffer cb, void *arg), void *arg,
                             kvgen_error *err);
/* Copies size bytes at offset of src to the same offset of dst on the device and waits: a
 * read-back of device-local memory through a host buffer. */
kvgen_status kvg_vk_copy(kvg_vk_ctx *ctx, const kvg_vk_buffer *src, const kvg_vk_buffer *dst, VkDeviceSize offset,
                         VkDeviceSize size, kvgen_error *err);
/* The context's lock (its queue, command pool and the model's scratch), re-entrant within a
 * thread: work that holds it (a step) may call what takes it for itself (a buffer's zero fill,
 * a staged upload or read-back, which every device-local buffer on a discrete GPU needs). */
void kvg_vk_lock(kvg_vk_ctx *ctx);
void kvg_vk_unlock(kvg_vk_ctx *ctx);

/* Validation messages counted so far (KVGEN_VALIDATE=1); for tests. */
int kvg_vk_validation_count(const kvg_vk_ctx *ctx);

/* The Vulkan context of a model loaded on the Vulkan backend; NULL otherwise. */
struct kvgen_model;
kvg_vk_ctx *kvg_vk_model_ctx(const struct kvgen_model *m);

/* ---- the weight types the shaders run (vk_weights.c: one table row per type) ----
 * At upload a matrix part is laid out as a quant region (every row's blocks, qwords words each)
 * then a scale region at word scale_off (every row's blocks, scale_halves 16-bit values each,
 * packed over the whole part), both row-major. A repacked block holds exactly the GGUF block's
 * bytes: its header (scales, mins, Q5_0/Q5_1's high bits) in the scale region in GGUF order, the
 * rest in the quant region, regrouped per 32-element sub-block where GGUF interleaves them (the
 * K types; shaders/weights.glsl). Types with 256-element super-blocks declare block_elems 256
 * (the shaders' GROUP of 8 sub-blocks). Adding a type: its row in vk_weights.c, its entry in
 * KVGEN_WEIGHT_TYPES (shaders/CMakeLists.txt) and its WTYPE_ branch in shaders/weights.glsl
 * (test_vk_types checks that the three and quant.c's traits table agree, and that each row's
 * repack is a bijection of the block's bits). */
typedef struct kvg_vk_wtype {
    uint32_t type;         /* ggml type number (kvg_quant.h) */
    const char *suffix;    /* shader names: embed_<suffix>, matvec_<suffix>, gemm_<suffix> */
    const char *define;    /* the -D those shaders are compiled with */
    uint32_t block_elems;  /* elements per repacked block (a row is a whole number of them) */
    uint32_t qwords;       /* 32-bit words per block in the quant region */
    uint32_t scale_halves; /* 16-bit values per block in the scale region (0: none) */
    bool pad;              /* rows may end in a partial block, zero-padded (float types) */
    /* one GGUF row of K elements: its blocks' quant words to q, their scales to `scales`
     * (scale_halves * 2 bytes per block, unaligned) */
    void (*repack)(const struct kvg_vk_wtype *t, const uint8_t *src, uint32_t K, uint32_t *q, uint8_t *scales);
} kvg_vk_wtype;

/* NULL: the Vulkan backend does not run this type */
const kvg_vk_wtype *kvg_vk_wtype_of(uint32_t type);
size_t kvg_vk_wtype_count(void);
const kvg_vk_wtype *kvg_vk_wtype_at(size_t i); /* table order; NULL past the end */

/* ---- test hooks (vk_hooks.c): run one kernel through the backend's own code paths ---- */

/* Which kernels a hook runs, as a model picks them by device (docs/vulkan.md) */
typedef enum kvg_vk_layout {
    KVG_VK_LAYOUT_DEVICE = -1, /* the device's own choice, as a model's load makes it: the lane
                                * kernels on CPU devices, subgroup reductions where it has
                                * subgroup arithmetic */
    KVG_VK_LAYOUT_COOP = 0,    /* cooperative workgroups, shared-memory reductions: the mat-vec
                                * (decode) or the tiled GEMM (prefill), attn.comp */
    KVG_VK_LAYOUT_LANE = 1,    /* the CPU devices' kernels: the lane mat-vec (also over 8-token
                                * groups for prefill), attn_lane.comp (head_dim a multiple of 8) */
    KVG_VK_LAYOUT_SUBGROUP = 2, /* the cooperative kernels with subgroup reductions (matvec_sg,
                                 * attn_sg) in 64-invocation workgroups; KVGEN_E_UNSUPPORTED without
                                 * subgroup arithmetic */
    KVG_VK_LAYOUT_SUBGROUP_ONE = 3, /* the same with one subgroup per mat-vec workgroup (the
                                     * device's subgroup size), as a GPU's load picks it */
    KVG_VK_LAYOUT_DOT = 4, /* SUBGROUP_ONE with an integer type's decode mat-vec and prefill
                            * GEMM by integer dot products (matvec_dot_<type>, gemm_dot_<type>:
                            * 8-bit activations), as a load with activation_bits = 8 picks them on
                            * a device that has them */
    KVG_VK_LAYOUT_HALF = 5, /* COOP with the prefill GEMM's tiles as f16 in double-buffered shared
                             * memory (gemm_h_<type>), as a GPU's load picks it */
    KVG_VK_LAYOUT_MATRIX = 6 /* SUBGROUP_ONE with the prefill GEMM on cooperative matrices
                              * (gemm_cm_<type>), as a GPU's load picks it where the device offers
                              * them; KVGEN_E_UNSUPPORTED elsewhere */
} kvg_vk_layout;
/* "device", "coop", "lane", "subgroup", "subgroup1", "dot", "half" or "matrix" (tests' messages) */
const char *kvg_vk_layout_name(kvg_vk_layout layout);

/* y[t][r] = epilogue(W x_t) for ncols tokens: W is `rows` rows of K elements in GGUF layout of
 * `type`; norm (K floats) or NULL for RMSNorm(x_t) * norm first; epi 0 store, 1 add (y holds the
 * values to add to), 3 swiglu (rows interleave gate/up; y has rows/2 per token). ncols <= 8
 * runs the decode mat-vec, larger the prefill GEMM (COOP) or the lane mat-vec over 8-token
 * groups (LANE); layout picks the kernels. */
kvgen_status kvg_vk_test_matmul(kvg_vk_ctx *ctx, uint32_t type, const void *w, uint32_t rows, uint32_t K,
                                const float *x, uint32_t ncols, const float *norm, float eps, int epi,
                                kvg_vk_layout layout, float *y, kvgen_error *err);

/* out[i] (K floats) = scale * row tokens[i] of W (rows x K in GGUF layout of `type`) through
 * embed_<type>, the matrix uploaded and split into parts as the backend does. */
kvgen_status kvg_vk_test_embed(kvg_vk_ctx *ctx, uint32_t type, const void *w, uint32_t rows, uint32_t K,
                               const int32_t *tokens, uint32_t n, float scale, float *out, kvgen_error *err);

/* The parts a model on the Vulkan backend uploaded one matrix as: `which` is "token_embd",
 * "output" or, for layer `layer`, "attn_qkv" (Q, K, V rows concatenated), "attn_output",
 * "ffn_gate_up" (gate and up rows interleaved) or "ffn_down". Fills up to max entries of out
 * (each part's weight type as uploaded, its rows, its buffer's bytes) and returns the part
 * count; -1 when m is not on the Vulkan backend or names no such matrix. */
typedef struct kvg_vk_part_info {
    uint32_t type, row0, rows;
    uint64_t bytes;
} kvg_vk_part_info;
int kvg_vk_model_parts(const struct kvgen_model *m, int layer, const char *which, kvg_vk_part_info *out, int max);

/* Attention of ncols queries at positions pos0.. over a cache holding positions [0, pos0+ncols)
 * of k and v ((n_kv, n_ctx, hd) floats); q and out are (ncols, n_head*hd). The cache is a
 * one-layer paged pool in one slab, pages of page_size (1..256) positions, written through the
 * pool's page writes (kv_type KVG_TYPE_Q8_0 or KVG_TYPE_Q4_0: blocks, 0: f16/f32 as the
 * context's KV) over slots filled
 * with NaN (q8_0: NaN scales): the session's
 * table names its pages in order, or (shuffle) in a fixed pseudo-random order drawn from a pool
 * half as large again. nsplit > 1 (decode, ncols 1) uses the split + reduce kernels. layout:
 * attn.comp (COOP), attn_lane.comp (LANE, where hd is a multiple of 8; else attn.comp) or
 * attn_sg (SUBGROUP). */
kvgen_status kvg_vk_test_attention(kvg_vk_ctx *ctx, int n_head, int n_kv, int hd, int n_ctx, int pos0, int ncols,
                                   int nsplit, kvg_vk_layout layout, int page_size, bool shuffle, uint32_t kv_type,
                                   const float *q, const float *k, const float *v, float *out, kvgen_error *err);
/* The same as a layer with a sliding window (window > 0: a query at pos sees [pos - window + 1,
 * pos] only) and soft-capped scores (softcap > 0: softcap * tanh(score / softcap)). */
kvgen_status kvg_vk_test_attention_layer(kvg_vk_ctx *ctx, int n_head, int n_kv, int hd, int n_ctx, int pos0,
                                         int ncols, int nsplit, kvg_vk_layout layout, int page_size, bool shuffle,
                                         uint32_t kv_type, int window, float softcap, const float *q, const float *k,
                                         const float *v, float *out, kvgen_error *err);

#endif
