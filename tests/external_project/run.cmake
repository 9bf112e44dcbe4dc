# The ctest test `external_project` (tests/CMakeLists.txt): uses mih as an outside project
# does. cmake -P with
#   MIH_BUILD_DIR   mih's build folder, built completely (cmake --install copies, never builds)
#   MIH_SOURCE      this folder
#   MIH_GENERATOR, MIH_BUILD_TYPE, MIH_CXX_COMPILER, MIH_CCACHE (may be empty): as mih's build
# Steps: install mih into <build>/external/install, configure this folder into
# <build>/external/build against it (once; the build step reconfigures when the installed
# package changes), build it, run its ctest. Each step that fails stops the test with a
# non-zero exit naming the step. A second run reuses both folders: only what changed in mih
# is reinstalled, relinked and rerun.
cmake_minimum_required(VERSION 3.22)

foreach(var MIH_BUILD_DIR MIH_SOURCE MIH_GENERATOR)
  if(NOT ${var})
    message(FATAL_ERROR "external_project: ${var} is not set (run through ctest, see tests/CMakeLists.txt)")
  endif()
endforeach()
set(install_dir "${MIH_BUILD_DIR}/external/install")
set(build_dir "${MIH_BUILD_DIR}/external/build")
string(TIMESTAMP t0 "%s")

# Runs one step; on failure prints its output (when captured) and fails, naming the step.
# QUIET captures the output (printed only on failure); HINT follows the failure message;
# REMOVE_ON_FAILURE is deleted when the step fails.
function(step name)
  cmake_parse_arguments(ARG "QUIET" "HINT;REMOVE_ON_FAILURE" "COMMAND" ${ARGN})
  string(TIMESTAMP start "%s")
  message(STATUS "external_project: ${name}")
  if(ARG_QUIET)
    execute_process(COMMAND ${ARG_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  else()
    execute_process(COMMAND ${ARG_COMMAND} RESULT_VARIABLE rc)
  endif()
  string(TIMESTAMP end "%s")
  math(EXPR seconds "${end} - ${start}")
  if(NOT rc STREQUAL "0")
    if(ARG_QUIET)
      message("${out}")
    endif()
    if(ARG_REMOVE_ON_FAILURE)
      file(REMOVE "${ARG_REMOVE_ON_FAILURE}")
    endif()
    string(REPLACE ";" " " command "${ARG_COMMAND}")
    message(FATAL_ERROR "external_project: step '${name}' FAILED (exit ${rc}) after ${seconds} s: ${command}${ARG_HINT}")
  endif()
  message(STATUS "external_project: ${name}: ok in ${seconds} s")
endfunction()

step(install QUIET COMMAND "${CMAKE_COMMAND}" --install "${MIH_BUILD_DIR}" --prefix "${install_dir}"
     HINT "\nis mih's build complete? (cmake --build ${MIH_BUILD_DIR})")

if(NOT EXISTS "${build_dir}/CMakeCache.txt")
  set(args -S "${MIH_SOURCE}" -B "${build_dir}" -G "${MIH_GENERATOR}" "-DCMAKE_PREFIX_PATH=${install_dir}")
  if(MIH_BUILD_TYPE)
    list(APPEND args "-DCMAKE_BUILD_TYPE=${MIH_BUILD_TYPE}")
  endif()
  if(MIH_CXX_COMPILER)
    list(APPEND args "-DCMAKE_CXX_COMPILER=${MIH_CXX_COMPILER}")
  endif()
  if(MIH_CCACHE)
    list(APPEND args "-DCMAKE_CXX_COMPILER_LAUNCHER=${MIH_CCACHE}")
  endif()
  # A failed configure leaves a cache behind: drop it, so the next run configures again.
  step(configure COMMAND "${CMAKE_COMMAND}" ${args} REMOVE_ON_FAILURE "${build_dir}/CMakeCache.txt")
endif()
step(build COMMAND "${CMAKE_COMMAND}" --build "${build_dir}")
step(test COMMAND "${CMAKE_CTEST_COMMAND}" --test-dir "${build_dir}" --output-on-failure)

string(TIMESTAMP t1 "%s")
math(EXPR total "${t1} - ${t0}")
message(STATUS "external_project: passed in ${total} s")
