// Findings: the code format, required fields of errors, and the report's status.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/findings/findings.h"

#include <nlohmann/json.hpp>

namespace mih {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

Finding error_finding() {
  Finding f;
  f.code = "MIH-STRUCT-001";
  f.phase = "structure";
  f.owner = "layers.0.q_proj.weight";
  f.message = "local shape [8, 16] does not match Shard(0) of [16, 16] over tp=2 at offset 4";
  f.facts = {{"local_shape", {8, 16}}};
  f.why_unsafe = "the optimizer would update rows another rank also owns";
  f.remediation = "create the parameter through ParallelContext::make_parameter";
  return f;
}

TEST(FindingsTest, ReportFailsOnAnyErrorAndPassesOnWarnings) {
  FindingReport report;
  Finding warning = error_finding();
  warning.severity = Severity::kWarning;
  warning.why_unsafe.clear();
  report.add(warning);
  EXPECT_FALSE(report.failed());
  EXPECT_EQ(report.to_json()["status"], "PASS");
  report.add(error_finding());
  EXPECT_TRUE(report.failed());
  nlohmann::json j = report.to_json();
  EXPECT_EQ(j["status"], "FAIL");
  EXPECT_EQ(j["errors"], 1);
  EXPECT_EQ(j["warnings"], 1);
  EXPECT_EQ(j["findings"][1]["owner"], "layers.0.q_proj.weight");
  EXPECT_THAT(report.summary(), HasSubstr("MIH-STRUCT-001 layers.0.q_proj.weight: local shape"));
}

TEST(FindingsTest, MalformedFindingsAreHarnessBugs) {
  FindingReport report;
  Finding bad_code = error_finding();
  bad_code.code = "STRUCT-1";
  EXPECT_THAT([&] { report.add(bad_code); }, ThrowsMessage<Error>(HasSubstr("not of the form MIH-<AREA>-NNN")));
  Finding no_fix = error_finding();
  no_fix.remediation.clear();
  EXPECT_THAT([&] { report.add(no_fix); }, ThrowsMessage<Error>(HasSubstr("an error without why_unsafe and remediation")));
  Finding bad_phase = error_finding();
  bad_phase.phase = "warmup";
  EXPECT_THAT([&] { report.add(bad_phase); }, ThrowsMessage<Error>(HasSubstr("unknown phase 'warmup'")));
  EXPECT_TRUE(report.findings().empty());
}

TEST(FindingsTest, FromJsonReadsEveryFieldAndRefusesAMissingOneOrAnUnknownSeverity) {
  const nlohmann::json written = error_finding();
  const Finding back = written.get<Finding>();
  EXPECT_EQ(back.facts, error_finding().facts);
  EXPECT_EQ(back.remediation, error_finding().remediation);
  EXPECT_EQ(back.severity, Severity::kError);
  for (const char* field : {"facts", "remediation", "message", "severity"}) {
    nlohmann::json j = written;
    j.erase(field);  // facts and remediation were read as {} and "" before
    EXPECT_THAT([&] { (void)j.get<Finding>(); },
                ThrowsMessage<Error>(AllOf(HasSubstr("finding \"MIH-STRUCT-001\" has no '" + std::string(field) + "'"),
                                           HasSubstr("not a finding mih writes"))))
        << field;
  }
  nlohmann::json fatal = written;
  fatal["severity"] = "fatal";  // read as info before: an error finding that failed nothing
  EXPECT_THAT([&] { (void)fatal.get<Finding>(); }, ThrowsMessage<Error>(HasSubstr("unknown severity 'fatal'")));
  nlohmann::json numeric = written;
  numeric["remediation"] = 3;
  EXPECT_THAT([&] { (void)numeric.get<Finding>(); }, ThrowsMessage<Error>(HasSubstr("a field of another type")));
  nlohmann::json warning = written;
  warning["severity"] = "warning";
  warning.erase("why_unsafe");
  EXPECT_TRUE(warning.get<Finding>().why_unsafe.empty()) << "the schema's one optional field";
}

}  // namespace
}  // namespace mih
