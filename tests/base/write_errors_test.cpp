// Issue 53: a write that fails says why in words. The free space is named only when space is
// the cause; a FIFO or a directory standing at the file's name, or the file size limit
// (ulimit -f), is named as such, with the fix.
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::ThrowsMessage;

class WriteErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name()); }

  fs::path dir_;
};

// A soft RLIMIT_FSIZE of `bytes` while in scope, with SIGXFSZ ignored (as conformance_main does).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    previous_ = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limited = saved_;
    limited.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limited);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_);
  }

 private:
  struct rlimit saved_ {};
  void (*previous_)(int) = SIG_DFL;
};

const char kLimitText[] = "the file size limit (ulimit -f, RLIMIT_FSIZE: 1024 bytes) is reached: raise it (ulimit "
                          "-f unlimited)";

TEST_F(WriteErrorsTest, AppendNamesAFifo) {
  const fs::path file = dir_ / "results.jsonl";
  ASSERT_EQ(::mkfifo(file.c_str(), 0644), 0);
  EXPECT_THAT([&] { append_whole(file, "{\"line\": 1}\n"); },
              ThrowsMessage<Error>(AllOf(HasSubstr("it is a FIFO, not a regular file"), Not(HasSubstr("MiB free")))));
}

TEST_F(WriteErrorsTest, AtomicWriteNamesADirectoryAtTheFile) {
  fs::create_directories(dir_ / "run.json");
  EXPECT_THAT([&] { write_file_atomic(dir_ / "run.json", "{}\n"); },
              ThrowsMessage<Error>(AllOf(HasSubstr("it is a directory, not a file"), Not(HasSubstr("MiB free")))));
}

TEST_F(WriteErrorsTest, AtomicWriteNamesTheFileSizeLimit) {
  const FileSizeLimit limit(1024);
  EXPECT_THAT([&] { write_file_atomic(dir_ / "report.md", std::string(4096, 'x')); },
              ThrowsMessage<Error>(AllOf(HasSubstr(kLimitText), Not(HasSubstr("MiB free")))));
  EXPECT_FALSE(fs::exists(dir_ / "report.md"));
}

TEST_F(WriteErrorsTest, AppendNamesTheFileSizeLimit) {
  const FileSizeLimit limit(1024);
  const fs::path file = dir_ / "results.jsonl";
  std::string line(4096, 'x');
  line.back() = '\n';
  EXPECT_THAT([&] { append_whole(file, line); },
              ThrowsMessage<Error>(AllOf(HasSubstr(kLimitText), Not(HasSubstr("MiB free")))));
  EXPECT_EQ(fs::file_size(file), 0u) << "a torn line was kept";
}

}  // namespace
}  // namespace mih
