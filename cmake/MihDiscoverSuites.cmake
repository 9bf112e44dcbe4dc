# Runs at ctest time (through the directory's TEST_INCLUDE_FILES): lists the tests of a
# GoogleTest binary and registers one ctest test per test suite, `--gtest_filter=<Suite>.*`.
# One process per suite rather than per test: starting a libtorch binary costs about a
# second here, which would dominate a run of hundreds of small tests.
#
# Inputs (set by the include file mih_add_test generates): MIH_EXE, MIH_LIST_FILE,
# MIH_LABELS, MIH_TIMEOUT, MIH_WORKDIR.
if(NOT EXISTS "${MIH_EXE}")
  add_test(NOT_BUILT_${MIH_LIST_FILE} "${MIH_EXE}")  # fails, naming the missing binary
  return()
endif()
if(NOT EXISTS "${MIH_LIST_FILE}" OR "${MIH_EXE}" IS_NEWER_THAN "${MIH_LIST_FILE}")
  execute_process(COMMAND "${MIH_EXE}" --gtest_list_tests
                  WORKING_DIRECTORY "${MIH_WORKDIR}"
                  OUTPUT_VARIABLE listing ERROR_VARIABLE listing_err RESULT_VARIABLE rc TIMEOUT 120)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mih: listing the tests of ${MIH_EXE} failed (${rc}):\n${listing}${listing_err}")
  endif()
  string(REPLACE "\n" ";" lines "${listing}")
  set(content "")
  foreach(line IN LISTS lines)
    # Suite lines start in column 0 and end with '.' (then maybe "  # GetParam() = ...").
    if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
      set(suite "${CMAKE_MATCH_1}")
      string(APPEND content
        "add_test([=[${suite}]=] \"${MIH_EXE}\" [=[--gtest_filter=${suite}.*]=])\n"
        "set_tests_properties([=[${suite}]=] PROPERTIES LABELS [=[${MIH_LABELS}]=] TIMEOUT ${MIH_TIMEOUT}"
        " WORKING_DIRECTORY [=[${MIH_WORKDIR}]=])\n")
    endif()
  endforeach()
  file(WRITE "${MIH_LIST_FILE}" "${content}")
endif()
include("${MIH_LIST_FILE}")
