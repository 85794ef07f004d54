#!/usr/bin/env python3
"""Dequantizes every tensor of a GGUF with gguf-py (gguf.quants.dequantize) and prints, per tensor,
its name, type, element count and a hash of the f32 bit patterns:
    h = sum over i of bits(x[i]) * (2*i + 1)   (mod 2^64, i the flat index)
test_real_tensors dequantizes the same file with kvgen's traits table and compares the hashes, so
every tensor must be bit-identical with gguf-py's dequantization.
Usage: scripts/oracle/tensor_hashes.py MODEL.gguf > core/tests/fixtures/NAME_tensor_hashes.txt"""
import importlib.metadata
import sys

import numpy as np
import gguf

CHUNK = 1 << 22


def tensor_hash(x):
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    h = np.uint64(0)
    with np.errstate(over="ignore"):
        for start in range(0, flat.size, CHUNK):
            bits = flat[start:start + CHUNK].view(np.uint32).astype(np.uint64)
            idx = np.arange(start, start + bits.size, dtype=np.uint64)
            h = np.uint64(h + np.sum(bits * (np.uint64(2) * idx + np.uint64(1)), dtype=np.uint64))
    return int(h)


def main():
    r = gguf.GGUFReader(sys.argv[1])
    print(f"# gguf-py {importlib.metadata.version('gguf')} dequantization of {sys.argv[1].split('/')[-1]}; "
          "name type elements hash")
    for t in r.tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type)
        print(f"{t.name} {t.tensor_type.name} {int(np.prod(t.shape))} {tensor_hash(x):016x}")


if __name__ == "__main__":
    main()
