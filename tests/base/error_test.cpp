// mih::Error, its codes and exit statuses, the check macros and with_context.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"

namespace mih {
namespace {

using ::testing::HasSubstr;

TEST(ErrorTest, CheckThrowsInvalidSpecWithTheParts) {
  try {
    int tp = 3;
    MIH_CHECK(tp == 2, "'tp' must be 2, got ", tp);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidSpec);
    EXPECT_EQ(e.message(), "'tp' must be 2, got 3");
  }
}

TEST(ErrorTest, CheckCodeAndInternalAssert) {
  EXPECT_THAT([] { MIH_CHECK_CODE(false, Code::kFailedPrecondition, "no gpu"); },
              ::testing::Throws<Error>(::testing::Property(&Error::code, Code::kFailedPrecondition)));
  EXPECT_THAT([] { MIH_INTERNAL_ASSERT(1 + 1 == 3, "math"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("harness bug, please report it): '1 + 1 == 3' does not hold")));
}

TEST(ErrorTest, ContextIsAddedOnTheWayUp) {
  try {
    with_context("while building the mesh on rank 1/4", [] { MIH_THROW(Code::kDeadlineExceeded, "rank 2 never joined"); });
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kDeadlineExceeded);
    EXPECT_EQ(std::string(e.what()), "rank 2 never joined\n  while building the mesh on rank 1/4");
  }
  EXPECT_THAT([] { with_context("while parsing", [] { throw std::runtime_error("boom"); }); },
              ::testing::ThrowsMessage<Error>(HasSubstr("boom\n  while parsing")));
}

TEST(ErrorTest, ExitStatusesRoundTrip) {
  EXPECT_EQ(exit_status(Code::kOk), 0);
  for (Code c : {Code::kInvalidSpec, Code::kFailedPrecondition, Code::kUnimplemented, Code::kDeadlineExceeded,
                 Code::kUnavailable, Code::kAborted, Code::kInternal}) {
    EXPECT_GE(exit_status(c), 11);
    EXPECT_EQ(code_from_exit_status(exit_status(c)), c) << code_name(c);
  }
  EXPECT_EQ(code_from_exit_status(3), Code::kOk);
  EXPECT_EQ(code_name(Code::kDeadlineExceeded), "deadline_exceeded");
}

}  // namespace
}  // namespace mih
