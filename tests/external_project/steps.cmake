# What the outside-project tests share (cmake -P scripts: install.cmake, run.cmake,
# tests/scaffold/run.cmake): step(), one command whose failure stops the test naming it, and
# outside_configure(), the configure of a project against the installed package.
#
# step(<name> [QUIET] [HINT text] [REMOVE_ON_FAILURE file] [OUTPUT_VARIABLE var] COMMAND ...)
#   Runs COMMAND; on failure prints its output (when captured) and fails, naming the step.
#   QUIET captures the output (printed only on failure); OUTPUT_VARIABLE captures it into
#   `var` too; HINT follows the failure message; REMOVE_ON_FAILURE is deleted on failure.
#   Prints each step's wall time: `<MIH_TEST_NAME>: <name>: ok in N s`.
function(step name)
  cmake_parse_arguments(ARG "QUIET" "HINT;REMOVE_ON_FAILURE;OUTPUT_VARIABLE" "COMMAND" ${ARGN})
  string(TIMESTAMP start "%s")
  message(STATUS "${MIH_TEST_NAME}: ${name}")
  if(ARG_QUIET OR ARG_OUTPUT_VARIABLE)
    execute_process(COMMAND ${ARG_COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  else()
    execute_process(COMMAND ${ARG_COMMAND} RESULT_VARIABLE rc)
  endif()
  string(TIMESTAMP end "%s")
  math(EXPR seconds "${end} - ${start}")
  if(ARG_OUTPUT_VARIABLE)
    set(${ARG_OUTPUT_VARIABLE} "${out}" PARENT_SCOPE)
  endif()
  if(NOT rc STREQUAL "0")
    if(ARG_QUIET OR ARG_OUTPUT_VARIABLE)
      message("${out}")
    endif()
    if(ARG_REMOVE_ON_FAILURE)
      file(REMOVE "${ARG_REMOVE_ON_FAILURE}")
    endif()
    string(REPLACE ";" " " command "${ARG_COMMAND}")
    message(FATAL_ERROR "${MIH_TEST_NAME}: step '${name}' FAILED (exit ${rc}) after ${seconds} s: ${command}${ARG_HINT}")
  endif()
  message(STATUS "${MIH_TEST_NAME}: ${name}: ok in ${seconds} s")
endfunction()

# outside_configure(<source dir> <build dir> [extra cmake args...])
#   Configures the project once against ${MIH_INSTALL_DIR} with mih's generator, build type,
#   compiler and compiler launcher (MIH_GENERATOR, MIH_BUILD_TYPE, MIH_CXX_COMPILER,
#   MIH_CCACHE); a later run reuses the build folder (its build step reconfigures when the
#   installed package changed). A failed configure drops its cache, so the next run configures
#   again.
function(outside_configure source build)
  if(EXISTS "${build}/CMakeCache.txt")
    return()
  endif()
  set(args -S "${source}" -B "${build}" -G "${MIH_GENERATOR}" "-DCMAKE_PREFIX_PATH=${MIH_INSTALL_DIR}" ${ARGN})
  if(MIH_BUILD_TYPE)
    list(APPEND args "-DCMAKE_BUILD_TYPE=${MIH_BUILD_TYPE}")
  endif()
  if(MIH_CXX_COMPILER)
    list(APPEND args "-DCMAKE_CXX_COMPILER=${MIH_CXX_COMPILER}")
  endif()
  if(MIH_CCACHE)
    list(APPEND args "-DCMAKE_CXX_COMPILER_LAUNCHER=${MIH_CCACHE}")
  endif()
  step(configure COMMAND "${CMAKE_COMMAND}" ${args} REMOVE_ON_FAILURE "${build}/CMakeCache.txt")
endfunction()

foreach(var MIH_BUILD_DIR MIH_GENERATOR MIH_INSTALL_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "${MIH_TEST_NAME}: ${var} is not set (run through ctest, see tests/CMakeLists.txt)")
  endif()
endforeach()
