// The suites' base class and their instantiation from the suite table (see conformance.h).
#include "suites/conformance.h"

#include <map>
#include <memory>

#include "harness/contract/evidence_layout.h"

namespace mih::conformance {

std::vector<CaseParam> cases_for(const std::string& prefix, const std::string& suite) {
  std::vector<CaseParam> out;
  if (!cases::run_enabled()) return out;
  const cases::Registration* r = cases::find_registration(prefix);
  if (!r || !cases::selected(*r)) return out;
  const spec::ModelSpec s = cases::spec_of_run(r->spec);  // with the checkpoint its cases start from
  const SuiteRow& row = suite_row(suite);
  for (const spec::Case* c : cases::runnable_cases(*r)) {
    if (row.applies({s, *c})) out.push_back({cases::case_request(*r, c->name)});
  }
  return out;
}

std::string param_name(const ::testing::TestParamInfo<CaseParam>& info) { return info.param.request->c.name; }

const verdicts::CaseEvidence* ConformanceTest::evidence() { return of(*request()); }

const verdicts::CaseEvidence* ConformanceTest::other(const std::string& case_name) {
  std::shared_ptr<const CaseRequest> sibling;
  try {
    sibling = cases::sibling_request(*request(), case_name);
  } catch (const Error& e) {
    cases::note_error(e.code());
    ADD_FAILURE() << "case " << request()->spec << "/" << case_name << " is not a case of matrix "
                  << request()->matrix.text() << ": " << e.what();
    return nullptr;
  }
  return of(*sibling);
}

const verdicts::CaseEvidence* ConformanceTest::of(const CaseRequest& p) {
  static std::map<std::string, std::unique_ptr<verdicts::CaseEvidence>> views;
  const std::string& case_name = p.c.name;
  const cases::CaseOutcome* o = nullptr;
  try {
    o = &cases::ensure_case(p);
  } catch (const Error& e) {
    cases::note_error(e.code());
    ADD_FAILURE() << "case " << p.spec << "/" << case_name
                  << (cases::run_options().verify_only ? " cannot be checked: " : " could not run: ") << e.what();
    return nullptr;
  }
  switch (classify(o->outcome)) {
    case OutcomeClass::kVerdict:
      break;
    case OutcomeClass::kInfrastructure:
      ADD_FAILURE() << "INFRASTRUCTURE FAILURE (not a conformance verdict): case " << p.spec << "/" << case_name
                    << " did not complete:\n"
                    << o->error << "\n  (logs: " << (o->evidence / layout::kRunDir).string() << ")";
      return nullptr;
    case OutcomeClass::kBadInput:
      ADD_FAILURE() << "BAD INPUT (not a conformance verdict): " << o->error;
      return nullptr;
    case OutcomeClass::kEnvironment:
      ADD_FAILURE() << "ENVIRONMENT (not a conformance verdict): case " << p.spec << "/" << case_name
                    << (o->outcome == Outcome::kInterrupted ? " was interrupted" : " could not run") << ":\n"
                    << o->error;
      return nullptr;
    case OutcomeClass::kConformanceFailure:
      ADD_FAILURE() << "case " << p.spec << "/" << case_name << " FAILED before its training finished: " << o->error
                    << "\n  (open " << (o->evidence / layout::kIntegrationState).string() << " and "
                    << (o->evidence / layout::kFindings).string() << ")";
      return nullptr;
  }
  const std::string key = o->evidence.string();
  auto it = views.find(key);
  if (it == views.end()) it = views.emplace(key, std::make_unique<verdicts::CaseEvidence>(o->evidence)).first;
  return it->second.get();
}

const spec::Case& ConformanceTest::resolved_case() { return request()->c; }

verdicts::Verdict ConformanceTest::parity(const verdicts::CaseEvidence& target, const verdicts::CaseEvidence& candidate,
                                          verdicts::Quantity quantity, int64_t first_step, bool record) {
  if (!verdicts::calibrated_lane(candidate)) {
    return verdicts::parity(target, candidate, quantity, verdicts::case_tolerance(candidate), first_step);
  }
  const verdicts::CaseEvidence* lane_reference = other(spec::kLaneReference);
  const verdicts::CaseEvidence* noise_twin = other(spec::kNoiseTwin);
  if (!lane_reference || !noise_twin) {
    return verdicts::Verdict::fail("the lane's reference or noise twin did not run, so no tolerance is calibrated");
  }
  const Calibration cal = verdicts::lane_calibration(*lane_reference, *noise_twin, candidate, cases::run_options().noise_k);
  // `mih check` writes nothing into the evidence it judges.
  return verdicts::parity(target, candidate, quantity, 0, first_step, &cal, record && !cases::run_options().read_only);
}

const verdicts::CaseEvidence* ConformanceTest::compared() {
  const std::string target = resolved_case().compare_to;
  if (target.empty()) {
    ADD_FAILURE() << "case " << request()->spec << "/" << request()->c.name
                  << " is compared with no other case, yet a suite that compares was instantiated on it";
    return nullptr;
  }
  return other(target);
}

std::string ConformanceTest::without_activation_checkpointing() {
  const spec::CaseMatrix& m = cases::resolved_matrix(request()->spec, request()->matrix.text());
  ParallelConfig want = resolved_case().config;
  want.activation_checkpointing = false;
  for (const auto& c : m.cases) {
    if (c.kind == spec::CaseKind::kTrain && c.config.name() == want.name() && c.config.dtype == want.dtype) return c.name;
  }
  return "";
}

}  // namespace mih::conformance
