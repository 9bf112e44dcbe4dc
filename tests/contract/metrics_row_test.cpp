// metrics.jsonl read typed (harness/contract/metrics_row.h): rows of a real file written and read
// back as the evidence store reads them; a planted missing or mistyped field is refused naming
// the file, the line and step and the field; the optional fields stay absent, never defaulted.
#include "harness/contract/metrics_row.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/evidence/evidence_store.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

json row(int64_t step) {
  return {{"step", step},
          {"loss", 2.5},
          {"grad_norm_pre_clip", 1.0},
          {"grad_norm_post_clip", 0.5},
          {"lr", 1e-3},
          {"input_hash", std::string(64, 'a')},
          {"comm_bytes", {{"dp_shard", 64}}},
          {"comm_sites", {{"dp_shard", {{"fsdp.all_gather", 64}}}}}};
}

std::vector<json> written(const std::vector<json>& rows) {
  const fs::path dir = mih::testing::temp_dir("metrics_row");
  std::ofstream out(dir / "metrics.jsonl");
  for (const json& r : rows) out << r.dump() << "\n";
  out.close();
  return EvidenceDir::open_existing(dir).read_jsonl("metrics.jsonl");
}

void expect_refused(const std::vector<json>& rows, const std::vector<std::string>& named) {
  try {
    contract::metrics_rows(written(rows), "case/cases/runtime/metrics.jsonl");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.message(), HasSubstr("evidence file case/cases/runtime/metrics.jsonl"));
    for (const auto& what : named) EXPECT_THAT(e.message(), HasSubstr(what));
  }
}

TEST(MetricsRowTest, ReadsRowsTypedByStep) {
  json second = row(1);
  second["loss"] = nullptr;  // not finite when written
  second["pipeline"] = {{"order", {"F0.0", "B0.0"}}, {"message_shape", {2, 4}}, {"message_dtype", "float32"}};
  second["fsdp_gather_forwards"] = {{"w", 2}};
  const auto rows = contract::metrics_rows(written({row(0), second}), "metrics.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows.at(0).lr, 1e-3);
  EXPECT_EQ(rows.at(0).metric("grad_norm_post_clip"), 0.5);
  EXPECT_EQ(rows.at(0).input_hash, std::string(64, 'a'));
  EXPECT_EQ(rows.at(0).comm_sites->at("dp_shard").at("fsdp.all_gather"), 64);
  EXPECT_FALSE(rows.at(0).comm_expected.has_value()) << "an optional field stays absent";
  EXPECT_FALSE(rows.at(0).fsdp_gather_forwards.has_value());
  EXPECT_FALSE(rows.at(0).pipeline.has_value());
  EXPECT_TRUE(std::isnan(rows.at(1).loss));
  EXPECT_EQ(rows.at(1).pipeline->order, (std::vector<std::string>{"F0.0", "B0.0"}));
  EXPECT_EQ(rows.at(1).fsdp_gather_forwards->at("w"), 2);
}

TEST(MetricsRowTest, AMissingOrMistypedFieldIsRefusedNamingIt) {
  json missing = row(1);
  missing.erase("lr");
  expect_refused({row(0), missing}, {"line 2 (step 1)", "lr", "rerun the case"});
  json no_hash = row(0);
  no_hash.erase("input_hash");
  expect_refused({no_hash}, {"line 1 (step 0)", "input_hash"});
  json mistyped = row(0);
  mistyped["loss"] = "2.5";
  expect_refused({mistyped}, {"line 1 (step 0)", "field loss"});
  json sites = row(0);
  sites["comm_sites"]["dp_shard"]["fsdp.all_gather"] = "64";
  expect_refused({sites}, {"comm_sites"});
  json no_step = row(0);
  no_step.erase("step");
  expect_refused({no_step}, {"line 1", "step"});
}

TEST(MetricsRowTest, TwoRowsOfOneStepAreRefused) {
  expect_refused({row(0), row(0)}, {"has two rows for step 0"});
}

}  // namespace
}  // namespace mih
