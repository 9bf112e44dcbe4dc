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
#include <optional>
#include <set>
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
  // An axis's degree ("tp = 4", "tp > num_key_value_heads"): a candidate alone, never in a
  // pair; after the other features, so named only where none of them separates as well.
  bool degree = false;
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

// A feature's test that holds when any phase of the case's configuration has it.
std::function<bool(const DiagnosisCase&)> in_any_phase(std::function<bool(const ParallelConfig&)> f) {
  return [f = std::move(f)](const DiagnosisCase& c) { return any_phase(c, f); };
}

// The mesh axes above 1 and the knobs that refine them: ep, edp, sp, the cp layouts, ac and
// gradient accumulation.
void add_axis_features(std::vector<Feature>& out) {
  for (const MeshDim& d : kMeshDims) {
    const std::string name(d.name);
    out.push_back({name + ">1", name + " > 1", name + " = 1", name + "=1", name,
                   in_any_phase([deg = d.degree](const ParallelConfig& p) { return p.*deg > 1; })});
  }
  // Megatron-Core's and TorchTitan's name for the run with the experts replicated.
  out.push_back({"ep>1", "ep > 1", "ep = 1", "EP=1", "ep", in_any_phase([](const ParallelConfig& p) { return p.ep > 1; })});
  // The expert-data-parallel ranks (DESIGN.md section 4): edp = dp_shard * cp / ep > 1 shards
  // the routed experts with FSDP too, so their gradients take another path than at edp = 1.
  out.push_back({"edp>1", "edp > 1", "edp = 1", "edp>1", "edp", in_any_phase([](const ParallelConfig& p) {
                   return p.ep > 1 && static_cast<int64_t>(p.dp_shard) * p.cp / p.ep > 1;
                 }), "ep"});
  out.push_back({"sp", "sequence parallelism", "without sequence parallelism", "no-SP", "sp",
                 in_any_phase([](const ParallelConfig& p) { return p.sequence_parallel; })});
  out.push_back({"cp_zigzag", "the zigzag cp layout", "without the zigzag cp layout", "non-zigzag", "cp",
                 in_any_phase([](const ParallelConfig& p) { return p.cp > 1 && p.cp_layout == CpLayout::kZigzag; })});
  out.push_back({"cp_contiguous", "the contiguous cp layout", "without the contiguous cp layout", "non-contiguous", "cp",
                 in_any_phase([](const ParallelConfig& p) { return p.cp > 1 && p.cp_layout == CpLayout::kContiguous; })});
  out.push_back({"ac", "activation checkpointing", "without activation checkpointing", "no-AC", "ac",
                 in_any_phase([](const ParallelConfig& p) { return p.activation_checkpointing; })});
  out.push_back({"micro_batches>1", "gradient accumulation (micro_batches > 1)", "one micro-batch", "one-micro-batch",
                 "micro_batches", in_any_phase([](const ParallelConfig& p) { return p.micro_batches > 1; })});
}

void add_resume_features(std::vector<Feature>& out) {
  out.push_back({"resume", "a resume", "without a resume", "uninterrupted", "resume", is_resume});
  out.push_back({"same_topology_resume", "a resume on the same topology", "without a resume on the same topology",
                 "uninterrupted", "resume", [](const DiagnosisCase& c) { return c.kind == "resume"; }});
  out.push_back({"cross_topology_resume", "a resume across topologies", "without a resume across topologies",
                 "uninterrupted or same-topology", "resume", [](const DiagnosisCase& c) { return c.kind == "cross_resume"; }});
  out.push_back({"noise_twin", "the noise twin", "not the noise twin", "non-twin", "noise_twin",
                 [](const DiagnosisCase& c) { return c.config.noise_twin; }});
}

// Each dtype and each spec, where the table has several.
void add_dtype_and_spec_features(const std::vector<DiagnosisCase>& cases, std::vector<Feature>& out) {
  std::set<std::string> dtypes, specs;
  for (const auto& c : cases) {
    for (const ParallelConfig* p : phases(c)) dtypes.insert(dtype_name(p->dtype));
    specs.insert(c.spec);
  }
  if (dtypes.size() > 1) {
    for (const auto& d : dtypes) {
      out.push_back({"dtype=" + d, "dtype " + d, "another dtype than " + d, "non-" + d, "dtype",
                     in_any_phase([d](const ParallelConfig& p) { return dtype_name(p.dtype) == d; })});
    }
  }
  if (specs.size() > 1) {
    for (const auto& s : specs) {
      out.push_back({"spec=" + s, "spec " + s, "another spec than " + s, "other-spec", "spec",
                     [s](const DiagnosisCase& c) { return c.spec == s; }});
    }
  }
}

// tp above the spec's key/value heads (each rank then holds a replicated KV head:
// Megatron-Core's layout for tp > num_query_groups), then the degrees of an axis where the
// table has several above 1 (a wrong KV head per rank only at tp 4 is not "tp > 1" when tp 2
// passes). The former first: the cause when both hold for the same cases.
void add_degree_features(const std::vector<DiagnosisCase>& cases, std::vector<Feature>& out) {
  const bool kv_heads = std::any_of(cases.begin(), cases.end(), [](const DiagnosisCase& c) {
    return c.num_key_value_heads > 0;
  });
  if (kv_heads) {
    out.push_back({"tp>num_key_value_heads", "tp > num_key_value_heads", "tp <= num_key_value_heads",
                   "tp<=num_key_value_heads", "tp",
                   [](const DiagnosisCase& c) {
                     return c.num_key_value_heads > 0 && any_phase(c, [&c](const ParallelConfig& p) {
                              return p.tp > c.num_key_value_heads;
                            });
                   },
                   "world_size", true});
  }
  for (const MeshDim& d : kMeshDims) {
    std::set<int64_t> degrees;
    for (const auto& c : cases) {
      for (const ParallelConfig* p : phases(c)) {
        if (p->*d.degree > 1) degrees.insert(p->*d.degree);
      }
    }
    if (degrees.size() < 2) continue;
    const std::string name(d.name);
    for (const int64_t n : degrees) {
      const std::string v = std::to_string(n);
      out.push_back({name + "=" + v, name + " = " + v, name + " != " + v, name + "!=" + v, name,
                     in_any_phase([deg = d.degree, n](const ParallelConfig& p) { return p.*deg == n; }),
                     "world_size", true});
    }
  }
}

// The features, in the order the diagnosis prefers them when several explain the same cases:
// the mesh axes, then the knobs that refine them, the resumes, the dtype and spec, and last
// the world size (what every parallel case shares).
std::vector<Feature> features_of(const std::vector<DiagnosisCase>& cases) {
  std::vector<Feature> out;
  add_axis_features(out);
  add_resume_features(out);
  add_dtype_and_spec_features(cases, out);
  add_degree_features(cases, out);
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

}  // namespace

const std::set<std::string>& reference_compared_suites() {
  static const std::set<std::string> kSuites = {"NumericParity", "InputIdentity"};
  return kSuites;
}

const std::set<std::string>& comparison_suites() {
  static const std::set<std::string> kSuites = {"NumericParity", "InputIdentity", "MatchesOriginal", "ModuleParity"};
  return kSuites;
}

const std::set<std::string>& original_model_suites() {
  static const std::set<std::string> kSuites = {"MatchesOriginal", "ModuleParity"};
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

bool fails_original(const DiagnosisCase& c) {
  return c.verdict == DiagnosisCase::Verdict::kFailed &&
         std::any_of(c.failed_suites.begin(), c.failed_suites.end(),
                     [](const std::string& s) { return original_model_suites().count(s) > 0; });
}

// Fills d.original (each case of `specs` failing the original's suites, the Reference first,
// with where it diverges) and d.consequences (the other failing cases of those specs).
void record_original(Diagnosis& d, const std::vector<const DiagnosisCase*>& cases,
                     const std::set<std::string>& specs) {
  std::vector<const DiagnosisCase*> order;
  for (const DiagnosisCase* c : cases) {
    if (c->kind == "reference" && specs.count(c->spec)) order.push_back(c);
  }
  for (const DiagnosisCase* c : cases) {
    if (c->kind != "reference" && specs.count(c->spec)) order.push_back(c);
  }
  for (const DiagnosisCase* c : order) {
    if (c->verdict != DiagnosisCase::Verdict::kFailed) continue;
    if (!fails_original(*c)) {
      d.consequences.push_back(c->id());
      continue;
    }
    std::vector<std::string> suites;
    for (const auto& s : c->failed_suites) {
      if (original_model_suites().count(s)) suites.push_back(s);
    }
    d.original.push_back(c->id() + " fails " + join(suites, " and ") +
                         (c->original_divergence.empty() ? "" : ": " + c->original_divergence));
    d.original_suites.insert(suites.begin(), suites.end());
  }
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

namespace {

// The cases with a verdict and what the diagnosis reads of them.
struct Table {
  std::vector<const DiagnosisCase*> cases;
  std::vector<Feature> features;
  std::vector<std::vector<bool>> has;  // [feature][case]: the feature holds on the case
  std::vector<bool> compared;          // per case: a suite compared it with something
  bool failed(size_t i) const { return cases[i]->verdict == DiagnosisCase::Verdict::kFailed; }
};

// The cases with a verdict; each case into d's failing, passing or no_verdict.
std::vector<const DiagnosisCase*> with_verdict(const std::vector<DiagnosisCase>& all, Diagnosis& d) {
  std::vector<const DiagnosisCase*> cases;
  for (const auto& c : all) {
    if (c.verdict == DiagnosisCase::Verdict::kNone) {
      d.no_verdict.push_back(c.id() + (c.no_verdict.empty() ? "" : " (" + c.no_verdict + ")"));
      continue;
    }
    cases.push_back(&c);
    (c.verdict == DiagnosisCase::Verdict::kFailed ? d.failing : d.passing).push_back(c.id());
  }
  return cases;
}

// A pass that compared nothing (the Reference without a golden, a case whose accumulation the
// spec declares not comparable) says nothing about a numeric failure elsewhere: never a
// control, never the pair's passing half.
std::vector<bool> compared_cases(const std::vector<const DiagnosisCase*>& cases, Diagnosis& d) {
  std::vector<bool> compared(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    for (const auto* suites : {&cases[i]->passed_suites, &cases[i]->failed_suites}) {
      for (const auto& s : *suites) compared[i] = compared[i] || comparison_suites().count(s) > 0;
    }
    if (cases[i]->verdict != DiagnosisCase::Verdict::kFailed && !compared[i]) d.compared_nothing.push_back(cases[i]->id());
  }
  return compared;
}

// Only the Reference-compared suites fail, while a findings-based suite passed on a failing case.
bool reference_compared_only(const std::vector<const DiagnosisCase*>& cases) {
  bool only_compared = true, findings_passed = false;
  for (const DiagnosisCase* c : cases) {
    if (c->verdict != DiagnosisCase::Verdict::kFailed) continue;
    for (const auto& s : c->failed_suites) only_compared = only_compared && reference_compared_suites().count(s);
    for (const auto& s : c->passed_suites) findings_passed = findings_passed || !reference_compared_suites().count(s);
  }
  return only_compared && findings_passed;
}

// The original model first. Only the comparison with it fails (it runs on the Reference): every
// case agrees with the port's own Reference, so no parallel feature is at fault. Or the
// Reference fails only that (MatchesOriginal, ModuleParity): every case is compared with a
// Reference that computes another model, so their failures are said as its possible
// consequences, and no axis is blamed on them (a config-invariant bug is in all of them).
// Returns the diagnosis when the original model is at fault.
std::optional<Diagnosis> original_model_diagnosis(const std::vector<DiagnosisCase>& all,
                                                  const std::vector<const DiagnosisCase*>& cases, Diagnosis d) {
  const bool only_original = std::all_of(cases.begin(), cases.end(), [](const DiagnosisCase* c) {
    return c->verdict != DiagnosisCase::Verdict::kFailed ||
           (!c->failed_suites.empty() &&
            std::all_of(c->failed_suites.begin(), c->failed_suites.end(), [](const std::string& s) {
              return s == "MatchesOriginal";
            }));
  });
  // A Reference that also fails a findings-based suite (the data contract, the structure) has
  // a fault those name more precisely: said below, as every case failing or separated. The
  // rule holds per spec: only the cases of a spec whose own Reference is not the original are
  // its consequences; another spec's failures are diagnosed on their own.
  std::set<std::string> not_original;  // specs whose Reference fails only the original's suites
  for (const DiagnosisCase* c : cases) {
    if (c->kind == "reference" && fails_original(*c) &&
        std::all_of(c->failed_suites.begin(), c->failed_suites.end(),
                    [](const std::string& s) { return original_model_suites().count(s) > 0; })) {
      not_original.insert(c->spec);
    }
  }
  const bool others_fail = std::any_of(cases.begin(), cases.end(), [&](const DiagnosisCase* c) {
    return c->verdict == DiagnosisCase::Verdict::kFailed && !not_original.count(c->spec);
  });
  if (!only_original && !not_original.empty() && others_fail) {
    std::vector<DiagnosisCase> rest;
    for (const auto& c : all) {
      if (!not_original.count(c.spec)) rest.push_back(c);
    }
    Diagnosis mixed = diagnose(rest);  // the other specs' table, counted alone
    record_original(mixed, cases, not_original);
    return mixed;
  }
  if (only_original || !not_original.empty()) {
    d.kind = Diagnosis::Kind::kOriginalModel;
    d.features = {"original_model"};
    std::set<std::string> every_spec;
    for (const DiagnosisCase* c : cases) every_spec.insert(c->spec);
    record_original(d, cases, only_original ? every_spec : not_original);
    return d;
  }
  return std::nullopt;
}

// Every candidate: single literals, then conjunctions of two (a positive first literal).
std::vector<Candidate> candidates_of(const Table& t) {
  std::vector<Candidate> candidates;
  const auto& features = t.features;
  auto add = [&](std::vector<Literal> literals) {
    Candidate c;
    c.literals = std::move(literals);
    c.truth.assign(t.cases.size(), true);
    for (const Literal& l : c.literals) {
      c.negatives += l.positive ? 0 : 1;
      for (size_t i = 0; i < t.cases.size(); ++i) c.truth[i] = c.truth[i] && t.has[l.feature][i] == l.positive;
    }
    // A predicate true everywhere or nowhere says nothing.
    if (std::count(c.truth.begin(), c.truth.end(), true) == 0) return;
    if (std::count(c.truth.begin(), c.truth.end(), false) == 0) return;
    for (size_t i = 0; i < t.cases.size(); ++i) c.exceptions += c.truth[i] != t.failed(i) ? 1 : 0;
    candidates.push_back(std::move(c));
  };
  // A feature's absence alone ("fails only with at most 2 ranks") is what a small table
  // separates by chance, never a cause: a negation only refines a feature ("tp > 1 without
  // sequence parallelism"), and never by the world size.
  for (size_t f = 0; f < features.size(); ++f) add({{f, true}});
  // An axis's degree stands alone: joined with another feature it only restates what that
  // one and its axis say ("dp_shard = 2 and ep > 1" for "ep > 1 and edp = 1").
  for (size_t f = 0; f < features.size(); ++f) {
    for (size_t g = 0; g < features.size(); ++g) {
      if (f == g || features[f].family == features[g].family || features[f].degree || features[g].degree) continue;
      if (g > f) add({{f, true}, {g, true}});
      if (features[g].family != "world_size") add({{f, true}, {g, false}});
    }
  }
  return candidates;
}

// Controls: passing cases that differ from a failing one only in the explanation's families.
// A resume's control is its uninterrupted twin (or a resume into the same config): only what it
// trains under after the load counts then.
void find_controls(const Table& t, const Candidate& best, Diagnosis& d) {
  const size_t total = t.cases.size();
  std::set<std::string> families;
  for (const Literal& l : best.literals) families.insert(t.features[l.feature].family);
  auto after_load = [&](const DiagnosisCase& c) {
    DiagnosisCase out = c;
    if (families.count("resume")) out.save_config.reset();
    return out;
  };
  for (size_t p = 0; p < total; ++p) {
    if (t.failed(p) || !t.compared[p]) continue;
    const DiagnosisCase passing = after_load(*t.cases[p]);
    bool control = false;
    for (size_t f = 0; f < total && !control; ++f) {
      if (!t.failed(f) || t.cases[f]->spec != t.cases[p]->spec) continue;
      const DiagnosisCase failing = after_load(*t.cases[f]);
      bool differs = false, elsewhere = false;
      for (const Feature& k : t.features) {
        if (k.has(failing) == k.has(passing)) continue;
        differs = true;
        elsewhere = elsewhere || (!families.count(k.family) && !families.count(k.parent));
      }
      control = differs && !elsewhere;
    }
    if (control) d.controls.push_back(t.cases[p]->id());
  }
  const bool plural = d.controls.size() > 1;
  if (best.literals.size() == 1) {
    d.controls_phrase = t.features[best.literals[0].feature].control + (plural ? " controls" : " control");
  } else {
    d.controls_phrase = plural ? "controls without it" : "control without it";
  }
}

// The best candidate's verdict: separated, mostly, every parallel case or inconclusive, what
// the run cannot tell apart from it, its exceptions and its controls.
void judge_best(const Table& t, const std::vector<Candidate>& candidates, Diagnosis& d) {
  const Candidate& best = *std::min_element(candidates.begin(), candidates.end(),
                                            [](const Candidate& a, const Candidate& b) { return a.key() < b.key(); });
  const size_t ws1 = t.features.size() - 1;  // world_size>1 is the last feature
  const std::vector<bool>& parallel = t.has[ws1];
  const size_t total = t.cases.size();
  size_t covered = 0;
  for (size_t i = 0; i < total; ++i) covered += best.truth[i] && t.failed(i) ? 1 : 0;
  // Exactly the parallel cases fail: an axis true on the same cases (dp_shard > 1 when it is
  // the only one) is not told from what they all share, and is named as indistinguishable.
  if (best.exceptions == 0 && best.truth == parallel) {
    d.kind = Diagnosis::Kind::kEveryParallel;
    d.features = {"world_size>1"};
    d.explanation = "world size > 1";
  } else if (best.exceptions == 0) {
    d.kind = Diagnosis::Kind::kSeparated;
  } else if (total >= 5 && static_cast<size_t>(best.exceptions) * 5 <= total && covered >= 2 && best.truth != parallel) {
    d.kind = Diagnosis::Kind::kMostly;
  } else {
    d.kind = Diagnosis::Kind::kInconclusive;
  }
  const bool named = d.kind == Diagnosis::Kind::kSeparated || d.kind == Diagnosis::Kind::kMostly;
  if (named) {
    for (const Literal& l : best.literals) d.features.push_back(literal_key(t.features[l.feature], l.positive));
    d.explanation = candidate_phrase(t.features, best);
  }
  if (d.kind != Diagnosis::Kind::kInconclusive) {
    // What the run cannot tell apart from it: single features true on exactly the same cases.
    for (const Candidate& c : candidates) {
      if (c.literals.size() != 1 || c.truth != best.truth || c.negatives) continue;
      const std::string phrase = candidate_phrase(t.features, c);
      if (phrase != d.explanation) d.indistinguishable.push_back(phrase);
    }
  }
  if (d.kind == Diagnosis::Kind::kMostly) {
    for (size_t i = 0; i < total; ++i) {
      if (best.truth[i] == t.failed(i)) continue;
      d.exceptions.push_back(t.cases[i]->id() + (t.failed(i) ? " fails without it" : " passes with it"));
    }
  }
  if (named) find_controls(t, best, d);
}

// The smallest pair: fewest differing features, then fewest ranks.
void smallest_pair(const Table& t, Diagnosis& d) {
  std::tuple<size_t, int64_t, std::string, std::string> best_pair{SIZE_MAX, 0, "", ""};
  const DiagnosisCase *pf = nullptr, *pp = nullptr;
  for (size_t f = 0; f < t.cases.size(); ++f) {
    if (!t.failed(f)) continue;
    for (size_t p = 0; p < t.cases.size(); ++p) {
      if (t.failed(p) || !t.compared[p]) continue;
      size_t diff = t.cases[f]->spec == t.cases[p]->spec ? 0 : 1;
      for (size_t k = 0; k < t.features.size(); ++k) diff += t.has[k][f] != t.has[k][p] ? 1 : 0;
      const auto key = std::make_tuple(diff, ranks(*t.cases[f]) + ranks(*t.cases[p]), t.cases[f]->id(), t.cases[p]->id());
      if (key < best_pair) {
        best_pair = key;
        pf = t.cases[f];
        pp = t.cases[p];
      }
    }
  }
  if (!pf || !pp) return;
  Diagnosis::Pair pair;
  pair.failing = pf->id();
  pair.passing = pp->id();
  pair.failing_command = rerun_command(*pf);
  pair.passing_command = rerun_command(*pp);
  pair.passing_fault_not_reached = pp->fault_not_reached;
  pair.test_command = test_command(*pf, *pp);
  if (pf->spec != pp->spec) pair.differences.push_back("spec " + pf->spec + " vs " + pp->spec);
  for (const Feature& f : t.features) {
    const bool a = f.has(*pf), b = f.has(*pp);
    if (a != b) pair.differences.push_back(a ? f.phrase : f.negated);
  }
  d.pair = pair;
}

}  // namespace

Diagnosis diagnose(const std::vector<DiagnosisCase>& all) {
  Diagnosis d;
  Table t;
  t.cases = with_verdict(all, d);
  if (d.failing.empty()) return d;
  t.features = features_of(all);
  t.compared = compared_cases(t.cases, d);
  d.reference_compared_only = reference_compared_only(t.cases);
  if (std::optional<Diagnosis> original = original_model_diagnosis(all, t.cases, d)) return *original;
  if (d.passing.empty()) {
    d.kind = Diagnosis::Kind::kEveryCase;
    d.features = {"every_case"};
    return d;
  }
  t.has.assign(t.features.size(), std::vector<bool>(t.cases.size()));
  for (size_t f = 0; f < t.features.size(); ++f) {
    for (size_t i = 0; i < t.cases.size(); ++i) t.has[f][i] = t.features[f].has(*t.cases[i]);
  }
  const std::vector<Candidate> candidates = candidates_of(t);
  if (candidates.empty()) {  // every feature is the same on every case
    d.kind = Diagnosis::Kind::kInconclusive;
  } else {
    judge_best(t, candidates, d);
  }
  smallest_pair(t, d);
  return d;
}

}  // namespace mih
