// The suites' declared reads (see suite_reads.h).
#include "harness/compare/suite_reads.h"

#include <filesystem>

#include "harness/base/error.h"

namespace mih::verdicts {
namespace {

namespace fs = std::filesystem;

// Whether `dir` holds `relative`; a "<k>" in its name stands for any step's number.
bool holds(const fs::path& dir, const std::string& relative) {
  const size_t k = relative.find("<k>");
  std::error_code ec;
  if (k == std::string::npos) return fs::exists(dir / relative, ec);
  const fs::path pattern(relative);
  const std::string name = pattern.filename().string(), head = name.substr(0, name.find("<k>")),
                    tail = name.substr(name.find("<k>") + 3);
  for (const auto& entry : fs::directory_iterator(dir / pattern.parent_path(), ec)) {
    const std::string n = entry.path().filename().string();
    if (n.size() > head.size() + tail.size() && n.rfind(head, 0) == 0 &&
        n.compare(n.size() - tail.size(), tail.size(), tail) == 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

std::string any_step(std::string (*step_file)(int64_t)) {
  std::string path = step_file(0);
  const size_t zero = path.rfind('0');
  MIH_CHECK_CODE(zero != std::string::npos, Code::kInternal, "any_step: ", path, " names no step");
  return path.replace(zero, 1, "<k>");
}

std::vector<std::string> missing_reads(const SuiteReads& reads, const JudgedCase& c) {
  std::vector<std::string> missing;
  for (const std::string& f : reads.files) {
    if (!holds(c.ev.dir(), f)) missing.push_back(f + " (of the case)");
  }
  for (const std::string& f : reads.reference_files) {
    if (!c.reference || !holds(c.reference->dir(), f)) missing.push_back(f + " (of its compare_to case)");
  }
  return missing;
}

}  // namespace mih::verdicts
