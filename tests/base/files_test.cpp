// Atomic file writes and log tails.
#include <sys/stat.h>
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

TEST(FilesTest, ReadRefusesAFifoWithoutBlocking) {
  const auto fifo = temp_dir() / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::string text = "untouched", why;
  EXPECT_FALSE(read_file(fifo, &text)) << "a FIFO with no writer";
  EXPECT_EQ(text, "untouched");
  bool special = false;
  EXPECT_EQ(open_regular_file(fifo, &why, &special), -1);
  EXPECT_TRUE(special);
  EXPECT_EQ(why, "it is a FIFO, not a regular file");
  EXPECT_EQ(open_regular_file(temp_dir(), &why, &special), -1);
  EXPECT_EQ(why, "it is a directory, not a regular file");
  EXPECT_EQ(open_regular_file(temp_dir() / "absent", &why, &special), -1);
  EXPECT_FALSE(special);
  EXPECT_EQ(why, "No such file or directory");
  write_file_atomic(temp_dir() / "plain", "bytes");
  const int fd = open_regular_file(temp_dir() / "plain", &why, &special);
  ASSERT_GE(fd, 0);
  char buffer[8] = {};
  EXPECT_EQ(::read(fd, buffer, sizeof buffer), 5);
  ::close(fd);
  ASSERT_TRUE(read_file(temp_dir() / "plain", &text));
  EXPECT_EQ(text, "bytes");
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
