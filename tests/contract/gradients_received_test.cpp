// check/gradients_received.json read typed (harness/contract/gradients_received.h): what an
// earlier phase wrote reads back, and a file without its lists, or with a list of another type,
// is refused naming the file and the fix.
#include "harness/contract/gradients_received.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "tests/support/temp_dir.h"

namespace mih::contract {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::filesystem::path written(const std::string& name, const json& content) {
  const auto file = mih::testing::temp_dir("gradients_received_" + name) / "gradients_received.json";
  write_file_atomic(file, content.dump());
  return file;
}

TEST(GradientsReceivedTest, ReadsWhatAnEarlierPhaseWrote) {
  const GradientsReceived g = read_gradients_received(
      written("ok", {{"never_received", {"lm_head.weight"}}, {"steps", {0, 1}}, {"trainable", 3}, {"declared_unused", json::array()}}));
  EXPECT_THAT(g.never_received, ElementsAre("lm_head.weight"));
  EXPECT_THAT(g.steps, ElementsAre(0, 1));
}

TEST(GradientsReceivedTest, AMissingOrMistypedListIsRefused) {
  for (const auto& [name, content] : {std::pair{"no_list", json{{"steps", {0}}}},
                                      std::pair{"strings", json{{"never_received", json::array()}, {"steps", {"0"}}}},
                                      std::pair{"numbers", json{{"never_received", {1}}, {"steps", {0}}}},
                                      std::pair{"array", json::array()}}) {
    const auto file = written(name, content);
    try {
      (void)read_gradients_received(file);
      ADD_FAILURE() << name << " was read";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Code::kFailedPrecondition) << name;
      EXPECT_THAT(e.what(), AllOf(HasSubstr(file.string()), HasSubstr("never_received"), HasSubstr("rerun the case")))
          << name;
    }
  }
}

}  // namespace
}  // namespace mih::contract
