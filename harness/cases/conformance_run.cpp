// The conformance run (see conformance_run.h).
#include "harness/cases/conformance_run.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/cases/golden.h"
#include "harness/cases/hf_interop.h"
#include "harness/cases/memo.h"
#include "harness/cases/memo_internal.h"
#include "harness/cases/run_diagnosis_internal.h"
#include "harness/cases/run_results_internal.h"
#include "harness/cases/shard.h"
#include "harness/evidence/evidence_store.h"
#include "harness/runtime/launcher.h"
#include "harness/spec/model_spec.h"
#include "harness/base/strings.h"

namespace mih::cases {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

ConformanceRun* g_current = nullptr;  // the one run of this process, while it lives

// " (--gtest_filter=...)" when the flags hold a filter.
std::string filter_text(const std::vector<std::string>& gtest_flags) {
  for (const auto& f : gtest_flags) {
    if (f.rfind("--gtest_filter=", 0) == 0) return " (" + f + ")";
  }
  return "";
}

// Calls `f(suite, test)` for every instantiated test (should_run is decided in RUN_ALL_TESTS).
template <typename F>
void for_each_test(F&& f) {
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j) f(suite, *suite.GetTestInfo(j));
  }
}

// After the tests: the cases that did not complete (an infrastructure outcome: a dead rank, a
// timeout, a cancelled job) and the failed tests of those cases and of the cases that read them
// (incomplete_dependency), which GoogleTest counts among its FAILED though none is a verdict:
// "" when there is none, else the line that says the run is incomplete and what was judged.
std::string not_judged_line() {
  std::map<std::string, std::string> cases;  // "<spec>/<case>" -> its error
  int not_judged = 0, failed = 0, passed = 0;
  for_each_test([&](const ::testing::TestSuite& suite, const ::testing::TestInfo& test) {
    if (!test.should_run()) return;
    if (!test.result()->Failed()) {
      ++passed;
      return;
    }
    const std::string full = suite.name(), name = test.name();
    const Registration* r = find_registration(full.substr(0, full.find('/')));
    const std::string case_name = name.substr(name.rfind('/') + 1);
    const CaseOutcome* o = r && name.rfind('/') != std::string::npos ? memoized_outcome(r->spec, case_name) : nullptr;
    const auto [dependency, dependency_outcome] =
        r ? incomplete_dependency(*r, case_name) : std::pair<std::string, const CaseOutcome*>{"", nullptr};
    if (o && classify(o->outcome) == OutcomeClass::kInfrastructure) {
      ++not_judged;
      cases.emplace(r->spec + "/" + case_name, o->error.substr(0, o->error.find('\n')));
    } else if (dependency_outcome && classify(dependency_outcome->outcome) == OutcomeClass::kInfrastructure) {
      // Its tests read a case that did not complete (the Reference it is compared with).
      ++not_judged;
      cases.emplace(dependency, dependency_outcome->error.substr(0, dependency_outcome->error.find('\n')));
    } else {
      ++failed;
    }
  });
  if (cases.empty()) return "";
  std::string list;
  for (const auto& [name, error] : cases) list += "\n  " + name + ": " + error;
  return "INCOMPLETE: " + std::to_string(cases.size()) + (cases.size() == 1 ? " case" : " cases") +
         " did not complete (infrastructure, not a conformance verdict); " + std::to_string(not_judged) +
         " of GoogleTest's FAILED tests are theirs or read them, and judge nothing; of the rest, " + std::to_string(passed) +
         " passed and " + std::to_string(failed) + " failed" + list;
}

// `--shard i/N`: narrows GoogleTest's filter to the cases of this run's share. The cases are
// those of the selected registrations with a test the filter selects; each gets a share
// (assign_shards, its cost the rank-steps of its launches) and the filter loses the tests of
// the cases of every other share. Returns what the share holds, for the progress line.
// Throws: mih::Error{kInvalidSpec} for more shares than selected cases (in every share, so no
//   job of the fan-out passes while another tests nothing), or with GoogleTest's own sharding
//   (GTEST_TOTAL_SHARDS) in the environment, which would split the share by test.
std::string apply_shard(const RunOptions& o) {
  const std::string where = "--shard " + std::to_string(o.shard_index) + "/" + std::to_string(o.shard_count);
  // GoogleTest's own sharding splits by test: a case's tests over two jobs, and a share halved.
  for (const char* var : {"GTEST_TOTAL_SHARDS", "GTEST_SHARD_INDEX"}) {
    const char* value = std::getenv(var);
    MIH_CHECK_CODE(!value, Code::kInvalidSpec, where, " with ", var, "=", value ? value : "",
                   " in the environment: GoogleTest would split this share again, by test; unset GTEST_TOTAL_SHARDS "
                   "and GTEST_SHARD_INDEX (--shard is the split, by whole cases)");
  }
  const std::string filter = ::testing::GTEST_FLAG(filter);
  // "<prefix>/<case>" of every instantiated test the filter selects.
  std::set<std::string> wanted;
  for_each_test([&](const ::testing::TestSuite& suite, const ::testing::TestInfo& test) {
    const std::string name = std::string(suite.name()) + "." + test.name();
    if (filter_selects(filter, name)) wanted.insert(name.substr(0, name.find('/')) + "/" + name.substr(name.rfind('/') + 1));
  });
  std::vector<ShardItem> items;
  for (const auto& r : registrations()) {
    if (!selected(r)) continue;
    for (const spec::Case* c : runnable_cases(r)) {
      const std::string key = r.prefix + "/" + c->name;
      if (!wanted.count(key)) continue;
      const int ranks = std::max(c->world_size(), c->save_config ? c->save_config->world_size() : 0);
      const int launches = c->save_config ? 2 : 1;
      items.push_back({key, static_cast<double>(ranks) * static_cast<double>(c->steps + 2 * launches)});
    }
  }
  // More shares than cases: some job would test nothing. Every job says so, not only the last.
  MIH_CHECK_CODE(!items.empty(), Code::kInvalidSpec, where, ": the run selects no case",
                 filter == "*" ? "" : " (filter " + filter + ")", "; what exists:\n", what_exists());
  MIH_CHECK_CODE(static_cast<size_t>(o.shard_count) <= items.size(), Code::kInvalidSpec, where,
                 ": the run selects ", items.size(), " case", items.size() == 1 ? "" : "s",
                 filter == "*" ? "" : " (filter " + filter + ")", ", fewer than its ", o.shard_count,
                 " shares, so a share would hold no case; use at most ", items.size(), " shares");
  const std::vector<int> shares = assign_shards(items, o.shard_count);
  std::vector<std::string> mine, excluded;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string& key = items[i].key;
    if (shares[i] == o.shard_index) {
      mine.push_back(key);
    } else {
      excluded.push_back(key.substr(0, key.find('/')) + "/*.*/" + key.substr(key.find('/') + 1));
    }
  }
  MIH_CHECK_CODE(!mine.empty(), Code::kInternal, where, ": the share holds none of ", items.size(), " cases");
  ::testing::GTEST_FLAG(filter) = filter_excluding(filter, excluded);
  return where + ": " + std::to_string(mine.size()) + " of the " + std::to_string(items.size()) +
         " selected cases (" + join(mine, ", ") + ")" +
         (o.verify_only ? "" : "; the cases they compare with run here too where needed");
}

}  // namespace

ConformanceRun::ConformanceRun(RunOptions options) : options_(std::move(options)) {
  MIH_CHECK_CODE(g_current == nullptr, Code::kInternal, "a conformance run is already current in this process");
  g_current = this;
}

ConformanceRun::~ConformanceRun() {
  if (g_current == this) g_current = nullptr;
}

ConformanceRun* ConformanceRun::current() { return g_current; }

const InitSource* ConformanceRun::init_source(const std::string& spec) const {
  const auto it = init_sources_.find(spec);
  return it == init_sources_.end() ? nullptr : &it->second;
}

const fs::path* ConformanceRun::golden(const std::string& spec) const {
  const auto it = goldens_.find(spec);
  return it == goldens_.end() ? nullptr : &it->second;
}

std::shared_ptr<const CaseRequest> ConformanceRun::request(const std::string& spec, const std::string& source,
                                                           const std::string& training_backend,
                                                           const std::string& case_name) const {
  const std::lock_guard<std::mutex> lock(requests_mu_);
  const std::string key = spec + '\n' + source + '\n' + training_backend + '\n' + case_name;
  auto it = requests_.find(key);
  if (it == requests_.end()) {
    it = requests_
             .emplace(key, std::make_shared<const CaseRequest>(
                               resolve_case_request(spec, source, training_backend, case_name)))
             .first;
  }
  return it->second;
}

void ConformanceRun::note_error(Code code) {
  if (code == Code::kInvalidSpec || code == Code::kFailedPrecondition) {
    if (input_code_ == Code::kOk) input_code_ = code;
  } else if (code != Code::kOk) {
    note_infrastructure(code);
  }
}

void ConformanceRun::note_infrastructure(Code code) {
  infrastructure_failed_ = true;
  if (infrastructure_code_ == Code::kOk) infrastructure_code_ = code;
}

int ConformanceRun::exit_status(int gtest_rc) const {
  if (infrastructure_failed_) return ::mih::exit_status(infrastructure_code_);
  if (input_code_ != Code::kOk) return ::mih::exit_status(input_code_);
  return gtest_rc == 0 ? 0 : 1;
}

void note_error(Code code) {
  if (ConformanceRun* run = ConformanceRun::current()) run->note_error(code);
}

// The checkpoint each selected spec's cases start from: --init-from for the run's one spec,
// else the spec's CheckpointSpec::init_from. Checked here, before any test runs: a URL, an
// LFS pointer, a missing shard, a key or shape that does not fit the port is bad input (exit
// 11, 12 for a missing directory), never a failing case. Verify-only runs and listings read
// no checkpoint (the evidence was produced elsewhere): the directory only decides where the
// SourceCheckpoint suite applies.
void ConformanceRun::resolve_init_sources(bool read_checkpoints) {
  const RunOptions& o = options_;
  std::set<std::string> specs;
  for (const auto& r : registrations()) {
    if (selected(r)) specs.insert(r.spec);
  }
  if (!o.init_from.empty()) {
    std::string names;
    for (const auto& n : specs) names += (names.empty() ? "'" : ", '") + n + "'";
    MIH_CHECK(specs.size() == 1, "--init-from ", o.init_from.string(), ": a checkpoint initializes the port of one "
              "spec, and this run selects ", specs.size(), " (", names.empty() ? "none" : names,
              "); add --only-spec NAME");
  }
  for (const auto& name : specs) {
    const spec::ModelSpec s = spec::SpecRegistry::instance().get(name);
    const fs::path dir = o.init_from.empty() ? fs::path(s.checkpoint.init_from) : o.init_from;
    if (dir.empty()) continue;
    if (!read_checkpoints) {
      init_sources_[name] = {fs::absolute(dir).lexically_normal(), ""};
      continue;
    }
    progress(name + ": checking checkpoint " + dir.string() + ", which its cases start from");
    init_sources_[name] = with_context(
        o.init_from.empty() ? "spec '" + name + "': checkpoint.init_from" : std::string("--init-from"),
        [&] { return check_init_from(s, dir); });
  }
}


void ConformanceRun::prepare(bool listing, const std::function<bool(const std::string& spec)>& golden_compared) {
  const RunOptions& o = options_;
  MIH_CHECK(o.fault.empty() == o.fault_cases.empty(),
            "--fault and --fault-cases go together: the fault, and the cases that run with it (the others, the "
            "reference first, run fault-free)");
  if (listing) {
  } else if (o.verify_only) {
    MIH_CHECK_CODE(fs::is_directory(o.evidence_root), Code::kFailedPrecondition, "--verify-only: evidence root ",
                   o.evidence_root.string(), " does not exist");
  } else {
    static_cast<void>(EvidenceDir(o.evidence_root));  // created and writable, or exit 12 naming the path and the OS error
  }
  // Resolve every registration's matrix now, once: a bad preset or file is bad input (exit
  // 11) before any test runs, not 160 failing tests. A rejected case is said, with its
  // arithmetic, before anything launches. A selected spec that runs none of the cases its
  // matrix lists is bad input too, whatever references, noise twin or controls mih adds
  // beside them: those check nothing the matrix asked for (every such spec named, with every
  // rejection).
  std::set<std::string> known_cases;
  std::vector<std::string> nothing_listed;
  for (const auto& r : registrations()) {
    if (!selected(r)) continue;
    const spec::CaseMatrix& m = resolved_matrix(r.spec, matrix_of(r));
    for (const auto& rejected : m.rejected) {
      progress(r.spec + "/" + rejected.name + ": not run, the spec cannot take it: " + rejected.reason);
    }
    if (const std::string why = why_no_listed_case(r); !why.empty()) {
      nothing_listed.push_back(why + "; `mih matrix --spec " + r.spec + " --matrix " + matrix_of(r) +
                               "` shows the arithmetic");
    }
    for (const auto& c : m.cases) known_cases.insert(c.name);
  }
  if (!nothing_listed.empty()) {
    std::string text;
    for (const auto& line : nothing_listed) text += "\n  " + line;
    MIH_THROW(Code::kInvalidSpec, nothing_listed.size() == 1 ? "" : std::to_string(nothing_listed.size()) + " specs: ",
              "no case the matrix lists can run", text,
              "\n  change the cases (or max_world_size), or leave the spec out of the run (--only-spec NAME, "
              "--prefixes P)");
  }
  // A --fault-cases name that is no selected case would run the fault nowhere: a green that lies.
  for (const auto& name : o.fault_cases) {
    if (known_cases.count(name)) continue;
    std::string list = join(known_cases, ", ");
    MIH_THROW(Code::kInvalidSpec, "--fault-cases: no selected case is named '", name, "' (the cases: ", list, ")");
  }
  resolve_init_sources(!o.verify_only && !listing);
  // Goldens: read now (the suite table decides where they apply), checked against this run's
  // export where the run selects a MatchesOriginal test (before any rank starts).
  goldens_ = resolve_goldens(o, [&](const std::string& spec_name) { return !listing && golden_compared(spec_name); });
  prepared_ = true;
}

int ConformanceRun::execute(const std::vector<std::string>& gtest_flags) {
  const RunOptions& o = options_;
  bool listing = false;
  for (const auto& a : gtest_flags) listing = listing || a.rfind("--gtest_list_tests", 0) == 0;
  std::vector<std::string> gargs = {"mih"};
  gargs.insert(gargs.end(), gtest_flags.begin(), gtest_flags.end());
  std::vector<char*> gargv;
  for (auto& a : gargs) gargv.push_back(a.data());
  int gargc = static_cast<int>(gargv.size());
  ::testing::InitGoogleTest(&gargc, gargv.data());
  if (!o.recorded_tests.empty()) {
    // `mih check` of a run root: every test the run recorded is one of this binary's under the
    // run's matrix, or the check would judge less than the run ran.
    std::set<std::string> here;  // every instantiated test (the filter is exactly the recorded names)
    for_each_test([&](const ::testing::TestSuite& suite, const ::testing::TestInfo& test) {
      here.insert(std::string(suite.name()) + "." + test.name());
    });
    std::vector<std::string> missing;
    for (const auto& name : o.recorded_tests) {
      if (!here.count(name)) missing.push_back(name);
    }
    MIH_CHECK_CODE(missing.empty(), Code::kFailedPrecondition, "mih check: ", o.evidence_root.string(),
                   "/results.jsonl records ", o.recorded_tests.size(), " tests of its run, and ", missing.size(),
                   " of them (", missing.front(), missing.size() > 1 ? ", ..." : "", ") are no test of this mih under "
                   "the run's matrix", o.matrix.empty() ? std::string() : " '" + o.matrix + "'",
                   ": the run used another binary, matrix or lane; check it with the conformance binary that ran it");
  }
  std::string share;
  if (o.shard_count > 0) share = apply_shard(o);
  if (!listing) ::testing::UnitTest::GetInstance()->listeners().Append(new_results_writer());
  // After the writer: its end event comes first, above GoogleTest's list of failures.
  if (!listing) ::testing::UnitTest::GetInstance()->listeners().Append(new_diagnosis_printer(o.evidence_root));
  if (::testing::UnitTest::GetInstance()->total_test_count() == 0) {
    std::fprintf(stderr, "mih: no conformance test is linked (MIH_CONFORMANCE_SUITES in a spec file of an OBJECT library)\n");
    return 1;
  }
  if (!o.verify_only && !listing) {
    json regs = json::array();
    for (const auto& r : registrations()) {
      regs.push_back({{"prefix", r.prefix},
                      {"spec", r.spec},
                      {"matrix", matrix_of(r)},
                      {"training_backend", r.training_backend}});
    }
    json init_from = json::object();
    for (const auto& [name, source] : init_sources_) {
      init_from[name] = {{"dir", source.dir.string()}, {"sha256", source.sha256}};
    }
    // Atomic: a link planted at run.json is replaced, never written through (issue 53).
    write_file_atomic(o.evidence_root / layout::kRunRecord,
                      json({{"matrix", o.matrix}, {"registrations", regs}, {"init_from", init_from}}).dump(2));
  }
  progress("evidence root " + o.evidence_root.string() + (o.verify_only ? " (verify-only)" : ""));
  if (!share.empty()) progress(share);
  if (listing) return RUN_ALL_TESTS();
  install_interrupt_handlers();  // SIGINT/SIGTERM: the ranks stopped, what is done written and said
  if (const int sig = interrupt_signal()) {
    // Caught while the run was being set up (conformance_main installs the handlers first).
    std::fprintf(stderr, "mih: interrupted by %s before the first test; nothing was launched\n",
                 sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal");
    return 128 + sig;
  }
  const int rc = RUN_ALL_TESTS();
  const bool help = std::find(gtest_flags.begin(), gtest_flags.end(), "--gtest_help") != gtest_flags.end();
  if (!help && ::testing::UnitTest::GetInstance()->test_to_run_count() == 0) {
    // A run that checked nothing is an error, never a green.
    std::fprintf(stderr, "mih: %s error: the run selected no test%s; what exists:\n%s",
                 std::string(code_name(Code::kInvalidSpec)).c_str(), filter_text(gtest_flags).c_str(),
                 what_exists().c_str());
    return ::mih::exit_status(Code::kInvalidSpec);
  }
  if (const std::string line = not_judged_line(); !line.empty()) std::fprintf(stderr, "mih: %s\n", line.c_str());
  const std::vector<std::string> disagree = record_case_states();
  for (const auto& line : disagree) std::fprintf(stderr, "mih: conformance failure: %s\n", line.c_str());
  if (o.read_only) {
    // mih check writes nothing: no results.jsonl to point at.
    progress("checked the evidence under " + o.evidence_root.string() + " (launched nothing, wrote nothing)");
  } else {
    progress(std::to_string(cases_launched()) + " case(s) launched; results in " +
             (o.evidence_root / layout::kResults).string() + "; `mih report " + o.evidence_root.string() +
             " --format md` for the table");
  }
  // Last, so that a run without the comparison with the original model never reads as one with it.
  if (o.no_golden) std::fprintf(stderr, "mih: %s\n", kMatchesOriginalNotRun);
  const int status = exit_status(rc);
  // The state and the exit status agree: a case that cannot be MATRIX_PASSED is no pass.
  return status == 0 && !disagree.empty() ? 1 : status;
}

// The registrations of the run with their cases and rejected cases, for a run that selected
// nothing: "  Llama (spec llama, matrix cpu-smoke): Reference, DpShard2, ...".
std::string what_exists() {
  std::string out;
  for (const auto& r : registrations()) {
    if (!selected(r)) continue;
    const spec::CaseMatrix& m = resolved_matrix(r.spec, matrix_of(r));
    std::string names = join(m.cases, ", ", [](const auto& c) { return c.name; });
    out += "  " + r.prefix + " (spec " + r.spec + ", matrix " + matrix_of(r) + "): " + names + "\n";
    for (const auto& rej : m.rejected) out += "    rejected " + rej.name + ": " + rej.reason + "\n";
  }
  if (out.empty()) out = "  no registration is selected (--prefixes, --only-spec)\n";
  return out + "  test names are <Prefix>/<Suite>.<Test>/<Case>, e.g. --gtest_filter='Llama/*.*/DpShard2'\n";
}


}  // namespace mih::cases
