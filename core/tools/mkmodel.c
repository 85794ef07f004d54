/* kvgen-mkmodel: writes a seeded random-weight llama GGUF of any shape and supported type.
 *
 *   kvgen-mkmodel -o OUT.gguf [--seed S] [--layers N] [--embd N] [--ff N] [--heads N] [--kv-heads N]
 *                 [--ctx N] [--rope-base F] [--type T | --mix q4_k_m] [--embd-type T] [--untied]
 *                 [--vocab VOCAB.gguf] [--vocab-size N] [--head-dim N] [--arch NAME] [--qkv-bias]
 *                 [--qk-norm] [--post-norms] [--rope-freqs] [--swa N] [--softcap ATTN,FINAL]
 *                 [--rope-dim N] [--orig-ctx N] [--rope-factors]
 *                 [--lora [--lora-rank N] [--lora-alpha F] [--lora-targets LIST] [--lora-type T]]
 *
 * --lora writes, instead of a model, a random LoRA adapter in llama.cpp's GGUF adapter format
 * for the model the other flags describe (the same flags make the model and an adapter that
 * fits it): general.type "adapter", adapter.type "lora", adapter.lora.alpha (--lora-alpha,
 * default the rank, so the product is applied at scale 1), and for each target matrix W of
 * every layer (--lora-targets, a comma list of q,k,v,o,gate,up,down; default all of them)
 * "<W>.lora_a" (ne0 = W's input width, ne1 = --lora-rank, default 8) and "<W>.lora_b" (ne0 = the
 * rank, ne1 = W's output width), of type --lora-type (F32, F16, BF16 or Q8_0; default F32;
 * Q8_0 rows are blocks of 32, so it needs a rank that is a multiple of 32). A row with fused
 * matrices (phi3) gets pairs for them as stored: attn_qkv when any of q, k, v is a target,
 * ffn_up (gate and up rows) when gate or up is. An encoder (bert) is refused. A is drawn with
 * std 1/sqrt(input width) and B with std 0.15/sqrt(rank), so the adapter moves each product by
 * about a quarter of its size: visible in the logits, never overwhelming.
 * The adapter's draws come from their own stream (--seed S gives another adapter).
 *
 * --head-dim sets attention.key_length/value_length (Q is heads x head-dim wide, which may
 * differ from --embd); --arch labels the file NAME and writes its metadata under "NAME."
 * (the tensors stay llama's); --qkv-bias adds F32 attn_q/k/v.bias tensors (qwen2), --qk-norm
 * attn_q_norm/attn_k_norm (qwen3, gemma3), --post-norms post_attention_norm/post_ffw_norm
 * (gemma2/3), --rope-freqs a llama 3 style rope_freqs tensor; --swa N writes
 * attention.sliding_window and --softcap A,F the attention/final logit soft-capping (gemma2).
 * --rope-dim N writes rope.dimension_count (partial rotary; default the head size).
 *
 * --arch bert writes an encoder as llama.cpp's converter writes BERT: token, position (--ctx of
 * them) and token-type embeddings with their LayerNorm, post-LayerNorm blocks with biases and an
 * ungated feed-forward, bert.attention.layer_norm_epsilon, bert.attention.causal = false and
 * bert.pooling_type (--pooling mean|cls|last|none, default mean; none leaves the key out), and a
 * synthetic uncased WordPiece vocabulary (tokenizer.ggml.model = bert) in the converter's spelling.
 *
 * A row of the architecture table that stores matrices fused (kvg_arch.h: phi3's attn_qkv with
 * the rows of Q, K, V and ffn_up with the rows of gate then up) gets them fused, and a row with
 * LongRoPE factors (phi3) gets its metadata as llama.cpp's converter writes it:
 * rope.scaling.original_context_length (--orig-ctx, default --ctx), attention.sliding_window
 * (--swa, default 0) and no vocab_size; --rope-factors adds rope_factors_long.weight and
 * rope_factors_short.weight (n_rot/2 each) and rope.scaling.attn_factor, sqrt(1 + ln(ctx/orig) /
 * ln(orig)) as the converter computes it for LongRoPE (1 when --ctx is not above --orig-ctx).
 * The extra tensors come after all others, so the rest of a file is the same with or without
 * them. Tests use these to build files of every architecture, or llama files carrying tensors
 * llama does not use.
 *
 * T is any type of quant.c's traits table that can be quantized to (--help lists them); --type T
 * writes every 2-D matrix as T (the embeddings, and output.weight with --untied, as --embd-type,
 * which defaults to T). Norms and biases are always F32. --mix q4_k_m writes llama.cpp's Q4_K_M
 * mix instead: Q6_K for the output matrix (output.weight, or token_embd.weight when the
 * embeddings are tied and serve as the output too) and for attn_v and ffn_down of the layers
 * that get more bits, Q4_K for every other matrix (token_embd.weight with --untied included);
 * --embd-type still sets the embeddings' and output's type. Layer l of n gets more bits when
 * l < n/8, l >= 7n/8 or (l - n/8) % 3 == 2 (integer division): the first and last eighth of the
 * layers and every third one in between. A tensor whose rows are not a whole number of its
 * type's blocks (256 elements for the K types) is refused, naming the tensor and its width.
 * The weights are meaningless but well-scaled (normal-ish, std 0.02 to 0.08; norm weights near 1),
 * so a forward pass gives finite, non-degenerate logits: tests and benchmarks of every shape use these. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvg_arch.h"
#include "kvg_gguf.h"
#include "kvg_quant.h"

typedef struct options {
    const char *out, *vocab_path, *arch;
    uint64_t seed;
    int layers, embd, ff, heads, kv_heads, ctx, vocab_size;
    float rope_base;
    uint32_t type, embd_type;
    int untied, head_dim, qkv_bias, qk_norm, post_norms, rope_freqs;
    int swa;                 /* <arch>.attention.sliding_window (0: none) */
    int rope_dim, orig_ctx, rope_factors;
    const kvg_arch *row;     /* the table's row for --arch, NULL for a name it lacks */
    float softcap_attn, softcap_final;
    int mix, embd_type_set; /* mix: MIX_NONE or MIX_Q4_K_M */
    int pooling;            /* an encoder's <arch>.pooling_type; -1: the key left out */
    int lora, lora_rank;    /* --lora: write an adapter; its rank */
    float lora_alpha;       /* < 0: the rank */
    unsigned lora_targets;  /* bit i: lora_target_names[i] */
    uint32_t lora_type;
} options;

/* the matrices --lora-targets names, and their tensors' name parts */
static const char *const lora_target_names[] = {"q", "k", "v", "o", "gate", "up", "down"};
#define LORA_TARGETS 7

enum { MIX_NONE, MIX_Q4_K_M };

typedef struct rng {
    uint64_t state;
} rng;

static uint64_t rng_next(rng *r) { /* splitmix64 */
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(rng *r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); }

/* Irwin-Hall: the sum of four uniforms, rescaled to unit variance; plain arithmetic, so a seed
 * gives the same bits on every machine (no libm transcendental functions involved) */
static float rng_normal(rng *r) {
    float s = rng_uniform(r) + rng_uniform(r) + rng_uniform(r) + rng_uniform(r);
    return (s - 2.0f) * 1.7320508f;
}

/* the types kvgen-mkmodel can write: those of quant.c's traits table that have from_float */
static size_t writable_types(uint32_t *out, size_t max) {
    uint32_t all[64];
    size_t n = kvg_traits_types(all, 64), k = 0;
    for (size_t i = 0; i < n && i < 64; i++) {
        const kvg_type_traits *t = kvg_type_traits_of(all[i]);
        if (t && t->from_float && k < max) out[k++] = all[i];
    }
    return k;
}

static void writable_list(char *buf, size_t size, const char *sep) {
    uint32_t types[64];
    size_t n = writable_types(types, 64), len = 0;
    if (size) buf[0] = 0;
    for (size_t i = 0; i < n; i++) {
        int w = snprintf(len < size ? buf + len : NULL, len < size ? size - len : 0, "%s%s", i ? sep : "",
                         kvg_type_name(types[i]));
        if (w > 0) len += (size_t)w;
    }
}

static void usage(void) {
    char types[512];
    writable_list(types, sizeof types, "|");
    fprintf(stderr,
            "usage: kvgen-mkmodel -o OUT.gguf [--seed S] [--layers N] [--embd N] [--ff N] [--heads N]\n"
            "                     [--kv-heads N] [--ctx N] [--rope-base F] [--type %s]\n"
            "                     [--mix q4_k_m] [--embd-type T] [--untied] [--vocab VOCAB.gguf] [--vocab-size N]\n"
            "                     [--head-dim N] [--arch NAME] [--qkv-bias] [--qk-norm] [--post-norms] [--pooling P]\n"
            "                     [--rope-freqs] [--swa N] [--softcap ATTN,FINAL] [--rope-dim N]\n"
            "                     [--orig-ctx N] [--rope-factors]\n"
            "                     [--lora [--lora-rank N] [--lora-alpha F] [--lora-targets q,k,v,o,gate,up,down]\n"
            "                      [--lora-type F32|F16|BF16|Q8_0]]\n"
            "  --type T       every 2-D matrix as T (default F32; norms and biases stay F32)\n"
            "  --mix q4_k_m   llama.cpp's Q4_K_M mix instead of --type: Q6_K for the output matrix (output.weight,\n"
            "                 or the tied token_embd.weight) and for attn_v and ffn_down of layer l of n when\n"
            "                 l < n/8, l >= 7n/8 or (l - n/8) %% 3 == 2; Q4_K for every other matrix\n"
            "  --embd-type T  token_embd.weight (and output.weight) as T (default: as --type or the mix)\n"
            "  --lora         a random LoRA adapter (llama.cpp's GGUF format) for the model the other flags\n"
            "                 describe, instead of the model: rank --lora-rank (8), alpha --lora-alpha (the rank),\n"
            "                 the matrices of --lora-targets (all seven), of type --lora-type (F32)\n"
            "K types need rows (--embd, --ff, heads x head size) that are multiples of 256.\n",
            types);
}

static int parse_type(const char *opt, const char *s, uint32_t *out) {
    uint32_t types[64];
    size_t n = writable_types(types, 64);
    for (size_t i = 0; i < n; i++)
        if (strcmp(s, kvg_type_name(types[i])) == 0) {
            *out = types[i];
            return 0;
        }
    char list[512];
    writable_list(list, sizeof list, ", ");
    fprintf(stderr, "kvgen-mkmodel: %s %s is not a type kvgen-mkmodel can write (valid: %s)\n", opt, s, list);
    return -1;
}

static int parse_int(const char *opt, const char *s, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v <= 0 || v > (1 << 20)) {
        fprintf(stderr, "kvgen-mkmodel: %s needs a positive integer, got '%s'\n", opt, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* "q,k,v,o,gate,up,down" (any of them, in any order) as bits of lora_target_names */
static int parse_lora_targets(const char *s, unsigned *out) {
    unsigned bits = 0;
    const char *p = s;
    while (*p) {
        size_t n = strcspn(p, ",");
        int found = -1;
        for (int i = 0; i < LORA_TARGETS; i++)
            if (strlen(lora_target_names[i]) == n && strncmp(p, lora_target_names[i], n) == 0) found = i;
        if (found < 0) {
            fprintf(stderr, "kvgen-mkmodel: --lora-targets %s: '%.*s' is not one of q,k,v,o,gate,up,down\n", s, (int)n,
                    p);
            return -1;
        }
        bits |= 1u << found;
        p += n;
        if (*p == ',') p++;
    }
    if (!bits) {
        fprintf(stderr, "kvgen-mkmodel: --lora-targets needs at least one of q,k,v,o,gate,up,down\n");
        return -1;
    }
    *out = bits;
    return 0;
}

static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->layers = 2;
    o->embd = 64;
    o->ff = 128;
    o->heads = 4;
    o->ctx = 512;
    o->rope_base = 10000.0f;
    o->type = KVG_TYPE_F32;
    o->pooling = 1;
    o->lora_rank = 8;
    o->lora_alpha = -1.0f;
    o->lora_targets = (1u << LORA_TARGETS) - 1;
    o->lora_type = KVG_TYPE_F32;
    int type_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--untied") == 0) {
            o->untied = 1;
            continue;
        }
        if (strcmp(a, "--qkv-bias") == 0) {
            o->qkv_bias = 1;
            continue;
        }
        if (strcmp(a, "--qk-norm") == 0) {
            o->qk_norm = 1;
            continue;
        }
        if (strcmp(a, "--post-norms") == 0) {
            o->post_norms = 1;
            continue;
        }
        if (strcmp(a, "--rope-freqs") == 0) {
            o->rope_freqs = 1;
            continue;
        }
        if (strcmp(a, "--rope-factors") == 0) {
            o->rope_factors = 1;
            continue;
        }
        if (strcmp(a, "--lora") == 0) {
            o->lora = 1;
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return -1;
        if (i + 1 >= argc) {
            fprintf(stderr, "kvgen-mkmodel: %s needs a value\n", a);
            return -1;
        }
        const char *v = argv[++i];
        int rc = 0;
        if (strcmp(a, "-o") == 0) o->out = v;
        else if (strcmp(a, "--seed") == 0) {
            char *end;
            o->seed = strtoull(v, &end, 0);
            if (*end || end == v) {
                fprintf(stderr, "kvgen-mkmodel: --seed needs an integer, got '%s'\n", v);
                rc = -1;
            }
        } else if (strcmp(a, "--layers") == 0) rc = parse_int(a, v, &o->layers);
        else if (strcmp(a, "--embd") == 0) rc = parse_int(a, v, &o->embd);
        else if (strcmp(a, "--ff") == 0) rc = parse_int(a, v, &o->ff);
        else if (strcmp(a, "--heads") == 0) rc = parse_int(a, v, &o->heads);
        else if (strcmp(a, "--kv-heads") == 0) rc = parse_int(a, v, &o->kv_heads);
        else if (strcmp(a, "--ctx") == 0) rc = parse_int(a, v, &o->ctx);
        else if (strcmp(a, "--vocab-size") == 0) rc = parse_int(a, v, &o->vocab_size);
        else if (strcmp(a, "--pooling") == 0) {
            o->pooling = strcmp(v, "none") == 0 ? -1 : strcmp(v, "mean") == 0 ? 1 : strcmp(v, "cls") == 0 ? 2
                       : strcmp(v, "last") == 0 ? 3 : -2;
            if (o->pooling == -2) {
                fprintf(stderr, "kvgen-mkmodel: --pooling takes mean, cls, last or none (no key), not %s\n", v);
                rc = -1;
            }
        }
        else if (strcmp(a, "--vocab") == 0) o->vocab_path = v;
        else if (strcmp(a, "--head-dim") == 0) rc = parse_int(a, v, &o->head_dim);
        else if (strcmp(a, "--swa") == 0) rc = parse_int(a, v, &o->swa);
        else if (strcmp(a, "--rope-dim") == 0) rc = parse_int(a, v, &o->rope_dim);
        else if (strcmp(a, "--orig-ctx") == 0) rc = parse_int(a, v, &o->orig_ctx);
        else if (strcmp(a, "--lora-rank") == 0) rc = parse_int(a, v, &o->lora_rank);
        else if (strcmp(a, "--lora-alpha") == 0) {
            char *end;
            o->lora_alpha = strtof(v, &end);
            if (*end || end == v || !(o->lora_alpha >= 0.0f) || !isfinite(o->lora_alpha)) {
                fprintf(stderr, "kvgen-mkmodel: --lora-alpha needs a number >= 0 (0: no alpha), got '%s'\n", v);
                rc = -1;
            }
        } else if (strcmp(a, "--lora-targets") == 0) {
            rc = parse_lora_targets(v, &o->lora_targets);
        } else if (strcmp(a, "--lora-type") == 0) {
            rc = parse_type(a, v, &o->lora_type);
            if (!rc && o->lora_type != KVG_TYPE_F32 && o->lora_type != KVG_TYPE_F16 && o->lora_type != KVG_TYPE_BF16 &&
                o->lora_type != KVG_TYPE_Q8_0) {
                fprintf(stderr, "kvgen-mkmodel: --lora-type %s: adapters are written as F32, F16, BF16 or Q8_0\n", v);
                rc = -1;
            }
        }
        else if (strcmp(a, "--softcap") == 0) {
            if (sscanf(v, "%f,%f", &o->softcap_attn, &o->softcap_final) != 2 || !(o->softcap_attn > 0.0f) ||
                !(o->softcap_final > 0.0f)) {
                fprintf(stderr, "kvgen-mkmodel: --softcap needs ATTN,FINAL (two positive numbers), got '%s'\n", v);
                rc = -1;
            }
        }
        else if (strcmp(a, "--arch") == 0) {
            o->arch = v;
            if (!*v || strlen(v) > 32) {
                fprintf(stderr, "kvgen-mkmodel: --arch needs a name of 1 to 32 characters\n");
                rc = -1;
            }
        }
        else if (strcmp(a, "--type") == 0) {
            rc = parse_type(a, v, &o->type);
            type_set = 1;
        } else if (strcmp(a, "--mix") == 0) {
            if (strcmp(v, "q4_k_m") == 0 || strcmp(v, "Q4_K_M") == 0) o->mix = MIX_Q4_K_M;
            else {
                fprintf(stderr, "kvgen-mkmodel: --mix %s is not a mix kvgen-mkmodel knows (valid: q4_k_m)\n", v);
                rc = -1;
            }
        } else if (strcmp(a, "--embd-type") == 0) {
            rc = parse_type(a, v, &o->embd_type);
            o->embd_type_set = 1;
        } else if (strcmp(a, "--rope-base") == 0) {
            char *end;
            o->rope_base = strtof(v, &end);
            if (*end || end == v || !(o->rope_base > 0.0f) || !isfinite(o->rope_base)) {
                fprintf(stderr, "kvgen-mkmodel: --rope-base needs a positive number, got '%s'\n", v);
                rc = -1;
            }
        } else {
            fprintf(stderr, "kvgen-mkmodel: unknown option %s\n", a);
            rc = -1;
        }
        if (rc) return rc;
    }
    if (!o->out) {
        fprintf(stderr, "kvgen-mkmodel: -o OUT.gguf is required\n");
        return -1;
    }
    if (o->mix && type_set) {
        fprintf(stderr, "kvgen-mkmodel: --mix and --type exclude each other\n");
        return -1;
    }
    if (!o->embd_type_set) o->embd_type = o->type;
    if (!o->kv_heads) o->kv_heads = o->heads;
    if (!o->arch) o->arch = "llama";
    o->row = kvg_arch_find(o->arch, strlen(o->arch));
    if (o->rope_factors && !(o->row && o->row->rope_factors)) {
        fprintf(stderr, "kvgen-mkmodel: --rope-factors needs an architecture with LongRoPE factors (phi3), not %s\n",
                o->arch);
        return -1;
    }
    if (!o->orig_ctx) o->orig_ctx = o->ctx;
    if (o->lora && o->row && o->row->encoder) {
        fprintf(stderr, "kvgen-mkmodel: --lora writes adapters for decoders (kvgen runs no adapters on an encoder), "
                "not for --arch %s\n", o->arch);
        return -1;
    }
    if (o->lora_alpha < 0.0f) o->lora_alpha = (float)o->lora_rank;
    if (o->embd % o->heads && !o->head_dim) {
        fprintf(stderr, "kvgen-mkmodel: --embd %d is not a multiple of --heads %d\n", o->embd, o->heads);
        return -1;
    }
    if (o->heads % o->kv_heads) {
        fprintf(stderr, "kvgen-mkmodel: --heads %d is not a multiple of --kv-heads %d\n", o->heads, o->kv_heads);
        return -1;
    }
    int head_dim = o->head_dim ? o->head_dim : o->embd / o->heads;
    if (head_dim % 2) {
        fprintf(stderr, "kvgen-mkmodel: the head size %d must be even (rope rotates pairs)\n", head_dim);
        return -1;
    }
    if (!o->rope_dim) o->rope_dim = head_dim;
    if (o->rope_dim % 2 || o->rope_dim > head_dim) {
        fprintf(stderr, "kvgen-mkmodel: --rope-dim %d must be even and at most the head size %d\n", o->rope_dim,
                head_dim);
        return -1;
    }
    return 0;
}

/* ---- vocabulary ---- */

typedef struct vocab {
    char **text;
    int32_t *type;
    int n, cap;
    char **merges;
    int n_merges;
} vocab;

static int vocab_add(vocab *v, const char *text, int32_t type) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 512;
        char **t = realloc(v->text, (size_t)cap * sizeof *t);
        if (!t) return -1;
        v->text = t;
        int32_t *ty = realloc(v->type, (size_t)cap * sizeof *ty);
        if (!ty) return -1;
        v->type = ty;
        v->cap = cap;
    }
    size_t len = strlen(text);
    v->text[v->n] = malloc(len + 1);
    if (!v->text[v->n]) return -1;
    memcpy(v->text[v->n], text, len + 1);
    v->type[v->n] = type;
    return v->n++;
}

/* GPT-2 maps every byte to a printable code point: printable Latin-1 bytes to themselves, the rest
 * to U+0100 onwards in byte order. Token texts are the UTF-8 of those code points. */
static void byte_token(int b, char out[3]) {
    int cp = b;
    if (!((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff))) {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

static int make_synthetic_vocab(vocab *v, int want) {
    for (int b = 0; b < 256; b++) {
        char t[3];
        byte_token(b, t);
        if (vocab_add(v, t, 1) < 0) return -1;
    }
    /* a few common English pairs ("Ġ" is the space byte), so the BPE path merges something */
    static const char *const merges[][2] = {
        {"\xc4\xa0", "t"}, {"h", "e"}, {"\xc4\xa0", "a"}, {"i", "n"}, {"t", "h"}, {"e", "r"}, {"o", "n"},
        {"\xc4\xa0t", "he"}, {"r", "e"}, {"a", "n"}, {"\xc4\xa0", "s"}, {"o", "u"}, {"\xc4\xa0", "w"}, {"e", "n"},
    };
    size_t nm = sizeof merges / sizeof merges[0];
    v->merges = calloc(nm, sizeof *v->merges);
    if (!v->merges) return -1;
    for (size_t i = 0; i < nm; i++) {
        char joined[16], rule[20];
        snprintf(joined, sizeof joined, "%s%s", merges[i][0], merges[i][1]);
        snprintf(rule, sizeof rule, "%s %s", merges[i][0], merges[i][1]);
        v->merges[i] = malloc(strlen(rule) + 1);
        if (!v->merges[i] || vocab_add(v, joined, 1) < 0) return -1;
        strcpy(v->merges[i], rule);
        v->n_merges++;
    }
    static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (size_t i = 0; i < 3; i++)
        if (vocab_add(v, specials[i], 3) < 0) return -1;
    if (want && want < v->n) {
        fprintf(stderr, "kvgen-mkmodel: --vocab-size %d is below the %d tokens of the synthetic vocabulary\n", want,
                v->n);
        return -2;
    }
    /* padding tokens: ordinary text no merge produces, so only sampling can emit them */
    for (int i = 0; v->n < want; i++) {
        char t[32];
        snprintf(t, sizeof t, "tok%d", i);
        if (vocab_add(v, t, 1) < 0) return -1;
    }
    return 0;
}

/* A WordPiece vocabulary as llama.cpp's converter writes one: word starts carry U+2581, continuations
 * are bare; lower-case only (an uncased vocabulary). [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4. */
static int make_wordpiece_vocab(vocab *v, int want) {
    static const char *const specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (int i = 0; i < 5; i++)
        if (vocab_add(v, specials[i], i == 1 ? 2 : 3) < 0) return -1;
    char t[32];
    for (int c = 33; c < 127; c++) { /* every printable ASCII character, as a start and as a continuation */
        if (c >= 'A' && c <= 'Z') continue;
        snprintf(t, sizeof t, "\xE2\x96\x81%c", c);
        if (vocab_add(v, t, 1) < 0) return -1;
        snprintf(t, sizeof t, "%c", c);
        if (vocab_add(v, t, 1) < 0) return -1;
    }
    static const char *const words[] = {"the", "hello", "world", "sword", "shop", "play", "cat", "dog", "memory"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        snprintf(t, sizeof t, "\xE2\x96\x81%s", words[i]);
        if (vocab_add(v, t, 1) < 0) return -1;
    }
    static const char *const tails[] = {"ing", "ed", "er", "s"};
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++)
        if (vocab_add(v, tails[i], 1) < 0) return -1;
    if (want && want < v->n) {
        fprintf(stderr, "kvgen-mkmodel: --vocab-size %d is below the %d tokens of the synthetic vocabulary\n", want,
                v->n);
        return -2;
    }
    for (int i = 0; v->n < want; i++) {
        snprintf(t, sizeof t, "\xE2\x96\x81tok%d", i);
        if (vocab_add(v, t, 1) < 0) return -1;
    }
    return 0;
}

static int write_wordpiece_tokenizer(kvg_gguf_writer *w, vocab *v) {
    kvg_str *s = malloc((size_t)v->n * sizeof *s);
    if (!s) return -1;
    for (int i = 0; i < v->n; i++) s[i] = (kvg_str){v->text[i], strlen(v->text[i])};
    kvg_gguf_set_str(w, "tokenizer.ggml.model", "bert");
    kvg_gguf_set_arr_str(w, "tokenizer.ggml.tokens", s, (uint64_t)v->n);
    kvg_gguf_set_arr_num(w, "tokenizer.ggml.token_type", KVG_GGUF_INT32, v->type, (uint64_t)v->n);
    free(s);
    kvg_gguf_set_u32(w, "tokenizer.ggml.padding_token_id", 0);
    kvg_gguf_set_u32(w, "tokenizer.ggml.unknown_token_id", 1);
    kvg_gguf_set_u32(w, "tokenizer.ggml.cls_token_id", 2);
    kvg_gguf_set_u32(w, "tokenizer.ggml.seperator_token_id", 3); /* llama.cpp's spelling */
    kvg_gguf_set_u32(w, "tokenizer.ggml.mask_token_id", 4);
    return 0;
}

static void vocab_free(vocab *v) {
    for (int i = 0; i < v->n; i++) free(v->text[i]);
    for (int i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->text);
    free(v->type);
    free(v->merges);
}

static int write_synthetic_tokenizer(kvg_gguf_writer *w, vocab *v) {
    kvg_str *s = malloc((size_t)(v->n > v->n_merges ? v->n : v->n_merges) * sizeof *s);
    if (!s) return -1;
    for (int i = 0; i < v->n; i++) s[i] = (kvg_str){v->text[i], strlen(v->text[i])};
    kvg_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    kvg_gguf_set_str(w, "tokenizer.ggml.pre", "gpt-2"); /* llama.cpp knows the GPT-2 pre-tokenizer only by this name */
    kvg_gguf_set_arr_str(w, "tokenizer.ggml.tokens", s, (uint64_t)v->n);
    kvg_gguf_set_arr_num(w, "tokenizer.ggml.token_type", KVG_GGUF_INT32, v->type, (uint64_t)v->n);
    for (int i = 0; i < v->n_merges; i++) s[i] = (kvg_str){v->merges[i], strlen(v->merges[i])};
    kvg_gguf_set_arr_str(w, "tokenizer.ggml.merges", s, (uint64_t)v->n_merges);
    free(s);
    int eot = 256 + v->n_merges;
    kvg_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)eot);
    kvg_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eot + 2); /* <|im_end|> ends a chat turn */
    kvg_gguf_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)eot);
    kvg_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    return 0;
}

/* copies every tokenizer.* key; returns the vocabulary size or -1 */
static int copy_tokenizer(kvg_gguf_writer *w, const char *path) {
    kvg_gguf *src;
    kvgen_error err = {0};
    if (kvg_gguf_open(path, &src, &err) != KVGEN_OK) {
        fprintf(stderr, "kvgen-mkmodel: %s\n", err.message);
        return -1;
    }
    uint64_t n = 0;
    kvg_gguf_vtype et;
    if (!kvg_gguf_get_arr(src, "tokenizer.ggml.tokens", &et, &n) || et != KVG_GGUF_STRING || n == 0 ||
        n > (1 << 20)) {
        fprintf(stderr, "kvgen-mkmodel: %s: no usable tokenizer.ggml.tokens array\n", path);
        kvg_gguf_close(src);
        return -1;
    }
    for (int i = 0; i < kvg_gguf_n_kv(src); i++) {
        const char *key = kvg_gguf_key(src, i);
        if (strncmp(key, "tokenizer.", 10) == 0) kvg_gguf_copy_kv(w, src, key);
    }
    kvg_gguf_close(src);
    return (int)n;
}

/* ---- weights ---- */

/* Layer l of n gets more bits in the Q4_K_M mix: the first and last eighth of the layers and
 * every third one in between (llama.cpp's rule). */
static int more_bits(int l, int n) { return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2; }

/* the type of a matrix: `what` is a layer tensor's name part ("attn_v"), "token_embd" or "output" */
static uint32_t matrix_type(const options *o, const char *what, int layer) {
    int embd = strcmp(what, "token_embd") == 0, out = strcmp(what, "output") == 0;
    if (o->mix == MIX_NONE) return embd || out ? o->embd_type : o->type;
    if ((embd || out) && o->embd_type_set) return o->embd_type;
    if (out || (embd && !o->untied)) return KVG_TYPE_Q6_K; /* tied embeddings are the output matrix too */
    if (embd) return KVG_TYPE_Q4_K;
    if ((strcmp(what, "attn_v") == 0 || strcmp(what, "ffn_down") == 0) && more_bits(layer, o->layers))
        return KVG_TYPE_Q6_K;
    return KVG_TYPE_Q4_K;
}

/* general.file_type: llama.cpp's number (llama_ftype) for the file's types; -1: it has none */
static int file_type(const options *o) {
    if (o->mix == MIX_Q4_K_M) return 15; /* MOSTLY_Q4_K_M */
    static const int ftypes[][2] = {
        {KVG_TYPE_F32, 0},   {KVG_TYPE_F16, 1},   {KVG_TYPE_Q4_0, 2},  {KVG_TYPE_Q4_1, 3},    {KVG_TYPE_Q8_0, 7},
        {KVG_TYPE_Q5_0, 8},  {KVG_TYPE_Q5_1, 9},  {KVG_TYPE_Q2_K, 10}, {KVG_TYPE_Q3_K, 11},   {KVG_TYPE_Q4_K, 14},
        {KVG_TYPE_Q5_K, 16}, {KVG_TYPE_Q6_K, 18}, {KVG_TYPE_IQ4_NL, 25}, {KVG_TYPE_IQ4_XS, 30}, {KVG_TYPE_BF16, 32},
    };
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++)
        if ((uint32_t)ftypes[i][0] == o->type) return ftypes[i][1];
    return -1;
}

/* rows x cols (cols = ne[0], contiguous) of type t: normal(0, std) + mean. `width` says which
 * option sets cols, for the message refusing rows that are not whole blocks. With w NULL it
 * only checks that. */
static int add_matrix(kvg_gguf_writer *w, rng *r, const char *name, uint32_t type, int cols, int rows, float mean,
                      float std, const char *width) {
    uint32_t be = kvg_type_block_elems(type);
    if (be == 0 || cols % (int)be) {
        fprintf(stderr, "kvgen-mkmodel: tensor %s has type %s, whose rows must be a multiple of %u elements, but "
                "they are %d wide (%s %d)\n", name, kvg_type_name(type), be, cols, width, cols);
        return -1;
    }
    if (!w) return 0;
    size_t row_bytes = kvg_row_bytes(type, (uint64_t)cols);
    size_t nbytes = row_bytes * (size_t)rows;
    float *row = malloc((size_t)cols * sizeof *row);
    unsigned char *data = malloc(nbytes ? nbytes : 1);
    if (!row || !data) {
        free(row);
        free(data);
        fprintf(stderr, "kvgen-mkmodel: out of memory\n");
        return -1;
    }
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) row[j] = mean + std * rng_normal(r);
        kvg_quantize_row(type, row, data + (size_t)i * row_bytes, (uint64_t)cols);
    }
    uint64_t ne[2] = {(uint64_t)cols, (uint64_t)rows};
    kvg_gguf_add_tensor(w, name, type, rows == 1 ? 1 : 2, ne, data, nbytes);
    free(row);
    free(data);
    return 0;
}

static float matrix_std(int n_in) {
    float s = 0.5f / sqrtf((float)n_in); /* keeps each projection's output near unit scale */
    return s < 0.02f ? 0.02f : s > 0.08f ? 0.08f : s;
}

/* An encoder's tensors (bert), named as llama.cpp's converter names them: embeddings of tokens,
 * positions and two token types with their LayerNorm, then per layer Q/K/V and the attention
 * output with biases, its LayerNorm, the ungated feed-forward with biases and its LayerNorm. */
static int write_encoder_weights(kvg_gguf_writer *w, const options *o, rng *r, int n_vocab) {
    int err = add_matrix(w, r, "token_embd.weight", matrix_type(o, "token_embd", 0), o->embd, n_vocab, 0.0f, 0.08f,
                         "--embd");
    if (!err) err = add_matrix(w, r, "token_types.weight", KVG_TYPE_F32, o->embd, 2, 0.0f, 0.05f, "--embd");
    if (!err) err = add_matrix(w, r, "position_embd.weight", matrix_type(o, "token_embd", 0), o->embd, o->ctx, 0.0f,
                               0.05f, "--embd");
    if (!err) err = add_matrix(w, r, "token_embd_norm.weight", KVG_TYPE_F32, o->embd, 1, 1.0f, 0.05f, "--embd");
    if (!err) err = add_matrix(w, r, "token_embd_norm.bias", KVG_TYPE_F32, o->embd, 1, 0.0f, 0.02f, "--embd");
    for (int l = 0; l < o->layers && !err; l++) {
        char name[64];
        float se = matrix_std(o->embd), sf = matrix_std(o->ff);
#define M(suffix, kind, type, cols, rows, mean, std, width)                                          \
    if (!err) {                                                                                      \
        snprintf(name, sizeof name, "blk.%d.%s.%s", l, suffix, kind);                                \
        err = add_matrix(w, r, name, type, cols, rows, mean, std, width);                            \
    }
        const char *parts[] = {"attn_q", "attn_k", "attn_v"};
        for (int p = 0; p < 3; p++) {
            M(parts[p], "weight", matrix_type(o, parts[p], l), o->embd, o->embd, 0.0f, se, "--embd")
            M(parts[p], "bias", KVG_TYPE_F32, o->embd, 1, 0.0f, 0.05f, "--embd")
        }
        M("attn_output", "weight", matrix_type(o, "attn_output", l), o->embd, o->embd, 0.0f, se, "--embd")
        M("attn_output", "bias", KVG_TYPE_F32, o->embd, 1, 0.0f, 0.05f, "--embd")
        M("attn_output_norm", "weight", KVG_TYPE_F32, o->embd, 1, 1.0f, 0.05f, "--embd")
        M("attn_output_norm", "bias", KVG_TYPE_F32, o->embd, 1, 0.0f, 0.02f, "--embd")
        M("ffn_up", "weight", matrix_type(o, "ffn_up", l), o->embd, o->ff, 0.0f, se, "--embd")
        M("ffn_up", "bias", KVG_TYPE_F32, o->ff, 1, 0.0f, 0.05f, "--ff")
        M("ffn_down", "weight", matrix_type(o, "ffn_down", l), o->ff, o->embd, 0.0f, sf, "--ff")
        M("ffn_down", "bias", KVG_TYPE_F32, o->embd, 1, 0.0f, 0.05f, "--embd")
        M("layer_output_norm", "weight", KVG_TYPE_F32, o->embd, 1, 1.0f, 0.05f, "--embd")
        M("layer_output_norm", "bias", KVG_TYPE_F32, o->embd, 1, 0.0f, 0.02f, "--embd")
#undef M
    }
    return err;
}

/* Every tensor, in file order. With w NULL: only checks every row width (no weights drawn). */
static int write_weights(kvg_gguf_writer *w, const options *o, rng *r, int n_vocab) {
    if (o->row && o->row->encoder) return write_encoder_weights(w, o, r, n_vocab);
    int head_dim = o->head_dim ? o->head_dim : o->embd / o->heads;
    int kv_dim = o->kv_heads * head_dim, q_dim = o->heads * head_dim;
    uint32_t fused = o->row ? o->row->fused : 0;
    int fused_qkv = (fused & KVG_FUSED_QKV) != 0, fused_gate_up = (fused & KVG_FUSED_GATE_UP) != 0;
    int err = add_matrix(w, r, "token_embd.weight", matrix_type(o, "token_embd", 0), o->embd, n_vocab, 0.0f, 0.08f,
                         "--embd");
    for (int l = 0; l < o->layers && !err; l++) {
        char name[64];
        float se = matrix_std(o->embd), sf = matrix_std(o->ff);
#define M(suffix, type, cols, rows, mean, std, width)                                                \
    if (!err) {                                                                                      \
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, suffix);                                  \
        err = add_matrix(w, r, name, type, cols, rows, mean, std, width);                            \
    }
#define T(suffix) matrix_type(o, suffix, l)
        M("attn_norm", KVG_TYPE_F32, o->embd, 1, 1.0f, 0.05f, "--embd")
        if (fused_qkv) {
            M("attn_qkv", T("attn_qkv"), o->embd, q_dim + 2 * kv_dim, 0.0f, se, "--embd")
        } else {
            M("attn_q", T("attn_q"), o->embd, q_dim, 0.0f, se, "--embd")
            M("attn_k", T("attn_k"), o->embd, kv_dim, 0.0f, se, "--embd")
            M("attn_v", T("attn_v"), o->embd, kv_dim, 0.0f, se, "--embd")
        }
        M("attn_output", T("attn_output"), q_dim, o->embd, 0.0f, matrix_std(q_dim), "heads x head size")
        M("ffn_norm", KVG_TYPE_F32, o->embd, 1, 1.0f, 0.05f, "--embd")
        if (fused_gate_up) {
            M("ffn_up", T("ffn_up"), o->embd, 2 * o->ff, 0.0f, se, "--embd")
        } else {
            M("ffn_gate", T("ffn_gate"), o->embd, o->ff, 0.0f, se, "--embd")
            M("ffn_up", T("ffn_up"), o->embd, o->ff, 0.0f, se, "--embd")
        }
        M("ffn_down", T("ffn_down"), o->ff, o->embd, 0.0f, sf, "--ff")
#undef T
#undef M
    }
    if (!err) err = add_matrix(w, r, "output_norm.weight", KVG_TYPE_F32, o->embd, 1, 1.0f, 0.05f, "--embd");
    if (!err && o->untied)
        err = add_matrix(w, r, "output.weight", matrix_type(o, "output", 0), o->embd, n_vocab, 0.0f, 0.08f, "--embd");
    /* after every other tensor, so that the others are the same with and without them */
    for (int l = 0; l < o->layers && !err && o->qkv_bias; l++) {
        char name[64];
        const char *parts[3] = {"attn_q", "attn_k", "attn_v"};
        for (int p = 0; p < 3 && !err; p++) {
            snprintf(name, sizeof name, "blk.%d.%s.bias", l, parts[p]);
            err = add_matrix(w, r, name, KVG_TYPE_F32, p ? kv_dim : q_dim, 1, 0.0f, 0.05f, "heads x head size");
        }
    }
    for (int l = 0; l < o->layers && !err && o->qk_norm; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_q_norm.weight", l);
        err = add_matrix(w, r, name, KVG_TYPE_F32, head_dim, 1, 1.0f, 0.05f, "the head size");
        snprintf(name, sizeof name, "blk.%d.attn_k_norm.weight", l);
        if (!err) err = add_matrix(w, r, name, KVG_TYPE_F32, head_dim, 1, 1.0f, 0.05f, "the head size");
    }
    for (int l = 0; l < o->layers && !err && o->post_norms; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.post_attention_norm.weight", l);
        err = add_matrix(w, r, name, KVG_TYPE_F32, o->embd, 1, 1.0f, 0.05f, "--embd");
        snprintf(name, sizeof name, "blk.%d.post_ffw_norm.weight", l);
        if (!err) err = add_matrix(w, r, name, KVG_TYPE_F32, o->embd, 1, 1.0f, 0.05f, "--embd");
    }
    /* llama 3 style: per-dimension factors dividing the RoPE frequencies, between 1 and ~2 */
    if (!err && o->rope_freqs) err = add_matrix(w, r, "rope_freqs.weight", KVG_TYPE_F32, head_dim / 2, 1, 1.4f, 0.15f,
                                                "the head size");
    /* Phi-3 style LongRoPE: the factors divide the frequencies; short ones near 1, long ones larger */
    if (!err && o->rope_factors)
        err = add_matrix(w, r, "rope_factors_long.weight", KVG_TYPE_F32, o->rope_dim / 2, 1, 3.0f, 0.8f, "--rope-dim");
    if (!err && o->rope_factors)
        err = add_matrix(w, r, "rope_factors_short.weight", KVG_TYPE_F32, o->rope_dim / 2, 1, 1.3f, 0.15f,
                         "--rope-dim");
    return err;
}

typedef struct lora_matrix {
    const char *part; /* "attn_q" in blk.N.attn_q.weight */
    int n_in, n_out;
    unsigned targets; /* the --lora-targets it holds */
} lora_matrix;

/* --lora: the adapter instead of the model (see the top of the file) */
static int write_adapter(const options *o) {
    int head_dim = o->head_dim ? o->head_dim : o->embd / o->heads;
    int q_dim = o->heads * head_dim, kv_dim = o->kv_heads * head_dim;
    uint32_t fused = o->row ? o->row->fused : 0;
    /* the matrices as the model file stores them (a fused one is adapted whole when any of its
     * parts is a target); bits: of lora_target_names */
    lora_matrix mats[LORA_TARGETS];
    int n_mats = 0;
#define MAT(name, in, out, bits) mats[n_mats++] = (lora_matrix){name, in, out, bits}
    if (fused & KVG_FUSED_QKV) MAT("attn_qkv", o->embd, q_dim + 2 * kv_dim, 7u);
    else {
        MAT("attn_q", o->embd, q_dim, 1u);
        MAT("attn_k", o->embd, kv_dim, 2u);
        MAT("attn_v", o->embd, kv_dim, 4u);
    }
    MAT("attn_output", q_dim, o->embd, 8u);
    if (fused & KVG_FUSED_GATE_UP) MAT("ffn_up", o->embd, 2 * o->ff, 16u | 32u);
    else {
        MAT("ffn_gate", o->embd, o->ff, 16u);
        MAT("ffn_up", o->embd, o->ff, 32u);
    }
    MAT("ffn_down", o->ff, o->embd, 64u);
#undef MAT
    kvg_gguf_writer *w = kvg_gguf_writer_new();
    if (!w) {
        fprintf(stderr, "kvgen-mkmodel: out of memory\n");
        return 1;
    }
    kvg_gguf_set_str(w, "general.architecture", o->arch);
    kvg_gguf_set_str(w, "general.type", "adapter");
    kvg_gguf_set_str(w, "general.name", "kvgen-mkmodel random lora");
    kvg_gguf_set_str(w, "adapter.type", "lora");
    kvg_gguf_set_f32(w, "adapter.lora.alpha", o->lora_alpha);
    rng r = {o->seed * 0x9e3779b97f4a7c15ull + 7}; /* not the model's stream */
    int err = 0, rank = o->lora_rank;
    for (int l = 0; l < o->layers && !err; l++)
        for (int t = 0; t < n_mats && !err; t++) {
            if (!(o->lora_targets & mats[t].targets)) continue;
            char name[96];
            int n_in = mats[t].n_in, n_out = mats[t].n_out;
            snprintf(name, sizeof name, "blk.%d.%s.weight.lora_a", l, mats[t].part);
            err = add_matrix(w, &r, name, o->lora_type, n_in, rank, 0.0f, 1.0f / sqrtf((float)n_in), "the input width");
            snprintf(name, sizeof name, "blk.%d.%s.weight.lora_b", l, mats[t].part);
            if (!err)
                err = add_matrix(w, &r, name, o->lora_type, rank, n_out, 0.0f, 0.15f / sqrtf((float)rank),
                                 "--lora-rank");
        }
    kvgen_error e = {0};
    if (!err && kvg_gguf_writer_save(w, o->out, &e) != KVGEN_OK) {
        fprintf(stderr, "kvgen-mkmodel: %s\n", e.message);
        err = 1;
    }
    kvg_gguf_writer_free(w);
    return err ? 1 : 0;
}

int main(int argc, char **argv) {
    options o;
    if (parse_args(argc, argv, &o) != 0) {
        usage();
        return 2;
    }
    if (o.lora) return write_adapter(&o);
    if (write_weights(NULL, &o, NULL, 0) != 0) return 2; /* a row width that is not whole blocks */
    kvg_gguf_writer *w = kvg_gguf_writer_new();
    vocab v = {0};
    int rc = 1;
    if (!w) goto done;
    kvg_gguf_set_str(w, "general.architecture", o.arch);
    int encoder = o.row && o.row->encoder;
    if (encoder) o.kv_heads = o.heads; /* bert's attention has as many K/V heads as query heads */
    kvg_gguf_set_str(w, "general.name", encoder ? "kvgen-mkmodel random bert" : "kvgen-mkmodel random llama");
    int n_vocab;
    if (o.vocab_path) {
        n_vocab = copy_tokenizer(w, o.vocab_path);
        if (n_vocab < 0) goto done;
        if (o.vocab_size && o.vocab_size != n_vocab) {
            fprintf(stderr, "kvgen-mkmodel: --vocab-size %d differs from the %d tokens of %s\n", o.vocab_size, n_vocab,
                    o.vocab_path);
            goto done;
        }
    } else if (encoder) {
        int vr = make_wordpiece_vocab(&v, o.vocab_size);
        if (vr == -1) fprintf(stderr, "kvgen-mkmodel: out of memory\n");
        if (vr != 0 || write_wordpiece_tokenizer(w, &v) != 0) goto done;
        n_vocab = v.n;
    } else {
        int vr = make_synthetic_vocab(&v, o.vocab_size);
        if (vr == -1) fprintf(stderr, "kvgen-mkmodel: out of memory\n");
        if (vr != 0 || write_synthetic_tokenizer(w, &v) != 0) goto done;
        n_vocab = v.n;
    }
    int head_dim = o.head_dim ? o.head_dim : o.embd / o.heads;
    char key[96];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", o.arch, suffix), key)
    kvg_gguf_set_u32(w, KEY("block_count"), (uint32_t)o.layers);
    kvg_gguf_set_u32(w, KEY("context_length"), (uint32_t)o.ctx);
    kvg_gguf_set_u32(w, KEY("embedding_length"), (uint32_t)o.embd);
    kvg_gguf_set_u32(w, KEY("feed_forward_length"), (uint32_t)o.ff);
    kvg_gguf_set_u32(w, KEY("attention.head_count"), (uint32_t)o.heads);
    kvg_gguf_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)o.kv_heads);
    if (encoder) { /* as llama.cpp's converter writes bert: no RoPE, LayerNorm's epsilon, pooling */
        kvg_gguf_set_f32(w, KEY("attention.layer_norm_epsilon"), 1e-12f);
        kvg_gguf_set_bool(w, KEY("attention.causal"), false);
        if (o.pooling >= 0) kvg_gguf_set_u32(w, KEY("pooling_type"), (uint32_t)o.pooling);
    } else {
        kvg_gguf_set_f32(w, KEY("rope.freq_base"), o.rope_base);
        kvg_gguf_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
        kvg_gguf_set_u32(w, KEY("rope.dimension_count"), (uint32_t)o.rope_dim);
    }
    int longrope = o.row && o.row->rope_factors; /* as llama.cpp's converter writes phi3 files */
    if (longrope) {
        kvg_gguf_set_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)o.orig_ctx);
        kvg_gguf_set_u32(w, KEY("attention.sliding_window"), (uint32_t)o.swa);
        if (o.rope_factors) {
            double scale = (double)o.ctx / o.orig_ctx;
            float af = scale > 1.0 ? (float)sqrt(1.0 + log(scale) / log((double)o.orig_ctx)) : 1.0f;
            kvg_gguf_set_f32(w, KEY("rope.scaling.attn_factor"), af);
        }
    } else {
        kvg_gguf_set_u32(w, KEY("vocab_size"), (uint32_t)n_vocab);
    }
    if (o.head_dim) {
        kvg_gguf_set_u32(w, KEY("attention.key_length"), (uint32_t)head_dim);
        kvg_gguf_set_u32(w, KEY("attention.value_length"), (uint32_t)head_dim);
    }
    if (o.swa && !longrope) kvg_gguf_set_u32(w, KEY("attention.sliding_window"), (uint32_t)o.swa);
    if (o.softcap_attn > 0.0f) {
        kvg_gguf_set_f32(w, KEY("attn_logit_softcapping"), o.softcap_attn);
        kvg_gguf_set_f32(w, KEY("final_logit_softcapping"), o.softcap_final);
    }
#undef KEY
    if (file_type(&o) >= 0) kvg_gguf_set_u32(w, "general.file_type", (uint32_t)file_type(&o));

    rng r = {o.seed * 0x2545f4914f6cdd1dull + 1};
    if (write_weights(w, &o, &r, n_vocab) != 0) goto done;
    kvgen_error e = {0};
    if (kvg_gguf_writer_save(w, o.out, &e) != KVGEN_OK) {
        fprintf(stderr, "kvgen-mkmodel: %s\n", e.message);
        goto done;
    }
    rc = 0;
done:
    vocab_free(&v);
    kvg_gguf_writer_free(w);
    return rc;
}
