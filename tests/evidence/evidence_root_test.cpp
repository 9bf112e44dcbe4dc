// Issue 53: an evidence root another user can write. Every user may write it without a sticky
// bit, or a group other than ours without it (a member could swap a directory for a link between
// the check and the write): refused, naming it, before the writable probe could empty a planted
// link's target. With the sticky bit (as /tmp): allowed (warned about when every user may write
// it), and a link or a directory another user planted below it is never entered (a whole case
// written outside the root before). As root, with a second user made by the test.
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/evidence/evidence_store.h"
#include "tests/support/plant_user.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

class EvidenceRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    planter_ = testing::plant_user(&why);
    if (planter_ == 0) GTEST_SKIP() << why;
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    root_ = testing::temp_dir(name);
    outside_ = testing::temp_dir(name + "_outside");
    secret_ = testing::root_only_file(outside_, "root");
  }

  bool plant(const std::function<bool()>& what) { return testing::as_user(planter_, what); }

  // The root in the planter's group with `mode`.
  void give_root_to_planters_group(mode_t mode) {
    ASSERT_EQ(::chown(root_.c_str(), 0, ::getpwuid(planter_)->pw_gid), 0);
    ::chmod(root_.c_str(), mode);
  }

  uid_t planter_ = 0;
  fs::path root_, outside_, secret_;
};

TEST_F(EvidenceRootTest, RefusesARootEveryUserCanWrite) {
  ::chmod(root_.c_str(), 0777);
  const fs::path probe = root_ / (".writable." + std::to_string(::getpid()));  // the probe's name before
  ASSERT_TRUE(plant([&] { return ::symlink(secret_.c_str(), probe.c_str()) == 0; }));
  EXPECT_THAT([&] { EvidenceDir dir(root_); },
              ThrowsMessage<Error>(AllOf(HasSubstr(root_.string() + " is writable by every user (mode 0777"),
                                         HasSubstr("chmod o-w " + root_.string()),
                                         HasSubstr("pass another --evidence-root"))));
  EXPECT_EQ(testing::contents_of(secret_), "root only\n") << "the writable probe emptied a root-only file";
}

TEST_F(EvidenceRootTest, NeverEntersALinkPlantedBelowAStickyRoot) {
  ::chmod(root_.c_str(), 01777);
  const fs::path spec = root_ / "llama";
  ASSERT_TRUE(plant([&] { return ::symlink(outside_.c_str(), spec.c_str()) == 0; }));
  EXPECT_THAT([&] { EvidenceDir dir(spec / "Reference"); },
              ThrowsMessage<Error>(AllOf(HasSubstr(spec.string() + " is a symbolic link of user 'mihplant"),
                                         HasSubstr("remove it, or pass another --evidence-root"))));
  EXPECT_FALSE(fs::exists(outside_ / "Reference")) << "a case directory was made outside the evidence root";
}

TEST_F(EvidenceRootTest, NeverEntersADirectoryOfAnotherUserBelowTheRoot) {
  ::chmod(root_.c_str(), 01777);
  const fs::path spec = root_ / "llama";
  ASSERT_TRUE(plant([&] { return ::mkdir(spec.c_str(), 0777) == 0 && ::chmod(spec.c_str(), 0777) == 0; }));
  EXPECT_THAT([&] { EvidenceDir dir(spec / "Reference"); },
              ThrowsMessage<Error>(HasSubstr(spec.string() + " belongs to user 'mihplant")));
  EXPECT_FALSE(fs::exists(spec / "Reference")) << "a case directory was made in another user's directory";
}

TEST_F(EvidenceRootTest, WarnsAboutAStickyRootEveryUserCanWrite) {
  ::chmod(root_.c_str(), 01777);
  ::testing::internal::CaptureStderr();
  EvidenceDir dir(root_);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(said, AllOf(HasSubstr("mih: warning: directory " + root_.string() + " (mode 1777) is writable by every "
                                    "user"),
                          HasSubstr("chmod go-w " + root_.string())));
}

TEST_F(EvidenceRootTest, RefusesARootAnotherGroupCanWrite) {
  give_root_to_planters_group(0775);
  EXPECT_THAT([&] { EvidenceDir dir(root_ / "llama" / "Reference"); },
              ThrowsMessage<Error>(AllOf(HasSubstr(root_.string() + " is writable by group 'mihplant"),
                                         HasSubstr("(mode 0775, no sticky bit)"),
                                         HasSubstr("chmod g-w " + root_.string()),
                                         HasSubstr("pass another --evidence-root"))));
  EXPECT_FALSE(fs::exists(root_ / "llama")) << "a directory was made in a root another group can write";
}

TEST_F(EvidenceRootTest, AcceptsAStickyRootAnotherGroupCanWrite) {
  give_root_to_planters_group(01775);
  EvidenceDir dir(root_ / "llama" / "Reference");
  EXPECT_TRUE(fs::is_directory(root_ / "llama" / "Reference"));
}

}  // namespace
}  // namespace mih
