# How a folder becomes a target. Every component of harness/ and every test folder is made
# through these helpers, so warnings, the precompiled header and output paths are set in
# one place.
#
# How to add a component:
#   harness/foo/CMakeLists.txt:
#     mih_add_library(foo SRCS foo.cpp DEPS mih::runtime)
#   then `add_subdirectory(foo)` in harness/CMakeLists.txt and link `mih::foo` where needed.
#
# mih_add_library(<name> [OBJECT] [PCH] SRCS <files...> [LIGHT_SRCS <files...>] [DEPS <targets...>]
#                 [PRIVATE_DEPS <targets...>] [DEFINES <defs...>])
#   Creates target `mih_<name>` with alias `mih::<name>`, installed and exported as
#   `mih::<name>` too (cmake/MihInstall.cmake). DEPS are PUBLIC (a dependent gets them),
#   PRIVATE_DEPS are not. OBJECT makes an object library: use it for specs/ and
#   suites/, whose GoogleTest registrations a static archive would silently drop. PCH
#   reuses the shared precompiled header (torch, json) for the target's sources except
#   LIGHT_SRCS: sources that include no torch header compile faster without it.
#
# mih_add_test(<name> SRCS <files...> [DEPS <targets...>] [LABELS <labels...>]
#              [TIMEOUT <seconds>])
#   Creates the GoogleTest executable `build/bin/mih_<name>_tests` (our own main, which
#   fails when no test is linked) and registers one ctest test per GoogleTest suite under
#   LABELS, each with TIMEOUT seconds (default 300). MIH_TEST_SOURCE_DIR names the test's
#   source folder.
#
# mih_add_executable(<name> SRCS <files...> [DEPS <targets...>])
#   Creates `build/bin/<name>` with our warnings.

# Warnings as errors on our own code only (MIH_WERROR, on by default); imported targets' headers
# are SYSTEM.
# RelWithDebInfo keeps line tables only (-g1 after CMake's -g): backtraces of a crashed rank
# stay readable, while full debug info makes the torch precompiled header 1.5x slower.
# __FILE__ (GoogleTest's failure locations, MIH_INTERNAL_ASSERT, comm ledger call sites) is
# relative to the source tree ("suites/numeric_parity.cpp"), never the absolute path of the
# machine that built mih: the source dir, and the relative path ccache's base dir rewrites it
# to, are both mapped away (the debug line tables keep the real paths).
file(RELATIVE_PATH _mih_source_from_build "${PROJECT_BINARY_DIR}" "${PROJECT_SOURCE_DIR}")
string(REGEX REPLACE "/+$" "" _mih_source_from_build "${_mih_source_from_build}")
set(MIH_FILE_PREFIX_MAPS "-fmacro-prefix-map=${PROJECT_SOURCE_DIR}/=")
if(_mih_source_from_build AND NOT IS_ABSOLUTE "${_mih_source_from_build}")
  list(APPEND MIH_FILE_PREFIX_MAPS "-fmacro-prefix-map=${_mih_source_from_build}/=")
endif()
function(mih_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra $<$<BOOL:${MIH_WERROR}>:-Werror> $<$<CONFIG:RelWithDebInfo>:-g1>
                         ${MIH_FILE_PREFIX_MAPS})
  target_compile_features(${target} PUBLIC cxx_std_20)
endfunction()

# The one shared precompiled header. Built once, reused by every PCH target: one .gch of
# torch/torch.h is about 650 MB and a minute of compile time here, and it cuts a TU that
# uses ATen ops from ~14 s to ~4 s and one that uses torch::nn from ~40 s to ~17 s.
function(mih_use_pch target)
  if(NOT MIH_USE_PCH)
    return()
  endif()
  if(NOT TARGET mih_pch)
    add_library(mih_pch OBJECT "${PROJECT_SOURCE_DIR}/cmake/pch.cpp")
    mih_target_defaults(mih_pch)
    target_link_libraries(mih_pch PRIVATE torch nlohmann_json::nlohmann_json)
    if(MIH_WITH_GLOO)
      target_compile_definitions(mih_pch PRIVATE USE_C10D_GLOO)  # as on mih::compat's users
    endif()
    target_precompile_headers(mih_pch PRIVATE "${PROJECT_SOURCE_DIR}/cmake/mih_pch.h")
  endif()
  target_precompile_headers(${target} REUSE_FROM mih_pch)
endfunction()

function(mih_add_library name)
  cmake_parse_arguments(ARG "OBJECT;PCH" "" "SRCS;LIGHT_SRCS;DEPS;PRIVATE_DEPS;DEFINES" ${ARGN})
  if(ARG_OBJECT)
    add_library(mih_${name} OBJECT ${ARG_SRCS} ${ARG_LIGHT_SRCS})
  else()
    add_library(mih_${name} STATIC ${ARG_SRCS} ${ARG_LIGHT_SRCS})
  endif()
  if(ARG_LIGHT_SRCS)
    set_source_files_properties(${ARG_LIGHT_SRCS} PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
  endif()
  add_library(mih::${name} ALIAS mih_${name})
  set_target_properties(mih_${name} PROPERTIES EXPORT_NAME ${name})
  set_property(GLOBAL APPEND PROPERTY MIH_PACKAGE_TARGETS mih_${name})
  mih_target_defaults(mih_${name})
  # `#include "harness/..."` from the source tree, and from <prefix>/include once installed.
  target_include_directories(mih_${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                                $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(mih_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  if(ARG_DEFINES)
    target_compile_definitions(mih_${name} PRIVATE ${ARG_DEFINES})
  endif()
  if(ARG_PCH)
    mih_use_pch(mih_${name})
  endif()
endfunction()

function(mih_add_executable name)
  cmake_parse_arguments(ARG "PCH" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  mih_target_defaults(${name})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  if(ARG_PCH)
    mih_use_pch(${name})
  endif()
endfunction()

function(mih_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(exe mih_${name}_tests)
  add_executable(${exe} ${ARG_SRCS})
  mih_target_defaults(${exe})
  target_link_libraries(${exe} PRIVATE mih::gtest_main GTest::gtest GTest::gmock ${ARG_DEPS})
  target_compile_definitions(${exe} PRIVATE MIH_TEST_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
  mih_use_pch(${exe})
  # One ctest test per GoogleTest suite, listed when ctest runs (cmake/MihDiscoverSuites.cmake).
  set(list_file "${CMAKE_CURRENT_BINARY_DIR}/${exe}_suites.cmake")
  file(GENERATE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/${exe}_include.cmake" CONTENT
    "set(MIH_EXE [=[$<TARGET_FILE:${exe}>]=])
set(MIH_LIST_FILE [=[${list_file}]=])
set(MIH_LABELS [=[${ARG_LABELS}]=])
set(MIH_TIMEOUT ${ARG_TIMEOUT})
set(MIH_WORKDIR [=[${CMAKE_CURRENT_BINARY_DIR}]=])
include([=[${PROJECT_SOURCE_DIR}/cmake/MihDiscoverSuites.cmake]=])
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${CMAKE_CURRENT_BINARY_DIR}/${exe}_include.cmake")
endfunction()
