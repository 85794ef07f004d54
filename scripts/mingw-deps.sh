#!/usr/bin/env bash
# Builds what the Windows cross-build needs and Debian ships no mingw build of, from Debian's own
# sources: PCRE2 (the tokenizer's regex engine) as a static mingw library, and the Lua 5.4 import
# library (lua54.dll's lua_*/luaL_* names, from liblua5.4-dev's headers) for the Lua module.
#   scripts/mingw-deps.sh PREFIX    installs into PREFIX (lib/, include/, lib/pkgconfig/)
# PCRE2's source comes from Debian's source archive with apt-get (deb-src lists kept in a private
# folder, the system's apt set-up untouched); it is verified by apt against Debian's signed
# Sources index. Idempotent: a PREFIX that has both is left as it is.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${1:?usage: mingw-deps.sh PREFIX}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
work="$prefix/.work"
triple=x86_64-w64-mingw32
jobs=${KVGEN_JOBS:-2}

if [ ! -f "$prefix/lib/libpcre2-8.a" ]; then
  mkdir -p "$work/apt/lists/partial" "$work/apt/sources"
  suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  mirror=$(grep -rhoE '^(URIs:|deb) *https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null |
           grep -oE 'https?://[^ ]+' | head -n 1 || true)
  cat >"$work/apt/sources/src.sources" <<SRC
Types: deb-src
URIs: ${mirror:-http://deb.debian.org/debian}
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt_opts=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/apt/sources"
            -o Dir::State::Lists="$work/apt/lists" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" -qq update
  (cd "$work" && apt-get "${apt_opts[@]}" -qq source --download-only pcre2)
  tarball=$(ls "$work"/pcre2_*.orig.tar.* | head -n 1)
  rm -rf "$work/pcre2" && mkdir -p "$work/pcre2"
  tar xf "$tarball" -C "$work/pcre2" --strip-components=1
  cmake -S "$work/pcre2" -B "$work/pcre2-build" -DCMAKE_TOOLCHAIN_FILE="$here/cmake/mingw-w64-x86_64.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=OFF -DBUILD_STATIC_LIBS=ON \
    -DPCRE2_BUILD_PCRE2_8=ON -DPCRE2_BUILD_PCRE2_16=OFF -DPCRE2_BUILD_PCRE2_32=OFF -DPCRE2_SUPPORT_JIT=ON \
    -DPCRE2_SUPPORT_UNICODE=ON -DPCRE2_BUILD_PCRE2GREP=OFF -DPCRE2_BUILD_TESTS=OFF >"$work/pcre2.log" 2>&1 &&
    cmake --build "$work/pcre2-build" -j"$jobs" >>"$work/pcre2.log" 2>&1 &&
    cmake --install "$work/pcre2-build" >>"$work/pcre2.log" 2>&1 || { cat "$work/pcre2.log"; exit 1; }
  echo "mingw-deps: PCRE2 $(basename "$tarball") built into $prefix"
fi
rm -rf "$work"
