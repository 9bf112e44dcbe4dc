# Finds the dependencies mih's targets link to and makes each an imported target: Threads,
# Torch (`torch`), nlohmann_json::nlohmann_json, CLI11::CLI11, OpenSSL::Crypto, GTest::gtest,
# stb::stb. Included by cmake/MihDependencies.cmake in the build, and installed with the
# package, where mihConfig.cmake includes it (MIH_FIND_DEPENDENCIES_FOR_PACKAGE ON) so that
# a consumer's find_package(mih) recreates what the exported targets name.
#
# In the package a missing dependency makes find_package(mih) fail, naming it (mih_FOUND
# FALSE, mih_NOT_FOUND_MESSAGE); in the build it is a configure error.

include(CMakeFindDependencyMacro)

# find_package(<pkg> <args...> REQUIRED), or find_dependency in the package.
macro(_mih_find_dependency pkg)
  if(MIH_FIND_DEPENDENCIES_FOR_PACKAGE)
    find_dependency(${pkg} ${ARGN})
  else()
    find_package(${pkg} ${ARGN} REQUIRED)
  endif()
endmacro()

# Fails the build's configure, or the package's find_package(mih), with the message parts.
macro(_mih_dependency_missing)
  string(CONCAT _mih_message ${ARGV})
  if(MIH_FIND_DEPENDENCIES_FOR_PACKAGE)
    set(mih_NOT_FOUND_MESSAGE "${_mih_message}")
    set(mih_FOUND FALSE)
    return()
  endif()
  message(FATAL_ERROR "${_mih_message}")
endmacro()

if(NOT MIH_FIND_DEPENDENCIES_FOR_PACKAGE)
  set(MIH_EXTRA_INCLUDE_DIR "" CACHE PATH "Extra include dir searched for nlohmann/json.hpp and CLI/CLI.hpp")
endif()

_mih_find_dependency(Threads)
# The package hints at the Torch it was built with (MIH_TORCH_DIR): the static libraries are
# compiled against its headers. CMAKE_PREFIX_PATH and Torch_DIR still come first.
if(NOT TARGET torch)
  if(MIH_TORCH_DIR)
    _mih_find_dependency(Torch HINTS "${MIH_TORCH_DIR}")
  else()
    _mih_find_dependency(Torch)
  endif()
endif()

# Header-only dependency: the package's config target, else a header in MIH_EXTRA_INCLUDE_DIR.
foreach(_mih_dep IN ITEMS "nlohmann_json;nlohmann/json.hpp" "CLI11;CLI/CLI.hpp")
  list(GET _mih_dep 0 _mih_pkg)
  list(GET _mih_dep 1 _mih_header)
  if(NOT TARGET ${_mih_pkg}::${_mih_pkg})
    find_package(${_mih_pkg} CONFIG QUIET)
  endif()
  if(NOT TARGET ${_mih_pkg}::${_mih_pkg})
    find_path(MIH_${_mih_pkg}_INCLUDE_DIR "${_mih_header}" HINTS "${MIH_EXTRA_INCLUDE_DIR}")
    if(NOT MIH_${_mih_pkg}_INCLUDE_DIR)
      _mih_dependency_missing("mih: ${_mih_pkg} not found (need ${_mih_header}); on Debian: apt-get "
                              "install nlohmann-json3-dev libcli11-dev, or pass -DMIH_EXTRA_INCLUDE_DIR=<dir>")
    endif()
    add_library(${_mih_pkg}::${_mih_pkg} INTERFACE IMPORTED GLOBAL)
    set_target_properties(${_mih_pkg}::${_mih_pkg} PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${MIH_${_mih_pkg}_INCLUDE_DIR}")
  endif()
endforeach()

# OpenSSL: SHA-256 of inputs and evidence (harness/base/sha256.h).
_mih_find_dependency(OpenSSL COMPONENTS Crypto)
# GoogleTest: the conformance suites are GoogleTest tests, so every conformance binary (the
# mih command included) links it, not only the harness's own tests.
_mih_find_dependency(GTest)

# stb_image (Debian libstb-dev: headers <stb/stb_image.h>, library libstb): harness/data
# decodes images through it. Imported, so its headers are SYSTEM (stb_image.h does not build
# with -Wextra -Werror).
if(NOT TARGET stb::stb)
  find_path(STB_INCLUDE_DIR stb/stb_image.h)
  find_library(STB_LIBRARY stb)
  if(NOT STB_INCLUDE_DIR OR NOT STB_LIBRARY)
    _mih_dependency_missing("mih: stb not found (need stb/stb_image.h and libstb: "
                            "STB_INCLUDE_DIR=${STB_INCLUDE_DIR}, STB_LIBRARY=${STB_LIBRARY}); "
                            "on Debian: apt-get install libstb-dev")
  endif()
  add_library(stb::stb UNKNOWN IMPORTED)
  set_target_properties(stb::stb PROPERTIES
    IMPORTED_LOCATION "${STB_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${STB_INCLUDE_DIR}")
endif()
