// Issue 53: write_file_atomic and append_whole in a directory another user can write never
// write through what that user planted there (a link at the guessable temp name, a link or a
// file of theirs at the appended file, a hard link to a file of ours that they may write). As
// root, with a second user made by the test.
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "tests/support/plant_user.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

class PlantedLinksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    planter_ = testing::plant_user(&why);
    if (planter_ == 0) GTEST_SKIP() << why;
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = testing::temp_dir(name);
    ::chmod(dir_.c_str(), 0777);  // open to the planter, as a shared scratch directory is
    secret_ = testing::root_only_file(testing::temp_dir(name + "_root_only"), "root");
  }

  // The planter's symlink `dir_`/`name` -> the root-only file.
  void plant_link(const std::string& name) {
    const fs::path link = dir_ / name;
    ASSERT_TRUE(testing::as_user(planter_, [&] { return ::symlink(secret_.c_str(), link.c_str()) == 0; }))
        << "the planter could not make " << link;
  }

  uid_t planter_ = 0;
  fs::path dir_, secret_;
};

TEST_F(PlantedLinksTest, AtomicWriteNeverWritesThroughAGuessedTempName) {
  plant_link("out.json.tmp." + std::to_string(::getpid()));  // the name mih used before
  write_file_atomic(dir_ / "out.json", "{\"new\": 1}\n");
  EXPECT_EQ(testing::contents_of(secret_), "root only\n") << "the root-only file was written through a link";
  EXPECT_EQ(testing::contents_of(dir_ / "out.json"), "{\"new\": 1}\n");
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir_ / "out.json")));
}

TEST_F(PlantedLinksTest, AtomicWriteReplacesALinkAtTheTargetWithoutFollowingIt) {
  plant_link("run.json");
  write_file_atomic(dir_ / "run.json", "{}\n");
  EXPECT_EQ(testing::contents_of(secret_), "root only\n") << "the root-only file was overwritten through a link";
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(dir_ / "run.json")));
}

TEST_F(PlantedLinksTest, AppendRefusesAPlantedLink) {
  plant_link("results.jsonl");
  EXPECT_THAT([&] { append_whole(dir_ / "results.jsonl", "{\"line\": 1}\n"); },
              ThrowsMessage<Error>(HasSubstr("it is a symbolic link, and mih never writes through one")));
  EXPECT_EQ(testing::contents_of(secret_), "root only\n") << "a line was appended to the root-only file";
}

TEST_F(PlantedLinksTest, AppendRefusesAFileOfAnotherUser) {
  const fs::path file = dir_ / "results.jsonl";
  ASSERT_TRUE(testing::as_user(planter_, [&] {
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0666);
    return fd >= 0 && ::close(fd) == 0;
  }));
  EXPECT_THAT([&] { append_whole(file, "{\"line\": 1}\n"); },
              ThrowsMessage<Error>(HasSubstr("it belongs to user 'mihplant")));
  EXPECT_EQ(fs::file_size(file), 0u) << "a line went into a file another user made (and controls)";
}

// fs.protected_hardlinks lets a user link a file they can read and write: a root file of their
// group, mode 0660. The append went into that file through the planted name before (issue 53).
TEST_F(PlantedLinksTest, AppendRefusesAHardLinkToAnotherFile) {
  const fs::path shared = testing::temp_dir("hard_link_source") / "group_file";
  std::ofstream(shared) << "group data\n";
  ::chmod(shared.parent_path().c_str(), 0755);
  ASSERT_EQ(::chown(shared.c_str(), 0, ::getpwuid(planter_)->pw_gid), 0);
  ::chmod(shared.c_str(), 0660);
  const fs::path name = dir_ / "results.jsonl";
  ASSERT_TRUE(testing::as_user(planter_, [&] { return ::link(shared.c_str(), name.c_str()) == 0; }))
      << "the planter could not hard-link " << shared;
  EXPECT_THAT([&] { append_whole(name, "{\"line\": 1}\n"); },
              ThrowsMessage<Error>(HasSubstr("it has 2 hard links: another name could be any file")));
  EXPECT_EQ(testing::contents_of(shared), "group data\n") << "a line was appended through a hard link";
}

}  // namespace
}  // namespace mih
