# The ctest test `mih_install` (tests/CMakeLists.txt), the fixture of the outside-project tests
# (external_project, scaffold_project): `cmake --install` of mih's build into MIH_INSTALL_DIR,
# as a model team installs it. Needs the whole build (cmake --install copies, it never builds);
# a second run copies only what changed.
cmake_minimum_required(VERSION 3.22)
set(MIH_TEST_NAME mih_install)
include("${CMAKE_CURRENT_LIST_DIR}/steps.cmake")
step(install QUIET COMMAND "${CMAKE_COMMAND}" --install "${MIH_BUILD_DIR}" --prefix "${MIH_INSTALL_DIR}"
     HINT "\nis mih's build complete? (cmake --build ${MIH_BUILD_DIR})")
