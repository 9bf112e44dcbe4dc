// EvidenceDir, the integration state machine and environment capture (see evidence_store.h).
#include "harness/evidence/evidence_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/safe_open.h"
#include "harness/contract/contract.h"

extern char** environ;

namespace mih {
namespace {

namespace fs = std::filesystem;

bool process_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

bool only_chars(const std::string& s, const char* chars) {
  return !s.empty() && s.find_first_not_of(chars) == std::string::npos;
}

// Exactly a temp name mih's writers make (write_file_atomic, python/mih_evidence.py):
// "<name>.tmp.<pid>.<16 hex>", or an older mih's "<name>.tmp.<pid>", with a dead pid. Nothing
// else is mih's to remove (issue 53: "x.tmp.<20 digits>" was std::stol's out_of_range, exit 17;
// "x.tmp.<pid>.notes" was removed).
bool stale_temp(const fs::path& p) {
  const std::string name = p.filename().string();
  const size_t at = name.rfind(".tmp.");
  if (at == 0 || at == std::string::npos) return false;
  std::string pid = name.substr(at + 5);
  const size_t dot = pid.find('.');
  if (dot != std::string::npos) {
    const std::string random = pid.substr(dot + 1);
    if (random.size() != 16 || !only_chars(random, "0123456789abcdef")) return false;
    pid.resize(dot);
  }
  if (pid.size() > 9 || !only_chars(pid, "0123456789")) return false;
  return !process_alive(std::stol(pid));
}

// A directory the sweep may enter: this user's or root's, reached without a link (lstat), no
// other user may write it unless sticky, and not a case's extra/ (the trainer's own,
// docs/evidence.md). Another user's directory in a sticky root is theirs (issue 53: the sweep
// deleted a user's bob/thesis.tmp.<pid>).
bool sweepable_directory(const fs::path& p, const struct stat& st) {
  return S_ISDIR(st.st_mode) && (st.st_uid == ::geteuid() || st.st_uid == 0) &&
         (!(st.st_mode & S_IWOTH) || (st.st_mode & S_ISVTX)) && p.filename() != contract::kExtraDir;
}

// Removes mih's stale temp files under `root`: only this user's own regular files with a temp
// name of mih's writers, in directories sweepable_directory allows (issue 53: another user's
// notes.tmp.<pid> in a sticky root was deleted).
void sweep_stale_temps(const fs::path& root) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    struct stat st;
    if (::lstat(it->path().c_str(), &st) != 0) {
      it.disable_recursion_pending();
      continue;
    }
    if (S_ISDIR(st.st_mode) && !sweepable_directory(it->path(), st)) it.disable_recursion_pending();
    std::error_code ignored;  // a temp another process removed first: nothing to do
    if (S_ISREG(st.st_mode) && st.st_uid == ::geteuid() && stale_temp(it->path())) fs::remove(it->path(), ignored);
  }
}

// Creates and removes a file of its own there: a new name nobody can guess, never an existing
// file or a link (issue 53: ".writable.<pid>" opened with O_TRUNC emptied a planted link's target).
void probe_writable(const fs::path& root) {
  const int dir = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  MIH_CHECK_CODE(dir >= 0, Code::kFailedPrecondition, "evidence directory ", root.string(), " cannot be opened: ",
                 std::strerror(errno), "; pass a writable --evidence-root");
  const std::string probe = ".writable." + std::to_string(::getpid()) + "." + unguessable_suffix();
  const int fd = create_new_file_at(dir, probe, 0600);
  const int err = errno;
  if (fd >= 0) {
    ::close(fd);
    ::unlinkat(dir, probe.c_str(), 0);
  }
  ::close(dir);
  MIH_CHECK_CODE(fd >= 0, Code::kFailedPrecondition, "evidence directory ", root.string(), " is not writable: ",
                 std::strerror(err), "; pass a writable --evidence-root");
}

std::string run_command(const std::string& command) {
  std::string out;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buffer[256];
    while (std::fgets(buffer, sizeof(buffer), pipe)) out += buffer;
    ::pclose(pipe);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

constexpr int kStateSchema = 1;
const std::vector<IntegrationState> kGates = {IntegrationState::kDiscovered, IntegrationState::kStructureValidated,
                                              IntegrationState::kModuleParityPassed, IntegrationState::kMatrixPassed};

bool terminal(IntegrationState s) { return s == IntegrationState::kFailed || s == IntegrationState::kBlocked; }

int gate_index(IntegrationState s) {
  auto it = std::find(kGates.begin(), kGates.end(), s);
  return it == kGates.end() ? -1 : static_cast<int>(it - kGates.begin());
}

}  // namespace

EvidenceDir EvidenceDir::open_existing(const fs::path& root) {
  std::error_code ec;
  MIH_CHECK_CODE(fs::is_directory(root, ec), Code::kFailedPrecondition, "evidence directory ", root.string(),
                 ec ? " cannot be read: " + ec.message() : std::string(" does not exist"),
                 "; give the <root>/<spec>/<case> directory a run wrote");
  fs::path canonical = fs::canonical(root, ec);
  return EvidenceDir(ec ? root : canonical, ReadOnly{});
}

EvidenceDir::EvidenceDir(fs::path root) : root_(std::move(root)) {
  // Entered a component at a time: no link of another user's, no directory another user owns
  // or every user can write (issue 53: a planted link sent a whole case outside the root).
  make_secure_directory(root_, "pass another --evidence-root");
  probe_writable(root_);
  root_ = fs::canonical(root_);
  sweep_stale_temps(root_);
}

fs::path EvidenceDir::resolve(std::string_view relative) const {
  const fs::path rel(relative);
  MIH_CHECK(!rel.empty() && rel.is_relative(), "evidence path '", relative,
            "' must be relative to the evidence directory ", root_.string());
  for (const auto& part : rel) {
    MIH_CHECK(part != "..", "evidence path '", relative, "' escapes the evidence directory (a '..' component)");
  }
  const fs::path full = root_ / rel;
  // A symlink on the way must not lead outside either.
  const fs::path real = fs::weakly_canonical(full);
  const std::string root = root_.string() + "/";
  MIH_CHECK(real.string().rfind(root, 0) == 0, "evidence path '", relative, "' leaves the evidence directory ",
            root_.string(), " through a symlink (to ", real.string(), ")");
  return full;
}

void EvidenceDir::write_json(std::string_view relative, const nlohmann::json& j, Durability durability) const {
  write_file_atomic(resolve(relative), j.dump(2) + "\n", durability);
}

void EvidenceDir::write_text(std::string_view relative, std::string_view text) const {
  write_file_atomic(resolve(relative), text);
}

void EvidenceDir::append_jsonl(std::string_view relative, const nlohmann::json& j) const {
  const fs::path path = resolve(relative);
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  append_whole(path, j.dump() + "\n");  // whole lines or nothing, even on a full disk
}

std::vector<nlohmann::json> EvidenceDir::read_jsonl(std::string_view relative) const {
  const fs::path path = resolve(relative);
  std::string text;
  MIH_CHECK_CODE(read_file(path, &text), Code::kFailedPrecondition, "cannot read ", path.string());
  std::vector<nlohmann::json> out;
  size_t start = 0, line = 1;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1, ++line) {
    nlohmann::json row;
    std::string problem;
    MIH_CHECK_CODE(parse_json_bounded(std::string_view(text).substr(start, end - start), &row, &problem),
                   Code::kFailedPrecondition, path.string(), " line ", line, " is not JSON (", problem,
                   "): it was truncated or edited; rerun the case");
    out.push_back(std::move(row));
  }
  // Writers append whole lines: a last line without its newline is damage, not data.
  MIH_CHECK_CODE(start == text.size(), Code::kFailedPrecondition, path.string(),
                 " ends in the middle of a line: it was truncated or edited; rerun the case");
  return out;
}

nlohmann::json EvidenceDir::read_json(std::string_view relative) const {
  const fs::path path = resolve(relative);
  std::string text;
  MIH_CHECK_CODE(read_file(path, &text), Code::kFailedPrecondition, "cannot read ", path.string());
  return parse_json_strict(text, path.string());
}

bool IntegrationStateMachine::current(IntegrationState* state) const {
  if (!fs::exists(dir_->resolve(layout::kIntegrationState))) return false;
  *state = record().state;
  return true;
}

contract::IntegrationStateRecord IntegrationStateMachine::record() const {
  return contract::parse_integration_state(dir_->read_json(layout::kIntegrationState),
                                           dir_->resolve(layout::kIntegrationState).string());
}

void IntegrationStateMachine::update(IntegrationState next, const std::vector<std::string>& evidence,
                                     const std::string& reason) {
  IntegrationState now = IntegrationState::kDiscovered;
  const bool exists = current(&now);
  const std::string from = exists ? state_name(now) : "(none)";
  MIH_CHECK_CODE(!exists || !terminal(now), Code::kFailedPrecondition, "integration state of ", dir_->root().string(),
                 " is terminal (", from, "); it cannot become ", state_name(next), ": use a new evidence directory");
  if (!terminal(next)) {
    const int want = gate_index(next), have = exists ? gate_index(now) : -1;
    MIH_CHECK_CODE(want == have + 1, Code::kFailedPrecondition, "integration state of ", dir_->root().string(), ": ",
                   from, " -> ", state_name(next), " is not allowed: gates advance one at a time (",
                   want <= have ? "never back" : "no skipping", ")");
  }
  std::set<std::string> paths;
  if (exists) {
    // The gates' evidence so far is carried forward: a record without its list lost it.
    const contract::IntegrationStateRecord before = record();
    MIH_CHECK_CODE(before.evidence.has_value(), Code::kFailedPrecondition, dir_->resolve(layout::kIntegrationState).string(),
                   " has no 'evidence' list, so the gates' evidence so far would be lost: it is not the integration "
                   "state mih writes (edited or damaged); rerun the case");
    paths.insert(before.evidence->begin(), before.evidence->end());
  }
  paths.insert(evidence.begin(), evidence.end());
  dir_->write_json(layout::kIntegrationState, {{"schema_version", kStateSchema},
                                              {"state", state_name(next)},
                                              {"previous_state", exists ? nlohmann::json(from) : nlohmann::json(nullptr)},
                                              {"evidence", std::vector<std::string>(paths.begin(), paths.end())},
                                              {"reason", reason}});
}

void IntegrationStateMachine::advance_if_before(IntegrationState target, const std::vector<std::string>& evidence) {
  MIH_CHECK(!terminal(target), "advance_if_before: the target must be a gate, got ", state_name(target));
  IntegrationState now = IntegrationState::kDiscovered;
  int have = current(&now) ? gate_index(now) : -1;
  MIH_CHECK_CODE(have >= 0 || !fs::exists(dir_->resolve(layout::kIntegrationState)), Code::kFailedPrecondition,
                 "integration state of ", dir_->root().string(), " is terminal (", state_name(now),
                 "); use a new evidence directory");
  for (int g = have + 1; g <= gate_index(target); ++g) update(kGates[static_cast<size_t>(g)], evidence);
}

void IntegrationStateMachine::fail(const std::string& reason, const std::vector<std::string>& evidence, bool blocked) {
  update(blocked ? IntegrationState::kBlocked : IntegrationState::kFailed, evidence, reason);
}

nlohmann::json capture_environment(const fs::path& source_dir, const nlohmann::json& extra) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string cpu;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  nlohmann::json variables = nlohmann::json::object();
  static const std::vector<std::string> kPrefixes = {"MIH_", "SLURM_", "OMPI_COMM_WORLD_", "TORCHELASTIC_"};
  static const std::set<std::string> kNames = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                               "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"};
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool keep = kNames.count(name) > 0;
    for (const auto& p : kPrefixes) keep = keep || name.rfind(p, 0) == 0;
    if (keep) variables[name] = entry.substr(name.size() + 1);
  }
  nlohmann::json git = nullptr;
  const std::string q = "'" + source_dir.string() + "'";
  const std::string revision = run_command("git -C " + q + " rev-parse HEAD 2>/dev/null");
  if (!revision.empty()) {
    git = {{"revision", revision}, {"dirty", !run_command("git -C " + q + " status --porcelain 2>/dev/null").empty()}};
  }
  nlohmann::json env = {{"host", host},
                        {"cpu", {{"model", cpu}, {"cores", static_cast<int64_t>(::sysconf(_SC_NPROCESSORS_ONLN))}}},
                        {"compiler", __VERSION__},
                        {"cplusplus", static_cast<int64_t>(__cplusplus)},
                        {"git", git},
                        {"variables", variables}};
  for (const auto& [k, v] : extra.items()) env[k] = v;
  return env;
}

}  // namespace mih
