# The ctest test `scaffold_project` (tests/CMakeLists.txt): a new author's first hour, with the
# installed package (the fixture test `mih_install` installs it into MIH_INSTALL_DIR):
#   1. `<install>/bin/mih scaffold --name tiny_gpt --out <build>/scaffold/tiny_gpt` (again on
#      a rerun: an unedited scaffold is mih's to rewrite);
#   2. the installed examples its README and the quickstart point at are there;
#   3. configure (once), build (its golden of the original GPT-2 made at build time with mih's
#      builtin producer), and run its ctest: the cpu-smoke matrix of the generated port, its
#      export and inspect, all as generated; MatchesOriginal ran and passed on its Reference;
#   4. the same project with two bugs planted in the port (model.h: the position embedding's
#      gradient not declared partial over tp, so under sequence parallelism it is never summed
#      over tp; the exact GELU where GPT-2 has the tanh one) must fail its Tp2Sp case as a
#      conformance failure (exit 1) localized to 'wpe', and MatchesOriginal on its Reference
#      (exit 1) localized to 'h.0': the GELU is the same in every configuration, so only the
#      golden of the original sees it.
# cmake -P with MIH_BUILD_DIR, MIH_INSTALL_DIR, MIH_GENERATOR, MIH_BUILD_TYPE,
# MIH_CXX_COMPILER, MIH_CCACHE (see tests/external_project/steps.cmake).
cmake_minimum_required(VERSION 3.22)
set(MIH_TEST_NAME scaffold_project)
include("${CMAKE_CURRENT_LIST_DIR}/../external_project/steps.cmake")
set(work "${MIH_BUILD_DIR}/scaffold")
set(mih "${MIH_INSTALL_DIR}/bin/mih")
string(TIMESTAMP t0 "%s")
# The two builds share cached objects (the installed conformance_main.cpp) whatever their
# folder: ccache leaves the working directory out of its hash.
set(ENV{CCACHE_NOHASHDIR} 1)

step(scaffold COMMAND "${mih}" scaffold --name tiny_gpt --out "${work}/tiny_gpt")
foreach(example reference_models/llama.cpp reference_models/llama.h specs/llama_spec.cpp specs/spec_support.h README.md)
  if(NOT EXISTS "${MIH_INSTALL_DIR}/share/mih/examples/${example}")
    message(FATAL_ERROR "scaffold_project: the installed examples lack ${example} (<prefix>/share/mih/examples, "
                        "cmake/MihInstall.cmake)")
  endif()
endforeach()
outside_configure("${work}/tiny_gpt" "${work}/build")
step(build COMMAND "${CMAKE_COMMAND}" --build "${work}/build")
step(test COMMAND "${CMAKE_CTEST_COMMAND}" --test-dir "${work}/build" --output-on-failure)
# ctest ran one case per process and every one passed: each case's state says so (a case that
# passed everything yet ended short of MATRIX_PASSED would disagree with the green).
file(GLOB states "${work}/build/mih-evidence/tiny_gpt_conformance/*/*/integration_state.json")  # <root>/<spec>/<case>
list(LENGTH states cases)
if(cases LESS 12)
  message(FATAL_ERROR "scaffold_project: its ctest run left ${cases} integration_state.json under "
                      "${work}/build/mih-evidence/tiny_gpt_conformance, not one per case of cpu-smoke")
endif()
foreach(state_file IN LISTS states)
  file(READ "${state_file}" state_json)
  string(JSON state GET "${state_json}" state)
  if(NOT state STREQUAL "MATRIX_PASSED")
    message(FATAL_ERROR "scaffold_project: every ctest test passed, yet ${state_file} is ${state}, not MATRIX_PASSED")
  endif()
endforeach()
file(STRINGS "${work}/build/mih-evidence/tiny_gpt_conformance/results.jsonl" original REGEX "TinyGpt/MatchesOriginal\\.")
list(FILTER original INCLUDE REGEX "\"status\":\"passed\"")
# results.jsonl gains a line per test each time the project's ctest runs: count the tests.
set(names "")
foreach(line IN LISTS original)
  string(REGEX MATCH "TinyGpt/MatchesOriginal\\.[A-Za-z]+/Reference" name "${line}")
  if(name)
    list(APPEND names "${name}")
  endif()
endforeach()
list(REMOVE_DUPLICATES names)
list(LENGTH names passed)
if(NOT passed EQUAL 4)
  message(FATAL_ERROR "scaffold_project: MatchesOriginal passed ${passed} test(s) on the generated port's Reference, "
                      "expected 4 (its golden of the original GPT-2: ${work}/build/golden)")
endif()
message(STATUS "scaffold_project: MatchesOriginal passed its 4 tests against the builtin GPT-2's golden")

# The planted bug: a scaffold of its own, edited, copied over the last one only where it
# differs (an unchanged bug build is not rebuilt).
file(REMOVE_RECURSE "${work}/bug-stage")
step(scaffold-for-bug QUIET COMMAND "${mih}" scaffold --name tiny_gpt --out "${work}/bug-stage")
file(READ "${work}/bug-stage/model.h" model)
set(correct "spec.tp_partial_grad = ctx.sequence_parallel();")
string(FIND "${model}" "${correct}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "scaffold_project: model.h no longer holds '${correct}', the line the planted bug replaces; "
                      "update tests/scaffold/run.cmake with the template")
endif()
string(REPLACE "${correct}" "spec.tp_partial_grad = false;" model "${model}")
set(gelu "at::gelu(c_fc(x), \"tanh\")")
string(FIND "${model}" "${gelu}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "scaffold_project: model.h no longer holds '${gelu}', the line the second planted bug replaces; "
                      "update tests/scaffold/run.cmake with the template")
endif()
string(REPLACE "${gelu}" "at::gelu(c_fc(x))" model "${model}")
file(WRITE "${work}/bug-stage/model.h" "${model}")
file(MAKE_DIRECTORY "${work}/bug")
file(GLOB staged RELATIVE "${work}/bug-stage" "${work}/bug-stage/*")
foreach(f IN LISTS staged)
  file(COPY_FILE "${work}/bug-stage/${f}" "${work}/bug/${f}" ONLY_IF_DIFFERENT)
endforeach()
file(REMOVE_RECURSE "${work}/bug-stage")
outside_configure("${work}/bug" "${work}/bug-build")
step(build-with-bug COMMAND "${CMAKE_COMMAND}" --build "${work}/bug-build")
file(REMOVE_RECURSE "${work}/bug-build/mih-evidence/bug")
execute_process(COMMAND "${work}/bug-build/tiny_gpt_conformance" --evidence-root "${work}/bug-build/mih-evidence/bug"
                        --no-progress "--gtest_filter=TinyGpt/*.*/Tp2Sp"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 1 OR NOT out MATCHES "localized to .wpe.")
  message("${out}")
  message(FATAL_ERROR "scaffold_project: the port with its position embedding's gradient never summed over tp "
                      "exited ${rc} on Tp2Sp; expected 1 (a conformance failure) localized to 'wpe'")
endif()
string(REGEX MATCH "[^\n]*wpe[^\n]*" named "${out}")
message(STATUS "scaffold_project: the planted bug fails Tp2Sp (exit 1): ${named}")
execute_process(COMMAND "${work}/bug-build/tiny_gpt_conformance" --evidence-root "${work}/bug-build/mih-evidence/bug"
                        --no-progress "--gtest_filter=TinyGpt/MatchesOriginal.*/Reference"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 1 OR NOT out MATCHES "localized to .h\\.0.")
  message("${out}")
  message(FATAL_ERROR "scaffold_project: the port with the exact GELU where GPT-2 has the tanh one exited ${rc} on "
                      "MatchesOriginal; expected 1 (a conformance failure against the golden) localized to 'h.0'")
endif()
string(REGEX MATCH "[^\n]*localized to 'h\\.0'[^\n]*" named "${out}")
message(STATUS "scaffold_project: the planted GELU fails MatchesOriginal (exit 1): ${named}")

string(TIMESTAMP t1 "%s")
math(EXPR total "${t1} - ${t0}")
message(STATUS "scaffold_project: passed in ${total} s")
