// The comm ledger: one record per collective a rank issues (axis, op, dtype, numel, bytes,
// duration, call site), kept in memory and appended to comm/ledger_rank<r>.jsonl as it
// happens, so a launcher can tell what a stuck or dead rank was last doing.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/contract/comm_ledger_row.h"

namespace mih {

/// Where a collective was called from: an optional label plus the caller's file and line,
/// captured by default arguments so call sites stay one line.
/// Example: comm.all_reduce(grad, ReduceOp::kSum, "grad_sync");
struct CallSite {
  CallSite(const char* label = "", std::source_location where = std::source_location::current());
  /// "grad_sync @ runtime/selftest.cpp:120" (file trimmed to its last two components).
  std::string str() const;

  const char* label;
  const char* file;
  int line;
};

/// What a layer declares it communicates, per collective it issues or makes its backward
/// issue (its contract: a row-parallel linear all-reduces its output over tp, a column-parallel
/// one all-reduces its input's gradient), recorded beside what really happened so the two can
/// be compared site by site (the CommVolume suite).
struct ExpectedComm {
  std::string axis;
  std::string site;   ///< the CallSite label the collective uses ("region.reduce_from")
  std::string layer;  ///< the declaring layer's FQN, or its kind when unknown
  int64_t bytes = 0;  ///< as CommRecord::bytes: the input payload of this rank
};

/// The ledger of one rank. Thread-safe.
class CommLedger {
 public:
  /// Records in memory only.
  CommLedger() = default;
  /// Also appends every record to `path` (created with its directory; whole lines, each
  /// flushed with one write so a killed rank leaves a readable file).
  /// Throws: mih::Error{kFailedPrecondition} if the file cannot be opened for appending.
  explicit CommLedger(const std::filesystem::path& path);
  ~CommLedger();
  CommLedger(const CommLedger&) = delete;
  CommLedger& operator=(const CommLedger&) = delete;

  /// Starts a record; returns its seq.
  int64_t begin(std::string_view axis, const std::vector<int>& ranks, std::string_view op,
                std::string_view dtype, int64_t numel, int64_t bytes, const CallSite& site);
  /// Completes record `seq`.
  void end(int64_t seq);
  /// Completes record `seq` with an error message.
  void fail(int64_t seq, std::string_view error);

  /// Completed records (end and error), in completion order.
  std::vector<CommRecord> completed() const;
  /// The record started but not completed, if any (what a stuck rank is doing).
  std::optional<CommRecord> in_flight() const;
  const std::filesystem::path& path() const { return path_; }
  /// Adds an expectation (Communicator::expect).
  void expect(ExpectedComm e);
  /// The expectations added since the last call, in order; clears them.
  std::vector<ExpectedComm> take_expected();

 private:
  void append(const CommRecord& record);
  void finish(int64_t seq, std::string_view event, std::string_view error);

  mutable std::mutex mutex_;
  std::filesystem::path path_;
  int fd_ = -1;
  int64_t next_seq_ = 0;
  std::vector<CommRecord> open_;
  std::vector<CommRecord> completed_;
  std::vector<ExpectedComm> expected_;
  std::vector<std::chrono::steady_clock::time_point> open_started_;
};

/// Reads a ledger file; a truncated last line (a rank killed mid-write) is skipped.
std::vector<CommRecord> read_ledger(const std::filesystem::path& path);

/// Describes the last thing a ledger shows: "in all_reduce on axis 'tp' (ranks [0, 1])
/// since 2.31 s, called from ...", "last completed broadcast on ...", or "no collective yet".
std::string describe_last_activity(const std::vector<CommRecord>& records, int64_t now_us);

/// Returns the wall clock in microseconds since the Unix epoch.
int64_t wall_clock_us();

}  // namespace mih
