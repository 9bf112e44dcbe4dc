// The diagnosis across a run's matrix (harness/evidence/diagnosis.h) on synthetic case tables:
// it names the feature that separates failing from passing cases (a single one, a pair, a
// resume kind), says what the run cannot tell apart, refuses to over-claim (one failing case,
// only the Reference passing, every case failing, no separating feature), picks the smallest
// pair to rerun, and reaches every report format from a run root.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/contract/case_record.h"
#include "harness/base/files.h"
#include "harness/evidence/diagnosis.h"
#include "harness/evidence/report.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using ::testing::UnorderedElementsAre;
using Verdict = DiagnosisCase::Verdict;

// The config of `mesh` ("dp_shard=2,ep=2"; "1" for world size 1) in the float64 lane.
ParallelConfig config_of(const std::string& mesh) {
  ParallelConfig c = mesh == "1" ? ParallelConfig() : ParallelConfig::parse_mesh(mesh);
  c.dtype = DType::kFloat64;
  return c;
}

// A case of spec `spec` named `name` with the config of `mesh`.
DiagnosisCase make(const std::string& name, const std::string& mesh, Verdict verdict, const std::string& spec = "moe") {
  DiagnosisCase c;
  c.spec = spec;
  c.name = name;
  c.config = config_of(mesh);
  c.kind = name == "Reference" ? "reference" : "train";
  c.verdict = verdict;
  c.matrix = "cpu-smoke";
  if (verdict == Verdict::kFailed) c.failed_suites = {"NumericParity"};
  c.passed_suites = {"Structure"};
  // A passing case compared with the Reference compared something (a control may be one).
  if (verdict == Verdict::kPassed && c.kind != "reference") c.passed_suites.insert("NumericParity");
  return c;
}

DiagnosisCase with(DiagnosisCase c, const std::function<void(ParallelConfig&)>& edit) {
  edit(c.config);
  return c;
}

DiagnosisCase resume(const std::string& name, const std::string& save, const std::string& load, Verdict verdict) {
  DiagnosisCase c = make(name, load, verdict, "llama");
  c.kind = save == load ? "resume" : "cross_resume";
  c.save_config = config_of(save);
  return c;
}

const auto kPass = Verdict::kPassed;
const auto kFail = Verdict::kFailed;

void sp(ParallelConfig& c) { c.sequence_parallel = true; }
void zigzag(ParallelConfig& c) { c.cp_layout = CpLayout::kZigzag; }

TEST(DiagnosisTest, NamesEpWhenTheEpCasesFailAndTheirEp1ControlsPass) {
  // A naive reading of one case (what DpShard2Ep2 has that the Reference lacks) would say
  // dp_shard; the matrix says ep: every dp_shard case without ep passes.
  const Diagnosis d = diagnose({make("Reference", "1", kPass), make("DpShard2", "dp_shard=2", kPass),
                                make("DpShard4", "dp_shard=4", kPass), make("DpShard2Ep2", "dp_shard=2,ep=2", kFail),
                                make("DpShard4Ep2", "dp_shard=4,ep=2", kFail),
                                with(make("Tp2Sp", "tp=2", kPass), sp),
                                with(make("DpShard2Tp2SpEp2", "dp_shard=2,tp=2,ep=2", kFail), sp)});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kSeparated);
  EXPECT_THAT(d.features, ElementsAre("ep>1"));
  EXPECT_THAT(d.controls, UnorderedElementsAre("moe/DpShard2", "moe/DpShard4"));
  EXPECT_THAT(d.summary(), StartsWith("fails only with ep > 1 (3 of 7 cases fail"));
  EXPECT_THAT(d.summary(), HasSubstr("EP=1 controls pass: moe/DpShard2, moe/DpShard4"));
  EXPECT_TRUE(d.indistinguishable.empty());
}

TEST(DiagnosisTest, NamesEpWithoutEdpWhenTheFsdpShardedExpertsPass) {
  // F23 in cpu-smoke: experts also FSDP-sharded over edp = dp_shard * cp / ep > 1 take the
  // reduce-scatter path, so only edp = 1 cases fail; "ep > 1" alone would have an exception.
  const Diagnosis d = diagnose({make("Reference", "1", kPass), make("DpShard2", "dp_shard=2", kPass),
                                make("DpShard4", "dp_shard=4", kPass), make("DpShard2Ep2", "dp_shard=2,ep=2", kFail),
                                make("DpShard4Ep2", "dp_shard=4,ep=2", kPass),
                                with(make("DpShard2Tp2Ep2Sp", "dp_shard=2,tp=2,ep=2", kFail), sp),
                                with(make("DpShard2Tp2Sp", "dp_shard=2,tp=2", kPass), sp)});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kSeparated);
  EXPECT_THAT(d.features, ElementsAre("ep>1", "!edp>1"));
  EXPECT_THAT(d.summary(), StartsWith("fails only with ep > 1 and edp = 1 (2 of 7 cases fail"));
  EXPECT_THAT(d.controls, UnorderedElementsAre("moe/DpShard2", "moe/DpShard2Tp2Sp"));
}

TEST(DiagnosisTest, NamesAPairTpWithoutSequenceParallelism) {
  const Diagnosis d = diagnose({make("Reference", "1", kPass, "llama"), make("DpShard2", "dp_shard=2", kPass, "llama"),
                                make("Tp2", "tp=2", kFail, "llama"), make("DpShard2Tp2", "dp_shard=2,tp=2", kFail, "llama"),
                                make("Cp2Tp2", "cp=2,tp=2", kFail, "llama"),
                                with(make("Tp2Sp", "tp=2", kPass, "llama"), sp),
                                with(make("DpShard2Tp2Sp", "dp_shard=2,tp=2", kPass, "llama"), sp)});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kSeparated);
  EXPECT_THAT(d.features, ElementsAre("tp>1", "!sp"));
  EXPECT_EQ(d.explanation, "tp > 1 without sequence parallelism");
  EXPECT_THAT(d.summary(), StartsWith("fails only with tp > 1 without sequence parallelism"));
}

TEST(DiagnosisTest, OnlyResumesAcrossTopologiesFail) {
  const Diagnosis d = diagnose({make("Reference", "1", kPass, "llama"), make("DpShard2", "dp_shard=2", kPass, "llama"),
                                make("Tp2", "tp=2", kPass, "llama"), make("Cp2", "cp=2", kPass, "llama"),
                                resume("ResumeDpShard2", "dp_shard=2", "dp_shard=2", kPass),
                                resume("ResumeDpShard2ToTp2", "dp_shard=2", "tp=2", kFail),
                                resume("ResumeTp2ToCp2", "tp=2", "cp=2", kFail)});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kSeparated);
  EXPECT_THAT(d.features, ElementsAre("cross_topology_resume"));
  EXPECT_THAT(d.summary(), StartsWith("fails only with a resume across topologies"));
  // Their uninterrupted twins (the configs they load into) pass; the same-topology resume is
  // not a twin of either.
  EXPECT_THAT(d.controls, UnorderedElementsAre("llama/Tp2", "llama/Cp2"));
  EXPECT_THAT(d.summary(), HasSubstr("uninterrupted or same-topology controls pass: llama/Tp2, llama/Cp2"));
}

TEST(DiagnosisTest, OneFailingCaseIsSaidToBeOneCaseNotARule) {
  const Diagnosis d = diagnose({make("Reference", "1", kPass), make("DpShard2", "dp_shard=2", kPass),
                                make("DpShard2Ep2", "dp_shard=2,ep=2", kFail)});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kSeparated);
  EXPECT_THAT(d.features, ElementsAre("ep>1"));
  EXPECT_THAT(d.summary(), StartsWith("1 of 3 cases fails: moe/DpShard2Ep2, the only one with ep > 1"));
  EXPECT_THAT(d.summary(), HasSubstr("its EP=1 control passes: moe/DpShard2"));
  EXPECT_THAT(d.summary(), Not(HasSubstr("fails only")));
}

TEST(DiagnosisTest, OnlyTheReferencePassingBlamesNoAxis) {
  const Diagnosis one = diagnose({make("Reference", "1", kPass, "llama"), make("DpShard2", "dp_shard=2", kFail, "llama")});
  EXPECT_EQ(one.kind, Diagnosis::Kind::kEveryParallel);
  EXPECT_THAT(one.features, ElementsAre("world_size>1"));
  EXPECT_THAT(one.summary(), HasSubstr("too few cases to tell which of its features matters"));
  EXPECT_THAT(one.indistinguishable, ElementsAre("dp_shard > 1"));

  const Diagnosis all = diagnose({make("Reference", "1", kPass, "llama"), make("DpShard2", "dp_shard=2", kFail, "llama"),
                                  make("Tp2", "tp=2", kFail, "llama"), with(make("Cp2Zz", "cp=2", kFail, "llama"), zigzag)});
  EXPECT_EQ(all.kind, Diagnosis::Kind::kEveryParallel);
  EXPECT_THAT(all.summary(), StartsWith("every parallel case fails (3 of 4 cases)"));
  EXPECT_THAT(all.summary(), Not(HasSubstr("a passing parallel case without it")));
}

TEST(DiagnosisTest, EveryCaseFailingTheReferenceIncludedIsNotAParallelBug) {
  const Diagnosis d = diagnose({make("Reference", "1", kFail, "llama"), make("DpShard2", "dp_shard=2", kFail, "llama"),
                                make("Tp2", "tp=2", kFail, "llama")});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kEveryCase);
  EXPECT_THAT(d.features, ElementsAre("every_case"));
  EXPECT_THAT(d.summary(), HasSubstr("every case fails, the Reference included (3 cases): not a parallel bug"));
  EXPECT_FALSE(d.pair.has_value());

  const Diagnosis no_reference =
      diagnose({make("DpShard2", "dp_shard=2", kFail, "llama"), make("Tp2", "tp=2", kFail, "llama")});
  EXPECT_THAT(no_reference.summary(), StartsWith("every case fails alike (2 cases, no Reference among them)"));
}

TEST(DiagnosisTest, SaysWhatTheRunCannotTellApart) {
  // Every cp case is zigzag: cp > 1 and the zigzag layout fail the same cases.
  const Diagnosis d = diagnose({make("Reference", "1", kPass, "llama"), make("DpShard2", "dp_shard=2", kPass, "llama"),
                                make("Tp2", "tp=2", kPass, "llama"), with(make("Cp2Zz", "cp=2", kFail, "llama"), zigzag),
                                with(make("Cp2ZzTp2", "cp=2,tp=2", kFail, "llama"), zigzag)});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kSeparated);
  EXPECT_THAT(d.features, ElementsAre("cp>1"));
  EXPECT_THAT(d.indistinguishable, ElementsAre("the zigzag cp layout"));
  EXPECT_THAT(d.lines(), ::testing::Contains(HasSubstr("the run cannot tell cp > 1 from the zigzag cp layout")));
}

TEST(DiagnosisTest, StatesExceptionsInALargeMatrixAndRefusesInASmallOne) {
  std::vector<DiagnosisCase> cases = {make("Reference", "1", kPass), make("DpShard2", "dp_shard=2", kPass),
                                      make("DpShard4", "dp_shard=4", kPass), make("Tp2", "tp=2", kPass),
                                      make("Cp2", "cp=2", kPass), make("DpShard2Tp2", "dp_shard=2,tp=2", kPass),
                                      make("DpShard2Ep2", "dp_shard=2,ep=2", kFail),
                                      make("DpShard4Ep2", "dp_shard=4,ep=2", kFail),
                                      make("Cp2Ep2", "cp=2,ep=2", kFail),
                                      make("DpShard2Cp2Ep2", "dp_shard=2,cp=2,ep=2", kPass)};
  const Diagnosis d = diagnose(cases);
  EXPECT_EQ(d.kind, Diagnosis::Kind::kMostly);
  EXPECT_THAT(d.features, ElementsAre("ep>1"));
  EXPECT_THAT(d.exceptions, ElementsAre("moe/DpShard2Cp2Ep2 passes with it"));

  // Three cases, two failures that share nothing the passing one lacks.
  const Diagnosis small = diagnose({make("DpShard2", "dp_shard=2", kFail), make("Tp2", "tp=2", kFail),
                                    make("DpShard2Tp2", "dp_shard=2,tp=2", kPass)});
  EXPECT_EQ(small.kind, Diagnosis::Kind::kInconclusive);
  EXPECT_THAT(small.summary(), StartsWith("no feature of the configurations, nor a pair of them, separates"));
  EXPECT_TRUE(small.features.empty());
}

TEST(DiagnosisTest, LeavesOutCasesWithoutAVerdict) {
  DiagnosisCase killed = make("Tp2", "tp=2", Verdict::kNone);
  killed.no_verdict = "transport_failure";
  const Diagnosis d = diagnose({make("Reference", "1", kPass), make("DpShard2", "dp_shard=2", kPass),
                                make("DpShard2Ep2", "dp_shard=2,ep=2", kFail), killed});
  EXPECT_THAT(d.no_verdict, ElementsAre("moe/Tp2 (transport_failure)"));
  EXPECT_THAT(d.passing, UnorderedElementsAre("moe/Reference", "moe/DpShard2"));
  EXPECT_THAT(d.lines().back(), HasSubstr("left out, without a verdict: moe/Tp2 (transport_failure)"));
  EXPECT_EQ(diagnose({make("Reference", "1", kPass), killed}).kind, Diagnosis::Kind::kNoFailure);
  EXPECT_TRUE(diagnose({make("Reference", "1", kPass), killed}).lines().empty());
}

TEST(DiagnosisTest, SmallestPairIsTheClosestPassingCaseWithItsRerunCommands) {
  DiagnosisCase faulty = make("DpShard2Ep2", "dp_shard=2,ep=2", kFail);
  faulty.fault = "F23";
  faulty.matrix = "/tmp/my matrices/moe.json";
  DiagnosisCase control = make("DpShard2", "dp_shard=2", kPass);
  control.fault = "F23";
  control.fault_not_reached = true;
  control.matrix = faulty.matrix;
  faulty.prefix = control.prefix = "Moe";
  const Diagnosis d = diagnose({make("Reference", "1", kPass), control, faulty,
                                make("DpShard4Ep2", "dp_shard=4,ep=2", kFail)});
  ASSERT_TRUE(d.pair.has_value());
  EXPECT_EQ(d.pair->failing, "moe/DpShard2Ep2");
  EXPECT_EQ(d.pair->passing, "moe/DpShard2");
  EXPECT_THAT(d.pair->differences, ElementsAre("ep > 1"));
  EXPECT_EQ(d.pair->failing_command, "mih run --spec moe --case DpShard2Ep2 --matrix '/tmp/my matrices/moe.json' --fault F23");
  // The control never ran the fault's code: its command reruns the correct code.
  EXPECT_EQ(d.pair->passing_command, "mih run --spec moe --case DpShard2 --matrix '/tmp/my matrices/moe.json'");
  EXPECT_THAT(d.lines(), ::testing::Contains(HasSubstr("never reached the fault's code")));
  // Both verdicts in one run: the fault only where it was reached.
  EXPECT_EQ(d.pair->test_command,
            "mih test --prefixes Moe --matrix '/tmp/my matrices/moe.json' --fault F23 --fault-cases DpShard2Ep2 "
            "'--gtest_filter=Moe/*.*/DpShard2Ep2:Moe/*.*/DpShard2'");
  // Cases run from other matrices have no common command.
  control.matrix = "cpu-smoke";
  EXPECT_EQ(diagnose({control, faulty}).pair->test_command, "");
}

TEST(DiagnosisTest, SaysWhenOnlyTheReferenceComparedSuitesFail) {
  DiagnosisCase a = make("DpShard2", "dp_shard=2", kFail, "llama");
  a.passed_suites = {"DataContract", "Structure"};
  DiagnosisCase b = make("DpShard4", "dp_shard=4", kFail, "llama");
  const Diagnosis d = diagnose({make("Reference", "1", kPass, "llama"), make("Tp2", "tp=2", kPass, "llama"), a, b});
  EXPECT_TRUE(d.reference_compared_only);
  EXPECT_THAT(d.lines(), ::testing::Contains(HasSubstr("only the suites that compare with the Reference fail")));
  b.failed_suites.insert("DataContract");
  EXPECT_FALSE(diagnose({make("Reference", "1", kPass, "llama"), a, b}).reference_compared_only);
}

// Issue 52: a config-invariant bug (the Reference fails MatchesOriginal at layers.0) beside a
// few parallel failures was blamed on activation checkpointing.
TEST(DiagnosisTest, LeadsWithTheOriginalModelWhenTheReferenceFailsIt) {
  DiagnosisCase reference = make("Reference", "1", kFail, "llama");
  reference.failed_suites = {"MatchesOriginal"};
  reference.passed_suites = {"Structure", "ModuleParity"};
  reference.original_divergence =
      "localized to 'layers.0': its forward output is the first to diverge at step 0 in forward order "
      "(HiddenStatesMatchOriginal)";
  auto ac = [](ParallelConfig& c) { c.activation_checkpointing = true; };
  const Diagnosis d = diagnose({reference, make("DpShard2", "dp_shard=2", kPass, "llama"),
                                make("DpReplicate2", "dp_replicate=2", kPass, "llama"),
                                make("Tp2", "tp=2", kPass, "llama"),
                                with(make("DpShard2Ac", "dp_shard=2", kFail, "llama"), ac),
                                with(make("Tp2Ac", "tp=2", kFail, "llama"), ac)});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kOriginalModel);
  EXPECT_THAT(d.features, ElementsAre("original_model"));
  EXPECT_THAT(d.summary(), StartsWith("the port does not compute the original model: llama/Reference fails "
                                      "MatchesOriginal: localized to 'layers.0'"));
  EXPECT_THAT(d.consequences, ElementsAre("llama/DpShard2Ac", "llama/Tp2Ac"));
  EXPECT_THAT(d.summary(), HasSubstr("treat them as its consequences, not an axis's"));
  EXPECT_THAT(d.summary(), Not(HasSubstr("activation checkpointing")));
  EXPECT_FALSE(d.pair.has_value());  // never "rerun Reference / DpReplicate2"
  EXPECT_EQ(d.to_json()["kind"], "original_model");

  // ModuleParity on the Reference is the original model too; tp cases failing are its consequences.
  reference.failed_suites = {"ModuleParity"};
  reference.original_divergence = "parity case 'rms_norm' forward: relative error 0.5 > tolerance 1e-12";
  const Diagnosis m = diagnose({reference, make("DpShard2", "dp_shard=2", kPass, "llama"),
                                make("Tp2", "tp=2", kFail, "llama"), make("DpShard2Tp2", "dp_shard=2,tp=2", kFail, "llama")});
  EXPECT_EQ(m.kind, Diagnosis::Kind::kOriginalModel);
  EXPECT_THAT(m.summary(), StartsWith("the port does not compute the original model: llama/Reference fails "
                                      "ModuleParity: parity case 'rms_norm'"));
  EXPECT_THAT(m.summary(), Not(HasSubstr("tp > 1")));

  // A Reference that also fails a findings-based suite has a fault that suite names: not led by this.
  reference.failed_suites = {"ModuleParity", "DataContract"};
  EXPECT_EQ(diagnose({reference, make("Tp2", "tp=2", kFail, "llama")}).kind, Diagnosis::Kind::kEveryCase);
}

// The original-model rule holds per spec: moe's Reference not being the original says nothing
// of llama's tp failures, which are diagnosed on llama's table alone (they were hidden as "its
// consequences"). And a Reference failing ModuleParity alone is said as ModuleParity.
TEST(DiagnosisTest, TheOriginalModelRuleHoldsPerSpec) {
  DiagnosisCase moe_reference = make("Reference", "1", kFail, "moe");
  moe_reference.failed_suites = {"ModuleParity"};
  moe_reference.original_divergence = "parity case 'router' forward: relative error 0.5 > tolerance 1e-12";
  const Diagnosis d = diagnose({moe_reference, make("DpShard2", "dp_shard=2", kFail, "moe"),
                                make("Reference", "1", kPass, "llama"), make("DpShard2", "dp_shard=2", kPass, "llama"),
                                make("Tp2", "tp=2", kFail, "llama"), make("DpShard2Tp2", "dp_shard=2,tp=2", kFail, "llama")});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kSeparated);
  EXPECT_THAT(d.failing, ElementsAre("llama/Tp2", "llama/DpShard2Tp2"));
  EXPECT_THAT(d.consequences, ElementsAre("moe/DpShard2"));
  EXPECT_THAT(d.summary(), StartsWith("the port does not compute the original model: moe/Reference fails ModuleParity"));
  EXPECT_THAT(d.summary(), HasSubstr("besides, the other specs: fails only with tp > 1 (2 of 4 cases fail"));
  EXPECT_THAT(d.summary(), Not(HasSubstr("llama/Tp2) are compared with that Reference")));
  // One spec only, ModuleParity alone failing: said as ModuleParity, not MatchesOriginal.
  const Diagnosis m = diagnose({moe_reference, make("DpShard2", "dp_shard=2", kPass, "moe")});
  EXPECT_EQ(m.kind, Diagnosis::Kind::kOriginalModel);
  EXPECT_THAT(m.summary(), HasSubstr("(only ModuleParity fails;"));
  EXPECT_THAT(m.summary(), Not(HasSubstr("only MatchesOriginal")));
}

// Issue 52: a case on which no comparison ran (its NumericParity not instantiated) passes by
// having compared nothing; it was the control and the pair's passing half.
TEST(DiagnosisTest, APassThatComparedNothingIsNeverAControl) {
  DiagnosisCase vacuous = make("DpShard2", "dp_shard=2", kPass);
  vacuous.passed_suites = {"Structure", "GradientSync"};
  const Diagnosis d = diagnose({make("Reference", "1", kPass), vacuous, make("DpShard4", "dp_shard=4", kPass),
                                make("DpShard2Ep2", "dp_shard=2,ep=2", kFail)});
  EXPECT_THAT(d.compared_nothing, UnorderedElementsAre("moe/Reference", "moe/DpShard2"));
  EXPECT_THAT(d.controls, Not(::testing::Contains("moe/DpShard2")));
  ASSERT_TRUE(d.pair.has_value());
  EXPECT_EQ(d.pair->passing, "moe/DpShard4");
  EXPECT_THAT(d.lines(), ::testing::Contains(HasSubstr("passed without comparing anything")));
  // Nothing that compared passes: no pair rather than a vacuous one.
  EXPECT_FALSE(diagnose({make("Reference", "1", kPass), vacuous, make("DpShard2Ep2", "dp_shard=2,ep=2", kFail)})
                   .pair.has_value());
}

// Issue 52 (point 5): a wrong KV head per rank only where tp exceeds the KV heads fails at tp 4
// and passes at tp 2: "tp > 1" has two exceptions, the degree none.
TEST(DiagnosisTest, NamesTheTpDegreeWhenOnlyTp4Fails) {
  std::vector<DiagnosisCase> cases = {make("Reference", "1", kPass, "llama"), make("DpShard2", "dp_shard=2", kPass, "llama"),
                                      make("Tp2", "tp=2", kPass, "llama"), with(make("Tp2Sp", "tp=2", kPass, "llama"), sp),
                                      make("Tp4", "tp=4", kFail, "llama"), make("DpShard2Tp4", "dp_shard=2,tp=4", kFail, "llama"),
                                      with(make("Tp4Sp", "tp=4", kFail, "llama"), sp)};
  const Diagnosis d = diagnose(cases);
  EXPECT_EQ(d.kind, Diagnosis::Kind::kSeparated);
  EXPECT_THAT(d.features, ElementsAre("tp=4"));
  EXPECT_THAT(d.summary(), StartsWith("fails only with tp = 4 (3 of 7 cases fail"));
  EXPECT_THAT(d.summary(), Not(HasSubstr("tp > 1")));

  // A spec that declares 2 KV heads: tp above them is the cause, tp = 4 what the run cannot tell from it.
  for (auto& c : cases) c.num_key_value_heads = 2;
  const Diagnosis kv = diagnose(cases);
  EXPECT_THAT(kv.features, ElementsAre("tp>num_key_value_heads"));
  EXPECT_THAT(kv.summary(), StartsWith("fails only with tp > num_key_value_heads (3 of 7 cases fail"));
  EXPECT_THAT(kv.indistinguishable, ::testing::Contains("tp = 4"));
}

TEST(DiagnosisTest, NamesTheSpecWhenOnlyOneSpecFails) {
  const Diagnosis d = diagnose({make("Reference", "1", kPass, "llama"), make("DpShard2", "dp_shard=2", kPass, "llama"),
                                make("Tp2", "tp=2", kPass, "llama"), make("Reference", "1", kPass, "vlm"),
                                make("DpShard2", "dp_shard=2", kFail, "vlm"), make("Tp2", "tp=2", kFail, "vlm")});
  EXPECT_EQ(d.kind, Diagnosis::Kind::kSeparated);
  EXPECT_THAT(d.features, ElementsAre("spec=vlm", "world_size>1"));
  EXPECT_EQ(d.explanation, "spec vlm and world size > 1");
}

TEST(DiagnosisTest, JsonCarriesEveryField) {
  const json j = diagnose({make("Reference", "1", kPass), make("DpShard2", "dp_shard=2", kPass),
                           make("DpShard2Ep2", "dp_shard=2,ep=2", kFail)})
                     .to_json();
  EXPECT_EQ(j["kind"], "separated");
  EXPECT_EQ(j["features"], json::array({"ep>1"}));
  EXPECT_EQ(j["pair"]["passing"], "moe/DpShard2");
  // The summary, the Reference-compared suites alone failing, the pair and its two commands,
  // the Reference that compared nothing (no golden).
  EXPECT_EQ(j["lines"].size(), 6u);
  EXPECT_EQ(j["compared_nothing"], json::array({"moe/Reference"}));
  EXPECT_EQ(j["reference_compared_only"], true);
}

// A run root as the runner writes it: three moe cases, the ep one failing.
fs::path write_run(const std::string& name) {
  const fs::path root = testing::temp_dir(name);
  std::string results;
  auto line = [&](const std::string& c, const std::string& suite, const std::string& status) {
    results += json({{"name", "Moe/" + suite + ".T/" + c}, {"spec", "moe"}, {"case", c}, {"suite", suite},
                     {"test", "T"}, {"status", status}, {"message", status == "failed" ? "diverged" : ""},
                     {"seconds", 0.1}, {"evidence", "moe/" + c}, {"time", "2026-12-03T10:00:00Z"}})
                   .dump() +
               "\n";
  };
  line("Reference", "Structure", "passed");
  line("DpShard2", "Structure", "passed");
  line("DpShard2", "NumericParity", "passed");
  line("DpShard2Ep2", "Structure", "passed");
  line("DpShard2Ep2", "NumericParity", "failed");
  write_file_atomic(root / "results.jsonl", results);
  for (const auto& [c, mesh] : std::vector<std::pair<std::string, std::string>>{
           {"Reference", "1"}, {"DpShard2", "dp_shard=2"}, {"DpShard2Ep2", "dp_shard=2,ep=2"}}) {
    const fs::path dir = root / "moe" / c;
    const ParallelConfig config = config_of(mesh);
    CaseRecord record;
    record.spec = "moe";
    record.case_name = c;
    record.kind = c == "Reference" ? spec::CaseKind::kReference : spec::CaseKind::kTrain;
    record.config = config;
    record.world_size = config.world_size();
    record.matrix = MatrixSource::parse("cpu-smoke");
    record.fingerprint = "0123456789abcdef";
    record.outcome = Outcome::kRan;
    record.files = {{"run/case.json", std::string(64, '0')}};
    write_file_atomic(dir / "case_run.json", json(record).dump());
    write_file_atomic(dir / "run" / "case.json",
                      json({{"spec", "moe"}, {"case", {{"name", c}, {"kind", "train"}, {"config", config}}}}).dump());
    write_file_atomic(dir / "integration_state.json", json({{"state", "STRUCTURE_VALIDATED"}}).dump());
  }
  return root;
}

TEST(DiagnosisReportTest, EveryFormatShowsTheDiagnosisOfTheRunRoot) {
  const RunResults run = read_run_results(write_run("diagnosis_report"));
  const std::vector<DiagnosisCase> cases = diagnosis_cases(run);
  ASSERT_EQ(cases.size(), 3u);
  const Diagnosis d = diagnose(cases);
  EXPECT_THAT(d.features, ElementsAre("ep>1"));
  const std::string md = render_report(run, ReportFormat::kMarkdown);
  EXPECT_THAT(md, HasSubstr("## Diagnosis\n\n1 of 3 cases fails: moe/DpShard2Ep2, the only one with ep > 1"));
  EXPECT_LT(md.find("## Diagnosis"), md.find("## Failures"));
  EXPECT_THAT(md, HasSubstr("  fails:  mih run --spec moe --case DpShard2Ep2 --matrix cpu-smoke"));
  const std::string xml = render_report(run, ReportFormat::kJunit);
  EXPECT_THAT(xml, HasSubstr("<system-out>evidence: "));
  EXPECT_THAT(xml, HasSubstr("matrix diagnosis: 1 of 3 cases fails: moe/DpShard2Ep2, the only one with ep &gt; 1"));
  const std::string html = render_report(run, ReportFormat::kHtml);
  EXPECT_THAT(html, HasSubstr("<h2>Diagnosis</h2>\n<p class=\"diagnosis\">1 of 3 cases fails"));
}

TEST(DiagnosisReportTest, ReadsWhereTheReferenceLeavesTheOriginalAndTheKvHeads) {
  const fs::path root = write_run("diagnosis_original");
  std::string results;
  read_file(root / "results.jsonl", &results);
  for (const auto& [test, message] : std::vector<std::pair<std::string, std::string>>{
           {"LossAndLogitsMatchOriginal", "localized to 'lm_head': the logits differ\n  first divergence ..."},
           {"HiddenStatesMatchOriginal",
            "Failure\nlocalized to 'layers.0': its forward output is the first to diverge at step 0\n  first ..."}}) {
    results += json({{"name", "Moe/MatchesOriginal." + test + "/Reference"}, {"spec", "moe"}, {"case", "Reference"},
                     {"suite", "MatchesOriginal"}, {"test", test}, {"status", "failed"}, {"message", message},
                     {"seconds", 0.1}, {"evidence", "moe/Reference"}})
                   .dump() +
               "\n";
  }
  write_file_atomic(root / "results.jsonl", results);
  write_file_atomic(root / "moe" / "DpShard2Ep2" / "spec.resolved.json", json({{"num_key_value_heads", 2}}).dump());
  const RunResults run = read_run_results(root);
  const std::vector<DiagnosisCase> cases = diagnosis_cases(run);
  ASSERT_EQ(cases.size(), 3u);
  EXPECT_EQ(cases[2].name, "Reference");
  EXPECT_EQ(cases[2].original_divergence,
            "localized to 'layers.0': its forward output is the first to diverge at step 0 (HiddenStatesMatchOriginal)");
  EXPECT_EQ(cases[1].num_key_value_heads, 2);
  EXPECT_EQ(cases[0].num_key_value_heads, 0);
  const std::string md = render_report(run, ReportFormat::kMarkdown);
  EXPECT_THAT(md, HasSubstr("## Diagnosis\n\nthe port does not compute the original model: moe/Reference fails "
                            "MatchesOriginal: localized to 'layers.0'"));
}

// The run root `name` with DpShard2's outcome set to `outcome` and DpShard2Ep2 compared with it.
fs::path run_compared_with_dp_shard2(const std::string& name, const std::string& outcome) {
  const fs::path root = write_run(name);
  for (const auto& [c, edit] : std::vector<std::pair<std::string, std::function<void(json&)>>>{
           {"DpShard2", [&](json& r) { r["outcome"] = outcome; r["fault"] = "F36"; }},
           {"DpShard2Ep2", [](json& r) { r["compare_to"] = "DpShard2"; }}}) {
    const fs::path path = root / "moe" / c / "case_run.json";
    std::string text;
    read_file(path, &text);
    json record = json::parse(text);
    edit(record);
    write_file_atomic(path, record.dump());
  }
  return root;
}

// A case compared with one whose evidence is not a reference (interrupted: the environment)
// failed its comparisons with nothing judged: left out with the reason, never a failing case of
// the table (it was, and the diagnosis blamed its features).
TEST(DiagnosisReportTest, ACaseComparedWithAnInterruptedOneHasNoVerdict) {
  const RunResults run = read_run_results(run_compared_with_dp_shard2("diagnosis_unjudged_twin", "interrupted"));
  const Diagnosis d = diagnose(diagnosis_cases(run));
  EXPECT_EQ(d.kind, Diagnosis::Kind::kNoFailure);
  EXPECT_THAT(d.no_verdict, ::testing::Contains("moe/DpShard2Ep2 (compared with DpShard2, which has no verdict "
                                                "(interrupted))"));
}

// A case compared with one that never reached its fault is judged: that one ran the correct code
// to the end (the fault catalog's F12: ResumeDpShard2 with the fault, compared with a DpShard2
// the fault never reaches, fails, and the diagnosis names the resume).
TEST(DiagnosisReportTest, ACaseComparedWithOneThatNeverReachedItsFaultIsJudged) {
  const RunResults run = read_run_results(run_compared_with_dp_shard2("diagnosis_judged_twin", "fault_not_reached"));
  const Diagnosis d = diagnose(diagnosis_cases(run));
  EXPECT_NE(d.kind, Diagnosis::Kind::kNoFailure);
  EXPECT_THAT(d.failing, ::testing::Contains("moe/DpShard2Ep2"));
  EXPECT_THAT(d.no_verdict, ::testing::Not(::testing::Contains(::testing::HasSubstr("moe/DpShard2Ep2"))));
}

TEST(DiagnosisReportTest, ACaseWithoutItsResolvedConfigurationHasNoVerdict) {
  const fs::path root = write_run("diagnosis_no_case_file");
  fs::remove(root / "moe" / "DpShard2" / "run" / "case.json");
  write_file_atomic(root / "moe" / "DpShard2Ep2" / "run" / "case.json", "{\"case\": {\"config\": {\"tp\": \"two\"}}}");
  const RunResults run = read_run_results(root);
  const Diagnosis d = diagnose(diagnosis_cases(run));
  EXPECT_EQ(d.kind, Diagnosis::Kind::kNoFailure);
  EXPECT_THAT(d.no_verdict, UnorderedElementsAre("moe/DpShard2 (no run/case.json says its configuration)",
                                                 "moe/DpShard2Ep2 (no run/case.json says its configuration)"));
  const CaseResult* bad = run.find_case("moe", "DpShard2Ep2");
  ASSERT_NE(bad, nullptr);
  EXPECT_THAT(bad->problems, ::testing::Contains(HasSubstr("not a case the runner resolved")));
}

}  // namespace
}  // namespace mih
