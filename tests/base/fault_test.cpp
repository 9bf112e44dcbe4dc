// The fault-injection switch: IDs, MIH_FAULT parsing, and that a fault point is off unless set.
#include <cstdlib>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"

namespace mih::fault {
namespace {

using ::testing::HasSubstr;

// Reads MIH_FAULT afresh, as a new process would.
void reread(const char* value) {
  if (value) {
    ::setenv("MIH_FAULT", value, 1);
  } else {
    ::unsetenv("MIH_FAULT");
  }
  detail::g_active.store(detail::kUnread);
}

class FaultTest : public ::testing::Test {
 protected:
  void TearDown() override { reread(nullptr); }
};

TEST_F(FaultTest, NamesAndParsesEveryId) {
  EXPECT_EQ(all().size(), static_cast<size_t>(kFaultCount));
  for (Fault f : all()) EXPECT_EQ(parse(name(f)), f) << name(f);
  EXPECT_EQ(name(Fault::kF01), "F01");
  EXPECT_EQ(name(Fault::kF22), "F22");
  EXPECT_EQ(parse("f3"), Fault::kF03);
  EXPECT_EQ(parse(""), Fault::kNone);
  EXPECT_EQ(parse("none"), Fault::kNone);
  EXPECT_EQ(name(Fault::kF23), "F23");
  for (const char* bad : {"F00", "F99", "F1x", "G01", "F001", "03"}) {
    EXPECT_THAT([&] { (void)parse(bad); }, ::testing::ThrowsMessage<Error>(HasSubstr("unknown fault"))) << bad;
  }
}

TEST_F(FaultTest, OffWithoutTheVariableAndOnlyTheNamedFaultWhenSet) {
  reread(nullptr);
  for (Fault f : all()) EXPECT_FALSE(active(f)) << name(f);
  EXPECT_EQ(current(), Fault::kNone);
  reread("F07");
  EXPECT_TRUE(active(Fault::kF07));
  EXPECT_FALSE(active(Fault::kF17));
  EXPECT_EQ(current(), Fault::kF07);
  reread("");
  EXPECT_FALSE(active(Fault::kF07));
}

TEST_F(FaultTest, AnUnknownValueIsAnErrorNotAFaultFreeRun) {
  reread("F99");
  for (Fault f : all()) EXPECT_FALSE(active(f));
  EXPECT_THAT([] { check_environment(); }, ::testing::ThrowsMessage<Error>(HasSubstr("unknown fault 'F99'")));
}

TEST_F(FaultTest, ScopedFaultSetsAndRestores) {
  reread(nullptr);
  {
    ScopedFault f(Fault::kF13);
    EXPECT_TRUE(active(Fault::kF13));
  }
  EXPECT_FALSE(active(Fault::kF13));
}

// reached() says whether the fault's code ran: evaluating another fault's point, or none,
// leaves it false; the fault's own point sets it.
TEST_F(FaultTest, ReachedOnlyOnceAPointOfTheFaultFires) {
  reread(nullptr);
  {
    ScopedFault f(Fault::kF26);
    EXPECT_FALSE(reached());
    EXPECT_FALSE(active(Fault::kF03));
    EXPECT_FALSE(reached()) << "another fault's point does not reach F26";
    EXPECT_TRUE(active(Fault::kF26));
    EXPECT_TRUE(reached());
  }
  ScopedFault none(Fault::kNone);
  for (Fault f : all()) EXPECT_FALSE(active(f));
  EXPECT_FALSE(reached()) << "no fault, nothing reached";
}

}  // namespace
}  // namespace mih::fault
