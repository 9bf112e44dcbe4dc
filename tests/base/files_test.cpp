// Atomic file writes and log tails.
#include <unistd.h>

#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

using ::testing::HasSubstr;

std::filesystem::path temp_dir() {
  static const std::filesystem::path dir = testing::temp_dir("files");
  return dir;
}

TEST(FilesTest, WriteAtomicCreatesDirectoriesAndReplaces) {
  auto path = temp_dir() / "a" / "b" / "x.json";
  write_file_atomic(path, "first");
  write_file_atomic(path, "second");
  std::string text;
  ASSERT_TRUE(read_file(path, &text));
  EXPECT_EQ(text, "second");
  for (const auto& entry : std::filesystem::directory_iterator(path.parent_path())) {
    EXPECT_EQ(entry.path().filename(), "x.json") << "no temp file left behind";
  }
}

TEST(FilesTest, UnwritablePathIsFailedPrecondition) {
  try {
    write_file_atomic("/proc/mih-no/x.json", "data");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("/proc/mih-no"));
  }
}

TEST(FilesTest, TailKeepsTheLastLines) {
  auto path = temp_dir() / "log.txt";
  std::ofstream(path) << "one\ntwo\nthree\nfour\n";
  EXPECT_EQ(tail_lines(path, 2), "three\nfour\n");
  EXPECT_EQ(tail_lines(path, 10), "one\ntwo\nthree\nfour\n");
  EXPECT_EQ(tail_lines(temp_dir() / "missing.txt", 3), "");
  // Only the last bytes are read; the partial first line is dropped.
  EXPECT_EQ(tail_lines(path, 10, 8), "four\n");
}

}  // namespace
}  // namespace mih
