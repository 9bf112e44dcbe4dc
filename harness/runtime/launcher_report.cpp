// The launcher's report of a run (launcher.h): how each rank ended, which rank to blame and why
// (its error file, the ranks its collective was waiting for, its log tail), as text
// (LaunchResult::report) and as JSON for the evidence.
#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <csignal>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/rank_error.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/runtime/comm_ledger.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/launcher_internal.h"
#include "harness/base/strings.h"

namespace mih {
namespace {

std::string signal_name(int sig) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
#endif
  return "signal " + std::to_string(sig);
}

std::string seconds_str(double s) {
  std::ostringstream out;
  out.precision(2);
  out << std::fixed << s << " s";
  return out.str();
}

std::string indent(const std::string& text, const std::string& prefix) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out += prefix + line + "\n";
  return out;
}

}  // namespace

namespace launcher_internal {

int root_cause(const std::vector<Child>& children) {
  const Child* best = nullptr;
  // 0: a failure of its own; 1: timed out waiting in a collective (it names the straggler);
  // 2: lost a peer that had already gone (a rank that timed out first and exited closes its
  // connections, so its peers can be reaped before it).
  auto consequence = [](const Child& c) {
    if (!WIFEXITED(c.status)) return 0;
    const Code code = code_from_exit_status(WEXITSTATUS(c.status));
    return code == Code::kUnavailable ? 2 : code == Code::kDeadlineExceeded ? 1 : 0;
  };
  auto order = [](const Child& c) { return c.reap_order < 0 ? std::numeric_limits<int>::max() : c.reap_order; };
  for (const auto& c : children) {
    if ((c.stopped && WIFSIGNALED(c.status)) || (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) continue;
    if (!best || std::make_pair(consequence(c), order(c)) < std::make_pair(consequence(*best), order(*best))) best = &c;
  }
  return best ? best->rank : -1;
}

std::string diagnose_stragglers(const std::map<int, std::vector<CommRecord>>& ledgers, int failed_rank) {
  auto it = ledgers.find(failed_rank);
  if (it == ledgers.end() || it->second.empty()) return "";
  const CommRecord& last = it->second.back();
  bool timed_out = last.event == "begin" || (last.event == "error" && last.error.find("did not complete") != std::string::npos);
  if (!timed_out) return "";
  auto calls_on = [&](const std::vector<CommRecord>& records) {
    return std::count_if(records.begin(), records.end(),
                         [&](const CommRecord& r) { return r.event == "begin" && r.axis == last.axis && r.ranks == last.ranks; });
  };
  const auto call = calls_on(it->second);
  std::vector<int> missing;
  for (int member : last.ranks) {
    auto m = ledgers.find(member);
    if (member != failed_rank && (m == ledgers.end() || calls_on(m->second) < call)) missing.push_back(member);
  }
  if (missing.empty()) return "";
  std::string list = join(missing, ", ");
  return mih::internal::str("rank(s) [", list, "] never entered call #", call, " on axis '", last.axis, "' (", last.op,
                            " from ", last.site, ") that rank ", failed_rank, " timed out in");
}

void read_error_file(const std::filesystem::path& run_dir, RankOutcome& o) {
  std::string text;
  if (read_file(run_dir / layout::rank_error(o.rank), &text)) {
    const auto j = parse_json_lenient(text);
    if (j.is_discarded()) return;  // not JSON: the rank's log says what happened
    try {
      const contract::RankErrorRecord e = contract::parse_rank_error(j, (run_dir / layout::rank_error(o.rank)).string());
      o.error_code = e.code;
      o.error_message = e.message;
      for (const auto& line : e.context) o.error_message += "\n" + line;
    } catch (const Error& refused) {
      o.error_message = refused.message();  // what the file lacks, in place of its message
    }
  }
}

std::vector<CommRecord> rank_ledger(const std::filesystem::path& run_dir, int rank) {
  auto path = run_dir / layout::ledger_rank(rank);
  return std::filesystem::exists(path) ? read_ledger(path) : std::vector<CommRecord>{};
}

}  // namespace launcher_internal

std::string RankOutcome::how() const {
  if (state == State::kStopped) return "stopped by the launcher (" + signal_name(signal) + ")";
  if (state == State::kSignaled) return "killed by " + signal_name(signal);
  std::string out = "exited with code " + std::to_string(exit_code);
  Code code = code_from_exit_status(exit_code);
  if (exit_code != 0 && code != Code::kOk) out += " (" + std::string(code_name(code)) + ")";
  return out;
}

Code LaunchResult::code() const {
  switch (status) {
    case Status::kOk: return Code::kOk;
    case Status::kTimedOut: return Code::kDeadlineExceeded;
    case Status::kInterrupted: return Code::kAborted;
    case Status::kRankFailed:
      for (const auto& r : ranks) {
        if (r.rank != failed_rank) continue;
        Code own = r.state == RankOutcome::State::kExited ? code_from_exit_status(r.exit_code) : Code::kOk;
        return own == Code::kOk ? Code::kAborted : own;
      }
      return Code::kAborted;
  }
  return Code::kInternal;
}

std::string LaunchResult::report() const {
  std::ostringstream out;
  const int n = static_cast<int>(ranks.size());
  auto name = [&](const RankOutcome& r) {
    return r.rank >= 0 ? "rank " + std::to_string(r.rank) + "/" + std::to_string(n) : std::string("launcher command");
  };
  std::vector<int> still_running;
  for (const auto& r : ranks) {
    if (r.state == RankOutcome::State::kStopped) still_running.push_back(r.rank);
  }
  auto list = [](const std::vector<int>& v) {
    std::string s = join(v, ", ");
    return "[" + s + "]";
  };
  if (status == Status::kOk) {
    out << "all " << n << " rank(s) exited 0 in " << seconds_str(seconds) << "\n";
    return out.str();
  }
  if (status == Status::kInterrupted) {
    out << "interrupted by " << (interrupt_signal == SIGINT ? "SIGINT" : interrupt_signal == SIGTERM ? "SIGTERM" : "a signal")
        << " after " << seconds_str(seconds) << ": every rank was stopped\n";
    return out.str();
  }
  const RankOutcome* cause = nullptr;
  if (status == Status::kRankFailed) {
    for (const auto& r : ranks) {
      if (r.rank == failed_rank) cause = &r;
    }
    out << "run failed: " << (cause ? name(*cause) + " " + cause->how() : "a rank failed") << " after "
        << seconds_str(cause ? cause->seconds : seconds) << "\n";
    if (cause && !cause->error_message.empty()) {
      out << "  error [" << cause->error_code << "]:\n" << indent(cause->error_message, "    ");
    }
    if (cause && !cause->last_activity.empty()) out << "  last activity: " << cause->last_activity << "\n";
    if (!diagnosis.empty()) out << "  likely cause: " << diagnosis << "\n";
    if (cause && !failed_log_tail.empty()) out << "  log tail (" << cause->log.string() << "):\n" << indent(failed_log_tail, "    | ");
    if (!still_running.empty()) out << "ranks still running when the run was stopped: " << list(still_running) << "\n";
  } else {
    out << "run timed out after " << seconds_str(static_cast<double>(timeout.count()) / 1000.0)
        << "; ranks still running were stopped: " << list(still_running) << "\n";
    bool none_started = std::all_of(ranks.begin(), ranks.end(),
                                    [](const RankOutcome& r) { return r.last_activity == "no collective yet"; });
    if (none_started) out << "  no rank reached a collective: if they were still starting, raise the run timeout\n";
  }
  out << "every rank:\n";
  for (const auto& r : ranks) {
    out << "  " << name(r) << " (pid " << r.pid << "): " << r.how() << " after " << seconds_str(r.seconds) << "\n";
    if (!r.last_activity.empty()) out << "    " << r.last_activity << "\n";
    if (&r != cause && !r.error_message.empty()) {
      out << "    error [" << r.error_code << "]:\n" << indent(r.error_message, "      ");
    }
  }
  if (status == Status::kTimedOut) {
    for (const auto& r : ranks) {
      if (r.state != RankOutcome::State::kStopped) continue;
      std::string tail = tail_lines(r.log, 3);
      if (!tail.empty()) out << "  " << name(r) << " log tail (" << r.log.string() << "):\n" << indent(tail, "    | ");
    }
  }
  return out.str();
}

void to_json(nlohmann::json& j, const LaunchResult& result) {
  static const char* kStatus[] = {"ok", "rank_failed", "timed_out", "interrupted"};
  static const char* kState[] = {"exited", "signaled", "stopped"};
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : result.ranks) {
    nlohmann::json o = {{"rank", r.rank},
                        {"pid", r.pid},
                        {"state", kState[static_cast<int>(r.state)]},
                        {"how", r.how()},
                        {"seconds", r.seconds},
                        {"started_by", r.started_by},
                        {"log", r.log.string()},
                        {"last_activity", r.last_activity}};
    if (r.state == RankOutcome::State::kExited) o["exit_code"] = r.exit_code;
    if (r.signal != 0) o["signal"] = signal_name(r.signal);
    if (!r.error_code.empty()) o["error"] = {{"code", r.error_code}, {"message", r.error_message}};
    ranks.push_back(std::move(o));
  }
  j = {{"status", kStatus[static_cast<int>(result.status)]},
       {"code", std::string(code_name(result.code()))},
       {"seconds", result.seconds},
       {"timeout_seconds", static_cast<double>(result.timeout.count()) / 1000.0},
       {"ranks", ranks}};
  if (result.status == LaunchResult::Status::kRankFailed) j["failed_rank"] = result.failed_rank;
  if (!result.diagnosis.empty()) j["diagnosis"] = result.diagnosis;
}

}  // namespace mih
