// select.glsl: the order in which argmax.comp and topk.comp rank logits, the same as the
// sampler's (core/generate/sampler.c): higher value first, lower index on ties, NaN as -inf, -0 as +0.
// Values are compared as keys, uints whose unsigned order is that float order, so no float
// comparison (and no denormal flushing) can make the device disagree with the host.
#ifndef KVG_SELECT_GLSL
#define KVG_SELECT_GLSL

uint kvg_key(uint bits) {
    if ((bits & 0x7fffffffu) > 0x7f800000u) bits = 0xff800000u; // NaN -> -inf
    if (bits == 0x80000000u) bits = 0u;                         // -0 -> +0
    return (bits & 0x80000000u) != 0u ? ~bits : (bits | 0x80000000u);
}

// a ranks before b
bool kvg_before(uint ka, uint ia, uint kb, uint ib) { return ka > kb || (ka == kb && ia < ib); }

#endif
