# The Lua module on Windows (included by lua/CMakeLists.txt). Debian ships no mingw Lua, so the
# module is built against liblua5.4-dev's headers (plain C, the same on every system) and an
# import library of lua54.dll that dlltool makes from the lua_*/luaL_* names the module's object
# file really uses (lua54_implib.cmake). The result, <build>/lua/kvgen.dll, loads into any Lua
# 5.4 whose core is lua54.dll (as Lua's own Windows builds are). Not built here: the embedding
# library kvgen_lua_static, its C tests and samples/host, which need a mingw liblua to link.
find_path(KVGEN_LUA54_INCLUDE_DIR lua.h PATHS /usr/include/lua5.4 NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)
if(NOT KVGEN_LUA54_INCLUDE_DIR OR NOT CMAKE_NM OR NOT CMAKE_DLLTOOL)
  message(WARNING "kvgen: the Windows Lua module needs /usr/include/lua5.4 (liblua5.4-dev), nm and dlltool; not built")
  return()
endif()

add_library(kvgen_lua_objects OBJECT ${KVGEN_LUA_SOURCES})
target_include_directories(kvgen_lua_objects PUBLIC ${CMAKE_CURRENT_SOURCE_DIR} ${KVGEN_LUA54_INCLUDE_DIR})
target_include_directories(kvgen_lua_objects PRIVATE ${PROJECT_SOURCE_DIR}/core/base) # kvg_json.h
target_link_libraries(kvgen_lua_objects PUBLIC kvgen)
if(TARGET kvgen_shaders) # libkvgen carries the Vulkan backend
  target_compile_definitions(kvgen_lua_objects PRIVATE KVGEN_LUA_HAVE_DEVICES=1)
endif()

set(_implib ${CMAKE_CURRENT_BINARY_DIR}/liblua54.dll.a)
add_custom_command(OUTPUT ${_implib}
  COMMAND ${CMAKE_COMMAND} "-DOBJECTS=$<TARGET_OBJECTS:kvgen_lua_objects>" -DNM=${CMAKE_NM}
          -DDLLTOOL=${CMAKE_DLLTOOL} -DDEF=${CMAKE_CURRENT_BINARY_DIR}/lua54.def -DOUT=${_implib}
          -P ${CMAKE_CURRENT_SOURCE_DIR}/lua54_implib.cmake
  DEPENDS kvgen_lua_objects $<TARGET_OBJECTS:kvgen_lua_objects> ${CMAKE_CURRENT_SOURCE_DIR}/lua54_implib.cmake
  VERBATIM)
add_custom_target(kvgen_lua54_implib DEPENDS ${_implib})

# exports: luaopen_kvgen (and kvgen_*, which libkvgen's objects mark dllexport when KVGEN_SHARED)
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/kvgen_lua.def "EXPORTS\n    luaopen_kvgen\n")
add_library(kvgen_lua MODULE $<TARGET_OBJECTS:kvgen_lua_objects> ${CMAKE_CURRENT_BINARY_DIR}/kvgen_lua.def)
add_dependencies(kvgen_lua kvgen_lua54_implib)
target_link_libraries(kvgen_lua PRIVATE kvgen ${_implib} pthread)
set_target_properties(kvgen_lua PROPERTIES OUTPUT_NAME kvgen PREFIX "" SUFFIX ".dll"
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lua RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lua)
install(TARGETS kvgen_lua LIBRARY DESTINATION ${KVGEN_LUA_CMOD_DIR} RUNTIME DESTINATION ${KVGEN_LUA_CMOD_DIR})

# the module: exports luaopen_kvgen, imports lua54.dll for the Lua API and Windows' own DLLs
# otherwise (no libgcc or winpthreads DLL)
add_test(NAME lua_module_exports COMMAND sh -c
  "dump=$(${CMAKE_OBJDUMP} -p \"$0\") || exit 1; echo \"$dump\" | sed -n '/\\[Ordinal\\/Name Pointer\\] Table/,/^$/p' | awk 'NR > 1 && NF { print $NF }' | grep -qx luaopen_kvgen || { echo 'luaopen_kvgen not exported'; exit 1; }; dlls=$(echo \"$dump\" | sed -n 's/^[[:space:]]*DLL Name: //p' | grep -viE '^(kernel32|msvcrt|user32|advapi32|ntdll|lua54|api-ms-win-.*)\\.dll$'); [ -z \"$dlls\" ] || { echo \"imports $dlls\"; exit 1; }; echo \"$dump\" | grep -q 'DLL Name: lua54.dll' || { echo 'no lua54.dll import'; exit 1; }; echo ok"
  $<TARGET_FILE:kvgen_lua>)

# -DKVGEN_WINDOWS_LUA=<lua.exe of a Lua built as lua54.dll> (scripts/mingw-deps.sh makes one):
# the module loaded and used under the emulator (lua/tests/windows_smoke.lua)
set(KVGEN_WINDOWS_LUA "" CACHE FILEPATH "A Windows lua.exe (with lua54.dll beside it) for the module's smoke test")
if(KVGEN_WINDOWS_LUA AND CMAKE_CROSSCOMPILING_EMULATOR)
  add_test(NAME lua_module_load COMMAND sh -c
    "\"$0\" \"$1\" -o \"$3\" --layers 2 --embd 64 --heads 4 --kv-heads 2 --type Q4_1 >/dev/null && \"$0\" \"$2\" \"$4\" \"$3\" \"$3.session\""
    ${CMAKE_CROSSCOMPILING_EMULATOR} $<TARGET_FILE:kvgen-mkmodel> ${KVGEN_WINDOWS_LUA} ${CMAKE_BINARY_DIR}/testtmp/lua-smoke.gguf
    ${CMAKE_CURRENT_SOURCE_DIR}/tests/windows_smoke.lua)
  set_tests_properties(lua_module_load PROPERTIES TIMEOUT 600 PASS_REGULAR_EXPRESSION "^ok "
    ENVIRONMENT "LUA_CPATH=${CMAKE_BINARY_DIR}/lua/?.dll")
endif()
