-- LuaRocks is optional: `luarocks make lua/kvgen-scm-1.rockspec` from the repository root builds
-- kvgen with CMake and installs the Lua module into the rocks tree.
rockspec_format = "3.0"
package = "kvgen"
version = "scm-1"
source = {
  url = "git+file://./", -- `luarocks make` builds the checkout it is run in
}
description = {
  summary = "Embeddable LLM text generation (llama-family GGUF models) for Lua 5.4",
  detailed = "Load a model once, give every NPC its own session (KV cache); CPU reference and Vulkan backends.",
  license = "MIT",
}
dependencies = {
  "lua >= 5.4, < 5.5",
}
build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "Release",
    CMAKE_INSTALL_PREFIX = "$(PREFIX)",
    KVGEN_LUA_CMOD_DIR = "$(LIBDIR)",
  },
}
