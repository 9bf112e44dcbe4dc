// Registrations, run options and resolved matrices (see registrations.h).
#include "harness/cases/registrations.h"

#include <cstdio>
#include <map>
#include <mutex>

#include "harness/cases/case_runner.h"
#include "harness/cases/conformance_run.h"
#include "harness/session/backend.h"
#include "harness/base/strings.h"

namespace mih::cases {
namespace {

std::vector<Registration>& registry() {
  static std::vector<Registration> r;
  return r;
}

std::vector<std::string>& duplicates() {
  static std::vector<std::string> d;
  return d;
}

}  // namespace

bool add_registration(Registration r) {
  for (const auto& x : registry()) {
    if (x.prefix == r.prefix) {
      std::fprintf(stderr, "mih: MIH_CONFORMANCE_SUITES prefix '%s' is registered twice (specs '%s' and '%s')\n",
                   r.prefix.c_str(), x.spec.c_str(), r.spec.c_str());
      duplicates().push_back(r.prefix);
      return false;
    }
  }
  registry().push_back(std::move(r));
  return true;
}

const std::vector<Registration>& registrations() { return registry(); }

const std::vector<std::string>& duplicate_prefixes() { return duplicates(); }

const Registration* find_registration(const std::string& prefix) {
  for (const auto& r : registry()) {
    if (r.prefix == prefix) return &r;
  }
  return nullptr;
}

const RunOptions& run_options() {
  static const RunOptions defaults;
  const ConformanceRun* run = ConformanceRun::current();
  return run ? run->options() : defaults;
}

bool run_enabled() {
  const ConformanceRun* run = ConformanceRun::current();
  return run && run->prepared();
}

bool selected(const Registration& r) {
  const RunOptions& o = run_options();
  const bool named = o.prefixes.count(r.prefix) > 0;
  return (o.only_spec.empty() || o.only_spec == r.spec) && (named || (o.prefixes.empty() && !r.on_request));
}

const InitSource* init_source_of(const std::string& spec) {
  const ConformanceRun* run = ConformanceRun::current();
  return run ? run->init_source(spec) : nullptr;
}

spec::ModelSpec spec_of_run(const std::string& name) {
  const InitSource* source = init_source_of(name);
  spec::ModelSpec s = spec::initialized_from(spec::SpecRegistry::instance().get(name), source ? source->dir.string() : "");
  const ConformanceRun* run = ConformanceRun::current();
  if (const std::filesystem::path* golden = run ? run->golden(name) : nullptr) s.golden.dir = golden->string();
  return s;
}

std::string matrix_of(const Registration& r) {
  const RunOptions& o = run_options();
  const std::string base = o.matrix.empty() ? r.matrix : o.matrix;
  if (o.lane.empty()) return base;
  MatrixSource source = MatrixSource::parse(base);
  source.lane = source.lane.merged_with(o.lane);
  return source.text();
}

const spec::CaseMatrix& resolved_matrix(const std::string& spec_name, const std::string& source) {
  static std::mutex mu;
  static std::map<std::pair<std::string, std::string>, spec::CaseMatrix> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(spec_name, source);
  auto it = cache.find(key);
  if (it == cache.end()) {
    it = cache.emplace(key, spec::resolve_matrix_source(spec::SpecRegistry::instance().get(spec_name), source)).first;
  }
  return it->second;
}

CaseRequest resolve_case_request(const std::string& spec, const std::string& source, const std::string& training_backend,
                                 const std::string& case_name) {
  const RunOptions& o = run_options();
  CaseRequest q;
  q.spec = spec;
  q.c = resolved_matrix(spec, source).at(case_name);
  q.matrix = MatrixSource::parse(source);
  q.training_backend = training_backend;
  q.fault = o.fault_cases.count(case_name) ? o.fault : std::string();
  if (const InitSource* init = init_source_of(spec)) {
    q.init_from = init->dir.string();
    q.init_from_sha256 = init->sha256;
  }
  q.case_timeout = o.case_timeout;
  q.collective_timeout = o.collective_timeout;
  q.fingerprint = case_fingerprint(q);
  return q;
}

namespace {

// The run's request (kept for the run), or a fresh one when no run is current.
std::shared_ptr<const CaseRequest> request_in_run(const std::string& spec, const std::string& source,
                                                  const std::string& training_backend, const std::string& case_name) {
  if (const ConformanceRun* run = ConformanceRun::current()) return run->request(spec, source, training_backend, case_name);
  return std::make_shared<const CaseRequest>(resolve_case_request(spec, source, training_backend, case_name));
}

}  // namespace

std::shared_ptr<const CaseRequest> case_request(const Registration& r, const std::string& case_name) {
  return request_in_run(r.spec, matrix_of(r), r.training_backend, case_name);
}

std::shared_ptr<const CaseRequest> sibling_request(const CaseRequest& of, const std::string& case_name) {
  return request_in_run(of.spec, of.matrix.text(), of.training_backend, case_name);
}

std::vector<const spec::Case*> runnable_cases(const Registration& r) {
  const spec::CaseMatrix& m = resolved_matrix(r.spec, matrix_of(r));
  const auto backend = TrainingBackendRegistry::instance().make(r.training_backend);
  std::vector<const spec::Case*> out;
  for (const auto& c : m.cases) {
    if (backend->unsupported(c.config, c.save_config.has_value()).empty()) out.push_back(&c);
  }
  return out;
}

std::string why_no_listed_case(const Registration& r) {
  const spec::CaseMatrix& m = resolved_matrix(r.spec, matrix_of(r));
  for (const spec::Case* c : runnable_cases(r)) {
    if (m.is_listed(c->name)) return "";
  }
  std::string why = join(m.rejected, "; ", [](const auto& rejected) { return rejected.name + " (" + rejected.reason + ")"; });
  const auto backend = TrainingBackendRegistry::instance().make(r.training_backend);
  for (const auto& name : m.listed) {
    const spec::Case& c = m.at(name);
    why += (why.empty() ? "" : "; ") + name + " (training backend '" + r.training_backend + "' cannot run it: " +
           backend->unsupported(c.config, c.save_config.has_value()) + ")";
  }
  std::string added = join(m.cases, ", ", [](const auto& c) { return c.name; });
  return "matrix '" + m.name + "' lists no case spec '" + r.spec + "' (" + r.prefix + ") can run; rejected: " + why +
         (added.empty() ? std::string() : "; only the cases mih adds beside a listed one would run (" + added + ")");
}

}  // namespace mih::cases
