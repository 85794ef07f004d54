#!/usr/bin/env python3
"""Makes core/tests/fixtures/smollm2_tok.txt: varied strings and the token ids the reference
tokenizers give for the default model (SmolLM2-135M-Instruct, gpt2 BPE, pre-tokenizer "smollm").

Not run by CI; it documents how the fixture was produced. The ids come from llama.cpp's
llama-tokenize (no BOS, special tokens not parsed, escapes not processed). When the Hugging Face
tokenizer built from the same GGUF is installed (pip install transformers tokenizers sentencepiece
protobuf), every string is also tokenized with it and disagreements are written as '#' comments;
kvgen follows llama.cpp (GGUF semantics) where the two differ.

Usage: scripts/oracle/tokenizer_fixture.py [model.gguf] [llama-tokenize] > core/tests/fixtures/smollm2_tok.txt

Fixture format (read by core/tests/test_tokenizer.c): lines starting with '#' are comments; each
case is a line "T <hex of the UTF-8 bytes>" followed by a line "I <space-separated ids>".
"""
import os
import random
import subprocess
import sys
import tempfile

MODEL = sys.argv[1] if len(sys.argv) > 1 else "models/SmolLM2-135M-Instruct.Q4_1.gguf"
TOKENIZE = sys.argv[2] if len(sys.argv) > 2 else "/tmp/oracle/llama.cpp/build/bin/llama-tokenize"

HAND = [
    "", " ", "  ", "\n", "\n\n", "\t", " \t\n ", "Hello world", " Hello world", "Hello  world",
    "Hello, world! How's it going?", "I'm sure you'll like it; they've said we'd go.", "DON'T SHOUT, it's OK'S",
    "The year 2024 had 366 days.", "3.14159265358979", "1,000,000", "0x7fff_ffff", "-42 + 17 = -25", "1e-9",
    "phone: +1 (555) 123-4567", "ISBN 978-3-16-148410-0", "v1.2.3-rc.4", "12345678901234567890",
    "def f(x):\n    return x * 2\n", "int main(void) {\n\treturn 0;\n}\n", "for (i = 0; i < n; i++) a[i] += b[i];",
    "if x == None:\n        pass\n\n\n", "   leading spaces", "trailing spaces   ", "tabs\tand\ttabs",
    "mixed \t \n whitespace \r\n runs", "CRLF line\r\nnext line\r\n", "café naïve résumé façade", "Äpfel über Öl",
    "São Paulo, Zürich, Kraków, Ærøskøbing", "Ελληνικά κείμενα", "Русский текст, ещё немного", "עברית", "العربية",
    "日本語のテキスト", "中文文本，标点。", "한국어 텍스트", "ภาษาไทย", "हिन्दी पाठ", "emoji 😀 face",
    "👍🏽 thumbs with skin tone", "👨‍👩‍👧‍👦 family ZWJ", "🇫🇷 flag", "✅ done ❌ failed", "♥♦♣♠",
    "math: ∑ ∫ √ ∞ ≠ ≤ ≥", "«quotes» “curly” ‘single’", "em—dash en–dash", "ellipsis… and…", "non\u00a0breaking",
    "zero\u200bwidth", "soft\u00adhyphen", "<|im_start|>user", "<|im_end|>", "<|endoftext|>", "<s> </s>",
    "<repo_name>kvgen", "!!!!!!", "??????", "......", "''''''", "```python\nprint(1)\n```", "----====",
    "a" * 100, "ab" * 50, "ＦＵＬＬＷＩＤＴＨ", "ｈａｌｆ", "ℌ𝔢𝔩𝔩𝔬", "x²+y²=z²", "½ ¼ ¾", "١٢٣ ٤٥٦",
    "𝟙𝟚𝟛", "Ⅻ roman", "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Windows\\System32",
    "/usr/local/bin/kvgen --help", "{\"key\": [1, 2, 3], \"n\": null}", "<div class=\"x\">hi</div>",
    "SELECT * FROM t WHERE id = 7;", "$HOME ~user ^caret |pipe", "a\u0301 combining", "e\u0308\u0323",
    "next\u0085line", "ogham\u1680space", "line\u2028sep", "ideo\u3000space", "mongolian\u180evs", "bom\ufeffx",
    "thin\u2009space 10\u202f000", "   \u00a0  x", "x \u3000 y", "\r", "\r\n", " \n \n", "\x0b\x0c", "end \n",
]

WORDS = ("the of and to in is was for on are with as I his they be at one have this from or had by hot word but "
         "what some we can out other were all there when up use your how said an each she which do their time if "
         "will way about many then them write would like so these her long make thing see him two has look more "
         "day could go come did number sound no most people my over know water than call first who may down side "
         "been now find any new work part take get place made live where after back little only round man year "
         "came show every good me give our under name very through just form sentence great think say help low "
         "line differ turn cause much mean before move right boy old too same tell does set three want air well "
         "also play small end put home read hand port large spell add even land here must big high such follow "
         "act why ask men change went light kind off need house picture try us again animal point mother world "
         "near build self earth father Dragon Knight Elara Thornwood tavern quest").split()
EXTRA = ["é", "ü", "ß", "ñ", "日本", "東京", "😀", "🎉", "🚀", "™", "€", "£", "—", "…", "’", "中", "文", "ж", "λ"]
PUNCT = list(".,;:!?-()[]{}\"'/\\*&^%$#@~`|<>=+_")


def random_string(rng):
    kind = rng.randrange(6)
    n = rng.randint(1, 14)
    parts = []
    for _ in range(n):
        r = rng.random()
        if r < 0.55:
            w = rng.choice(WORDS)
            if rng.random() < 0.15:
                w = w.capitalize() if rng.random() < 0.7 else w.upper()
            parts.append(w)
        elif r < 0.7:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 8))))
        elif r < 0.8:
            parts.append(rng.choice(EXTRA))
        elif r < 0.9:
            parts.append("".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 3))))
        else:
            parts.append(rng.choice(["'s", "'t", "'re", "'ll", "'d", "'ve", "'m", "n't"]))
    seps = [" ", " ", " ", " ", "  ", "\n", "\t", "", " \n", "   "]
    out = parts[0]
    for p in parts[1:]:
        out += rng.choice(seps) + p
    if kind == 0:
        out = " " + out
    elif kind == 1:
        out += rng.choice(["\n", "  ", " ", "\n\n"])
    elif kind == 2:
        out = out.replace(" ", rng.choice([" ", "  "]))
    return out


def llama_ids(text):
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(text.encode("utf-8"))
        name = f.name
    try:
        out = subprocess.run([TOKENIZE, "-m", MODEL, "-f", name, "--ids", "--no-bos", "--no-parse-special",
                              "--no-escape", "--log-disable"], capture_output=True, check=True).stdout.decode()
    finally:
        os.unlink(name)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return [int(x) for x in line.strip("[]").split(",") if x.strip()]


def hf_tokenizer():
    """The Hugging Face tokenizer for the GGUF's vocabulary, or None when not installed.

    transformers' AutoTokenizer.from_pretrained(dir, gguf_file=...) is tried first; recent
    transformers versions need torch for it, so without torch the same tokenizer is assembled
    with the tokenizers library the way transformers' GGUF converter does for SmolLM2:
    BPE(vocab, merges) with Sequence[Digits(individual), ByteLevel(no prefix space)]."""
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(MODEL)),
                                            gguf_file=os.path.basename(MODEL))
        return lambda s: tok.encode(s, add_special_tokens=False, split_special_tokens=True)
    except Exception:
        pass
    try:
        import gguf
        from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    except ImportError:
        return None
    r = gguf.GGUFReader(MODEL)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = [tuple(m.split(" ", 1)) for m in r.fields["tokenizer.ggml.merges"].contents()]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    return lambda s: tok.encode(s, add_special_tokens=False).ids


def main():
    rng = random.Random(20240607)
    strings = list(HAND) + [random_string(rng) for _ in range(300 - len(HAND))]
    hf = hf_tokenizer()
    print("# kvgen tokenizer fixture for SmolLM2-135M-Instruct (gpt2 BPE, pre-tokenizer smollm)")
    print("# made by scripts/oracle/tokenizer_fixture.py with llama.cpp llama-tokenize --no-bos --no-parse-special")
    print("# format: 'T <hex UTF-8>' then 'I <ids>'; '#' lines are comments")
    agree = 0
    for s in strings:
        ids = llama_ids(s)
        if hf is not None:
            hids = hf(s)
            if hids == ids:
                agree += 1
            else:
                print("# hf differs: %s -> %s" % (s.encode().hex(), " ".join(map(str, hids))))
        print("T " + s.encode("utf-8").hex())
        print("I " + " ".join(map(str, ids)))
    if hf is not None:
        print("# hf agrees with llama.cpp on %d of %d strings" % (agree, len(strings)))
    sys.stderr.write("%d strings%s\n" % (len(strings), "" if hf is None else ", hf agrees on %d" % agree))


if __name__ == "__main__":
    main()
