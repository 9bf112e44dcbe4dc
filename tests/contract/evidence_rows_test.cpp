// data/input_identity.jsonl and the checkpoint round trip's captures read typed
// (harness/contract/input_identity_row.h, roundtrip_capture.h): real rows read back, and a
// planted missing or mistyped field refused naming the file, the line and step and the field,
// never read as a default ("" or -1) that a verdict would then compare.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/input_identity_row.h"
#include "harness/contract/roundtrip_capture.h"

namespace mih {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json identity(int64_t step) {
  return {{"step", step}, {"global", std::string(64, 'a')}, {"fields", {{"labels", std::string(64, 'b')}}}, {"rows", 4}};
}

template <typename Read>
void expect_refused(Read read, const std::vector<std::string>& named) {
  try {
    read();
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition) << e.what();
    for (const auto& what : named) EXPECT_THAT(e.message(), HasSubstr(what));
  }
}

TEST(EvidenceRowsTest, InputIdentityRowsTypedByStep) {
  const auto rows = contract::input_identity_rows({identity(0), identity(1)}, "case/data/input_identity.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows.at(1).rows, 4);
  EXPECT_EQ(rows.at(1).fields.at("labels"), std::string(64, 'b'));
}

TEST(EvidenceRowsTest, InputIdentityRowWithoutAFieldIsRefusedByName) {
  for (const char* field : {"global", "fields", "rows"}) {
    json broken = identity(1);
    broken.erase(field);
    expect_refused([&] { contract::input_identity_rows({identity(0), broken}, "case/data/input_identity.jsonl"); },
                   {"evidence file case/data/input_identity.jsonl, line 2 (step 1)", field});
  }
  json text_rows = identity(0);
  text_rows["rows"] = "4";
  expect_refused([&] { contract::input_identity_rows({text_rows}, "case/data/input_identity.jsonl"); }, {"rows"});
  expect_refused([&] { contract::input_identity_rows({identity(0), identity(0)}, "case/data/input_identity.jsonl"); },
                 {"two rows for step 0"});
}

json capture() {
  return {{"next_step", 2}, {"tensors", {{"w", {{"sha256", std::string(64, 'c')}, {"shape", {2, 3}}}}}}};
}

TEST(EvidenceRowsTest, RoundtripCaptureTyped) {
  const contract::RoundtripCapture c = contract::roundtrip_capture(layout::kRoundtripLoad, capture(), "case/load.json");
  EXPECT_EQ(c.next_step, 2);
  EXPECT_EQ(c.tensors.at("w").shape, (std::vector<int64_t>{2, 3}));
}

TEST(EvidenceRowsTest, RoundtripCaptureWithoutItsStepOrHashIsRefusedByName) {
  json no_step = capture();
  no_step.erase("next_step");
  expect_refused([&] { contract::roundtrip_capture(layout::kRoundtripLoad, no_step, "case/load.json"); },
                 {"evidence file case/load.json", "next_step"});
  json no_hash = capture();
  no_hash["tensors"]["w"].erase("sha256");
  expect_refused(
      [&] { contract::roundtrip_capture(layout::before_save(layout::kRoundtripSave), no_hash, "case/save.json"); },
      {"evidence file case/save.json", "sha256"});
}

}  // namespace
}  // namespace mih
