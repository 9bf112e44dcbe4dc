// The typed readers of the checks' evidence the verdicts judge (fsdp_unit_table.h,
// invariant_results.h, module_parity_results.h, activation_checkpoint_record.h, and what
// resolved_spec.h reads of the spec's declarations): a valid value read typed, and for each a
// planted missing or mistyped field refused naming the file and the field, never read as a
// default (an absent passed was a failed invariant, an absent steps a verdict's failure, an
// absent grad_tolerance the output's tolerance). Values written to real files and read back as
// the evidence store reads them.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/activation_checkpoint_record.h"
#include "harness/contract/fsdp_unit_table.h"
#include "harness/contract/invariant_results.h"
#include "harness/contract/module_parity_results.h"
#include "harness/contract/resolved_spec.h"
#include "harness/evidence/evidence_store.h"
#include "tests/support/evidence_refusal.h"

namespace mih {
namespace {

using nlohmann::json;
using mih::testing::expect_evidence_refused;

json file(const json& value) { return mih::testing::written_json(value, "checks_evidence"); }


TEST(ChecksEvidenceTest, FsdpUnitTable) {
  const json valid = {{"layers.0", {{"parameters", {"layers.0.w"}}, {"dtypes", {"float64@dp_shard=2/DENSE"}}}},
                      {"root", {{"parameters", json::array()}, {"dtypes", json::array()}}}};
  const auto units = contract::fsdp_unit_table(file(valid), "case/check/fsdp_units.json");
  ASSERT_EQ(units.size(), 2u);
  EXPECT_EQ(units.at("layers.0").parameters, std::vector<std::string>{"layers.0.w"});
  EXPECT_TRUE(units.at("root").dtypes.empty());
  for (const char* key : {"dtypes", "parameters"}) {
    json bad = valid;
    bad["layers.0"].erase(key);
    expect_evidence_refused([&] { contract::fsdp_unit_table(file(bad), "case/check/fsdp_units.json"); },
                   {"case/check/fsdp_units.json", key});
  }
  json bad = valid;
  bad["layers.0"]["parameters"] = {7};
  expect_evidence_refused([&] { contract::fsdp_unit_table(file(bad), "case/check/fsdp_units.json"); }, {"parameters"});
}

TEST(ChecksEvidenceTest, InvariantResults) {
  const json valid = {{"rope_table", {{"passed", true}, {"facts", {{"max_error", 0.0}}}}},
                      {"init_std", {{"passed", false}, {"facts", json::object()}, {"weights", "a loaded checkpoint"}}}};
  for (const char* relative : {"check/invariants_structure.json", "cases/runtime/invariants_step3.json",
                               "checkpoint/invariants_after_load.json"}) {
    const auto results = contract::invariant_results(relative, file(valid), std::string("case/") + relative);
    ASSERT_EQ(results.size(), 2u) << relative;
    EXPECT_TRUE(results.at("rope_table").passed);
    EXPECT_FALSE(results.at("rope_table").weights.has_value()) << "absent: not a materialization invariant";
    EXPECT_EQ(results.at("init_std").weights, "a loaded checkpoint");
    for (const char* key : {"passed", "facts"}) {
      json bad = valid;
      bad["rope_table"].erase(key);
      expect_evidence_refused([&] { contract::invariant_results(relative, file(bad), std::string("case/") + relative); },
                     {relative, key});
    }
    json bad = valid;
    bad["init_std"]["passed"] = "false";
    expect_evidence_refused([&] { contract::invariant_results(relative, file(bad), std::string("case/") + relative); }, {"passed"});
  }
}

json observation(const std::string& name) {
  return {{"name", name}, {"max_abs_error", 1e-15}, {"relative_error", 1e-14}, {"tolerance", 1e-12}, {"passed", true}};
}

TEST(ChecksEvidenceTest, ModuleParityResults) {
  json not_finite = observation("grad:w");
  not_finite["relative_error"] = nullptr;
  not_finite["passed"] = false;
  not_finite["note"] = "undefined";
  const json valid = {{"swiglu", {{"passed", false}, {"unmapped", json::array()}, {"failure", "grad:w"},
                                  {"observations", {observation("output"), not_finite}}}},
                      {"broken", {{"passed", false}, {"unmapped", {"w"}}, {"error", "threw"}, {"observations", json::array()}}}};
  const auto results = contract::module_parity_results(file(valid), "case/check/module_parity.json");
  const auto& swiglu = results.at("swiglu");
  ASSERT_EQ(swiglu.observations.size(), 2u);
  EXPECT_EQ(swiglu.observations[0].relative_error, 1e-14);
  EXPECT_FALSE(swiglu.observations[1].relative_error.has_value()) << "null: not finite";
  EXPECT_EQ(swiglu.observations[1].note, "undefined");
  EXPECT_FALSE(swiglu.error.has_value());
  EXPECT_EQ(results.at("broken").error, "threw");
  for (const char* key : {"passed", "unmapped", "observations"}) {
    json bad = valid;
    bad["swiglu"].erase(key);
    expect_evidence_refused([&] { contract::module_parity_results(file(bad), "case/check/module_parity.json"); },
                   {"case/check/module_parity.json", key});
  }
  for (const char* key : {"tolerance", "relative_error", "passed", "name"}) {
    json bad = valid;
    bad["swiglu"]["observations"][0].erase(key);
    expect_evidence_refused([&] { contract::module_parity_results(file(bad), "case/check/module_parity.json"); }, {key});
  }
  json bad = valid;
  bad["swiglu"]["observations"][0]["passed"] = "true";
  expect_evidence_refused([&] { contract::module_parity_results(file(bad), "case/check/module_parity.json"); }, {"passed"});
}

TEST(ChecksEvidenceTest, ActivationCheckpointRecord) {
  const json valid = {{"enabled", true}, {"regions", {"layers.0"}},
                      {"steps", {{{"step", 0}, {"regions", {{"layers.0", {{"checkpointed", 2}, {"recomputed", 2}}}}}},
                                 {{"step", 1}, {"regions", json::object()}}}}};
  const auto ac = contract::activation_checkpoint_record(file(valid), "case/check/activation_checkpoint.json");
  EXPECT_TRUE(ac.enabled);
  ASSERT_EQ(ac.steps.size(), 2u);
  EXPECT_EQ(ac.steps[0].regions.at("layers.0").recomputed, 2);
  EXPECT_TRUE(ac.steps[1].regions.empty());
  for (const char* key : {"steps", "regions", "enabled"}) {
    json bad = valid;
    bad.erase(key);
    expect_evidence_refused([&] { contract::activation_checkpoint_record(file(bad), "case/check/activation_checkpoint.json"); },
                   {"case/check/activation_checkpoint.json", key});
  }
  json bad = valid;
  bad["steps"][0]["regions"]["layers.0"].erase("recomputed");
  expect_evidence_refused([&] { contract::activation_checkpoint_record(file(bad), "case/check/activation_checkpoint.json"); },
                 {"recomputed"});
  bad = valid;
  bad["steps"][0]["regions"]["layers.0"]["checkpointed"] = -1;
  expect_evidence_refused([&] { contract::activation_checkpoint_record(file(bad), "case/check/activation_checkpoint.json"); },
                 {"checkpointed"});
}

}  // namespace
}  // namespace mih
