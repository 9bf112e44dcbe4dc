# The ctest test `external_project` (tests/CMakeLists.txt): uses mih as an outside project
# does. cmake -P with
#   MIH_BUILD_DIR   mih's build folder
#   MIH_INSTALL_DIR the installed package (the fixture test `mih_install` installs it there)
#   MIH_SOURCE      this folder
#   MIH_GENERATOR, MIH_BUILD_TYPE, MIH_CXX_COMPILER, MIH_CCACHE (may be empty): as mih's build
# Steps: configure this folder into <build>/external/build against the install (once; the
# build step reconfigures when the installed package changes), build it, run its ctest. Each
# step that fails stops the test with a non-zero exit naming the step. A second run reuses the
# folder: only what changed in mih is relinked and rerun.
cmake_minimum_required(VERSION 3.22)
set(MIH_TEST_NAME external_project)
include("${CMAKE_CURRENT_LIST_DIR}/steps.cmake")
set(build_dir "${MIH_BUILD_DIR}/external/build")
string(TIMESTAMP t0 "%s")

outside_configure("${MIH_SOURCE}" "${build_dir}")
step(build COMMAND "${CMAKE_COMMAND}" --build "${build_dir}")
step(test COMMAND "${CMAKE_CTEST_COMMAND}" --test-dir "${build_dir}" --output-on-failure)

string(TIMESTAMP t1 "%s")
math(EXPR total "${t1} - ${t0}")
message(STATUS "external_project: passed in ${total} s")
