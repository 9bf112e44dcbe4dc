// A second, unprivileged user for the security tests (issue 53): made with useradd when the
// tests run as root, removed when the test binary ends; what it plants (a link, a directory) is
// made by a child process running as that user. Tests skip, saying why, when not root.
#pragma once

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

namespace mih::testing {

namespace internal {
class PlantUserCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!name.empty()) std::system(("userdel " + name + " >/dev/null 2>&1").c_str());
  }
  std::string name;
};
inline PlantUserCleanup* const kPlantUserCleanup =
    static_cast<PlantUserCleanup*>(::testing::AddGlobalTestEnvironment(new PlantUserCleanup));
}  // namespace internal

/// The uid of this binary's planting user "mihplant<pid>" (useradd -M -r, no login), made once;
/// 0 with *why set when not root or useradd fails.
inline uid_t plant_user(std::string* why) {
  static uid_t uid = 0;
  static std::string failure;
  if (uid != 0) return uid;
  if (::geteuid() != 0) {
    *why = "needs root to make a second, unprivileged user (useradd) that plants the links";
    return 0;
  }
  const std::string name = "mihplant" + std::to_string(::getpid());
  for (int attempt = 0; attempt < 20 && uid == 0; ++attempt) {  // another useradd may hold /etc/passwd
    if (std::system(("useradd -M -r -s /usr/sbin/nologin " + name + " >/dev/null 2>&1").c_str()) == 0 ||
        std::system(("id -u " + name + " >/dev/null 2>&1").c_str()) == 0) {
      internal::kPlantUserCleanup->name = name;
      std::FILE* p = ::popen(("id -u " + name).c_str(), "r");
      unsigned long value = 0;
      if (p != nullptr && std::fscanf(p, "%lu", &value) == 1) uid = static_cast<uid_t>(value);
      if (p != nullptr) ::pclose(p);
    } else {
      ::usleep(200 * 1000);
    }
  }
  if (uid == 0) *why = "useradd " + name + " failed";
  return uid;
}

/// Runs `plant` in a child process as `uid` (its group too); true when it returned true.
inline bool as_user(uid_t uid, const std::function<bool()>& plant) {
  const struct passwd* pw = ::getpwuid(uid);
  const gid_t gid = pw != nullptr ? pw->pw_gid : static_cast<gid_t>(uid);
  const pid_t child = ::fork();
  if (child == 0) {
    const bool ok = ::setgroups(0, nullptr) == 0 && ::setgid(gid) == 0 && ::setuid(uid) == 0 && plant();
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  return child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/// A root-only file <dir>/<name>_secret/secret (directory 0700, file 0600) holding
/// "root only\n": what a planted link points at.
inline std::filesystem::path root_only_file(const std::filesystem::path& dir, const std::string& name) {
  const std::filesystem::path secret_dir = dir / (name + "_secret");
  std::filesystem::create_directories(secret_dir);
  ::chmod(secret_dir.c_str(), 0700);
  const std::filesystem::path file = secret_dir / "secret";
  std::ofstream(file) << "root only\n";
  ::chmod(file.c_str(), 0600);
  return file;
}

/// The bytes of `file` ("" when unreadable).
inline std::string contents_of(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace mih::testing
