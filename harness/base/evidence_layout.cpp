// The evidence layout's path functions (see evidence_layout.h).
#include "harness/base/evidence_layout.h"

namespace mih::layout {

std::filesystem::path case_dir(const std::filesystem::path& root, const std::string& spec, const std::string& case_name) {
  return root / spec / case_name;
}

std::filesystem::path case_lock(const std::filesystem::path& root, const std::string& spec, const std::string& case_name) {
  return root / spec / ("." + case_name + ".lock");
}

}  // namespace mih::layout
