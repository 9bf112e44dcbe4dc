# The ctest test `scaffold_project` (tests/CMakeLists.txt): a new author's first hour, with the
# installed package (the fixture test `mih_install` installs it into MIH_INSTALL_DIR):
#   1. `<install>/bin/mih scaffold --name tiny_gpt --out <build>/scaffold/tiny_gpt` (again on
#      a rerun: an unedited scaffold is mih's to rewrite);
#   2. the installed examples its README and the quickstart point at are there;
#   3. configure (once), build (its golden of the original GPT-2 made at build time with mih's
#      builtin producer), and run its ctest: the cpu-smoke matrix of the generated port, its
#      export and inspect, all as generated; MatchesOriginal ran and passed on its Reference;
#   3b. the same for `mih scaffold --name tiny_llama --template llama`: the Llama-style port
#      (GQA with tp 4 above its KV heads, rotary, SwiGLU, pipeline stages), its golden of the
#      original Llama, its whole cpu-smoke matrix with the pp cases, export and inspect;
#   4. the GPT-2 project with two bugs planted in the port (model.h: the position embedding's
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

# scaffold_and_pass(<name> <Prefix> <template> <fewest cases>): the project `mih scaffold
# --name <name> --template <template>` writes into ${work}/<name> configures against the
# install, builds (its golden made at build time) and passes its ctest as generated: every
# case's state MATRIX_PASSED, at least <fewest cases> of them, and MatchesOriginal's 4 tests
# passed on its Reference.
function(scaffold_and_pass name prefix template fewest)
  set(dir "${work}/${name}")
  set(build "${work}/build")
  if(NOT name STREQUAL "tiny_gpt")
    set(build "${work}/${name}-build")
  endif()
  step(scaffold-${template} COMMAND "${mih}" scaffold --name ${name} --template ${template} --out "${dir}")
  outside_configure("${dir}" "${build}")
  step(build-${template} COMMAND "${CMAKE_COMMAND}" --build "${build}")
  step(test-${template} COMMAND "${CMAKE_CTEST_COMMAND}" --test-dir "${build}" --output-on-failure)
  # ctest ran one case per process and every one passed: each case's state says so (a case
  # that passed everything yet ended short of MATRIX_PASSED would disagree with the green).
  set(evidence "${build}/mih-evidence/${name}_conformance")
  file(GLOB states "${evidence}/*/*/integration_state.json")  # <root>/<spec>/<case>
  list(LENGTH states cases)
  if(cases LESS ${fewest})
    message(FATAL_ERROR "scaffold_project: the ${template} project's ctest run left ${cases} integration_state.json "
                        "under ${evidence}, not one per case of cpu-smoke (${fewest} or more)")
  endif()
  foreach(state_file IN LISTS states)
    file(READ "${state_file}" state_json)
    string(JSON state GET "${state_json}" state)
    if(NOT state STREQUAL "MATRIX_PASSED")
      message(FATAL_ERROR "scaffold_project: every ctest test passed, yet ${state_file} is ${state}, not MATRIX_PASSED")
    endif()
  endforeach()
  file(STRINGS "${evidence}/results.jsonl" original REGEX "${prefix}/MatchesOriginal\\.")
  list(FILTER original INCLUDE REGEX "\"status\":\"passed\"")
  # results.jsonl gains a line per test each time the project's ctest runs: count the tests.
  set(names "")
  foreach(line IN LISTS original)
    string(REGEX MATCH "${prefix}/MatchesOriginal\\.[A-Za-z]+/Reference" test "${line}")
    if(test)
      list(APPEND names "${test}")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES names)
  list(LENGTH names passed)
  if(NOT passed EQUAL 4)
    message(FATAL_ERROR "scaffold_project: MatchesOriginal passed ${passed} test(s) on the ${template} port's "
                        "Reference, expected 4 (its golden of the original: ${build}/golden)")
  endif()
  message(STATUS "scaffold_project: the ${template} port passed ${cases} cases and MatchesOriginal's 4 tests against "
                 "its golden")
endfunction()

foreach(example reference_models/llama.cpp reference_models/llama.h specs/llama_spec.cpp specs/spec_support.h README.md)
  if(NOT EXISTS "${MIH_INSTALL_DIR}/share/mih/examples/${example}")
    message(FATAL_ERROR "scaffold_project: the installed examples lack ${example} (<prefix>/share/mih/examples, "
                        "cmake/MihInstall.cmake)")
  endif()
endforeach()
scaffold_and_pass(tiny_gpt TinyGpt gpt2 12)
# The Llama-style template: 12 cases as GPT-2's, and Tp4 and the 7 pipeline cases (5 pp
# configurations and the resumes into and out of pp stages).
scaffold_and_pass(tiny_llama TinyLlama llama 20)

# A porter's own architecture (docs/golden.md, "Three ways to get a golden"): the llama scaffold
# declared as model_type "mytoy", which mih ships no builtin for, its golden made at build time
# by the plug-in tests/scaffold/mytoy_golden.py (mih_add_golden ... PRODUCER, through the real
# `<binary> golden --plugin`); MatchesOriginal passes against it, golden.json names the plug-in,
# its version and SHA-256; the same plug-in with a wrong equation (the rotary table at theta
# 10000, not the config's) fails MatchesOriginal (exit 1); a plug-in without NAME is refused
# (exit 11, naming NAME).
set(toy "${work}/tiny_toy")
file(REMOVE_RECURSE "${work}/toy-stage")
step(scaffold-for-plugin QUIET COMMAND "${mih}" scaffold --name tiny_toy --template llama --out "${work}/toy-stage")
file(READ "${work}/toy-stage/spec.cpp" spec)
set(declared "s.checkpoint.hf = {\"llama\",\n                     {\"LlamaForCausalLM\"},")
string(FIND "${spec}" "${declared}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "scaffold_project: the llama template's spec.cpp no longer declares '${declared}'; update "
                      "tests/scaffold/run.cmake with the template")
endif()
string(REPLACE "${declared}" "s.checkpoint.hf = {\"mytoy\",\n                     {\"MyToyForCausalLM\"}," spec "${spec}")
file(WRITE "${work}/toy-stage/spec.cpp" "${spec}")
file(READ "${work}/toy-stage/CMakeLists.txt" lists)
string(REPLACE "SPEC tiny_toy OUT" "SPEC tiny_toy PRODUCER mytoy_golden.py OUT" lists "${lists}")
file(WRITE "${work}/toy-stage/CMakeLists.txt" "${lists}")
file(COPY_FILE "${CMAKE_CURRENT_LIST_DIR}/mytoy_golden.py" "${work}/toy-stage/mytoy_golden.py")
file(MAKE_DIRECTORY "${toy}")
file(GLOB staged RELATIVE "${work}/toy-stage" "${work}/toy-stage/*")
foreach(f IN LISTS staged)
  file(COPY_FILE "${work}/toy-stage/${f}" "${toy}/${f}" ONLY_IF_DIFFERENT)
endforeach()
file(REMOVE_RECURSE "${work}/toy-stage")
outside_configure("${toy}" "${work}/toy-build")
step(build-with-plugin COMMAND "${CMAKE_COMMAND}" --build "${work}/toy-build")
file(READ "${work}/toy-build/golden/golden.json" manifest)
string(JSON impl_name GET "${manifest}" implementation name)
string(JSON impl_version GET "${manifest}" implementation version)
string(JSON impl_sha GET "${manifest}" implementation plugin_sha256)
string(JSON impl_arch GET "${manifest}" implementation architecture)
file(SHA256 "${toy}/mytoy_golden.py" plugin_sha)
if(NOT impl_name STREQUAL "mytoy" OR NOT impl_version STREQUAL "0.1" OR NOT impl_sha STREQUAL plugin_sha
   OR NOT impl_arch STREQUAL "mytoy")
  message(FATAL_ERROR "scaffold_project: the plug-in's golden.json names implementation ${impl_name} ${impl_version} "
                      "(${impl_arch}, plug-in SHA-256 ${impl_sha}); expected mytoy 0.1 (mytoy, ${plugin_sha})")
endif()
set(toy_bin "${work}/toy-build/tiny_toy_conformance")
execute_process(COMMAND "${toy_bin}" --evidence-root "${work}/toy-build/mih-evidence/plugin" --no-progress
                        "--gtest_filter=TinyToy/MatchesOriginal.*/Reference"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX MATCHALL "\\[       OK \\] TinyToy/MatchesOriginal" passed "${out}")
list(LENGTH passed passed)
if(NOT rc EQUAL 0 OR NOT passed EQUAL 4)
  message("${out}")
  message(FATAL_ERROR "scaffold_project: MatchesOriginal against the mytoy plug-in's golden exited ${rc} with ${passed} "
                      "tests passed; expected 0 and 4")
endif()
message(STATUS "scaffold_project: MatchesOriginal passed its 4 tests against the plug-in's golden (mytoy 0.1)")
file(READ "${CMAKE_CURRENT_LIST_DIR}/mytoy_golden.py" plugin)
string(REPLACE "PERTURB = False" "PERTURB = True" perturbed "${plugin}")
file(WRITE "${work}/perturbed_golden.py" "${perturbed}")
file(REMOVE_RECURSE "${work}/toy-perturbed")
step(golden-perturbed QUIET COMMAND "${toy_bin}" golden --spec tiny_toy --out "${work}/toy-perturbed"
     --plugin "${work}/perturbed_golden.py")
execute_process(COMMAND "${toy_bin}" test --golden "${work}/toy-perturbed" --evidence-root
                        "${work}/toy-build/mih-evidence/perturbed" --no-progress
                        "--gtest_filter=TinyToy/MatchesOriginal.*/Reference"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 1 OR NOT out MATCHES "localized to")
  message("${out}")
  message(FATAL_ERROR "scaffold_project: against a plug-in whose rotary table ignores the config's theta, "
                      "MatchesOriginal exited ${rc}; expected 1 (a conformance failure against the golden), localized")
endif()
string(REGEX MATCH "[^\n]*localized to[^\n]*" named "${out}")
message(STATUS "scaffold_project: the perturbed plug-in's golden fails MatchesOriginal (exit 1): ${named}")
string(REPLACE "NAME = \"mytoy\"\n" "" nameless "${plugin}")
file(WRITE "${work}/nameless_golden.py" "${nameless}")
execute_process(COMMAND "${toy_bin}" golden --spec tiny_toy --out "${work}/toy-nameless" --plugin "${work}/nameless_golden.py"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 11 OR NOT out MATCHES "does not define NAME")
  message("${out}")
  message(FATAL_ERROR "scaffold_project: a plug-in without NAME exited ${rc}; expected 11 naming NAME")
endif()
message(STATUS "scaffold_project: a plug-in without NAME is refused (exit 11)")

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
