// The diagnosis across a run's matrix (diagnosis.h): features of each case's resolved
// configuration, the simplest predicate that separates failing from passing cases, the
// controls and the smallest pair to rerun.
#include "harness/evidence/diagnosis.h"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/evidence/report.h"
#include "harness/evidence/report_internal.h"
#include "harness/base/strings.h"

namespace mih {
namespace {

using nlohmann::json;

// A feature of a case's configuration, in the field's words.
struct Feature {
  std::string key;      // "ep>1"
  std::string phrase;   // "ep > 1"
  std::string negated;  // "ep = 1"
  std::string control;  // what a passing case without it is called: "EP=1"
  std::string family;   // features of one family refine one another (cp > 1, zigzag)
  std::function<bool(const DiagnosisCase&)> has;
  // The family this one refines without being of it (edp refines ep, and a pair may join them):
  // a control may differ in it too.
  std::string parent = "";
};

// The case's configurations: a resume's before and after the load.
std::vector<const ParallelConfig*> phases(const DiagnosisCase& c) {
  std::vector<const ParallelConfig*> out = {&c.config};
  if (c.save_config) out.push_back(&*c.save_config);
  return out;
}

bool any_phase(const DiagnosisCase& c, const std::function<bool(const ParallelConfig&)>& f) {
  for (const ParallelConfig* p : phases(c)) {
    if (f(*p)) return true;
  }
  return false;
}

// The most ranks of its phases (computed wide: the degrees come from evidence on disk).
int64_t ranks(const DiagnosisCase& c) {
  int64_t n = 0;
  for (const ParallelConfig* p : phases(c)) {
    int64_t w = 1;
    for (const MeshDim& d : kMeshDims) w = std::min<int64_t>(w * std::max(p->*d.degree, 1), int64_t{1} << 40);
    n = std::max(n, w);
  }
  return n;
}

bool is_resume(const DiagnosisCase& c) { return c.kind == "resume" || c.kind == "cross_resume"; }

// The features, in the order the diagnosis prefers them when several explain the same cases:
// the mesh axes, then the knobs that refine them, the resumes, the dtype and spec, and last
// the world size (what every parallel case shares).
std::vector<Feature> features_of(const std::vector<DiagnosisCase>& cases) {
  std::vector<Feature> out;
  for (const MeshDim& d : kMeshDims) {
    const std::string name(d.name);
    out.push_back({name + ">1", name + " > 1", name + " = 1", name + "=1", name,
                   [deg = d.degree](const DiagnosisCase& c) {
                     return any_phase(c, [deg](const ParallelConfig& p) { return p.*deg > 1; });
                   }});
  }
  // Megatron-Core's and TorchTitan's name for the run with the experts replicated.
  out.push_back({"ep>1", "ep > 1", "ep = 1", "EP=1", "ep",
                 [](const DiagnosisCase& c) { return any_phase(c, [](const ParallelConfig& p) { return p.ep > 1; }); }});
  // The expert-data-parallel ranks (DESIGN.md section 4): edp = dp_shard * cp / ep > 1 shards
  // the routed experts with FSDP too, so their gradients take another path than at edp = 1.
  out.push_back({"edp>1", "edp > 1", "edp = 1", "edp>1", "edp", [](const DiagnosisCase& c) {
                   return any_phase(c, [](const ParallelConfig& p) {
                     return p.ep > 1 && static_cast<int64_t>(p.dp_shard) * p.cp / p.ep > 1;
                   });
                 }, "ep"});
  out.push_back({"sp", "sequence parallelism", "without sequence parallelism", "no-SP", "sp", [](const DiagnosisCase& c) {
                   return any_phase(c, [](const ParallelConfig& p) { return p.sequence_parallel; });
                 }});
  out.push_back({"cp_zigzag", "the zigzag cp layout", "without the zigzag cp layout", "non-zigzag", "cp",
                 [](const DiagnosisCase& c) {
                   return any_phase(c, [](const ParallelConfig& p) { return p.cp > 1 && p.cp_layout == CpLayout::kZigzag; });
                 }});
  out.push_back({"cp_contiguous", "the contiguous cp layout", "without the contiguous cp layout", "non-contiguous", "cp",
                 [](const DiagnosisCase& c) {
                   return any_phase(c,
                                    [](const ParallelConfig& p) { return p.cp > 1 && p.cp_layout == CpLayout::kContiguous; });
                 }});
  out.push_back({"ac", "activation checkpointing", "without activation checkpointing", "no-AC", "ac",
                 [](const DiagnosisCase& c) {
                   return any_phase(c, [](const ParallelConfig& p) { return p.activation_checkpointing; });
                 }});
  out.push_back({"micro_batches>1", "gradient accumulation (micro_batches > 1)", "one micro-batch", "one-micro-batch",
                 "micro_batches",
                 [](const DiagnosisCase& c) {
                   return any_phase(c, [](const ParallelConfig& p) { return p.micro_batches > 1; });
                 }});
  out.push_back({"resume", "a resume", "without a resume", "uninterrupted", "resume", is_resume});
  out.push_back({"same_topology_resume", "a resume on the same topology", "without a resume on the same topology",
                 "uninterrupted", "resume", [](const DiagnosisCase& c) { return c.kind == "resume"; }});
  out.push_back({"cross_topology_resume", "a resume across topologies", "without a resume across topologies",
                 "uninterrupted or same-topology", "resume", [](const DiagnosisCase& c) { return c.kind == "cross_resume"; }});
  out.push_back({"noise_twin", "the noise twin", "not the noise twin", "non-twin", "noise_twin",
                 [](const DiagnosisCase& c) { return c.config.noise_twin; }});
  std::set<std::string> dtypes, specs;
  for (const auto& c : cases) {
    for (const ParallelConfig* p : phases(c)) dtypes.insert(dtype_name(p->dtype));
    specs.insert(c.spec);
  }
  if (dtypes.size() > 1) {
    for (const auto& d : dtypes) {
      out.push_back({"dtype=" + d, "dtype " + d, "another dtype than " + d, "non-" + d, "dtype",
                     [d](const DiagnosisCase& c) {
                       return any_phase(c, [&d](const ParallelConfig& p) { return dtype_name(p.dtype) == d; });
                     }});
    }
  }
  if (specs.size() > 1) {
    for (const auto& s : specs) {
      out.push_back({"spec=" + s, "spec " + s, "another spec than " + s, "other-spec", "spec",
                     [s](const DiagnosisCase& c) { return c.spec == s; }});
    }
  }
  out.push_back({"world_size>2", "more than 2 ranks", "at most 2 ranks", "2-rank", "world_size",
                 [](const DiagnosisCase& c) { return ranks(c) > 2; }});
  out.push_back({"world_size>1", "world size > 1", "world size 1", "world-size-1", "world_size",
                 [](const DiagnosisCase& c) { return ranks(c) > 1; }});
  return out;
}

struct Literal {
  size_t feature;
  bool positive;
};

struct Candidate {
  std::vector<Literal> literals;
  std::vector<bool> truth;  // per case with a verdict
  int exceptions = 0;
  int negatives = 0;
  // Fewest exceptions, fewest literals, positive before negative, then the features' order.
  auto key() const {
    std::vector<size_t> order;
    for (const auto& l : literals) order.push_back(l.feature);
    return std::make_tuple(exceptions, literals.size(), negatives, order);
  }
};

std::string literal_key(const Feature& f, bool positive) { return positive ? f.key : "!" + f.key; }

std::string literal_phrase(const Feature& f, bool positive) { return positive ? f.phrase : f.negated; }

// "tp > 1 without sequence parallelism", "dp_shard > 1 and ep = 1".
std::string candidate_phrase(const std::vector<Feature>& features, const Candidate& c) {
  std::string out;
  for (const Literal& l : c.literals) {
    const std::string p = literal_phrase(features[l.feature], l.positive);
    if (out.empty()) {
      out = p;
    } else {
      out += (p.rfind("without ", 0) == 0 ? " " : " and ") + p;
    }
  }
  return out;
}

// "fails only with ep > 1", "fails only without activation checkpointing".
std::string only_with(const std::string& phrase) {
  return phrase.rfind("without ", 0) == 0 ? "fails only " + phrase : "fails only with " + phrase;
}

std::string join(const std::vector<std::string>& items, const std::string& sep = ", ", size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? sep : "") + items[i];
  if (items.size() > limit) out += sep + "... (" + std::to_string(items.size() - limit) + " more)";
  return out;
}

// POSIX shell quoting where a value needs it.
std::string shell_quote(const std::string& s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || std::string("@%+=:,./_-").find(ch) != std::string::npos;
  });
  if (plain) return s;
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::string cases_word(size_t n) { return std::to_string(n) + (n == 1 ? " case" : " cases"); }

}  // namespace

const std::set<std::string>& reference_compared_suites() {
  static const std::set<std::string> kSuites = {"NumericParity", "InputIdentity"};
  return kSuites;
}

std::string rerun_command(const DiagnosisCase& c, bool with_fault) {
  std::string out = "mih run --spec " + shell_quote(c.spec) + " --case " + shell_quote(c.name);
  if (!c.matrix.empty()) out += " --matrix " + shell_quote(c.matrix);
  if (with_fault && !c.fault.empty() && !c.fault_not_reached) out += " --fault " + shell_quote(c.fault);
  if (!c.init_from.empty()) out += " --init-from " + shell_quote(c.init_from);
  if (!c.training_backend.empty() && c.training_backend != "trainer") {
    out += " --training-backend " + shell_quote(c.training_backend);
  }
  return out;
}

namespace {

// `mih test` of a failing and a passing case run alike; "" otherwise.
std::string test_command(const DiagnosisCase& f, const DiagnosisCase& p) {
  if (f.prefix.empty() || p.prefix.empty() || f.matrix != p.matrix || f.init_from != p.init_from ||
      f.training_backend != p.training_backend) {
    return "";
  }
  const std::string ff = f.fault_not_reached ? "" : f.fault, pf = p.fault_not_reached ? "" : p.fault;
  if (!ff.empty() && !pf.empty() && ff != pf) return "";
  std::string out = "mih test --prefixes " + shell_quote(f.prefix == p.prefix ? f.prefix : f.prefix + "," + p.prefix);
  if (!f.matrix.empty()) out += " --matrix " + shell_quote(f.matrix);
  if (!f.init_from.empty()) out += " --only-spec " + shell_quote(f.spec) + " --init-from " + shell_quote(f.init_from);
  if (!ff.empty() || !pf.empty()) {
    out += " --fault " + shell_quote(ff.empty() ? pf : ff) + " --fault-cases " +
           shell_quote(!ff.empty() && !pf.empty() ? f.name + "," + p.name : ff.empty() ? p.name : f.name);
  }
  return out + " " + shell_quote("--gtest_filter=" + f.prefix + "/*.*/" + f.name + ":" + p.prefix + "/*.*/" + p.name);
}

}  // namespace

std::string diagnosis_kind_name(Diagnosis::Kind kind) {
  switch (kind) {
    case Diagnosis::Kind::kNoFailure: return "no_failure";
    case Diagnosis::Kind::kEveryCase: return "every_case";
    case Diagnosis::Kind::kEveryParallel: return "every_parallel";
    case Diagnosis::Kind::kSeparated: return "separated";
    case Diagnosis::Kind::kMostly: return "mostly";
    case Diagnosis::Kind::kInconclusive: return "inconclusive";
    case Diagnosis::Kind::kOriginalModel: return "original_model";
  }
  return "?";
}

Diagnosis diagnose(const std::vector<DiagnosisCase>& all) {
  Diagnosis d;
  std::vector<const DiagnosisCase*> cases;  // with a verdict
  for (const auto& c : all) {
    if (c.verdict == DiagnosisCase::Verdict::kNone) {
      d.no_verdict.push_back(c.id() + (c.no_verdict.empty() ? "" : " (" + c.no_verdict + ")"));
      continue;
    }
    cases.push_back(&c);
    (c.verdict == DiagnosisCase::Verdict::kFailed ? d.failing : d.passing).push_back(c.id());
  }
  if (d.failing.empty()) return d;
  const std::vector<Feature> features = features_of(all);
  auto failed = [&](size_t i) { return cases[i]->verdict == DiagnosisCase::Verdict::kFailed; };

  // Only the Reference-compared suites fail, while a findings-based suite passed on a failing case.
  bool only_compared = true, findings_passed = false;
  for (const DiagnosisCase* c : cases) {
    if (c->verdict != DiagnosisCase::Verdict::kFailed) continue;
    for (const auto& s : c->failed_suites) only_compared = only_compared && reference_compared_suites().count(s);
    for (const auto& s : c->passed_suites) findings_passed = findings_passed || !reference_compared_suites().count(s);
  }
  d.reference_compared_only = only_compared && findings_passed;

  // Only the comparison with the original model fails (it runs on the Reference): every case
  // agrees with the port's own Reference, so no parallel feature is at fault.
  const bool only_original = std::all_of(cases.begin(), cases.end(), [](const DiagnosisCase* c) {
    return c->verdict != DiagnosisCase::Verdict::kFailed ||
           (!c->failed_suites.empty() &&
            std::all_of(c->failed_suites.begin(), c->failed_suites.end(), [](const std::string& s) {
              return s == "MatchesOriginal";
            }));
  });
  if (only_original) {
    d.kind = Diagnosis::Kind::kOriginalModel;
    d.features = {"original_model"};
    return d;
  }

  if (d.passing.empty()) {
    d.kind = Diagnosis::Kind::kEveryCase;
    d.features = {"every_case"};
    return d;
  }

  // Every candidate: single literals, then conjunctions of two (a positive first literal).
  std::vector<std::vector<bool>> has(features.size(), std::vector<bool>(cases.size()));
  for (size_t f = 0; f < features.size(); ++f) {
    for (size_t i = 0; i < cases.size(); ++i) has[f][i] = features[f].has(*cases[i]);
  }
  std::vector<Candidate> candidates;
  auto add = [&](std::vector<Literal> literals) {
    Candidate c;
    c.literals = std::move(literals);
    c.truth.assign(cases.size(), true);
    for (const Literal& l : c.literals) {
      c.negatives += l.positive ? 0 : 1;
      for (size_t i = 0; i < cases.size(); ++i) c.truth[i] = c.truth[i] && has[l.feature][i] == l.positive;
    }
    // A predicate true everywhere or nowhere says nothing.
    if (std::count(c.truth.begin(), c.truth.end(), true) == 0) return;
    if (std::count(c.truth.begin(), c.truth.end(), false) == 0) return;
    for (size_t i = 0; i < cases.size(); ++i) c.exceptions += c.truth[i] != failed(i) ? 1 : 0;
    candidates.push_back(std::move(c));
  };
  // A feature's absence alone ("fails only with at most 2 ranks") is what a small table
  // separates by chance, never a cause: a negation only refines a feature ("tp > 1 without
  // sequence parallelism"), and never by the world size.
  for (size_t f = 0; f < features.size(); ++f) add({{f, true}});
  for (size_t f = 0; f < features.size(); ++f) {
    for (size_t g = 0; g < features.size(); ++g) {
      if (f == g || features[f].family == features[g].family) continue;
      if (g > f) add({{f, true}, {g, true}});
      if (features[g].family != "world_size") add({{f, true}, {g, false}});
    }
  }
  if (candidates.empty()) {  // every feature is the same on every case
    d.kind = Diagnosis::Kind::kInconclusive;
  } else {
    const Candidate& best = *std::min_element(candidates.begin(), candidates.end(),
                                              [](const Candidate& a, const Candidate& b) { return a.key() < b.key(); });
    const size_t ws1 = features.size() - 1;  // world_size>1 is the last feature
    std::vector<bool> parallel(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) parallel[i] = has[ws1][i];
    const size_t total = cases.size();
    size_t covered = 0;
    for (size_t i = 0; i < total; ++i) covered += best.truth[i] && failed(i) ? 1 : 0;
    // Exactly the parallel cases fail: an axis true on the same cases (dp_shard > 1 when it is
    // the only one) is not told from what they all share, and is named as indistinguishable.
    if (best.exceptions == 0 && best.truth == parallel) {
      d.kind = Diagnosis::Kind::kEveryParallel;
      d.features = {"world_size>1"};
      d.explanation = "world size > 1";
    } else if (best.exceptions == 0) {
      d.kind = Diagnosis::Kind::kSeparated;
    } else if (total >= 5 && static_cast<size_t>(best.exceptions) * 5 <= total && covered >= 2 &&
               best.truth != parallel) {
      d.kind = Diagnosis::Kind::kMostly;
    } else {
      d.kind = Diagnosis::Kind::kInconclusive;
    }
    if (d.kind == Diagnosis::Kind::kSeparated || d.kind == Diagnosis::Kind::kMostly) {
      for (const Literal& l : best.literals) d.features.push_back(literal_key(features[l.feature], l.positive));
      d.explanation = candidate_phrase(features, best);
    }
    if (d.kind != Diagnosis::Kind::kInconclusive) {
      // What the run cannot tell apart from it: single features true on exactly the same cases.
      for (const Candidate& c : candidates) {
        if (c.literals.size() != 1 || c.truth != best.truth || c.negatives) continue;
        const std::string phrase = candidate_phrase(features, c);
        if (phrase != d.explanation) d.indistinguishable.push_back(phrase);
      }
    }
    if (d.kind == Diagnosis::Kind::kMostly) {
      for (size_t i = 0; i < total; ++i) {
        if (best.truth[i] == failed(i)) continue;
        d.exceptions.push_back(cases[i]->id() + (failed(i) ? " fails without it" : " passes with it"));
      }
    }
    // Controls: passing cases that differ from a failing one only in the explanation's
    // families. A resume's control is its uninterrupted twin (or a resume into the same
    // config): only what it trains under after the load counts then.
    if (d.kind == Diagnosis::Kind::kSeparated || d.kind == Diagnosis::Kind::kMostly) {
      std::set<std::string> families;
      for (const Literal& l : best.literals) families.insert(features[l.feature].family);
      auto after_load = [&](const DiagnosisCase& c) {
        DiagnosisCase out = c;
        if (families.count("resume")) out.save_config.reset();
        return out;
      };
      for (size_t p = 0; p < total; ++p) {
        if (failed(p)) continue;
        const DiagnosisCase passing = after_load(*cases[p]);
        bool control = false;
        for (size_t f = 0; f < total && !control; ++f) {
          if (!failed(f) || cases[f]->spec != cases[p]->spec) continue;
          const DiagnosisCase failing = after_load(*cases[f]);
          bool differs = false, elsewhere = false;
          for (const Feature& k : features) {
            if (k.has(failing) == k.has(passing)) continue;
            differs = true;
            elsewhere = elsewhere || (!families.count(k.family) && !families.count(k.parent));
          }
          control = differs && !elsewhere;
        }
        if (control) d.controls.push_back(cases[p]->id());
      }
      const bool plural = d.controls.size() > 1;
      if (best.literals.size() == 1) {
        d.controls_phrase = features[best.literals[0].feature].control + (plural ? " controls" : " control");
      } else {
        d.controls_phrase = plural ? "controls without it" : "control without it";
      }
    }
  }

  // The smallest pair: fewest differing features, then fewest ranks.
  std::tuple<size_t, int64_t, std::string, std::string> best_pair{SIZE_MAX, 0, "", ""};
  const DiagnosisCase *pf = nullptr, *pp = nullptr;
  for (size_t f = 0; f < cases.size(); ++f) {
    if (!failed(f)) continue;
    for (size_t p = 0; p < cases.size(); ++p) {
      if (failed(p)) continue;
      size_t diff = cases[f]->spec == cases[p]->spec ? 0 : 1;
      for (size_t k = 0; k < features.size(); ++k) diff += has[k][f] != has[k][p] ? 1 : 0;
      const auto key = std::make_tuple(diff, ranks(*cases[f]) + ranks(*cases[p]), cases[f]->id(), cases[p]->id());
      if (key < best_pair) {
        best_pair = key;
        pf = cases[f];
        pp = cases[p];
      }
    }
  }
  if (pf && pp) {
    Diagnosis::Pair pair;
    pair.failing = pf->id();
    pair.passing = pp->id();
    pair.failing_command = rerun_command(*pf);
    pair.passing_command = rerun_command(*pp);
    pair.passing_fault_not_reached = pp->fault_not_reached;
    pair.test_command = test_command(*pf, *pp);
    if (pf->spec != pp->spec) pair.differences.push_back("spec " + pf->spec + " vs " + pp->spec);
    for (const Feature& f : features) {
      const bool a = f.has(*pf), b = f.has(*pp);
      if (a != b) pair.differences.push_back(a ? f.phrase : f.negated);
    }
    d.pair = pair;
  }
  return d;
}

std::string Diagnosis::summary() const {
  const size_t n = failing.size() + passing.size();
  switch (kind) {
    case Kind::kNoFailure: return "";
    case Kind::kEveryCase: {
      const bool reference = std::any_of(failing.begin(), failing.end(), [](const std::string& id) {
        return id.size() >= 10 && id.compare(id.size() - 10, 10, "/Reference") == 0;
      });
      if (n == 1) return "1 case ran and it fails (" + failing.front() + "): nothing to contrast it with";
      if (reference) {
        return "every case fails, the Reference included (" + cases_word(n) +
               "): not a parallel bug; look at the data, the model or the Reference";
      }
      return "every case fails alike (" + cases_word(n) + ", no Reference among them): no feature separates them; a "
             "passing case (the Reference, a world-size-1 case) would tell whether it is parallel at all";
    }
    case Kind::kOriginalModel:
      return "only MatchesOriginal fails (" + join(failing) + "; " + std::to_string(passing.size()) +
             " case(s) pass): every configuration agrees with the port's Reference, and the Reference computes another "
             "model than the original; not a parallel bug: compare the port's equations and its declared config with "
             "the original's, starting at the layer the localization names";
    case Kind::kEveryParallel: {
      std::string out;
      if (failing.size() == 1) {
        out = "1 of " + cases_word(n) + " fails (" + failing.front() +
              ") and only world-size-1 cases pass: too few cases to tell which of its features matters";
      } else {
        out = "every parallel case fails (" + std::to_string(failing.size()) + " of " + cases_word(n) +
              ") and only world-size-1 cases pass: not one axis but what every parallel layout here shares (a "
              "reduction over the whole mesh such as the grad norm, the loss normalization, the data split)";
      }
      if (!indistinguishable.empty()) {
        out += "; " + std::string(failing.size() == 1 ? "it has " : "all of them have ") + join(indistinguishable) +
               ": a passing parallel case without it would tell";
      }
      return out;
    }
    case Kind::kSeparated: {
      std::string out;
      if (failing.size() == 1) {
        out = "1 of " + cases_word(n) + " fails: " + failing.front() + ", the only one with " + explanation;
      } else {
        out = only_with(explanation) + " (" + std::to_string(failing.size()) + " of " + cases_word(n) +
              " fail, every one with it; no passing case has it)";
      }
      if (!controls.empty()) {
        out += std::string(failing.size() == 1 && controls.size() == 1 ? "; its " : "; ") + controls_phrase +
               (controls.size() > 1 ? " pass: " : " passes: ") + join(controls);
      }
      return out;
    }
    case Kind::kMostly:
      return "mostly with " + explanation + ": " + std::to_string(failing.size()) + " of " + cases_word(n) +
             " fail, with " + std::to_string(exceptions.size()) + " exception" + (exceptions.size() == 1 ? "" : "s") +
             " (" + join(exceptions) + ")";
    case Kind::kInconclusive:
      return "no feature of the configurations, nor a pair of them, separates the " +
             std::to_string(failing.size()) + " failing from the " + std::to_string(passing.size()) +
             " passing cases (failing: " + join(failing) + ")";
  }
  return "";
}

std::vector<std::string> Diagnosis::lines() const {
  if (kind == Kind::kNoFailure) return {};
  std::vector<std::string> out = {summary()};
  if ((kind == Kind::kSeparated || kind == Kind::kMostly) && !indistinguishable.empty()) {
    out.push_back("the run cannot tell " + explanation + " from " + join(indistinguishable, " or ") +
                  " (no case has one without the other)");
  }
  if (reference_compared_only) {
    std::string suites = join(reference_compared_suites(), ", ");
    out.push_back("only the suites that compare with the Reference fail (" + suites +
                  "); every findings-based suite passes on the failing cases: the numbers differ while every "
                  "structural check holds (a reduction, a normalization, or the Reference itself)");
  }
  if (pair) {
    out.push_back("smallest pair to rerun" +
                  (pair->differences.empty() ? std::string() : " (they differ in: " + join(pair->differences) + ")") +
                  ":");
    out.push_back("  fails:  " + pair->failing_command);
    out.push_back("  passes: " + pair->passing_command +
                  (pair->passing_fault_not_reached ? "  (it never reached the fault's code: it ran the correct code)"
                                                   : ""));
    if (!pair->test_command.empty()) out.push_back("  both verdicts: " + pair->test_command);
  }
  if (!no_verdict.empty()) out.push_back("left out, without a verdict: " + join(no_verdict));
  return out;
}

json Diagnosis::to_json() const {
  json j = {{"kind", diagnosis_kind_name(kind)},
            {"summary", summary()},
            {"lines", lines()},
            {"features", features},
            {"explanation", explanation},
            {"indistinguishable", indistinguishable},
            {"failing", failing},
            {"passing", passing},
            {"no_verdict", no_verdict},
            {"exceptions", exceptions},
            {"controls", controls},
            {"reference_compared_only", reference_compared_only},
            {"pair", nullptr}};
  if (pair) {
    j["pair"] = {{"failing", pair->failing},
                 {"passing", pair->passing},
                 {"failing_command", pair->failing_command},
                 {"passing_command", pair->passing_command},
                 {"differences", pair->differences},
                 {"passing_fault_not_reached", pair->passing_fault_not_reached},
                 {"test_command", pair->test_command}};
  }
  return j;
}

std::vector<DiagnosisCase> diagnosis_cases(const RunResults& run) {
  std::vector<DiagnosisCase> out;
  for (const CaseResult& r : run.cases) {
    DiagnosisCase c;
    c.spec = r.spec;
    c.name = r.name;
    c.kind = r.kind.empty() ? "train" : r.kind;
    c.matrix = r.matrix;
    c.fault = r.fault;
    c.init_from = r.init_from;
    c.training_backend = r.training_backend;
    bool any_failed = false, any_passed = false;
    for (const TestResult& t : run.tests) {
      if (t.spec != r.spec || t.case_name != r.name) continue;
      if (c.prefix.empty() && t.name.find('/') != std::string::npos) c.prefix = t.name.substr(0, t.name.find('/'));
      if (t.status == TestStatus::kFailed) {
        any_failed = true;
        c.failed_suites.insert(t.suite);
      } else if (t.status == TestStatus::kPassed) {
        any_passed = true;
        c.passed_suites.insert(t.suite);
      }
    }
    for (const auto& s : c.failed_suites) c.passed_suites.erase(s);
    // A case it is compared with (along compare_to) that did not complete: its failures judged nothing.
    const CaseResult* incomplete_reference = report_internal::incomplete_along(run, run.find_case(r.spec, r.compare_to));
    if (!r.config) {
      c.no_verdict = "no run/case.json says its configuration";
    } else if (r.outcome && classify(*r.outcome) != OutcomeClass::kVerdict &&
               classify(*r.outcome) != OutcomeClass::kConformanceFailure) {
      // No verdict on the model: infrastructure, the environment, or bad input.
      c.no_verdict = outcome_name(*r.outcome);
    } else if (incomplete_reference && any_failed) {
      c.no_verdict = "compared with " + incomplete_reference->name + ", which did not complete";
    } else if (any_failed) {
      c.verdict = DiagnosisCase::Verdict::kFailed;
    } else if (any_passed) {
      c.verdict = DiagnosisCase::Verdict::kPassed;
    } else {
      c.no_verdict = "no test ran";
    }
    if (r.config) c.config = *r.config;
    c.save_config = r.save_config;
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace mih
