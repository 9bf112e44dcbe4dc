# Runs at ctest time (TEST_INCLUDE_FILES, see MihConformance.cmake): asks a conformance binary
# for its cases (`--mih-list-cases`) and registers one ctest test per case.
if(NOT EXISTS "${MIH_EXE}")
  add_test(NOT_BUILT_${MIH_NAME} "${MIH_EXE}")  # fails, naming the missing binary
  return()
endif()
# Listed again when the binary, or one it runs (MIH_LISTED_BY: mih's core behind its front), is
# newer than the list: a stale list would leave a new spec's cases out of ctest unsaid.
set(stale FALSE)
foreach(binary IN ITEMS "${MIH_EXE}" ${MIH_LISTED_BY})
  if(NOT EXISTS "${MIH_LIST_FILE}" OR "${binary}" IS_NEWER_THAN "${MIH_LIST_FILE}")
    set(stale TRUE)
  endif()
endforeach()
if(stale)
  execute_process(COMMAND "${MIH_EXE}" --mih-list-cases ${MIH_MATRIX_ARGS}
                  WORKING_DIRECTORY "${MIH_WORKDIR}"
                  OUTPUT_VARIABLE listing ERROR_VARIABLE listing_err RESULT_VARIABLE rc TIMEOUT 120)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mih: listing the cases of ${MIH_EXE} failed (${rc}):\n${listing}${listing_err}")
  endif()
  string(REPLACE "\n" ";" lines "${listing}")
  set(content "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([A-Za-z0-9_]+) ([^ ]+) ([A-Za-z0-9_]+) (.*)$")
      set(prefix "${CMAKE_MATCH_1}")
      set(case "${CMAKE_MATCH_3}")
      string(REPLACE "," ";" labels "${CMAKE_MATCH_4}")
      if(MIH_LABELS)
        string(APPEND labels ";${MIH_LABELS}")
      endif()
      set(test "${MIH_NAME}/${prefix}/${case}")
      string(APPEND content
        "add_test([=[${test}]=] \"${MIH_EXE}\" --evidence-root [=[${MIH_ROOT}]=] --no-progress ${MIH_MATRIX_ARGS}"
        " [=[--gtest_filter=${prefix}/*.*/${case}]=])\n"
        "set_tests_properties([=[${test}]=] PROPERTIES LABELS [=[${labels}]=] TIMEOUT ${MIH_TIMEOUT}"
        " FIXTURES_REQUIRED [=[${MIH_NAME}_evidence]=] WORKING_DIRECTORY [=[${MIH_WORKDIR}]=])\n")
    endif()
  endforeach()
  file(WRITE "${MIH_LIST_FILE}" "${content}")
endif()
include("${MIH_LIST_FILE}")
