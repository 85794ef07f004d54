#!/usr/bin/env python3
"""Makes the all-MiniLM-L6-v2 fixtures from the sentence-transformers folder that
scripts/fetch_model.sh --minilm unpacks (config.json, model.safetensors, tokenizer.json, ...):

  core/tests/fixtures/minilm_wordpiece.txt  WordPiece ids of ~300 strings (accents, CJK, punctuation,
                                            numbers, control characters, long texts) from Hugging
                                            Face's `tokenizers` (tokenizer.json, [CLS]/[SEP] added,
                                            no truncation; no string holds a special token's
                                            name, which kvgen matches only when asked to)
  core/tests/fixtures/minilm_embed.txt      the unit embedding of 60 texts (the empty text and texts
                                            past the 256-token truncation among them)

Not run by CI. The embeddings come from sentence-transformers when it is importable (pip install
torch sentence-transformers); else from this file's own numpy forward pass over the safetensors
(BERT in float64, mean pooling over every token, L2 normalization: what sentence-transformers
computes for one unpadded text). The fixture's first line says which one made it.

Usage: scripts/oracle/minilm_fixture.py MODEL_DIR core/tests/fixtures

Formats (read by core/tests/test_embed_real.c): '#' lines are comments; a case is "T <hex of the
UTF-8 bytes>" followed by "I <ids>" (wordpiece) or "E <floats>" (embed).
"""
import json
import math
import os
import random
import sys

import numpy as np
from safetensors import safe_open
from tokenizers import Tokenizer

HAND = [
    "", " ", "\n", "Hello world", "Hello, world! How's it going?", "HELLO World", "héllo wörld", "Crème Brûlée",
    "naïve café résumé", "Ångström Øresund Æsir", "Łódź Kraków Gdańsk", "İstanbul ılık", "ﬁne ligature",
    "Straße", "Ελληνικά γλώσσα", "Άρης Ωμέγα", "Русский язык", "Ёлка йогурт", "Україна їжак",
    "日本語のテキスト", "中文字符测试", "한국어 텍스트", "混合 mixed 文本 text", "emoji 😀 and ❤️ hearts",
    "The year 2024 had 366 days.", "3.14159265358979", "1,000,000", "-42 + 17 = -25", "v1.2.3-rc.4",
    "phone: +1 (555) 123-4567", "e-mail: someone@example.com", "https://example.com/a?b=c&d=e",
    "quotes “double” ‘single’ «guillemets»", "dashes – and — em", "ellipsis… done", "¿Qué? ¡Sí!",
    "tab\there", "new\nline", "carriage\r\nreturn", "control\x01\x02chars", "zero\u200bwidth", "soft\u00adhyphen",
    "non\u00a0breaking", "ideographic\u3000space", "a" * 150, "supercalifragilisticexpialidocious",
    "unbelievably uncharacteristically", "The blacksmith forged a sword.",
    "#hashtag @mention $100 50% ^caret &amp; *star", "(parens) [brackets] {braces} <angles>",
    "Ç'est l'été", "façade coöperate", "Zürich Genève", "ÀÉÎÕÜ àéîõü", "ガギグゲゴ パピプペポ ヴ です ぶどう",
]

WORDS = ["the", "sword", "Dragon", "village", "élan", "über", "niño", "東京", "北京", "ソード", "마을", "мир",
         "λόγος", "42", "3.5", "1,024", "don't", "it's", "U.S.A.", "e.g.", "—", "!", "?", "...", "café",
         "İzmir", "Æther", "œuvre", "naïveté", "smith's", "x86_64", "C++", "#1", "日本", "Москва"]

SENTENCES = [
    "", "The blacksmith sells swords and shields.", "A dragon was seen near the northern village.",
    "The innkeeper serves warm stew every evening.", "Bandits attacked the caravan on the east road.",
    "The queen's crown was stolen from the vault.", "I love fresh bread in the morning.",
    "The weather is cold and rainy today.", "My brother left to become a knight.",
    "The old wizard lives in a tower by the lake.", "Gold coins are hidden under the well.",
    "The bridge collapsed after the storm.", "She sings beautifully at the festival.",
    "Wolves howl in the forest at night.", "The mine has been closed for ten years.",
    "A merchant from the south sells rare spices.", "The temple bell rings at dawn.",
    "Never trust the ferryman after dark.", "The harvest was poor this autumn.",
    "He owes me twenty silver pieces.", "Where can I buy a sword?", "Who stole the crown?",
    "Is it going to rain tomorrow?", "What does the innkeeper cook?", "Tell me about the dragon.",
    "The cat sat on the mat.", "Quantum entanglement puzzles physicists.", "Café au lait, s'il vous plaît.",
    "Die Straße ist sehr lang.", "El niño comió una manzana.", "東京は日本の首都です。", "我喜欢学习中文。",
    "Москва — столица России.", "Η Αθήνα είναι όμορφη.", "숲속의 작은 집", "1 + 1 = 2, and 2 * 3 = 6.",
    "!!!???...", "UPPER CASE SHOUTING", "mIxEd CaSe TeXt", "tab\tseparated\tvalues",
    "line one\nline two", "a", "supercalifragilisticexpialidocious", "email me at npc@village.example",
    "The price is $19.99 (tax included).", "😀 emoji only", "control\x01char", "zero\u200bwidth joiner",
    "The knight rode north to face the dragon, carrying his father's sword and a shield painted with "
    "the crest of the old kingdom, while the villagers watched from the walls and prayed for his return.",
]


def long_texts(rng):
    """texts well past 256 tokens"""
    out = []
    for k in range(4):
        words = [rng.choice(WORDS + ["village", "dragon", "sword", "market", "river"]) for _ in range(300 + 100 * k)]
        out.append(" ".join(words))
    out.append(("The story goes on and on. " * 80).strip())
    out.append("word " * 1000)
    return out


def tokenizer_strings(rng):
    out = list(HAND)
    for _ in range(240):
        n = rng.randint(1, 12)
        s = ""
        for _ in range(n):
            w = rng.choice(WORDS)
            if rng.random() < 0.2:
                w = w.upper()
            s += w + rng.choice([" ", " ", " ", "", ", ", "\n", "\t", "  "])
        out.append(s)
    out += long_texts(rng)
    return out


def hexs(s):
    return s.encode("utf-8").hex()


class NumpyBert:
    """BERT's forward pass in float64 for one unpadded text."""

    def __init__(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            self.cfg = json.load(f)
        st = safe_open(os.path.join(folder, "model.safetensors"), "np")
        self.w = {k: st.get_tensor(k).astype(np.float64) for k in st.keys() if not k.endswith("position_ids")}

    def ln(self, x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.cfg["layer_norm_eps"]) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def lin(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def embed(self, ids):
        w, n = self.w, len(ids)
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] + \
            w["embeddings.token_type_embeddings.weight"][0]
        x = self.ln(x, "embeddings.LayerNorm")
        H = self.cfg["num_attention_heads"]
        hd = self.cfg["hidden_size"] // H
        erf = np.vectorize(math.erf)
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q = self.lin(x, p + "attention.self.query").reshape(n, H, hd).transpose(1, 0, 2)
            k = self.lin(x, p + "attention.self.key").reshape(n, H, hd).transpose(1, 0, 2)
            v = self.lin(x, p + "attention.self.value").reshape(n, H, hd).transpose(1, 0, 2)
            s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            a = (s @ v).transpose(1, 0, 2).reshape(n, H * hd)
            x = self.ln(x + self.lin(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = self.lin(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
            x = self.ln(x + self.lin(h, p + "output.dense"), p + "output.LayerNorm")
        e = x.mean(0)
        return e / np.linalg.norm(e)


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    folder, out_dir = argv[1], argv[2]
    rng = random.Random(7)
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    import tokenizers
    with open(os.path.join(out_dir, "minilm_wordpiece.txt"), "w", encoding="utf-8") as f:
        f.write(f"# all-MiniLM-L6-v2 WordPiece ids from Hugging Face tokenizers {tokenizers.__version__} "
                "(tokenizer.json, [CLS]/[SEP] added, no truncation); made by scripts/oracle/minilm_fixture.py\n")
        for s in tokenizer_strings(rng):
            f.write(f"T {hexs(s)}\nI {' '.join(str(i) for i in tok.encode(s).ids)}\n")

    texts = SENTENCES + long_texts(random.Random(11))
    try:
        from sentence_transformers import SentenceTransformer
        import sentence_transformers
        model = SentenceTransformer(folder, device="cpu")
        vecs = model.encode(texts, normalize_embeddings=True, batch_size=16)
        how = f"sentence-transformers {sentence_transformers.__version__} (torch, float32)"
    except ImportError:
        bert = NumpyBert(folder)
        tok.enable_truncation(256)
        vecs = [bert.embed(tok.encode(t).ids) for t in texts]
        how = "the numpy float64 BERT forward pass of scripts/oracle/minilm_fixture.py (sentence-transformers absent)"
    with open(os.path.join(out_dir, "minilm_embed.txt"), "w", encoding="utf-8") as f:
        f.write(f"# all-MiniLM-L6-v2 unit embeddings (mean pooling, 256-token truncation) from {how}\n")
        for t, v in zip(texts, vecs):
            f.write(f"T {hexs(t)}\nE {' '.join('%.7g' % x for x in v)}\n")
    print(f"wrote {len(tokenizer_strings(random.Random(7)))} tokenizer cases and {len(texts)} embeddings ({how})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
