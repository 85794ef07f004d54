#!/usr/bin/env bash
# Builds what the Windows cross-build needs and Debian ships no mingw build of, from Debian's own
# source packages: PCRE2 (the tokenizer's regex engine) as a static mingw library, and Lua 5.4
# as lua54.dll + lua.exe (only to run the Lua module's smoke test under Wine; the module itself
# links an import library made from its own object, lua/windows.cmake).
#   scripts/mingw-deps.sh PREFIX    installs into PREFIX (lib/, include/, lib/pkgconfig/, bin/)
# The sources come from Debian's source archive with apt-get (deb-src lists kept in a private
# folder, the system's apt set-up untouched), verified by apt against Debian's signed Sources
# index. Idempotent: what PREFIX has already is left as it is.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${1:?usage: mingw-deps.sh PREFIX}
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
work="$prefix/.work"
triple=x86_64-w64-mingw32
jobs=${KVGEN_JOBS:-2}

apt_ready=0
debian_source() { # package: downloads its source package into $work
  if [ "$apt_ready" = 0 ]; then
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
    apt_ready=1
  fi
  (cd "$work" && apt-get "${apt_opts[@]}" -qq source --download-only "$1")
}

if [ ! -f "$prefix/lib/libpcre2-8.a" ]; then
  debian_source pcre2
  tarball=$(ls "$work"/pcre2_*.orig.tar.* | head -n 1)
  rm -rf "$work/pcre2" && mkdir -p "$work/pcre2"
  tar xf "$tarball" -C "$work/pcre2" --strip-components=1
  cmake -S "$work/pcre2" -B "$work/pcre2-build" -DCMAKE_TOOLCHAIN_FILE="$here/cmake/mingw-w64-x86_64.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=OFF -DBUILD_STATIC_LIBS=ON \
    -DPCRE2_BUILD_PCRE2_8=ON -DPCRE2_BUILD_PCRE2_16=OFF -DPCRE2_BUILD_PCRE2_32=OFF -DPCRE2_SUPPORT_JIT=ON \
    -DPCRE2_SUPPORT_UNICODE=ON -DPCRE2_BUILD_PCRE2GREP=OFF -DPCRE2_BUILD_TESTS=OFF >"$work/pcre2.log" 2>&1 &&
    cmake --build "$work/pcre2-build" -j"$jobs" >>"$work/pcre2.log" 2>&1 &&
    cmake --install "$work/pcre2-build" >>"$work/pcre2.log" 2>&1 || { cat "$work/pcre2.log"; exit 1; }
  sed -i 's|^Cflags: -I${includedir} *$|Cflags: -I${includedir} -DPCRE2_STATIC|' "$prefix/lib/pkgconfig/libpcre2-8.pc"
  echo "mingw-deps: PCRE2 $(basename "$tarball") built into $prefix"
fi

if [ ! -f "$prefix/bin/lua.exe" ]; then
  debian_source lua5.4
  tarball=$(ls "$work"/lua5.4_*.orig.tar.* | head -n 1)
  rm -rf "$work/lua" && mkdir -p "$work/lua" "$prefix/bin"
  tar xf "$tarball" -C "$work/lua" --strip-components=1
  cc="$triple-gcc-win32"
  command -v "$cc" >/dev/null || cc="$triple-gcc"
  (cd "$work/lua/src" &&
   "$cc" -O2 -DLUA_BUILD_AS_DLL -shared -static-libgcc -o "$prefix/bin/lua54.dll" \
     $(ls ./*.c | grep -vE '/(lua|luac)\.c$') -Wl,--out-implib,"$work/liblua54.a" &&
   "$cc" -O2 -DLUA_BUILD_AS_DLL -static-libgcc -o "$prefix/bin/lua.exe" lua.c "$work/liblua54.a")
  echo "mingw-deps: Lua $(basename "$tarball") built into $prefix/bin"
fi
rm -rf "$work"
