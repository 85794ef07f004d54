#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#ifdef SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
// attn.comp: causal attention of ncols query tokens over the layer's KV cache, online softmax.
// Dispatch: (n_kv, ceil(ncols / TQ), nsplit), WG invocations. One workgroup handles every query
// head that shares KV head gl_WorkGroupID.x (G = n_head / n_kv) for TQ consecutive tokens (a
// query tile: R = G * TQ <= 8 query rows, row r is token t0 + r / G, head r % G), so each cached
// K/V element it reads serves all R rows: a prefill step of n tokens reads the cache n / TQ times
// instead of n times. TQ > 1 only where the tile's tokens share one page table (a prefill step;
// a batched step's columns are sessions of their own). Query t sits at position kvg_pos(t)
// (common.glsl) and sees positions [first, kvg_pos(t)]: first is 0, or on a sliding-window layer
// (pc.window) the oldest position inside the window; the tile walks the union of its rows' spans
// and each row masks the positions it does not see. Split s covers a contiguous 1/nsplit of that
// union (decode splits long contexts so that several workgroups share the work;
// attn_reduce.comp merges the partial results, a row without positions in a split leaving
// m = -1e30, l = 0 there); scores are soft-capped where pc.softcap says (gemma2).
// Bindings: 0 params, 2 q (token t at t*ldq, head h at h*hd, already rotated), 3 out (DIRECT:
// t*ldo + h*hd), 5/10 the KV cache (kv.glsl: the pool's slabs, the page table), 7 partials
// (not DIRECT: per (t, h, s): m, l, acc[hd]).
// SUBGROUP (the attn_sg variant, for devices with subgroup arithmetic): a tile's maximum score
// and sum of weights per query head come from subgroupMax / subgroupAdd and one shared value per
// subgroup, instead of every invocation reading all WG scores and weights from shared memory.
// Positions are walked WG at a time. lavapipe's 65,535-iteration limit counts every loop iteration
// of an invocation together (about (2 + G * TQ) * WG + head_dim / 8 per tile here), so the host
// chooses nsplit so that one split covers at most 4,096 positions.
layout(constant_id = 0) const uint WG = 64;
layout(constant_id = 5) const uint KV_F16 = 1;
layout(constant_id = 6) const uint DIRECT = 1;
layout(constant_id = 8) const uint GQ = 1; // query heads per KV head (<= 8)
layout(constant_id = 9) const uint HD = 64; // head_dim (even, <= 256)
layout(constant_id = 15) const uint TQ = 1; // tokens per workgroup (GQ * TQ <= 8)
layout(local_size_x_id = 0) in;

#define KVG_OWN_PC
#include "common.glsl"

layout(push_constant) uniform PC {
    uint n_head, n_kv, hd, ldq, ldo, n_ctx, nsplit, ncols;
    float scale;
    uint kv_layer, kv_page, kv_v, pt_base; // paged KV (kv.glsl)
    uint window;   // > 0: a sliding-window layer, a query at pos sees [pos - window + 1, pos] only
    float softcap; // > 0: scores become softcap * tanh(score / softcap)
    uint split_min; // the fewest positions a split covers (the host's choice: 64 or 256)
} pc;

// the first position a query at pos sees
uint attn_first(uint pos) { return pc.window > 0u && pos >= pc.window ? pos - pc.window + 1u : 0u; }
// soft-capping of a (scaled) score; the argument of tanh bounded as in epilogue.glsl
float attn_cap(float s) { return pc.softcap > 0.0 ? pc.softcap * tanh(clamp(s / pc.softcap, -15.0, 15.0)) : s; }

layout(std430, set = 0, binding = 2) readonly buffer Q { float qin[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Out { float yout[]; };
#include "kv.glsl"
layout(std430, set = 0, binding = 7) writeonly buffer Part { float part[]; };

const uint MAXG = GQ * TQ, MAXHD = HD, MAXD = (HD + WG - 1u) / WG; // MAXG: the query rows
const uint DU = HD % 8u == 0u ? 8u : HD % 4u == 0u ? 4u : 2u;      // score loop: elements per trip
#ifdef SUBGROUP
// per (query row, subgroup): the tile's maximum score, the sum of its weights
shared float sg_max[MAXG * WG], sg_sum[MAXG * WG];
#else
shared float sc[MAXG * WG];
#endif
shared float pr[MAXG * WG];
shared float qs[MAXG * MAXHD]; // the query rows, scaled

// where the V row of each position of the current tile starts, found once per tile by its lane
shared uint v_slab[WG], v_elem[WG];

kv_ref kv_row(uint tab, bool is_k, uint kvh, uint p) {
    return kv_locate(tab, pc.kv_layer, pc.kv_v, pc.kv_page, pc.hd, is_k, kvh, p);
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint kvh = gl_WorkGroupID.x, t0 = gl_WorkGroupID.y * TQ, s = gl_WorkGroupID.z;
    const uint G = GQ, R = MAXG;
    const uint hd = HD;
    // each token's span [tfirst, tlen) (empty for a token past the step's), shared by its G rows,
    // and their union
    uint tfirst[TQ], tlen[TQ];
    uint len = 0u, first = 0xffffffffu;
    [[unroll]] for (uint j = 0u; j < TQ; j++) {
        uint t = t0 + j;
        tlen[j] = t < pc.ncols ? kvg_pos(t) + 1u : 0u;
        tfirst[j] = t < pc.ncols ? attn_first(tlen[j] - 1u) : 0u;
        if (t < pc.ncols) {
            len = max(len, tlen[j]);
            first = min(first, tfirst[j]);
        }
    }
    uint tab = kvg_tab(t0, pc.pt_base);
    // at least split_min positions per split: short contexts leave the later splits empty (cheap)
    // rather than paying every split's fixed cost for a few positions each
    uint chunk = max((len - first + pc.nsplit - 1u) / pc.nsplit, max(pc.split_min, 1u));
    uint p_begin = min(len, first + s * chunk), p_end = min(len, p_begin + chunk);

    // the scaled queries of the R rows, loaded once by the workgroup; every lane reads each of
    // them (the same address across lanes: a broadcast) for each of its positions. Held per
    // invocation instead, up to 8 x 256 floats would not fit a GPU's registers.
    for (uint i = tid; i < R * HD; i += WG) {
        uint r = i / HD, t = t0 + r / G;
        qs[i] = t < pc.ncols ? qin[t * pc.ldq + (kvh * G + r % G) * hd + i % HD] * pc.scale : 0.0;
    }
    barrier();

    float m[MAXG], l[MAXG], acc[MAXG * MAXD];
    [[unroll]] for (uint g = 0u; g < MAXG; g++) {
        m[g] = -1e30;
        l[g] = 0.0;
        [[unroll]] for (uint e = 0u; e < MAXD; e++) acc[g * MAXD + e] = 0.0;
    }
    for (uint base = p_begin; base < p_end; base += WG) {
        uint nvalid = min(WG, p_end - base);
        uint p = base + tid;
        float own[MAXG]; // this invocation's score per query row (-1e30: no position)
        [[unroll]] for (uint g = 0u; g < R; g++) own[g] = -1e30;
        if (tid < nvalid) {
            kv_ref kr = kv_row(tab, true, kvh, p);
            kv_ref vr = kv_row(tab, false, kvh, p);
            v_slab[tid] = vr.slab;
            v_elem[tid] = vr.e;
            float sg[MAXG]; // in registers: one shared-memory write per score
            [[unroll]] for (uint g = 0u; g < R; g++) sg[g] = 0.0;
            // DU elements per trip, unrolled; the whole head_dim unrolled for 8 rows would be
            // thousands of shared-memory loads in one body, which Mesa 25's lavapipe (a shader
            // with barriers compiled as an LLVM coroutine) takes minutes to compile
            for (uint d0 = 0u; d0 < HD; d0 += DU)
                [[unroll]] for (uint d = d0; d < d0 + DU; d += 2u) {
                    vec2 kv = kv_load2(kr, d);
                    [[unroll]] for (uint g = 0u; g < R; g++)
                        sg[g] += kv.x * qs[g * MAXHD + d] + kv.y * qs[g * MAXHD + d + 1u];
                }
            [[unroll]] for (uint g = 0u; g < R; g++)
                if (p >= tfirst[g / G] && p < tlen[g / G]) own[g] = attn_cap(sg[g]);
        }
#ifdef SUBGROUP
        [[unroll]] for (uint g = 0u; g < R; g++) {
            float smax = subgroupMax(own[g]);
            if (subgroupElect()) sg_max[g * WG + gl_SubgroupID] = smax;
        }
#else
        [[unroll]] for (uint g = 0u; g < R; g++) sc[g * WG + tid] = own[g];
#endif
        barrier();
        [[unroll]] for (uint g = 0u; g < R; g++) {
            float tmax = -1e30;
#ifdef SUBGROUP
            for (uint i = 0u; i < gl_NumSubgroups; i++) tmax = max(tmax, sg_max[g * WG + i]);
#else
            for (uint i = 0u; i < nvalid; i++) tmax = max(tmax, sc[g * WG + i]);
#endif
            float mnew = max(m[g], tmax);
            float corr = exp(m[g] - mnew);
            m[g] = mnew;
            l[g] *= corr;
            [[unroll]] for (uint e = 0u; e < MAXD; e++) acc[g * MAXD + e] *= corr;
            float w = own[g] > -1e30 ? exp(own[g] - mnew) : 0.0; // 0 where the row sees no position
            pr[g * WG + tid] = w;
#ifdef SUBGROUP
            float ssum = subgroupAdd(w);
            if (subgroupElect()) sg_sum[g * WG + gl_SubgroupID] = ssum;
#endif
        }
        barrier();
        [[unroll]] for (uint g = 0u; g < R; g++) {
#ifdef SUBGROUP
            for (uint i = 0u; i < gl_NumSubgroups; i++) l[g] += sg_sum[g * WG + i];
#else
            for (uint i = 0u; i < nvalid; i++) l[g] += pr[g * WG + i];
#endif
        }
        [[unroll]] for (uint e = 0u; e < MAXD; e++) {
            uint d = tid + e * WG;
            if (d >= hd) break;
            for (uint i = 0u; i < nvalid; i++) {
                kv_ref vr;
                vr.slab = v_slab[i];
                vr.e = v_elem[i];
                float v = kv_load1(vr, d);
                [[unroll]] for (uint g = 0u; g < R; g++) acc[g * MAXD + e] += pr[g * WG + i] * v;
            }
        }
        barrier();
    }

    [[unroll]] for (uint g = 0u; g < R; g++) {
        uint h = kvh * G + g % G, t = t0 + g / G;
        if (t >= pc.ncols) continue;
        if (DIRECT != 0u) {
            float inv = l[g] > 0.0 ? 1.0 / l[g] : 0.0;
            [[unroll]] for (uint e = 0u; e < MAXD; e++) {
                uint d = tid + e * WG;
                if (d < hd) yout[t * pc.ldo + h * hd + d] = acc[g * MAXD + e] * inv;
            }
        } else {
            uint pb = ((t * pc.n_head + h) * pc.nsplit + s) * (hd + 2u);
            if (tid == 0u) {
                part[pb] = m[g];
                part[pb + 1u] = l[g];
            }
            [[unroll]] for (uint e = 0u; e < MAXD; e++) {
                uint d = tid + e * WG;
                if (d < hd) part[pb + 2u + d] = acc[g * MAXD + e];
            }
        }
    }
}
