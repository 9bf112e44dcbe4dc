// The MatchesOriginal suite (suites/suite_table.h): the port's world-size-1 reference against
// goldens of the original model (docs/golden.md, harness/cases/golden.h) at step 0: the loss
// and logits, each mapped layer's output, every parameter's gradient, the parameters after
// the optimizer step. The only suite that compares the port with something other than itself:
// a bug the port makes the same way in every configuration (an attention scale, a rotary
// theta, a norm variant) passes every other suite.
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "harness/contract/evidence_layout.h"
#include "harness/cases/golden.h"
#include "harness/evidence/evidence_store.h"
#include "suites/conformance.h"

namespace mih::conformance {

bool MatchesOriginal::applies(const SuiteContext& s) {
  if (s.spec.golden.dir.empty()) return false;
  return s.c.kind == spec::CaseKind::kReference || s.c.name == spec::kLaneReference;
}
const char* MatchesOriginal::where() {
  return "the Reference (and a reduced lane's LaneReference) of a spec with goldens of the original model "
         "(golden.dir, or mih test --golden DIR)";
}

namespace {

// One comparison per case, shared by the suite's tests, written to compare/golden.json (but by
// `mih check`).
struct Compared {
  cases::Golden golden;
  cases::GoldenComparison comparison;
};

const Compared& compare_once(const CaseParam& p, const verdicts::CaseEvidence& ev, const Calibration* lane) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Compared>> done;
  std::lock_guard<std::mutex> lock(mu);
  const std::string key = ev.dir().string();
  auto it = done.find(key);
  if (it != done.end()) return *it->second;
  const spec::ModelSpec s = cases::spec_of_run(p.request->spec);
  auto c = std::make_unique<Compared>();
  c->golden = cases::read_golden(s.golden.dir);
  c->comparison = cases::compare_with_golden(s, c->golden, ev, lane);
  // `mih check` judges the evidence without writing into it (RunOptions::read_only).
  if (!cases::run_options().read_only) {
    EvidenceDir(ev.dir()).write_json(layout::kGoldenComparison, c->comparison.evidence);
  }
  return *done.emplace(key, std::move(c)).first->second;
}

}  // namespace

// The verdict of `quantity`: in a reduced lane at the lane's calibrated tolerances (the lane's
// reference and noise twin, launched if needed), else at the golden's own.
#define MIH_MATCHES_ORIGINAL_(quantity)                                                                  \
  MIH_CASE_EVIDENCE(ev);                                                                                 \
  std::optional<Calibration> lane;                                                                       \
  if (verdicts::calibrated_lane(*ev)) {                                                                  \
    const verdicts::CaseEvidence* lane_reference = other(spec::kLaneReference);                          \
    const verdicts::CaseEvidence* noise_twin = other(spec::kNoiseTwin);                                  \
    if (!lane_reference || !noise_twin) return;                                                          \
    MIH_ASSERT_VERDICT([&] {                                                                             \
      lane = verdicts::lane_calibration(*lane_reference, *noise_twin, *ev, cases::run_options().noise_k); \
      return verdicts::Verdict::pass();                                                                  \
    }());                                                                                                \
  }                                                                                                      \
  MIH_ASSERT_VERDICT([&] {                                                                               \
    const Compared& c = compare_once(GetParam(), *ev, lane ? &*lane : nullptr);                          \
    return cases::golden_verdict(c.comparison, quantity, c.golden, *ev);                                 \
  }())

MIH_SUITE_READS_NONE(MatchesOriginal);

TEST_P(MatchesOriginal, LossAndLogitsMatchOriginal) { MIH_MATCHES_ORIGINAL_(cases::GoldenQuantity::kLossAndLogits); }
TEST_P(MatchesOriginal, HiddenStatesMatchOriginal) { MIH_MATCHES_ORIGINAL_(cases::GoldenQuantity::kHiddenStates); }
TEST_P(MatchesOriginal, GradientsMatchOriginal) { MIH_MATCHES_ORIGINAL_(cases::GoldenQuantity::kGradients); }
TEST_P(MatchesOriginal, StepMatchesOriginal) { MIH_MATCHES_ORIGINAL_(cases::GoldenQuantity::kStep); }

}  // namespace mih::conformance
