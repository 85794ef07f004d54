#!/usr/bin/env python3
"""Converts a sentence-transformers BERT folder (config.json, model.safetensors, tokenizer.json,
sentence_bert_config.json, 1_Pooling/config.json) into a GGUF file kvgen runs as `bert`.

    convert_bert.py MODEL_DIR OUT.gguf [--f32]

The file is laid out as llama.cpp's converter lays out BERT, so either program reads it:
tensors token_embd, position_embd, token_types, token_embd_norm, blk.N.attn_q/k/v,
attn_output, attn_output_norm, ffn_up, ffn_down, layer_output_norm (weights and biases);
metadata under bert. (context_length, embedding_length, feed_forward_length, block_count,
attention.head_count, attention.layer_norm_epsilon, attention.causal = false, pooling_type
1 mean / 2 cls); tokenizer.ggml.model = "bert" with the vocabulary in the converter's spelling
(word starts prefixed with U+2581, continuations without "##"). Matrices are F16 (F32 with
--f32); norms, biases and token types stay F32.

context_length is sentence-transformers' max_seq_length when the folder has it (the length the
model was trained to embed, 256 for all-MiniLM-L6-v2), else max_position_embeddings: kvgen cuts
longer texts there, as sentence-transformers does. Needs the PyPI packages gguf, numpy and
safetensors.
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFWriter
from safetensors import safe_open

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_UNUSED = 1, 2, 3, 5


def read_json(folder, name, default=None):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        if default is not None:
            return default
        sys.exit(f"convert_bert.py: {path} is missing")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def vocabulary(folder):
    """Token texts by id in the converter's spelling, their types, and the special ids."""
    tok = read_json(folder, "tokenizer.json")
    model = tok.get("model", {})
    if model.get("type") != "WordPiece":
        sys.exit("convert_bert.py: tokenizer.json is not a WordPiece tokenizer")
    vocab = model["vocab"]
    texts = [None] * len(vocab)
    for text, i in vocab.items():
        texts[i] = text
    if any(t is None for t in texts):
        sys.exit("convert_bert.py: tokenizer.json's vocabulary has holes in its ids")
    prefix = model.get("continuing_subword_prefix", "##")
    specials = {t["content"] for t in tok.get("added_tokens", []) if t.get("special")}
    unk = model.get("unk_token", "[UNK]")
    out, types = [], []
    for t in texts:
        if t == unk:
            out.append(t)
            types.append(TOKEN_UNKNOWN)
        elif t in specials:
            out.append(t)
            types.append(TOKEN_CONTROL)
        elif t.startswith("[unused") and t.endswith("]"):
            out.append(t)
            types.append(TOKEN_UNUSED)
        elif t.startswith(prefix):
            out.append(t[len(prefix):])
            types.append(TOKEN_NORMAL)
        else:
            out.append("\u2581" + t)
            types.append(TOKEN_NORMAL)
    ids = {name: vocab.get(name, -1) for name in ("[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]")}
    return out, types, ids


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2 if len(argv) < 3 else 0
    folder, out_path = argv[1], argv[2]
    f32 = "--f32" in argv[3:]
    cfg = read_json(folder, "config.json")
    st_cfg = read_json(folder, "sentence_bert_config.json", {})
    pool_cfg = read_json(folder, os.path.join("1_Pooling", "config.json"), {})
    if cfg.get("model_type") != "bert" or cfg.get("hidden_act", "gelu") != "gelu":
        sys.exit("convert_bert.py: config.json is not a BERT model with the GELU activation")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        sys.exit("convert_bert.py: only absolute position embeddings are supported")
    n_layer = cfg["num_hidden_layers"]
    ctx = st_cfg.get("max_seq_length") or cfg["max_position_embeddings"]
    ctx = min(ctx, cfg["max_position_embeddings"])
    pooling = 2 if pool_cfg.get("pooling_mode_cls_token") else 1

    w = GGUFWriter(out_path, "bert")
    w.add_string("general.name", os.path.basename(os.path.normpath(folder)))
    w.add_uint32("general.file_type", 0 if f32 else 1)
    w.add_uint32("bert.context_length", ctx)
    w.add_uint32("bert.embedding_length", cfg["hidden_size"])
    w.add_uint32("bert.feed_forward_length", cfg["intermediate_size"])
    w.add_uint32("bert.block_count", n_layer)
    w.add_uint32("bert.attention.head_count", cfg["num_attention_heads"])
    w.add_float32("bert.attention.layer_norm_epsilon", cfg.get("layer_norm_eps", 1e-12))
    w.add_bool("bert.attention.causal", False)
    w.add_uint32("bert.pooling_type", pooling)

    tokens, types, ids = vocabulary(folder)
    w.add_string("tokenizer.ggml.model", "bert")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    # the rows of token_types.weight, as llama.cpp's converter records them (its loader needs it)
    w.add_uint32("tokenizer.ggml.token_type_count", cfg.get("type_vocab_size", 2))
    for key, name in (("cls_token_id", "[CLS]"), ("seperator_token_id", "[SEP]"), ("unknown_token_id", "[UNK]"),
                      ("padding_token_id", "[PAD]"), ("mask_token_id", "[MASK]")):
        if ids[name] >= 0:
            w.add_uint32("tokenizer.ggml." + key, ids[name])

    weights = safe_open(os.path.join(folder, "model.safetensors"), "np")
    names = set(weights.keys())
    base = "bert." if any(n.startswith("bert.") for n in names) else ""

    def get(name):
        if base + name not in names:
            sys.exit(f"convert_bert.py: tensor {base + name} is missing")
        return weights.get_tensor(base + name).astype(np.float32)

    def add(gguf_name, hf_name, matrix, rows=None):
        t = get(hf_name)
        if rows is not None:
            t = np.ascontiguousarray(t[:rows])
        w.add_tensor(gguf_name, t if (f32 or not matrix) else t.astype(np.float16))

    add("token_embd.weight", "embeddings.word_embeddings.weight", True)
    # the positions past the truncation length are never used: the table keeps context_length
    # rows, as llama.cpp's loader expects of a file's position embeddings
    add("position_embd.weight", "embeddings.position_embeddings.weight", True, ctx)
    add("token_types.weight", "embeddings.token_type_embeddings.weight", False)
    add("token_embd_norm.weight", "embeddings.LayerNorm.weight", False)
    add("token_embd_norm.bias", "embeddings.LayerNorm.bias", False)
    parts = [("attn_q", "attention.self.query"), ("attn_k", "attention.self.key"), ("attn_v", "attention.self.value"),
             ("attn_output", "attention.output.dense"), ("attn_output_norm", "attention.output.LayerNorm"),
             ("ffn_up", "intermediate.dense"), ("ffn_down", "output.dense"),
             ("layer_output_norm", "output.LayerNorm")]
    for i in range(n_layer):
        for gguf_part, hf_part in parts:
            norm = gguf_part.endswith("norm")
            add(f"blk.{i}.{gguf_part}.weight", f"encoder.layer.{i}.{hf_part}.weight", not norm)
            add(f"blk.{i}.{gguf_part}.bias", f"encoder.layer.{i}.{hf_part}.bias", False)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"convert_bert.py: wrote {out_path} ({len(tokens)} tokens, {n_layer} layers, context {ctx}, "
          f"{'F32' if f32 else 'F16'})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
