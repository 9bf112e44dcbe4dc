// The one indexing of evidence rows by step (harness/contract/step_rows.h): rows of a real
// JSONL file written and read back, the refusals (a second row of one step, of one step and
// stage, a row without an integer step or a string stage) naming the file, the step and the fix.
#include "harness/contract/step_rows.h"

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

// The lines of `rows` written to <dir>/metrics.jsonl and read back as the evidence store reads them.
std::vector<json> written(const fs::path& dir, const std::vector<json>& rows) {
  std::ofstream(dir / "metrics.jsonl") << [&] {
    std::string text;
    for (const json& r : rows) text += r.dump() + "\n";
    return text;
  }();
  return EvidenceDir::open_existing(dir).read_jsonl("metrics.jsonl");
}

void expect_refused(const std::vector<json>& rows, const std::string& second_key, const std::string& what) {
  std::map<StepKey, json> out;
  EXPECT_THAT(index_rows_by_step(rows, "run/metrics.jsonl", second_key, &out),
              AllOf(HasSubstr("evidence file run/metrics.jsonl"), HasSubstr(what), HasSubstr("rerun the case")));
}

TEST(StepRowsTest, IndexesRowsByStep) {
  const fs::path dir = mih::testing::temp_dir("step_rows");
  const auto rows = written(dir, {{{"step", 1}, {"loss", 2.0}}, {{"step", 0}, {"loss", 3.0}}});
  const auto by_step = rows_by_step(rows, "metrics.jsonl");
  ASSERT_EQ(by_step.size(), 2u);
  EXPECT_EQ(by_step.at(0)["loss"], 3.0);
  EXPECT_EQ(by_step.at(1)["loss"], 2.0);
}

TEST(StepRowsTest, RefusesTwoRowsOfOneStep) {
  const fs::path dir = mih::testing::temp_dir("step_rows");
  const auto rows = written(dir, {{{"step", 0}, {"loss", 9.0}}, {{"step", 0}, {"loss", 3.0}}});
  expect_refused(rows, "", "has two rows for step 0: one run writes one row per step; it is not one run's evidence");
  EXPECT_THAT([&] { rows_by_step(rows, "run/metrics.jsonl"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("run/metrics.jsonl has two rows for step 0")));
  try {
    rows_by_step(rows, "run/metrics.jsonl");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
  }
}

TEST(StepRowsTest, RefusesARowWithoutAnIntegerStep) {
  const fs::path dir = mih::testing::temp_dir("step_rows");
  expect_refused(written(dir, {{{"step", 0}}, {{"loss", 1.0}}}), "", "row 2 has no integer \"step\"");
  expect_refused(written(dir, {{{"step", "0"}}}), "", "row 1 has no integer \"step\"");
  expect_refused(written(dir, {{{"step", 0.5}}}), "", "row 1 has no integer \"step\"");
  EXPECT_THAT([&] { rows_by_step(written(dir, {{{"loss", 1.0}}}), "run/metrics.jsonl"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("row 1 has no integer \"step\"")));
}

TEST(StepRowsTest, IndexesProbesByStepAndStage) {
  const fs::path dir = mih::testing::temp_dir("step_rows");
  const auto lines = written(dir, {{{"step", 0}, {"stage", "forward_output"}},
                                          {{"step", 0}, {"stage", "output_grad"}},
                                          {{"step", 1}, {"stage", "forward_output"}}});
  const auto by_key = rows_by_step_and(lines, "probes/rank0.jsonl", "stage");
  EXPECT_EQ(by_key.size(), 3u);
  EXPECT_TRUE(by_key.count({0, "output_grad"}));
  expect_refused(written(dir, {{{"step", 1}, {"stage", "output_grad"}}, {{"step", 1}, {"stage", "output_grad"}}}),
                 "stage", "has two rows for step 1, stage output_grad: one run writes one row per step and stage");
  expect_refused(written(dir, {{{"step", 1}}}), "stage", "row 1 has no string \"stage\"");
}

}  // namespace
}  // namespace mih
