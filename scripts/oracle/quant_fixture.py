#!/usr/bin/env python3
"""Makes core/tests/fixtures/quant/<TYPE>.bin: blocks of each quantized type kvgen computes with
and what gguf-py (the gguf package, llama.cpp's own Python reader) makes of them.

Not run by CI; it documents how the fixtures were produced. Needs `pip install gguf numpy`.
Usage: scripts/oracle/quant_fixture.py [OUT_DIR]   (default core/tests/fixtures/quant)

For every type the file holds raw blocks and gguf-py's dequantization of them
(gguf.quants.dequantize): hand-picked blocks (all-zero bytes; maximal levels with the largest
finite f16 scales; a block whose values are all negative; a byte ramp), blocks of random bytes
with random finite scales and, for the types gguf-py can quantize, the blocks it made from the
inputs below. For those types (gguf.quants.quantize does not raise NotImplementedError) the file
also holds f32 input blocks (zeros, large values, negative-only, ramps, exact rounding ties,
tiny values, a constant, random normals, outliers) and gguf-py's quantized bytes for them.

gguf-py has no Q8_K class (ggml uses Q8_K only for activations): its dequantization is computed
here with numpy from the layout (f32 d, int8 q[256], int16 bsums[16]; x = d * q, in f32).

Format (little-endian), read by core/tests/test_quant_kquant.c:
    char magic[4] = "KVQF"; uint32 version = 1, ggml type, block elements, block bytes,
    n_blocks, n_quant, 0
    uint8 blocks[n_blocks][block bytes]; f32 dequantized[n_blocks][block elements]
    f32 quant_input[n_quant][block elements]; uint8 quantized[n_quant][block bytes]
"""
import os
import struct
import sys
from importlib.metadata import version

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = sys.argv[1] if len(sys.argv) > 1 else "core/tests/fixtures/quant"
SEED = 20240611

# per type: the offsets of its scale fields (f16 unless noted) and how to make a block whose
# values are all <= 0 from random bytes: (offset, and-mask, or-mask) byte edits, then scale values
LAYOUT = {
    # name: (f16 scale offsets, f32 scale offsets, negative-only recipe)
    "Q4_0": ([0], [], {"mask": [(2, 18, 0x77, 0)], "scales": [1.0]}),            # nibbles < 8
    "Q4_1": ([0, 2], [], {"mask": [], "scales": [1.0, -40.0]}),                   # m far below
    "Q5_0": ([0], [], {"mask": [(2, 6, 0, 0)], "scales": [1.0]}),                  # qh = 0: q < 16
    "Q5_1": ([0, 2], [], {"mask": [], "scales": [1.0, -80.0]}),
    "Q8_0": ([0], [], {"mask": [(2, 34, 0x7f, 0x80)], "scales": [1.0]}),           # q < 0
    "Q2_K": ([80, 82], [], {"mask": [], "scales": [-1.0, 1.0]}),                   # d < 0, dmin > 0
    "Q3_K": ([108], [], {"mask": [(0, 32, 0, 0xff), (104, 108, 0x55, 0xaa)], "scales": [-1.0]}),  # q >= 0, scale >= 0
    "Q4_K": ([0, 2], [], {"mask": [], "scales": [-1.0, 1.0]}),
    "Q5_K": ([0, 2], [], {"mask": [], "scales": [-1.0, 1.0]}),
    "Q6_K": ([208], [], {"mask": [(128, 192, 0, 0), (192, 208, 0x7f, 0)], "scales": [1.0]}),   # q < 0, scale >= 0
    "Q8_K": ([], [0], {"mask": [(4, 260, 0x7f, 0x80)], "scales": [1.0]}),
    "IQ4_NL": ([0], [], {"mask": [(2, 18, 0x77, 0)], "scales": [1.0]}),           # levels < 0
    "IQ4_XS": ([0], [], {"mask": [(2, 4, 0x55, 0xaa), (8, 136, 0x77, 0)], "scales": [1.0]}),
}
TYPES = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K, T.IQ4_NL, T.IQ4_XS]


def set_scales(blk, f16_offs, f32_offs, values):
    offs = [(o, "e") for o in f16_offs] + [(o, "f") for o in f32_offs]
    for (o, kind), v in zip(offs, values):
        blk[o:o + (2 if kind == "e" else 4)] = np.frombuffer(struct.pack("<" + kind, v), dtype=np.uint8)


def random_scale(rng):
    return float(np.float16(rng.choice([-1, 1]) * 10.0 ** rng.uniform(-4, 2)))


def dequantize(qtype, blocks):
    if qtype == T.Q8_K:
        d = blocks[:, :4].copy().view(np.float32)
        q = blocks[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * q).astype(np.float32)
    return quants.dequantize(blocks, qtype).reshape(blocks.shape[0], -1).astype(np.float32)


def can_quantize(qtype, be):
    try:
        quants.quantize(np.zeros((1, be), dtype=np.float32), qtype)
        return True
    except NotImplementedError:
        return False


def quant_inputs(rng, be):
    rows = [
        np.zeros(be),
        rng.normal(size=be) * 1e4,                           # large magnitude
        -np.abs(rng.normal(size=be)) - 0.1,                  # negative only
        np.linspace(-1.0, 1.0, be),                          # ramp
        np.linspace(0.0, 3.0, be),                           # non-negative ramp
        (np.arange(be) - be // 2) * 0.5,                     # exact halves: rounding ties
        rng.normal(size=be) * 1e-6,                          # tiny: subnormal half scales
        np.full(be, 0.375),                                  # constant
        np.where(np.arange(be) == 5, 8.0, rng.normal(size=be) * 0.1),   # one outlier
        np.concatenate([np.full(be // 2, -2.0), np.full(be - be // 2, 2.0)]),  # +-extreme: first wins
    ]
    rows += [rng.normal(size=be) * s for s in (0.02, 0.05, 1.0, 3.0)]
    return np.stack(rows).astype(np.float32)


def make(qtype, rng):
    name = qtype.name
    be, bb = GGML_QUANT_SIZES[qtype]
    f16_offs, f32_offs, neg = LAYOUT[name]
    n_scales = len(f16_offs) + len(f32_offs)
    blocks = []
    blocks.append(np.zeros(bb, dtype=np.uint8))                              # all zero
    b = np.full(bb, 0xFF, dtype=np.uint8)                                    # maximal levels, largest scales
    set_scales(b, f16_offs, f32_offs, [65504.0] * len(f16_offs) + [1e30] * len(f32_offs))
    blocks.append(b)
    b = rng.integers(0, 256, bb, dtype=np.uint8)                             # negative only
    for lo, hi, andm, orm in neg["mask"]:
        b[lo:hi] = (b[lo:hi] & andm) | orm
    set_scales(b, f16_offs, f32_offs, neg["scales"])
    blocks.append(b)
    b = (np.arange(bb) * 7 % 256).astype(np.uint8)                           # byte ramp
    set_scales(b, f16_offs, f32_offs, [0.5, 0.25][:n_scales])
    blocks.append(b)
    n_random = 4 if be == 256 else 16
    for i in range(n_random):
        b = rng.integers(0, 256, bb, dtype=np.uint8)
        vals = [random_scale(rng) for _ in range(n_scales)]
        if i == 0 and f16_offs:
            vals[0] = float(np.float16(3e-6))                                # a subnormal half
        set_scales(b, f16_offs, f32_offs, vals)
        blocks.append(b)
    blocks = np.stack(blocks)

    qin = np.zeros((0, be), dtype=np.float32)
    qout = np.zeros((0, bb), dtype=np.uint8)
    if qtype != T.Q8_K and can_quantize(qtype, be):
        qin = quant_inputs(rng, be)
        qout = quants.quantize(qin, qtype).reshape(qin.shape[0], bb)
        blocks = np.concatenate([blocks, qout])
    deq = dequantize(qtype, blocks)
    assert deq.shape == (blocks.shape[0], be) and np.isfinite(deq).all(), name
    assert (deq[2] <= 0).all() and (deq[2] < 0).any(), f"{name}: the negative-only block is not"

    header = b"KVQF" + struct.pack("<7I", 1, int(qtype), be, bb, blocks.shape[0], qin.shape[0], 0)
    data = header + blocks.tobytes() + deq.astype("<f4").tobytes() + qin.astype("<f4").tobytes() + qout.tobytes()
    path = os.path.join(OUT, f"{name}.bin")
    with open(path, "wb") as f:
        f.write(data)
    print(f"{path}: {blocks.shape[0]} blocks, {qin.shape[0]} quantized by gguf-py, {len(data)} bytes")


def main():
    os.makedirs(OUT, exist_ok=True)
    print(f"gguf {version('gguf')}, numpy {np.__version__}")
    rng = np.random.default_rng(SEED)
    for qtype in TYPES:
        make(qtype, rng)


if __name__ == "__main__":
    main()
