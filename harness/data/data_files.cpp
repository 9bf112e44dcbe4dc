// list_data_files (see data_files.h).
#include "harness/data/data_files.h"

#include <algorithm>
#include <set>

#include "harness/base/error.h"

namespace mih::data {

namespace fs = std::filesystem;

std::vector<fs::path> list_data_files(const fs::path& dir, std::string_view fix) {
  std::error_code ec;
  const auto status = fs::status(dir, ec);
  MIH_CHECK_CODE(fs::exists(status), Code::kFailedPrecondition, "'", dir.string(), "' does not exist; ", fix);
  MIH_CHECK_CODE(fs::is_directory(status), Code::kFailedPrecondition, "'", dir.string(),
                 "' is not a directory; ", fix);
  std::vector<fs::path> files;
  std::set<fs::path> visited;  // canonical paths: a symlink back up the tree is walked once
  auto walk = [&](auto& self, const fs::path& d) -> void {
    std::error_code walk_ec;
    auto canonical = fs::canonical(d, walk_ec);
    if (!walk_ec && !visited.insert(canonical).second) return;
    fs::directory_iterator it(d, walk_ec);
    MIH_CHECK_CODE(!walk_ec, Code::kFailedPrecondition, "cannot list directory '", d.string(), "': ",
                   walk_ec.message(), "; make it readable or ", fix);
    for (; it != fs::directory_iterator(); it.increment(walk_ec)) {
      const fs::path& p = it->path();
      std::error_code entry_ec;
      const auto s = fs::status(p, entry_ec);  // follows symlinks; a dangling one is not_found
      if (fs::is_directory(s)) {
        self(self, p);
      } else if (fs::is_regular_file(s)) {
        files.push_back(p);
      }
    }
    MIH_CHECK_CODE(!walk_ec, Code::kFailedPrecondition, "cannot list directory '", d.string(), "': ",
                   walk_ec.message(), "; make it readable or ", fix);
  };
  walk(walk, dir);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace mih::data
