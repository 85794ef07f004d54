-- LuaRocks is optional. From the repository root:
--   luarocks --lua-version 5.4 make lua/kvgen-scm-1.rockspec               (root: /usr/local)
--   luarocks --lua-version 5.4 --tree DIR make lua/kvgen-scm-1.rockspec    (any other tree)
-- builds kvgen with CMake in build.luarocks/ (the library, the module, the CLI; no tests) and
-- installs kvgen.so where the tree's Lua modules go (/usr/local/lib/lua/5.4 for the system
-- tree, on lua5.4's default package.cpath), plus the `kvgen` and `kvgen-mkmodel` tools into the
-- tree's bin/. Set CMAKE_BUILD_PARALLEL_LEVEL for a parallel build.
rockspec_format = "3.0"
package = "kvgen"
version = "scm-1"
source = {
  url = "git+file://./", -- `luarocks make` builds the checkout it is run in
}
description = {
  summary = "Embeddable LLM text generation (llama-family GGUF models) for Lua 5.4",
  detailed = "Load a model once, give every NPC its own session (KV cache); CPU and Vulkan backends.",
  license = "MIT",
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    KVGEN_TESTS = "OFF",
  },
  -- only the module and the tools go into the tree (not the C headers, libkvgen.a, the CMake
  -- package), so no `cmake --install`; LuaRocks copies these
  install_pass = false,
  install = {
    lib = { kvgen = "build.luarocks/kvgen.so" },
    bin = {
      kvgen = "build.luarocks/kvgen",
      ["kvgen-mkmodel"] = "build.luarocks/kvgen-mkmodel",
    },
  },
}
