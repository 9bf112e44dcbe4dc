// check_owned, entries_under, file_digests and sha256_of_file (see owned_files.h).
#include "harness/base/owned_files.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/sha256.h"

namespace mih {
namespace fs = std::filesystem;

void check_owned(const fs::path& dir, const std::string& record, const std::vector<std::string>& paths,
                 const std::string& command) {
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (status.type() == fs::file_type::not_found) return;
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, command, ": cannot read --out ", dir.string(), ": ", ec.message());
  MIH_CHECK_CODE(fs::is_directory(status), Code::kFailedPrecondition, command, ": --out ", dir.string(),
                 " is a file, not a directory; give a new or empty directory");
  if (fs::is_empty(dir, ec) && !ec) return;
  std::string text;
  const bool has_record = read_file(dir / record, &text);
  MIH_CHECK_CODE(has_record, Code::kFailedPrecondition, command, ": --out ", dir.string(), " holds files and no ", record,
                 " of an earlier `mih ", command, "`, so mih did not write it; give a new or empty directory (nothing "
                 "was written)");
  const nlohmann::json j = parse_json_lenient(text);  // bounded depth: the record is input from outside
  MIH_CHECK_CODE(j.is_object() && j.contains("files") && j["files"].is_object(), Code::kFailedPrecondition, command,
                 ": --out ", dir.string(), " holds a ", record, " that lists no files (an older mih wrote it, or it was "
                 "edited), so mih cannot tell the files it wrote from others; give a new or empty directory, or delete "
                 "this one first (nothing was written)");
  const nlohmann::json& files = j["files"];
  for (const auto& relative : paths) {
    const fs::path path = dir / relative;
    const fs::file_status s = fs::symlink_status(path, ec);
    if (s.type() == fs::file_type::not_found) continue;
    const auto listed = files.find(relative);
    MIH_CHECK_CODE(listed != files.end(), Code::kFailedPrecondition, command, ": --out ", dir.string(), " holds '",
                   relative, "', which ", record, " does not list: it is not mih's to overwrite or delete; give a new "
                   "or empty directory, or move it out (nothing was written)");
    MIH_CHECK_CODE(fs::is_regular_file(s), Code::kFailedPrecondition, command, ": '", relative, "' in ", dir.string(),
                   " is not the regular file mih wrote (a link, a folder or a FIFO now stands there); mih never "
                   "overwrites what it did not write: ", command, " into a new directory, or remove it first (nothing "
                   "was written)");
    MIH_CHECK_CODE(listed->is_string() && sha256_of_file(path) == listed->get<std::string>(),
                   Code::kFailedPrecondition, command, ": '", relative, "' in ", dir.string(),
                   " was edited since mih wrote it; mih never overwrites an edit: ", command,
                   " into a new directory, or delete the file first (nothing was written)");
  }
}

std::vector<std::string> entries_under(const fs::path& dir, const std::string& except) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string relative = it->path().lexically_relative(dir).string();
    if (relative != except) out.push_back(relative);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::map<std::string, std::string> file_digests(const fs::path& dir, const std::string& except) {
  std::map<std::string, std::string> out;
  for (const auto& relative : entries_under(dir, except)) {
    std::error_code ec;
    if (fs::is_regular_file(fs::symlink_status(dir / relative, ec))) out[relative] = sha256_of_file(dir / relative);
  }
  return out;
}

std::string sha256_of_file(const fs::path& file) {
  std::string why;
  const int fd = open_regular_file(file, &why);  // never blocks on a FIFO or a device
  MIH_CHECK_CODE(fd >= 0, Code::kFailedPrecondition, "cannot read ", file.string(), " to fingerprint it: ", why);
  Sha256 h;
  std::vector<char> buffer(1 << 20);
  while (true) {
    const ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      MIH_CHECK_CODE(n == 0, Code::kFailedPrecondition, "error reading ", file.string(), " to fingerprint it: ",
                     std::strerror(err));
      break;
    }
    h.update(buffer.data(), static_cast<size_t>(n));
  }
  return h.hex_digest();
}

}  // namespace mih
