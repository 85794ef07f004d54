#!/usr/bin/env bash
# kvgen set-up: installs the Debian packages kvgen needs and fetches the default model and the
# sentence-embedding model all-MiniLM-L6-v2 (its tests skip where that fetch fails).
# Idempotent: skips what is already there. Run as root (or with sudo available).
#   KVGEN_MODEL=/path/to.gguf   use another model (nothing is downloaded then)
#   KVGEN_SKIP_PACKAGES=1       do not touch system packages
#   KVGEN_SKIP_MODEL=1          do not fetch the models
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

packages=(
  build-essential cmake pkg-config clang libclang-rt-dev
  libvulkan-dev mesa-vulkan-drivers glslc glslang-tools spirv-tools vulkan-validationlayers vulkan-tools
  lua5.4 liblua5.4-dev lua-busted luarocks
  libpcre2-dev libcurl4-openssl-dev python3-venv
  python3-jsonschema
  unzip ca-certificates
  gcc-mingw-w64-x86-64 wine64
)

install_packages() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: packages already installed"
    return
  fi
  echo "setup: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # the downloaded packages (well over 1 GiB with Wine and the cross compilers) are installed now
  $sudo apt-get clean
}

[ "${KVGEN_SKIP_PACKAGES:-0}" = 1 ] || install_packages
# the AArch64 stage of scripts/test.sh: the cross compiler, qemu-user and PCRE2 for arm64
# (a multiarch package, so dpkg learns the architecture first); KVGEN_SKIP_AARCH64=1 leaves it out
if [ "${KVGEN_SKIP_PACKAGES:-0}" != 1 ] && [ "${KVGEN_SKIP_AARCH64:-0}" != 1 ] &&
   [ "$(dpkg --print-architecture)" = amd64 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  dpkg --print-foreign-architectures | grep -qx arm64 || { $sudo dpkg --add-architecture arm64; $sudo apt-get update -qq; }
  packages=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libpcre2-dev:arm64)
  install_packages
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
  packages=(python3 python3-pip)
  [ "${KVGEN_SKIP_PACKAGES:-0}" = 1 ] || install_packages
fi
[ "${KVGEN_SKIP_MODEL:-0}" = 1 ] || [ -n "${KVGEN_MODEL:-}" ] || "$here/scripts/fetch_model.sh"
# the sentence-embedding model (all-MiniLM-L6-v2, converted to GGUF) for the embedding tests and
# samples/npc_memory.lua; without it those skip, so a failed fetch does not stop the set-up
if [ "${KVGEN_SKIP_MODEL:-0}" != 1 ] && [ -z "${KVGEN_MODEL:-}" ]; then
  "$here/scripts/fetch_model.sh" --minilm || echo "setup: all-MiniLM-L6-v2 not fetched: the embedding model's tests skip"
fi
