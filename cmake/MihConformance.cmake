# Conformance binaries for model authors (DESIGN.md section 5).
#
# mih_add_conformance_suite(<name> SPECS <spec.cpp...> [PRESET <preset-or-json>]
#                           [DEPS <targets...>] [LABELS <labels...>] [TIMEOUT <seconds>]
#                           [PREFIXES <Prefix...>])
#   Builds `<name>`: the spec files (each with MIH_CONFORMANCE_SUITES), the conformance
#   suites, the GoogleTest runner, the rank worker and the mih CLI in one binary, and
#   registers one ctest test per (spec, case) named `<name>/<Prefix>/<Case>`, which runs every
#   suite on that case (`--gtest_filter=<Prefix>/*.*/<Case>`). Labels: conformance, the spec,
#   the case's group and axes (dp_shard, tp, sp, cp, ac, mb, resume), the suites that apply
#   to it, and LABELS; so `ctest -L tp` runs the tensor-parallel cases and `ctest -L Resume`
#   the cases the Resume suite asserts on. PRESET overrides every spec's matrix. The cases
#   share one evidence root, <build>/mih-evidence/<name>: each is launched once per ctest run
#   (the test `<name>/fresh` empties the root first) and a case's reference is launched by
#   whichever test needs it first. PREFIXES restricts the binary's tests to these
#   MIH_CONFORMANCE_SUITES registrations (when DEPS link spec files registering others).
#   A relative PRESET that names a file of the calling folder is made absolute (the tests
#   run in the build folder).
#
# In the build these come from cmake/ and the source tree; an outside project gets them from
# find_package(mih), which sets MIH_CMAKE_DIR, MIH_CONFORMANCE_MAIN, MIH_SUITES_TARGET
# (mih::suites) and MIH_CLI_TARGET (mih::cli) before including this file (cmake/mihConfig.cmake.in).
#
# mih_register_conformance_tests(<target> NAME <name> [PRESET ...] [LABELS ...] [TIMEOUT s]
#                                [LISTED_BY <targets...>])
#   The ctest registration alone, for a binary made otherwise (the mih command). LISTED_BY: the
#   binaries whose cases <target> lists when it is a front that runs another (the mih command
#   runs mih-core): the case list is made again when any of them is newer than it.
#
# mih_add_golden(<name> COMMAND <target> SPEC <spec> OUT <dir> [IMPL builtin|transformers]
#                [PRODUCER <plug-in file>] [PYTHON <python>] [RESULT_VARIABLE <var>])
#   The golden of the original model for a spec (docs/golden.md), made at build time:
#   `<target> golden --spec <spec> --out <dir>` (the float64 export, then the golden producer
#   MIH_GOLDEN_PRODUCER run by a Python with torch), redone when <target> is relinked or the
#   producer changes; target <name> is part of `all`. <var> is set to <dir>, or to "" (with a
#   warning) when no Python with torch is found: then there is no golden, and a spec whose
#   golden.dir is the empty string has no MatchesOriginal suite. PYTHON names the Python
#   (IMPL transformers needs one with transformers: MIH_TRANSFORMERS_PYTHON, which the scripts
#   install); without it MIH_PYTHON, else the python3 found, else /usr/bin/python3, the first
#   with torch. PRODUCER names a golden plug-in instead of IMPL: your own Python implementation
#   of an architecture mih has no builtin for (NAME, VERSION and forward on mih_golden_api.py,
#   docs/golden.md "Three ways to get a golden"), run by `<target> golden --plugin <file>`
#   (relative to the current source directory); the golden is redone when the file changes.

function(mih_register_conformance_tests target)
  cmake_parse_arguments(ARG "" "NAME;PRESET;TIMEOUT" "LABELS;PREFIXES;LISTED_BY" ${ARGN})
  set(listed_by "")
  foreach(t IN LISTS ARG_LISTED_BY)
    list(APPEND listed_by "$<TARGET_FILE:${t}>")
  endforeach()
  if(NOT ARG_NAME)
    set(ARG_NAME ${target})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 900)
  endif()
  set(root "${CMAKE_BINARY_DIR}/mih-evidence/${ARG_NAME}")
  set(matrix_args "")
  if(ARG_PRESET AND NOT IS_ABSOLUTE "${ARG_PRESET}" AND EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/${ARG_PRESET}")
    set(ARG_PRESET "${CMAKE_CURRENT_SOURCE_DIR}/${ARG_PRESET}")
  endif()
  if(ARG_PRESET)
    set(matrix_args "--matrix;${ARG_PRESET}")
  endif()
  if(ARG_PREFIXES)
    string(REPLACE ";" "," prefixes "${ARG_PREFIXES}")
    list(APPEND matrix_args "--prefixes" "${prefixes}")
  endif()
  add_test(NAME ${ARG_NAME}/fresh COMMAND ${CMAKE_COMMAND} -E rm -rf "${root}")
  set_tests_properties(${ARG_NAME}/fresh PROPERTIES FIXTURES_SETUP ${ARG_NAME}_evidence LABELS "conformance;${ARG_LABELS}")
  set(list_file "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_cases.cmake")
  file(GENERATE OUTPUT "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_conformance_include.cmake" CONTENT
    "set(MIH_EXE [=[$<TARGET_FILE:${target}>]=])
set(MIH_NAME [=[${ARG_NAME}]=])
set(MIH_LIST_FILE [=[${list_file}]=])
set(MIH_MATRIX_ARGS [=[${matrix_args}]=])
set(MIH_ROOT [=[${root}]=])
set(MIH_LABELS [=[${ARG_LABELS}]=])
set(MIH_TIMEOUT ${ARG_TIMEOUT})
set(MIH_WORKDIR [=[${CMAKE_CURRENT_BINARY_DIR}]=])
set(MIH_LISTED_BY [=[${listed_by}]=])
include([=[${MIH_CMAKE_DIR}/MihDiscoverCases.cmake]=])
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_conformance_include.cmake")
endfunction()

function(mih_add_conformance_suite name)
  cmake_parse_arguments(ARG "" "PRESET;TIMEOUT" "SPECS;DEPS;LABELS;PREFIXES" ${ARGN})
  if(NOT ARG_SPECS)
    message(FATAL_ERROR "mih_add_conformance_suite(${name}): SPECS is required (spec files with MIH_CONFORMANCE_SUITES)")
  endif()
  add_executable(${name} ${ARG_SPECS} "${MIH_CONFORMANCE_MAIN}")
  target_compile_features(${name} PRIVATE cxx_std_20)
  target_link_libraries(${name} PRIVATE ${MIH_SUITES_TARGET} ${MIH_CLI_TARGET} ${ARG_DEPS})
  set(extra "")
  foreach(kw PRESET TIMEOUT)
    if(ARG_${kw})
      list(APPEND extra ${kw} ${ARG_${kw}})
    endif()
  endforeach()
  if(ARG_PREFIXES)
    list(APPEND extra PREFIXES ${ARG_PREFIXES})
  endif()
  mih_register_conformance_tests(${name} NAME ${name} LABELS ${ARG_LABELS} ${extra})
endfunction()

function(mih_add_golden name)
  cmake_parse_arguments(ARG "" "COMMAND;SPEC;OUT;IMPL;PRODUCER;PYTHON;RESULT_VARIABLE" "" ${ARGN})
  foreach(kw COMMAND SPEC OUT)
    if(NOT ARG_${kw})
      message(FATAL_ERROR "mih_add_golden(${name}): ${kw} is required")
    endif()
  endforeach()
  if(NOT ARG_IMPL)
    set(ARG_IMPL builtin)
  endif()
  set(how --impl ${ARG_IMPL})
  set(plugin "")
  if(ARG_PRODUCER)
    if(ARG_IMPL STREQUAL "transformers")
      message(FATAL_ERROR "mih_add_golden(${name}): PRODUCER (your plug-in) and IMPL transformers name two originals; "
                          "give one of them")
    endif()
    get_filename_component(plugin "${ARG_PRODUCER}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    if(NOT EXISTS "${plugin}")
      message(FATAL_ERROR "mih_add_golden(${name}): PRODUCER ${plugin}: no such file (the Python file of your golden "
                          "plug-in)")
    endif()
    set(how --plugin "${plugin}")
    set(ARG_IMPL "plug-in ${ARG_PRODUCER}")
  endif()
  if(ARG_PYTHON)
    set(python "${ARG_PYTHON}")
  else()
    mih_find_golden_python()
    set(python "${MIH_GOLDEN_PYTHON}")
  endif()
  if(NOT python)
    message(WARNING "mih_add_golden(${name}): no Python with torch (MIH_PYTHON, or python3 with python3-torch), so "
                    "no golden of spec ${ARG_SPEC} and no MatchesOriginal suite on it")
    if(ARG_RESULT_VARIABLE)
      set(${ARG_RESULT_VARIABLE} "" PARENT_SCOPE)
    endif()
    return()
  endif()
  get_filename_component(producer_dir "${MIH_GOLDEN_PRODUCER}" DIRECTORY)
  file(GLOB producer_files "${producer_dir}/*.py")
  add_custom_command(
    OUTPUT "${ARG_OUT}/golden.json" "${ARG_OUT}/golden.safetensors"
    # The build owns its two outputs: a golden an older mih wrote there has no mih_golden.json,
    # and `mih golden` never overwrites a file it has no record of writing.
    COMMAND ${CMAKE_COMMAND} -E rm -f "${ARG_OUT}/golden.json" "${ARG_OUT}/golden.safetensors"
    COMMAND $<TARGET_FILE:${ARG_COMMAND}> golden --spec ${ARG_SPEC} --out "${ARG_OUT}" ${how}
            --python "${python}" --producer "${MIH_GOLDEN_PRODUCER}"
    DEPENDS ${ARG_COMMAND} ${producer_files} ${plugin}
    COMMENT "Golden of spec ${ARG_SPEC}: the original (${ARG_IMPL}) on its float64 export"
    VERBATIM)
  add_custom_target(${name} ALL DEPENDS "${ARG_OUT}/golden.json")
  if(ARG_RESULT_VARIABLE)
    set(${ARG_RESULT_VARIABLE} "${ARG_OUT}" PARENT_SCOPE)
  endif()
endfunction()

# Sets MIH_GOLDEN_PYTHON (cached) to the first Python with torch: MIH_PYTHON, else the python3
# CMake finds, else Debian's (python3-torch installs there); "" when none has torch.
macro(mih_find_golden_python)
  if(NOT DEFINED MIH_GOLDEN_PYTHON_OK)
    # MIH_PYTHON, else the python3 CMake finds, else Debian's (python3-torch installs there).
    set(candidates ${MIH_PYTHON})
    if(NOT MIH_PYTHON)
      find_package(Python3 COMPONENTS Interpreter QUIET)
      list(APPEND candidates ${Python3_EXECUTABLE} /usr/bin/python3)
    endif()
    set(ok FALSE)
    set(python "")
    foreach(candidate IN LISTS candidates)
      if(NOT ok AND EXISTS "${candidate}")
        execute_process(COMMAND "${candidate}" -c "import torch" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
        if(rc EQUAL 0)
          set(ok TRUE)
          set(python "${candidate}")
        endif()
      endif()
    endforeach()
    set(MIH_GOLDEN_PYTHON_OK ${ok} CACHE INTERNAL "a Python with torch runs the golden producer")
    set(MIH_GOLDEN_PYTHON "${python}" CACHE INTERNAL "the Python that runs the golden producer")
  endif()
endmacro()
