# Cross build for AArch64 Linux with Debian's gcc-aarch64-linux-gnu, tests run under
# qemu-user (scripts/test.sh's AArch64 stage):
#   cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DKVGEN_VULKAN=OFF -DKVGEN_LUA=OFF
# PCRE2 comes from the arm64 multiarch package (dpkg --add-architecture arm64;
# apt-get install libpcre2-dev:arm64). The library itself is built for the AArch64 baseline:
# the dotprod kernels carry their own target (core/cpu/qdot_arm.c).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(KVGEN_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${KVGEN_CROSS_TRIPLE}-gcc)
# the cross C library under /usr/aarch64-linux-gnu; multiarch packages (libpcre2-dev:arm64)
# under /usr/lib/aarch64-linux-gnu, found through the root "/"
set(CMAKE_FIND_ROOT_PATH /usr/${KVGEN_CROSS_TRIPLE} /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# Debian 12's cross gcc 12.2 crashes (internal compiler error in vect_transform_reduction) when
# it vectorizes some fmax reductions of the tests at -O3; loop vectorization off avoids it (the
# kernels are written with intrinsics, and float loops are not reassociated either way)
set(CMAKE_C_FLAGS_INIT "-fno-tree-loop-vectorize")
# pkg-config reads the arm64 .pc files only
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${KVGEN_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
# ctest runs the test programs under qemu-user; KVGEN_QEMU_CPU picks the emulated CPU
# (max: with the dot product; cortex-a53: without). -L makes the cross C library's dynamic
# loader the programs' interpreter; the library path makes that loader take the libc.so.6 of the
# same package too. Without it the loader looks in /lib/aarch64-linux-gnu, which -L does not
# find under /usr/aarch64-linux-gnu, so qemu falls back to the host's directory and the loader
# gets the libc6:arm64 that libpcre2-dev:arm64 pulled in: a loader and a C library of different
# builds, under which pthread_create never returns (every program that starts a thread hangs).
find_program(KVGEN_QEMU qemu-aarch64)
if(KVGEN_QEMU)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KVGEN_QEMU} -L /usr/${KVGEN_CROSS_TRIPLE}
      -E LD_LIBRARY_PATH=/usr/${KVGEN_CROSS_TRIPLE}/lib)
endif()
