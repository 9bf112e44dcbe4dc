// integration_state.json read typed (harness/contract/integration_state.h): the state machine's
// record reads back, a field of another type or a state that is none of mih's is refused naming
// the file, an absent evidence or reason is nullopt, and the machine refuses to carry a record
// without its evidence list forward.
#include "harness/contract/integration_state.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/evidence/evidence_store.h"
#include "tests/support/temp_dir.h"

namespace mih::contract {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

json written() {
  return {{"schema_version", 1},
          {"state", "STRUCTURE_VALIDATED"},
          {"previous_state", "DISCOVERED"},
          {"evidence", {"check/findings.json", "environment.json"}},
          {"reason", ""}};
}

std::string refusal(const json& record) {
  try {
    (void)parse_integration_state(record, "case/integration_state.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition) << e.what();
    return e.what();
  }
  return "(accepted)";
}

TEST(IntegrationStateRecordTest, ReadsWhatTheMachineWrote) {
  const EvidenceDir dir(mih::testing::temp_dir("integration_state_record"));
  IntegrationStateMachine machine(dir);
  machine.update(IntegrationState::kDiscovered, {"environment.json"});
  machine.update(IntegrationState::kStructureValidated, {"check/findings.json"});
  const IntegrationStateRecord r = machine.record();
  EXPECT_EQ(r.state, IntegrationState::kStructureValidated);
  EXPECT_EQ(r.previous_state, IntegrationState::kDiscovered);
  ASSERT_TRUE(r.evidence.has_value());
  EXPECT_THAT(*r.evidence, ElementsAre("check/findings.json", "environment.json"));
  EXPECT_EQ(r.reason, "");
  json first = written();
  first["previous_state"] = nullptr;
  EXPECT_FALSE(parse_integration_state(first, "f").previous_state.has_value());
}

TEST(IntegrationStateRecordTest, AFieldOfAnotherTypeIsNamedAnAbsentOneIsNullopt) {
  json r = written();
  r["evidence"] = {"check/findings.json", 3};
  EXPECT_THAT(refusal(r), AllOf(HasSubstr("case/integration_state.json: 'evidence' must be a list of paths, got"),
                                HasSubstr("rerun the case")));
  r = written();
  r["reason"] = 7;  // read as no reason before
  EXPECT_THAT(refusal(r), HasSubstr("'reason' must be a string, got 7"));
  r = written();
  r["state"] = "PASSED";
  EXPECT_THAT(refusal(r), AllOf(HasSubstr("unknown integration state 'PASSED'"), HasSubstr("rerun the case")));
  r = written();
  r["previous_state"] = 2;
  EXPECT_THAT(refusal(r), HasSubstr("'previous_state' must be a state's name or null"));
  EXPECT_THAT(refusal(json::array()), HasSubstr("holds no state name"));
  const IntegrationStateRecord state_only = parse_integration_state({{"state", "FAILED"}}, "f");
  EXPECT_EQ(state_only.state, IntegrationState::kFailed);
  EXPECT_FALSE(state_only.evidence.has_value());
  EXPECT_FALSE(state_only.reason.has_value());
}

TEST(IntegrationStateRecordTest, TheMachineRefusesARecordWithoutItsEvidence) {
  const auto root = mih::testing::temp_dir("integration_state_no_evidence");
  const EvidenceDir dir(root);
  json r = written();
  r.erase("evidence");  // read as no evidence before: the next gate wrote its list without the earlier ones
  dir.write_json(layout::kIntegrationState, r);
  IntegrationStateMachine machine(dir);
  EXPECT_THAT([&] { machine.update(IntegrationState::kModuleParityPassed, {"check/module_parity.json"}); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("has no 'evidence' list"), HasSubstr("rerun the case"))));
}

}  // namespace
}  // namespace mih::contract
