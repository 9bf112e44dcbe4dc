# The installed CMake package, so that an outside project can use mih: `cmake --install build
# --prefix <p>` installs every mih_add_library target (static archives; the OBJECT libraries'
# object files, whose GoogleTest and spec registrations an archive would drop), the headers,
# the `mih` command, harness/cli/conformance_main.cpp, the reference ports and specs as
# examples (<p>/share/mih/examples) and <p>/lib/cmake/mih/mihConfig.cmake.
#
# How an outside project uses it (tests/external_project is one, run by the ctest test
# `external_project`):
#   find_package(mih REQUIRED)      # configured with -DCMAKE_PREFIX_PATH=<p>
#   enable_testing()
#   mih_add_conformance_suite(my_port_conformance SPECS my_spec.cpp PRESET matrix.json)
# Targets are exported as mih::<name> (mih::suites, mih::spec, mih::parallel ...; the command
# is mih::mih). The shared precompiled header stays in the build: PRIVATE precompiled headers
# are not exported and mih_pch is not installed.
include(CMakePackageConfigHelpers)

set(MIH_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/mih")
set(MIH_INSTALL_DATADIR "${CMAKE_INSTALL_DATADIR}/mih")

get_property(_mih_package_targets GLOBAL PROPERTY MIH_PACKAGE_TARGETS)
install(TARGETS ${_mih_package_targets} mih EXPORT mihTargets
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  OBJECTS DESTINATION "${CMAKE_INSTALL_LIBDIR}/mih/objects"
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}")
install(EXPORT mihTargets NAMESPACE mih:: DESTINATION "${MIH_INSTALL_CMAKEDIR}")
# The core binary the `mih` front runs, where the front looks for it (bin/../libexec/mih).
install(TARGETS mih_core RUNTIME DESTINATION "${CMAKE_INSTALL_LIBEXECDIR}/mih")

# Headers keep the source layout: #include "harness/..." and "suites/conformance.h".
install(DIRECTORY harness/ DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/harness" FILES_MATCHING PATTERN "*.h"
        PATTERN "*_internal.h" EXCLUDE)
install(DIRECTORY reference_models/ DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/reference_models" FILES_MATCHING PATTERN "*.h")
install(FILES specs/spec_support.h DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/specs")
install(FILES suites/conformance.h suites/suite_table.h DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/suites")
install(FILES harness/cli/conformance_main.cpp DESTINATION "${MIH_INSTALL_DATADIR}")
install(DIRECTORY suites/matrices/ DESTINATION "${MIH_INSTALL_DATADIR}/matrices")
# The evidence contract (docs/evidence.md) for writers other than mih's session.
install(DIRECTORY schemas/ DESTINATION "${MIH_INSTALL_DATADIR}/schemas")
# The contract's PyTorch writer (torch only; a package: `import mih_evidence` with
# PYTHONPATH=<prefix>/share/mih/python): a Python training loop's evidence (docs/evidence.md,
# docs/torch2-trainers.md), and that page's example loop, whole and runnable beside it.
install(DIRECTORY python/mih_evidence DESTINATION "${MIH_INSTALL_DATADIR}/python" FILES_MATCHING PATTERN "*.py")
install(FILES python/mih_evidence_example.py DESTINATION "${MIH_INSTALL_DATADIR}/python")
# The golden producer (docs/golden.md): any Python with torch runs it; `mih golden` and
# mih_add_golden find it here.
# Every module of it (the builtin originals import their siblings: builtin_mla, builtin_llava).
install(DIRECTORY golden/ DESTINATION "${MIH_INSTALL_DATADIR}/golden" FILES_MATCHING PATTERN "*.py" PATTERN "README.md"
        PATTERN "__pycache__" EXCLUDE)
# The reference ports and their specs, as examples for authors (docs/examples.md is their
# README): read and copied, not built by the package.
install(FILES reference_models/llama.h reference_models/llama.cpp reference_models/vlm.h reference_models/vlm.cpp
              reference_models/gpt2.h reference_models/gpt2.cpp reference_models/registry.h reference_models/registry.cpp
        DESTINATION "${MIH_INSTALL_DATADIR}/examples/reference_models")
install(FILES specs/llama_spec.cpp specs/moe_spec.cpp specs/vlm_spec.cpp specs/gpt2_spec.cpp specs/spec_support.h
        DESTINATION "${MIH_INSTALL_DATADIR}/examples/specs")
install(DIRECTORY specs/sources/ DESTINATION "${MIH_INSTALL_DATADIR}/examples/specs/sources")
install(FILES docs/examples.md DESTINATION "${MIH_INSTALL_DATADIR}/examples" RENAME README.md)

configure_package_config_file(cmake/mihConfig.cmake.in "${PROJECT_BINARY_DIR}/mihConfig.cmake"
  INSTALL_DESTINATION "${MIH_INSTALL_CMAKEDIR}"
  PATH_VARS MIH_INSTALL_DATADIR)
write_basic_package_version_file("${PROJECT_BINARY_DIR}/mihConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)  # 0.x: a minor version may break the spec API
install(FILES "${PROJECT_BINARY_DIR}/mihConfig.cmake" "${PROJECT_BINARY_DIR}/mihConfigVersion.cmake"
              cmake/MihFindDependencies.cmake cmake/MihConformance.cmake cmake/MihDiscoverCases.cmake
        DESTINATION "${MIH_INSTALL_CMAKEDIR}")
