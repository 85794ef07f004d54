#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
// attn_lane.comp: causal attention for CPU devices (lavapipe), online softmax, no shared memory
// and no barriers. A CPU device runs a workgroup on one core as 8-wide SIMD and turns every
// storage-buffer or shared-memory load into a loop over the lanes, so the cost is the number of
// loads each lane issues: here one invocation owns one (query token, KV head, position range),
// keeps the GQ queries, each head's running max and sum and its output row in registers, and
// reads each cached K and V row once for all GQ query heads, a uvec4 (8 f16 / 4 f32) at a time
// (q8_0 / q4_0 rows, which start at any even byte: the aligned uvec4s around the row, re-aligned
// in registers, then each block's scale and its 32 signed bytes or nibbles).
// Dispatch: (ceil(ncols * nsplit / WG), n_kv, 1), WG invocations. Invocation j takes token
// t = j % ncols (at position pos = kvg_pos(t), seeing [first(pos), pos]: first is 0, or on a
// sliding-window layer (pc.window) the oldest position inside the window) and split s = j / ncols:
// decode's lanes are the splits of one KV head, prefill's are consecutive tokens walking the same
// rows. Split s covers positions lo + [s * chunk, (s + 1) * chunk) of what its token sees,
// lo = first(pos0), chunk = max(ceil((pos0 + ncols - lo) / nsplit), MINCHUNK), the same for every
// token (a batched decode: each token's own span), so attn_reduce.comp merges the partials.
// Scores are soft-capped where pc.softcap says (gemma2).
// Bindings: 0 params, 2 q (token t at t*ldq, head h at h*hd, already rotated), 3 out (DIRECT:
// t*ldo + h*hd), 5/10 the KV cache (kv.glsl), 7 partials (not DIRECT: per (t, h, s): m, l,
// acc[hd]). head_dim must be a multiple of 8; ldq, ldo multiples of 4.
// lavapipe's 65,535-iteration limit: one loop trip per position (all else unrolled), and the
// host keeps chunk <= 4,096.
layout(constant_id = 0) const uint WG = 8;
layout(constant_id = 5) const uint KV_F16 = 1;
layout(constant_id = 6) const uint DIRECT = 1;
layout(constant_id = 8) const uint GQ = 1;  // query heads per KV head (<= 8)
layout(constant_id = 9) const uint HD = 64; // head_dim (multiple of 8, <= 256)
layout(local_size_x_id = 0) in;

#define KVG_OWN_PC
#include "common.glsl"

layout(push_constant) uniform PC {
    uint n_head, n_kv, hd, ldq, ldo, n_ctx, nsplit, ncols;
    float scale;
    uint kv_layer, kv_page, kv_v, pt_base; // paged KV (kv.glsl)
    uint window;   // > 0: a sliding-window layer, a query at pos sees [pos - window + 1, pos] only
    float softcap; // > 0: scores become softcap * tanh(score / softcap)
} pc;

// the first position a query at pos sees
uint attn_first(uint pos) { return pc.window > 0u && pos >= pc.window ? pos - pc.window + 1u : 0u; }
// soft-capping of a (scaled) score; the argument of tanh bounded as in epilogue.glsl
float attn_cap(float s) { return pc.softcap > 0.0 ? pc.softcap * tanh(clamp(s / pc.softcap, -15.0, 15.0)) : s; }

layout(std430, set = 0, binding = 2) readonly buffer Q { vec4 qin4[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { vec4 yout4[]; };
#define KVG_KV_WIDE (HD / 4u)
// block pages (q8_0, q4_0): RB bytes a row; H: its NH words from its first byte, taken from
// NH + 1 words R from the 4-byte boundary below it, taken from the uvec4s from the 16-byte
// boundary below (up to 3 words before the row)
#define KVG_KV_WIDE_N (KV_QB != 0u ? N4Q : KV_F16 != 0u ? HD / 8u : HD / 4u)
#include "kv.glsl"
const uint RB = HD / 32u * KV_BLOCK, NH = (RB + 3u) / 4u, N4Q = (NH + 7u) / 4u;
layout(std430, set = 0, binding = 7) writeonly buffer Part { float part[]; };

const uint NV = HD / 4u;       // vec4 per row
// fewer positions per split cost more in partials written and merged than they save
const uint MINCHUNK = 32u;

// word i of the uvec4s w loaded for a block row
#define Q8_W(w, i) w[(i) >> 2][(i) & 3u]
// a cached row (kv_ref r) as vec4s x[NV]; w: uvec4[KVG_KV_WIDE] scratch (macros: see kv.glsl)
#define ROW_OF(r, w, x) { \
    KVG_LOAD_ROW4(r, w) \
    if (KV_QB != 0u) { \
        uint q8o = ((r).e & 15u) >> 2, q8h = (r).e & 2u; \
        uint q8r[NH + 1u], q8w[NH + 1u]; /* (+ 1: no empty array where HD < 32 or no blocks) */ \
        [[unroll]] for (uint rk = 0u; rk <= NH; rk++) \
            q8r[rk] = q8o == 0u ? Q8_W(w, rk) : q8o == 1u ? Q8_W(w, rk + 1u) \
                    : q8o == 2u ? Q8_W(w, rk + 2u) : Q8_W(w, rk + 3u); \
        [[unroll]] for (uint rk = 0u; rk < NH; rk++) \
            q8w[rk] = q8h == 0u ? q8r[rk] : (q8r[rk] >> 16) | (q8r[rk + 1u] << 16); \
        [[unroll]] for (uint rb = 0u; rb < HD / 32u; rb++) { \
            uint ob = rb * KV_BLOCK, oq = ob + 2u; \
            float sc = unpackHalf2x16(q8w[ob >> 2] >> ((ob & 2u) * 8u)).x; \
            if (KV_Q4 != 0u) { /* byte i: element i (low nibble), i + 16 (high) */ \
                [[unroll]] for (uint rk = 0u; rk < 4u; rk++) { \
                    uint j = (oq >> 2) + rk; \
                    uint qw = (oq & 2u) == 0u ? q8w[j] : (q8w[j] >> 16) | (q8w[j + 1u] << 16); \
                    uvec4 lo = uvec4(qw, qw >> 8, qw >> 16, qw >> 24) & 15u; \
                    uvec4 hi = uvec4(qw >> 4, qw >> 12, qw >> 20, qw >> 28) & 15u; \
                    x[rb * 8u + rk] = (vec4(lo) - 8.0) * sc; \
                    x[rb * 8u + 4u + rk] = (vec4(hi) - 8.0) * sc; \
                } \
            } else \
            [[unroll]] for (uint rk = 0u; rk < 8u; rk++) { \
                uint j = (oq >> 2) + rk; \
                int qw = int((oq & 2u) == 0u ? q8w[j] : (q8w[j] >> 16) | (q8w[j + 1u] << 16)); \
                x[rb * 8u + rk] = vec4(bitfieldExtract(qw, 0, 8), bitfieldExtract(qw, 8, 8), \
                                       bitfieldExtract(qw, 16, 8), bitfieldExtract(qw, 24, 8)) * sc; \
            } \
        } \
    } else if (KV_F16 != 0u) { \
        [[unroll]] for (uint rj = 0u; rj < HD / 8u; rj++) { \
            x[2u * rj] = vec4(unpackHalf2x16(w[rj].x), unpackHalf2x16(w[rj].y)); \
            x[2u * rj + 1u] = vec4(unpackHalf2x16(w[rj].z), unpackHalf2x16(w[rj].w)); \
        } \
    } else { \
        [[unroll]] for (uint rj = 0u; rj < NV; rj++) x[rj] = uintBitsToFloat(w[rj]); \
    } }

void main() {
    uint j = gl_GlobalInvocationID.x, kvh = gl_GlobalInvocationID.y;
    uint t = j % pc.ncols, s = j / pc.ncols;
    if (s >= pc.nsplit) return;
    uint len = kvg_pos(t) + 1u;
    // a batched decode's tokens are of different sessions: each splits its own length; a step's
    // tokens split the span from the first one's first visible position (sliding window) on
    uint maxlen = params.batch != 0u ? len : params.pos0 + pc.ncols;
    uint lo = attn_first(params.batch != 0u ? len - 1u : params.pos0);
    uint chunk = max((maxlen - lo + pc.nsplit - 1u) / pc.nsplit, MINCHUNK);
    uint tab = kvg_tab(t, pc.pt_base);
    uint p_begin = min(len, max(lo + s * chunk, attn_first(len - 1u))), p_end = min(len, lo + (s + 1u) * chunk);

    vec4 q[GQ * NV];
    [[unroll]] for (uint g = 0u; g < GQ; g++) {
        uint qb = (t * pc.ldq + (kvh * GQ + g) * HD) / 4u;
        [[unroll]] for (uint e = 0u; e < NV; e++) q[g * NV + e] = qin4[qb + e] * pc.scale;
    }
    float m[GQ], l[GQ];
    vec4 acc[GQ * NV];
    [[unroll]] for (uint g = 0u; g < GQ; g++) {
        m[g] = -1e30;
        l[g] = 0.0;
        [[unroll]] for (uint e = 0u; e < NV; e++) acc[g * NV + e] = vec4(0.0);
    }

    for (uint p = p_begin; p < p_end; p++) {
        kv_ref kr = kv_locate(tab, pc.kv_layer, pc.kv_v, pc.kv_page, HD, true, kvh, p);
        vec4 x[NV];
        uvec4 w[KVG_KV_WIDE];
        ROW_OF(kr, w, x)
        float sc[GQ];
        [[unroll]] for (uint g = 0u; g < GQ; g++) {
            vec4 d4 = vec4(0.0);
            [[unroll]] for (uint e = 0u; e < NV; e++) d4 += q[g * NV + e] * x[e];
            sc[g] = attn_cap(d4.x + d4.y + d4.z + d4.w);
        }
        kv_ref vr = kv_v_of(kr, pc.kv_v);
        ROW_OF(vr, w, x)
        [[unroll]] for (uint g = 0u; g < GQ; g++) {
            float mnew = max(m[g], sc[g]);
            float corr = exp(m[g] - mnew), pw = exp(sc[g] - mnew);
            m[g] = mnew;
            l[g] = l[g] * corr + pw;
            [[unroll]] for (uint e = 0u; e < NV; e++) acc[g * NV + e] = acc[g * NV + e] * corr + pw * x[e];
        }
    }

    [[unroll]] for (uint g = 0u; g < GQ; g++) {
        uint h = kvh * GQ + g;
        if (DIRECT != 0u) {
            float inv = l[g] > 0.0 ? 1.0 / l[g] : 0.0;
            uint ob = (t * pc.ldo + h * HD) / 4u;
            [[unroll]] for (uint e = 0u; e < NV; e++) yout4[ob + e] = acc[g * NV + e] * inv;
        } else {
            uint pb = ((t * pc.n_head + h) * pc.nsplit + s) * (HD + 2u);
            part[pb] = m[g];
            part[pb + 1u] = l[g];
            [[unroll]] for (uint e = 0u; e < NV; e++) {
                part[pb + 2u + 4u * e] = acc[g * NV + e].x;
                part[pb + 3u + 4u * e] = acc[g * NV + e].y;
                part[pb + 4u + 4u * e] = acc[g * NV + e].z;
                part[pb + 5u + 4u * e] = acc[g * NV + e].w;
            }
        }
    }
}
