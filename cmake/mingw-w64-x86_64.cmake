# Cross-compiling kvgen for 64-bit Windows with Debian's mingw-w64 (gcc-mingw-w64-x86-64):
#   cmake -S . -B build-win -DCMAKE_TOOLCHAIN_FILE=cmake/mingw-w64-x86_64.cmake \
#         -DKVGEN_PCRE2_ROOT=<prefix of a mingw PCRE2 build (scripts/mingw-deps.sh)>
# The win32 thread model: kvgen's threads are Win32's own (core/base/platform.c), so nothing
# needs libwinpthread-1.dll at run time. Tests run under Wine (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR x86_64)
set(KVGEN_MINGW_TRIPLE x86_64-w64-mingw32)

find_program(CMAKE_C_COMPILER NAMES ${KVGEN_MINGW_TRIPLE}-gcc-win32 ${KVGEN_MINGW_TRIPLE}-gcc REQUIRED)
find_program(CMAKE_RC_COMPILER NAMES ${KVGEN_MINGW_TRIPLE}-windres)
find_program(CMAKE_DLLTOOL NAMES ${KVGEN_MINGW_TRIPLE}-dlltool)

set(CMAKE_FIND_ROOT_PATH /usr/${KVGEN_MINGW_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# the C runtime's libgcc linked in, so that the binaries need only Windows' own DLLs
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static-libgcc")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-static-libgcc")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "-static-libgcc")

find_program(KVGEN_WINE NAMES wine wine64 PATHS /usr/lib/wine NO_CMAKE_FIND_ROOT_PATH)
if(KVGEN_WINE)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KVGEN_WINE})
endif()
