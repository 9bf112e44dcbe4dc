// The typed readers of harness/contract (structure_table.h, findings_file.h, probe_row.h,
// performance_row.h, comm_expected_step.h): a valid value read typed, and
// for each a planted missing or mistyped field refused naming the file and the field (the line
// and step for a JSONL file), never read as a default. Values written to real files and read
// back as the evidence store reads them.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/comm_expected_step.h"
#include "harness/contract/findings_file.h"
#include "harness/contract/performance_row.h"
#include "harness/contract/probe_row.h"
#include "harness/contract/structure_table.h"
#include "harness/evidence/evidence_store.h"
#include "tests/support/evidence_refusal.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using mih::testing::expect_evidence_refused;

std::vector<json> lines(const std::vector<json>& rows) {
  const fs::path dir = mih::testing::temp_dir("evidence_readers");
  std::ofstream out(dir / "rows.jsonl");
  for (const json& r : rows) out << r.dump() << "\n";
  out.close();
  return EvidenceDir::open_existing(dir).read_jsonl("rows.jsonl");
}

json file(const json& value) { return mih::testing::written_json(value, "evidence_readers"); }


json parameter() {
  return {{"fqn", "layers.0.w"}, {"requires_grad", true}, {"local_shape", {4, 8}}, {"dtype", "float32"},
          {"placements", {{"dp_shard", "Shard(0)"}}}, {"tp_local_shape", {8, 8}},
          {"fsdp_rows", {{"offset", 0}, {"size", 4}, {"chunk", 4}}}};
}

TEST(EvidenceReadersTest, StructureTable) {
  const auto rows = contract::structure_parameters(file({{"parameters", {parameter()}}}), "case/check/structure.json");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].fsdp_rows->chunk, 4);
  EXPECT_FALSE(rows[0].expert()) << "no gradient_kind: a writer before expert parallelism, DENSE";
  EXPECT_EQ(rows[0].fsdp_axis_or_dp_shard(), "dp_shard");
  EXPECT_TRUE(rows[0].on_rank0());
  EXPECT_FALSE(rows[0].pp_ranks.has_value());
  for (const char* key : {"requires_grad", "local_shape", "dtype", "fqn"}) {
    json p = parameter();
    p.erase(key);
    expect_evidence_refused([&] { contract::structure_parameters(file({{"parameters", {p}}}), "case/check/structure.json"); },
                   {"case/check/structure.json", key});
  }
  json chunkless = parameter();
  chunkless["fsdp_rows"].erase("chunk");
  expect_evidence_refused([&] { contract::structure_parameters(file({{"parameters", {chunkless}}}), "case/check/structure.json"); },
                 {"chunk"});
  json mistyped = parameter();
  mistyped["requires_grad"] = "yes";
  expect_evidence_refused([&] { contract::structure_parameters(file({{"parameters", {mistyped}}}), "case/check/structure.json"); },
                 {"requires_grad"});
}

json finding() {
  return {{"code", "MIH-STRUCT-001"}, {"phase", "structure"}, {"owner", "w"}, {"severity", "error"},
          {"message", "m"}, {"facts", json::object()}, {"remediation", "r"}};
}

TEST(EvidenceReadersTest, FindingsFile) {
  const json valid = {{"findings", {finding()}}, {"checks", {{"structure", {{"runs", 1}, {"examined", 3}, {"unit", "parameters"}}}}}};
  const auto f = contract::findings_file(file(valid), "check/findings.json", "case/check/findings.json");
  ASSERT_EQ(f.findings.size(), 1u);
  EXPECT_TRUE(f.findings[0].error());
  EXPECT_EQ(f.checks.at("structure").examined, 3);
  for (const char* key : {"severity", "owner", "code"}) {
    json bad = valid;
    bad["findings"][0].erase(key);
    expect_evidence_refused([&] { contract::findings_file(file(bad), "check/findings.json", "case/check/findings.json"); },
                   {"case/check/findings.json", key});
  }
  json bad = valid;
  bad["checks"]["structure"].erase("examined");
  expect_evidence_refused([&] { contract::findings_file(file(bad), "check/findings.json", "case/check/findings.json"); },
                 {"examined"});
  bad = valid;
  bad["checks"]["structure"]["runs"] = "1";
  expect_evidence_refused([&] { contract::findings_file(file(bad), "check/findings.json", "case/check/findings.json"); },
                 {"runs"});
}

json probe(int64_t step, const std::string& stage) {
  json stats = {{"sum", 1.0}, {"sum_sq", 2.0}, {"nonfinite", 0}, {"defined_ranks", 1}, {"numel", 3}, {"sketch", {0.5, 0.25}}};
  return {{"step", step}, {"stage", stage}, {"tensors", {{"w", stats}}}};
}

TEST(EvidenceReadersTest, ProbeRows) {
  const auto rows = contract::probe_rows(lines({probe(0, "model_before"), probe(0, "after_optimizer")}), "case/probes/rank0.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows.at({0, "after_optimizer"}).tensors["w"]["numel"], 3);
  json no_numel = probe(1, "after_optimizer");
  no_numel["tensors"]["w"].erase("numel");
  expect_evidence_refused([&] { contract::probe_rows(lines({probe(0, "model_before"), no_numel}), "case/probes/rank0.jsonl"); },
                 {"case/probes/rank0.jsonl, line 2 (step 1)", "numel"});
  json nonfinite = probe(0, "after_optimizer");
  nonfinite["tensors"]["w"]["nonfinite"] = 0.5;
  expect_evidence_refused([&] { contract::probe_rows(lines({nonfinite}), "case/probes/rank0.jsonl"); }, {"nonfinite"});
  expect_evidence_refused([&] { contract::probe_rows(lines({probe(0, "model_before"), probe(0, "model_before")}), "case/probes/rank0.jsonl"); },
                 {"two rows for step 0, stage model_before"});
}

TEST(EvidenceReadersTest, PerformanceRows) {
  const auto rows = contract::performance_rows(lines({{{"step", 0}, {"pipeline_order", {"F0.0", "B0.0"}}}, {{"step", 1}}}), 1,
                                               "case/cases/runtime/performance_rank1.jsonl");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].pipeline_order->size(), 2u);
  EXPECT_FALSE(rows[1].pipeline_order.has_value());
  expect_evidence_refused([&] { contract::performance_rows(lines({{{"pipeline_order", {"F0.0"}}}}), 1, "case/cases/runtime/performance_rank1.jsonl"); },
                 {"performance_rank1.jsonl, line 1", "step"});
  expect_evidence_refused([&] { contract::performance_rows(lines({{{"step", 0}, {"pipeline_order", "F0.0"}}}), 1, "case/cases/runtime/performance_rank1.jsonl"); },
                 {"pipeline_order"});
}

TEST(EvidenceReadersTest, CommExpectedStep) {
  const auto bytes = contract::comm_expected_by_layer(file({{"tp", {{"region.reduce_from", {{"layers.0.o_proj", 64}}}}}}), 2,
                                                      "case/cases/runtime/comm_expected_step2.json");
  EXPECT_EQ(bytes.at("tp").at("region.reduce_from").at("layers.0.o_proj"), 64);
  expect_evidence_refused([&] { contract::comm_expected_by_layer(file({{"tp", {{"region.reduce_from", {{"layers.0.o_proj", "64"}}}}}}), 2,
                                                        "case/cases/runtime/comm_expected_step2.json"); },
                 {"comm_expected_step2.json", "layers.0.o_proj"});
}

}  // namespace
}  // namespace mih
