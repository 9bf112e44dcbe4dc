// The report of a conformance run: reading results.jsonl (a rerun's last line wins, missing and
// malformed input named) and the case directories, the suites x cases table, the failures,
// JUnit counts and validity against tests/evidence/junit.xsd (checked with xmllint), escaping,
// and the HTML page's charts. The fixture is a small run written the way the runner writes it.
#include <sys/wait.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/contract/case_record.h"
#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/evidence/report.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

// The failure message of llama/Tp2: markup, a quote, a control character, a code fence.
const std::string kTp2Message = "loss at step 3: expected <x & y>, got \"nan\"\x01\nsee ```probes/rank0.jsonl```";

json result(const std::string& spec, const std::string& suite, const std::string& test, const std::string& case_name,
            const std::string& status, const std::string& message = "", const std::string& time = "2026-11-30T11:00:05Z") {
  std::string instance = spec;
  instance[0] = static_cast<char>(std::toupper(instance[0]));
  return {{"name", instance + "/" + suite + "." + test + "/" + case_name},
          {"spec", spec},
          {"case", case_name},
          {"suite", suite},
          {"test", test},
          {"status", status},
          {"message", message},
          {"seconds", 0.25},
          {"evidence", spec + "/" + case_name},
          {"time", time}};
}

std::string jsonl(const std::vector<json>& rows) {
  std::string out;
  for (const json& row : rows) out += row.dump() + "\n";
  return out;
}

// steps 0..3 of a case, loss falling from `loss0`; `extra` lines are appended after them.
std::string metrics(double loss0, const std::vector<json>& extra = {}) {
  std::vector<json> rows;
  for (int s = 0; s < 4; ++s) {
    rows.push_back({{"step", s}, {"loss", loss0 - 0.1 * s}, {"grad_norm_pre_clip", 1.8 - 0.2 * s},
                    {"grad_norm_post_clip", 0.99}, {"lr", 0.001}, {"valid_tokens", 510}, {"step_ms", 217.7}});
  }
  rows.insert(rows.end(), extra.begin(), extra.end());
  return jsonl(rows);
}

// A whole case record (case_run.json is strict: every field, case_record.h) with the fields of
// `fields` over a record of a completed one-axis case; its config is dp_shard=<world_size>.
json case_record(const json& fields) {
  CaseRecord r;
  r.outcome = Outcome::kRan;
  r.matrix = MatrixSource::parse("cpu-smoke");
  r.fingerprint = "0123456789abcdef";
  r.files = {{"run/case.json", std::string(64, '0')}};
  r.world_size = fields.value("world_size", 1);
  if (r.world_size > 1) r.config = ParallelConfig::parse_mesh("dp_shard=" + std::to_string(r.world_size));
  json j = r;
  for (const auto& [key, value] : fields.items()) {
    if (key != "config") j[key] = value;
  }
  return j;
}

void write_case(const fs::path& dir, const json& fields, const std::string& state, const std::string& metrics_text) {
  write_file_atomic(dir / "case_run.json", case_record(fields).dump(2));
  write_file_atomic(dir / "integration_state.json", json{{"state", state}, {"reason", ""}}.dump(2));
  if (!metrics_text.empty()) write_file_atomic(dir / "cases" / "runtime" / "metrics.jsonl", metrics_text);
}

// llama: Reference, DpShard2 (compared to Reference; its LossMatchesReference failed, then
// passed on a rerun; a resume repeated step 2), Tp2 (compared to Reference; one failure, a
// step without a finite loss); mixtral: Ep2 (a transport failure before training, no metrics).
fs::path write_fixture(const std::string& name) {
  const fs::path root = testing::temp_dir(name);
  write_file_atomic(root / "results.jsonl",
                    jsonl({result("llama", "Structure", "ParametersMatch", "Reference", "passed", "", "2026-11-30T11:00:01Z"),
                           result("llama", "Structure", "ParametersMatch", "DpShard2", "passed"),
                           result("llama", "Structure", "ParametersMatch", "Tp2", "passed"),
                           result("llama", "NumericParity", "LossMatchesReference", "DpShard2", "failed", "first run"),
                           result("llama", "NumericParity", "GradNormMatchesReference", "DpShard2", "passed"),
                           result("llama", "NumericParity", "LossMatchesReference", "Tp2", "failed", kTp2Message),
                           result("llama", "NumericParity", "GradNormMatchesReference", "Tp2", "passed"),
                           result("llama", "Checkpoint", "ResumeMatches", "DpShard2", "skipped",
                                  "resume needs two launches\nsecond line"),
                           result("mixtral", "Structure", "ParametersMatch", "Ep2", "failed",
                                  "rank 1 closed its connection"),
                           result("llama", "NumericParity", "LossMatchesReference", "DpShard2", "passed", "",
                                  "2026-11-30T11:09:00Z")}));
  const json train = {{"spec", "llama"}, {"kind", "train"}, {"config", json::object()}, {"seconds", 2.7},
                      {"state", "STRUCTURE_VALIDATED"}, {"outcome", "ran"}};
  json reference = train, dp = train, tp = train;
  reference.update({{"case", "Reference"}, {"world_size", 1}});
  dp.update({{"case", "DpShard2"}, {"world_size", 2}, {"compare_to", "Reference"}});
  tp.update({{"case", "Tp2"}, {"world_size", 2}, {"compare_to", "Reference"}});
  write_case(root / "llama" / "Reference", reference, "STRUCTURE_VALIDATED", metrics(5.5));
  write_case(root / "llama" / "DpShard2", dp, "STRUCTURE_VALIDATED",
             metrics(5.5, {{{"step", 2}, {"loss", 4.25}, {"grad_norm_pre_clip", 1.4}}}));
  write_case(root / "llama" / "Tp2", tp, "STRUCTURE_VALIDATED",
             metrics(5.6, {{{"step", 2}, {"loss", nullptr}, {"grad_norm_pre_clip", 1.4}}}));
  write_case(root / "mixtral" / "Ep2",
             {{"spec", "mixtral"}, {"case", "Ep2"}, {"kind", "train"}, {"world_size", 2}, {"compare_to", "Reference"},
              {"outcome", "transport_failure"}, {"error", "rank 1 closed its connection"}},
             "FAILED", "");
  return root;
}

const TestResult& find_test(const RunResults& run, const std::string& name) {
  for (const TestResult& t : run.tests) {
    if (t.name == name) return t;
  }
  throw std::runtime_error("no test " + name);
}

Error error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no mih::Error was thrown";
  return Error(Code::kOk, "");
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// The text from `start` up to (not including) the next `end` after it; "" if `start` is absent.
std::string between(const std::string& text, const std::string& start, const std::string& end) {
  const size_t from = text.find(start);
  if (from == std::string::npos) return "";
  return text.substr(from, text.find(end, from + start.size()) - from);
}

struct CommandResult {
  int status = -1;
  std::string output;
};

CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe)) r.output += buffer;
  const int status = ::pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// xmllint --schema tests/evidence/junit.xsd on `xml`, written to a file in `dir`.
CommandResult validate_junit(const std::string& xml, const fs::path& dir) {
  const fs::path file = dir / "report.xml";
  write_file_atomic(file, xml);
  const fs::path schema = fs::path(MIH_TEST_SOURCE_DIR) / "junit.xsd";
  CommandResult r = run_command("xmllint --noout --schema '" + schema.string() + "' '" + file.string() + "'");
  if (r.status == 127) {
    ADD_FAILURE() << "xmllint not found: install libxml2-utils (it is in MIH_PACKAGES of scripts/lib/common.sh)";
  }
  return r;
}

TEST(ReportFormatTest, ParsesNamesAndListsTheValidOnes) {
  EXPECT_EQ(parse_report_format("md"), ReportFormat::kMarkdown);
  EXPECT_EQ(parse_report_format("junit"), ReportFormat::kJunit);
  EXPECT_EQ(parse_report_format("html"), ReportFormat::kHtml);
  const Error e = error_of([] { parse_report_format("pdf"); });
  EXPECT_EQ(e.code(), Code::kInvalidSpec);
  EXPECT_THAT(e.message(), HasSubstr("expected one of md, junit, html; got 'pdf'"));
}

TEST(RunResultsTest, LastLineOfARerunWins) {
  const RunResults run = read_run_results(write_fixture("report_rerun"));
  EXPECT_EQ(run.tests.size(), 9u);  // 10 lines, one of them a rerun
  const TestResult& rerun = find_test(run, "Llama/NumericParity.LossMatchesReference/DpShard2");
  EXPECT_EQ(rerun.status, TestStatus::kPassed);
  EXPECT_EQ(rerun.time, "2026-11-30T11:09:00Z");
  EXPECT_EQ(run.passed(), 6);
  EXPECT_EQ(run.failed(), 2);
  EXPECT_EQ(run.skipped(), 1);
  EXPECT_EQ(run.tests.front().name, "Llama/Checkpoint.ResumeMatches/DpShard2");  // sorted by name
}

TEST(RunResultsTest, ReadsTheCaseDirectories) {
  const RunResults run = read_run_results(write_fixture("report_cases"));
  ASSERT_EQ(run.cases.size(), 4u);
  const CaseResult* dp = run.find_case("llama", "DpShard2");
  ASSERT_NE(dp, nullptr);
  EXPECT_EQ(dp->evidence, "llama/DpShard2");
  EXPECT_EQ(dp->compare_to(), "Reference");
  ASSERT_TRUE(dp->record.has_value());
  EXPECT_EQ(dp->record->world_size, 2);
  EXPECT_EQ(dp->state, "STRUCTURE_VALIDATED");
  ASSERT_EQ(dp->steps.size(), 4u);
  EXPECT_EQ(dp->steps[2].loss, 4.25);  // the resumed step 2's line, written last
  EXPECT_TRUE(dp->problems.empty()) << dp->problems.front();
  EXPECT_TRUE(std::isnan(run.find_case("llama", "Tp2")->steps[2].loss));
  const CaseResult* ep = run.find_case("mixtral", "Ep2");
  ASSERT_NE(ep, nullptr);
  EXPECT_TRUE(ep->steps.empty());
  EXPECT_EQ(ep->outcome(), Outcome::kTransportFailure);
  EXPECT_EQ(ep->state, "FAILED");
  EXPECT_EQ(run.find_case("llama", "Ep2"), nullptr);
}

// A case_run.json that CaseRecord's from_json refuses leaves the case without a record: the
// report still renders, the problem listed, and the case is not a pass.
TEST(RunResultsTest, ARecordThatDoesNotReadIsAProblemAndTheReportRenders) {
  const fs::path root = write_fixture("report_bad_record");
  json edited = read_json_file(root / "llama/DpShard2/case_run.json");
  edited["outcome"] = "passed";  // not an outcome mih writes
  write_file_atomic(root / "llama/DpShard2/case_run.json", edited.dump(2));
  const RunResults run = read_run_results(root);
  const CaseResult* dp = run.find_case("llama", "DpShard2");
  ASSERT_NE(dp, nullptr);
  EXPECT_FALSE(dp->record.has_value());
  EXPECT_FALSE(dp->outcome().has_value());
  ASSERT_FALSE(dp->problems.empty());
  EXPECT_THAT(dp->problems.front(), HasSubstr("case_run.json: case record: outcome"));
  EXPECT_THAT(render_report(run, ReportFormat::kMarkdown), HasSubstr("llama/DpShard2: evidence that cannot be read"));
  EXPECT_THAT(not_passed_reasons(run), ::testing::Contains(HasSubstr("evidence that cannot be read")));
}

TEST(RunResultsTest, MissingRunRootOrResultsIsAFailedPreconditionNamingTheFile) {
  const fs::path root = testing::temp_dir("report_missing");
  const Error no_results = error_of([&] { read_run_results(root); });
  EXPECT_EQ(no_results.code(), Code::kFailedPrecondition);
  EXPECT_THAT(no_results.message(), HasSubstr("'" + (root / "results.jsonl").string() + "' does not exist"));
  EXPECT_THAT(no_results.message(), HasSubstr("--evidence-root " + root.string() + " first"));
  const Error no_root = error_of([&] { read_run_results(root / "nope"); });
  EXPECT_EQ(no_root.code(), Code::kFailedPrecondition);
  EXPECT_THAT(no_root.message(), HasSubstr("run root '" + (root / "nope").string() + "' does not exist"));
}

// A damaged results.jsonl is bad evidence (exit 12), like every other evidence file (it was 11).
TEST(RunResultsTest, MalformedLineIsBadEvidenceNamingFileAndLine) {
  const fs::path root = testing::temp_dir("report_malformed");
  const std::string file = (root / "results.jsonl").string();
  const std::string good = result("llama", "Structure", "ParametersMatch", "Tp2", "passed").dump() + "\n";
  write_file_atomic(file, good + "\n" + "{\"name\": \"Llama/A.B/C\", \"status\": \n");
  const Error not_json = error_of([&] { read_run_results(root); });
  EXPECT_EQ(not_json.code(), Code::kFailedPrecondition);
  EXPECT_THAT(not_json.message(), HasSubstr(file + " line 3 is not JSON"));  // line 2 is blank

  write_file_atomic(file, good + R"({"name": "Llama/A.B/C", "status": "ok"})" + "\n");
  const Error bad_status = error_of([&] { read_run_results(root); });
  EXPECT_EQ(bad_status.code(), Code::kFailedPrecondition);
  EXPECT_THAT(bad_status.message(), HasSubstr(file + " line 2: 'status' must be one of passed, failed, skipped; got 'ok'"));

  write_file_atomic(file, good + R"({"name": "Llama/A.B/C", "status": "passed", "seconds": "fast"})" + "\n");
  EXPECT_THAT(error_of([&] { read_run_results(root); }).message(), HasSubstr(file + " line 2: 'seconds' must be"));

  // A writer that died mid-line leaves a last line without its newline: dropped, not an error.
  write_file_atomic(file, good + R"({"name": "Llama/A.B/C", "sta)");
  EXPECT_EQ(read_run_results(root).tests.size(), 1u);
}

TEST(RunResultsTest, FieldsMissingFromALineComeFromTheTestName) {
  const fs::path root = testing::temp_dir("report_names");
  write_file_atomic(root / "results.jsonl", R"({"name": "Llama/NumericParity.LossMatchesReference/Tp2", "status": "passed"})"
                                            "\n" R"({"name": "ErrorTest.HasACode", "status": "passed"})" "\n");
  const RunResults run = read_run_results(root);
  const TestResult& p = find_test(run, "Llama/NumericParity.LossMatchesReference/Tp2");
  EXPECT_EQ(p.suite, "NumericParity");
  EXPECT_EQ(p.test, "LossMatchesReference");
  EXPECT_EQ(p.case_name, "Tp2");
  const TestResult& plain = find_test(run, "ErrorTest.HasACode");
  EXPECT_EQ(plain.suite, "ErrorTest");
  EXPECT_EQ(plain.test, "HasACode");
  EXPECT_EQ(plain.case_name, "");
}

TEST(MarkdownReportTest, TableCellsArePassFailSkipOrDash) {
  const RunResults run = read_run_results(write_fixture("report_md_table"));
  const std::string md = render_report(run, ReportFormat::kMarkdown);
  // Mixtral/Ep2's failed test is not a verdict: its case did not complete (transport_failure).
  EXPECT_THAT(md, HasSubstr("9 tests: 6 passed, 1 failed, 1 not judged (infrastructure: 1 case did not complete), "
                            "1 skipped; 4 cases"));
  EXPECT_THAT(md, HasSubstr("\n- 1 test failed\n"));
  const std::string llama = between(md, "\n## llama\n", "\n## ");
  EXPECT_THAT(llama, HasSubstr("| suite | DpShard2 | Reference | Tp2 |\n|---|---|---|---|\n"));
  EXPECT_THAT(llama, HasSubstr("| Checkpoint | skip | - | - |\n"));
  // DpShard2: failed, then passed on the rerun; Tp2: one test failed, one passed.
  EXPECT_THAT(llama, HasSubstr("| NumericParity | pass | - | FAIL |\n"));
  EXPECT_THAT(llama, HasSubstr("| Structure | pass | pass | pass |\n"));
  const std::string mixtral = between(md, "\n## mixtral\n", "\n## ");
  EXPECT_THAT(mixtral, HasSubstr("| Structure | FAIL |\n"));
  EXPECT_THAT(mixtral, HasSubstr("`Ep2`: train; world size 2; outcome transport_failure; state FAILED"));
}

TEST(MarkdownReportTest, ListsEveryFailureWithEvidenceAndMessage) {
  const fs::path root = write_fixture("report_md_failures");
  const std::string md = render_report(read_run_results(root), ReportFormat::kMarkdown);
  const std::string failures = between(md, "\n## Failures\n", "\n## Skipped");
  EXPECT_EQ(count(failures, "\n### "), 2);
  EXPECT_THAT(failures, HasSubstr("### `Llama/NumericParity.LossMatchesReference/Tp2`\n\nEvidence: `" +
                                  (root / "llama" / "Tp2").string() + "`\n"));
  // The message holds a ``` fence, so the block's fence is longer.
  EXPECT_THAT(failures, HasSubstr("\n````\nloss at step 3: expected <x & y>, got \"nan\"\xEF\xBF\xBD\nsee "
                                  "```probes/rank0.jsonl```\n````\n"));
  EXPECT_THAT(failures, HasSubstr("### `Mixtral/Structure.ParametersMatch/Ep2` (transport failure)"));
  EXPECT_THAT(failures, Not(HasSubstr("LossMatchesReference/DpShard2")));  // passed on its rerun
  EXPECT_THAT(md, HasSubstr("\n## Skipped\n\n- `Llama/Checkpoint.ResumeMatches/DpShard2`: resume needs two launches\n"));
}

TEST(JunitReportTest, CountsAreRight) {
  const fs::path root = write_fixture("report_junit_counts");
  const std::string xml = render_report(read_run_results(root), ReportFormat::kJunit);
  EXPECT_THAT(xml, HasSubstr("<testsuites name=\"mih conformance " + root.string() +
                             "\" tests=\"9\" failures=\"1\" errors=\"1\" time=\"2.250\">"));
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"llama.NumericParity\" tests=\"4\" failures=\"1\" errors=\"0\" "
                             "skipped=\"0\" time=\"1.000\" timestamp=\"2026-11-30T11:00:05\">"));
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"llama.Checkpoint\" tests=\"1\" failures=\"0\" errors=\"0\" skipped=\"1\""));
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"llama.Structure\" tests=\"3\" failures=\"0\" errors=\"0\" skipped=\"0\" "
                             "time=\"0.750\" timestamp=\"2026-11-30T11:00:01\">"));
  EXPECT_THAT(xml, HasSubstr("<testsuite name=\"mixtral.Structure\" tests=\"1\" failures=\"0\" errors=\"1\""));
  EXPECT_EQ(count(xml, "<testsuite "), 4);
  EXPECT_EQ(count(xml, "<testcase "), 9);
  EXPECT_EQ(count(xml, "<failure "), 1);
  EXPECT_EQ(count(xml, "<skipped "), 1);
  EXPECT_THAT(xml, HasSubstr("<testcase classname=\"llama.NumericParity\" name=\"LossMatchesReference/DpShard2\" "
                             "time=\"0.250\"/>"));
  EXPECT_THAT(xml, HasSubstr("<error message=\"rank 1 closed its connection\" type=\"transport_failure\">"));
  EXPECT_THAT(xml, HasSubstr("<skipped message=\"resume needs two launches&#10;second line\"/>"));
}

TEST(JunitReportTest, ValidatesAgainstTheSchema) {
  const fs::path root = write_fixture("report_junit_valid");
  const CommandResult r = validate_junit(render_report(read_run_results(root), ReportFormat::kJunit), root);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("validates"));
}

// The schema is a real check: the report with one testcase's name removed fails it.
TEST(JunitReportTest, SchemaRejectsATestcaseWithoutName) {
  const fs::path root = write_fixture("report_junit_broken");
  std::string xml = render_report(read_run_results(root), ReportFormat::kJunit);
  const std::string name = " name=\"LossMatchesReference/Tp2\"";
  const size_t at = xml.find(name);
  ASSERT_NE(at, std::string::npos);
  xml.erase(at, name.size());
  const CommandResult r = validate_junit(xml, root);
  ASSERT_NE(r.status, 127);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("The attribute 'name' is required but missing"));
}

// Every test line passed, and yet: DpShard2's record names fault F20 and Tp2's state is FAILED.
TEST(ReportVerdictTest, AFaultOrAFailedStateIsNeverAPass) {
  const fs::path root = testing::temp_dir("report_verdict");
  write_file_atomic(root / "results.jsonl",
                    jsonl({result("llama", "NumericParity", "LossMatchesReference", "DpShard2", "passed"),
                           result("llama", "NumericParity", "LossMatchesReference", "Tp2", "passed"),
                           result("llama", "Structure", "ParametersMatch", "Reference", "passed")}));
  const json train = {{"spec", "llama"}, {"kind", "train"}, {"world_size", 2}, {"outcome", "ran"}, {"fault", ""}};
  json reference = train, dp = train, tp = train;
  reference.update({{"case", "Reference"}});
  dp.update({{"case", "DpShard2"}, {"fault", "F20"}});
  tp.update({{"case", "Tp2"}});
  write_case(root / "llama" / "Reference", reference, "STRUCTURE_VALIDATED", metrics(5.5));
  write_case(root / "llama" / "DpShard2", dp, "STRUCTURE_VALIDATED", metrics(5.5));
  write_case(root / "llama" / "Tp2", tp, "FAILED", metrics(5.5));
  const RunResults run = read_run_results(root);
  EXPECT_EQ(run.failed(), 0);
  const std::vector<std::string> reasons = not_passed_reasons(run);
  ASSERT_EQ(reasons.size(), 2u) << ::testing::PrintToString(reasons);
  EXPECT_THAT(reasons[0], HasSubstr("llama/DpShard2: ran with fault F20 of the catalog injected"));
  EXPECT_THAT(reasons[1], HasSubstr("llama/Tp2: integration state FAILED"));
  const std::string md = render_report(run, ReportFormat::kMarkdown);
  EXPECT_THAT(md, HasSubstr("3 tests: 3 passed, 0 failed, 0 skipped; 3 cases\n\n**Verdict: NOT PASSED**\n\n- llama/DpShard2: "));
  EXPECT_THAT(md, HasSubstr("`DpShard2`: train; world size 2; outcome ran; state STRUCTURE_VALIDATED; fault F20 injected"));
  EXPECT_THAT(render_report(run, ReportFormat::kHtml), HasSubstr("<p class=\"verdict fail\">Verdict: NOT PASSED</p>"));
  // JUnit: a failed CaseRecord testcase for each case, valid against the schema.
  const std::string xml = render_report(run, ReportFormat::kJunit);
  EXPECT_THAT(xml, HasSubstr("tests=\"5\" failures=\"2\" errors=\"0\""));
  EXPECT_THAT(xml, HasSubstr("<testcase classname=\"llama.CaseRecord\" name=\"Record/DpShard2\""));
  EXPECT_THAT(xml, HasSubstr("ran with fault F20 of the catalog injected"));
  const CommandResult valid = validate_junit(xml, root);
  EXPECT_EQ(valid.status, 0) << valid.output;
  // The same run without the fault and the FAILED state is a pass.
  dp["fault"] = "";
  write_case(root / "llama" / "DpShard2", dp, "STRUCTURE_VALIDATED", metrics(5.5));
  write_case(root / "llama" / "Tp2", tp, "MATRIX_PASSED", metrics(5.5));
  const RunResults clean = read_run_results(root);
  EXPECT_TRUE(not_passed_reasons(clean).empty()) << ::testing::PrintToString(not_passed_reasons(clean));
  EXPECT_THAT(render_report(clean, ReportFormat::kMarkdown), HasSubstr("\n**Verdict: PASSED**\n"));
  EXPECT_THAT(render_report(clean, ReportFormat::kJunit), HasSubstr("tests=\"3\" failures=\"0\""));
}

TEST(JunitReportTest, EscapesMarkupAndDropsControlCharacters) {
  const std::string xml = render_report(read_run_results(write_fixture("report_junit_escape")), ReportFormat::kJunit);
  const std::string failure = between(xml, "<failure ", "</failure>");
  EXPECT_THAT(failure, HasSubstr("message=\"loss at step 3: expected &lt;x &amp; y&gt;, got &quot;nan&quot;\xEF\xBF\xBD\""));
  EXPECT_THAT(failure, HasSubstr(">loss at step 3: expected &lt;x &amp; y&gt;, got &quot;nan&quot;\xEF\xBF\xBD\nsee "));
  EXPECT_EQ(xml.find('\x01'), std::string::npos);
  EXPECT_THAT(xml, Not(HasSubstr("<x & y>")));
}

TEST(HtmlReportTest, ChartsPerCaseAndEscapedFailures) {
  const std::string html = render_report(read_run_results(write_fixture("report_html")), ReportFormat::kHtml);
  EXPECT_THAT(html, HasSubstr("<!DOCTYPE html>"));
  for (const std::string id : {"case-llama-Reference", "case-llama-DpShard2", "case-llama-Tp2"}) {
    const std::string section = between(html, "id=\"" + id + "\"", "</section>");
    EXPECT_EQ(count(section, "<svg "), 2) << id;
    EXPECT_GE(count(section, "<polyline "), 2) << id;
    EXPECT_THAT(section, HasSubstr(">grad_norm_pre_clip</text>")) << id;
  }
  // Compared to Reference: its curve is the dashed one; Reference has no curve to compare to.
  const std::string dp = between(html, "id=\"case-llama-DpShard2\"", "</section>");
  EXPECT_EQ(count(dp, "stroke-dasharray"), 4);  // two charts: a dashed polyline and legend line each
  EXPECT_THAT(dp, HasSubstr(">Reference</text>"));
  EXPECT_THAT(between(html, "id=\"case-llama-Reference\"", "</section>"), Not(HasSubstr("stroke-dasharray")));
  // Tp2's step 2 has no finite loss: the line breaks there and the chart says so.
  EXPECT_THAT(between(html, "id=\"case-llama-Tp2\"", "</section>"), HasSubstr("loss (1 step not finite)"));
  const std::string ep = between(html, "id=\"case-mixtral-Ep2\"", "</section>");
  EXPECT_THAT(ep, HasSubstr("No training metrics"));
  EXPECT_EQ(count(ep, "<svg "), 0);

  EXPECT_THAT(html, HasSubstr("<pre>loss at step 3: expected &lt;x &amp; y&gt;, got &quot;nan&quot;\xEF\xBF\xBD\nsee "));
  EXPECT_THAT(html, Not(HasSubstr("<x & y>")));
  EXPECT_EQ(html.find('\x01'), std::string::npos);
  // Self-contained: no script, no external stylesheet, image or link.
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("<link")));
  EXPECT_THAT(html, Not(HasSubstr("src=")));
  EXPECT_THAT(html, Not(HasSubstr("href=\"http")));
}

// A reduced-precision lane's case: compare/calibration.json as verdicts::calibration_evidence
// writes it, one quantity at half its tolerance and one past it.
TEST(PrecisionReportTest, ShowsTheCalibrationAsATableAndAHeatMap) {
  const fs::path root = write_fixture("report_precision");
  auto q = [](const char* kind, const char* name, int step, const char* stage, double error, json noise, double tol) {
    return json{{"kind", kind}, {"name", name}, {"step", step}, {"stage", stage}, {"error", error}, {"noise", noise},
                {"tolerance", tol}};
  };
  write_file_atomic(root / "llama" / "DpShard2" / "compare" / "calibration.json",
                    json{{"dtype", "float32"}, {"epsilon", 1.1920928955078125e-07}, {"k", 10}, {"k_update", 50},
                         {"floor_eps", 4}, {"factor", 1}, {"reference", "LaneReference"},
                         {"max_error_over_tolerance", 2.0}, {"worst", "tensor 'norm.weight' at step 1, grad_before_clip"},
                         {"quantities", {q("metric", "loss", 0, "metrics", 5e-8, 1e-8, 1e-7),
                                         q("tensor", "norm.weight", 1, "grad_before_clip", 2e-5, 1e-6, 1e-5),
                                         q("tensor", "norm.weight", 0, "model_before", 0, nullptr, 4.8e-7)}}}
                        .dump());
  const RunResults run = read_run_results(root);
  const CaseResult* dp = run.find_case("llama", "DpShard2");
  ASSERT_NE(dp, nullptr);
  ASSERT_TRUE(dp->calibration.present);
  EXPECT_FALSE(run.find_case("llama", "Tp2")->calibration.present);
  ASSERT_EQ(dp->calibration.rows.size(), 3u);
  EXPECT_TRUE(std::isnan(dp->calibration.rows[2].noise));  // null: the twin did not record it
  const std::string md = render_report(run, ReportFormat::kMarkdown);
  const std::string section = between(md, "## Precision lanes", "## Time");
  EXPECT_THAT(section, HasSubstr("### llama / DpShard2"));
  EXPECT_THAT(section, HasSubstr("float32 lane against LaneReference: tolerance = max(10 x noise (50 for updated "
                                 "parameters), 4 x epsilon = 4.768e-07); largest error / tolerance 2.000"));
  EXPECT_THAT(section, HasSubstr("| metrics | 0.50 (5.0) | - |"));
  EXPECT_THAT(section, HasSubstr("| grad_before_clip | - | 2.00 **FAIL** (20.0) |"));
  EXPECT_THAT(section, HasSubstr("| model_before | 0.00 (-) | - |"));
  EXPECT_THAT(md, Not(HasSubstr("### llama / Tp2\n")));
  const std::string html = between(render_report(run, ReportFormat::kHtml), "id=\"case-llama-DpShard2\"", "</section>");
  EXPECT_THAT(html, HasSubstr("<table class=\"heat\">"));
  EXPECT_THAT(html, HasSubstr("<th class=\"q\">tensor norm.weight</th>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"h4\" title=\"error 2e-05, noise 1e-06, tolerance 1e-05, error / noise 20\">2.00</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"h2\" title=\"error 5e-08, noise 1e-08, tolerance 1e-07, error / noise 5\">0.50</td>"));
  EXPECT_THAT(html, HasSubstr("noise not measured"));
}

}  // namespace
}  // namespace mih
