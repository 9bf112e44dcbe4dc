// Which harness wrote a piece of evidence: its release version and the build of the running
// executable. Recorded in every case's environment.json; verify-only refuses evidence of
// another version (mih test --verify-only --allow-other-version checks it anyway).
#pragma once

#include <string>
#include <string_view>

namespace mih {

/// The harness release, e.g. "0.2.0" (CMake's PROJECT_VERSION).
std::string_view harness_version();

/// The GNU build id of the running executable (the linker's --build-id note, hex; unique per
/// link), or "" when it has none. Two builds of one version differ here.
const std::string& build_id();

}  // namespace mih
