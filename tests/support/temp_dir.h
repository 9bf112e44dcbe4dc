// One temporary folder per test process, removed when every test passed (kept, and named,
// when one failed: its run directories, logs and ledgers are the evidence to look at).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace mih::testing {

/// /tmp/mih_tests_<pid>/<name>, created empty.
inline std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("mih_tests_" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

namespace internal {
class TempRootCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    auto root = std::filesystem::temp_directory_path() / ("mih_tests_" + std::to_string(::getpid()));
    if (!std::filesystem::exists(root)) return;
    if (::testing::UnitTest::GetInstance()->Passed()) {
      std::error_code ec;
      std::filesystem::remove_all(root, ec);
    } else {
      std::fprintf(stderr, "mih tests: kept %s for inspection\n", root.c_str());
    }
  }
};
// One registration per binary (an inline variable is initialized once).
inline ::testing::Environment* const kTempRootCleanup = ::testing::AddGlobalTestEnvironment(new TempRootCleanup);
}  // namespace internal

}  // namespace mih::testing
