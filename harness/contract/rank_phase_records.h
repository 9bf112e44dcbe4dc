// What each rank of a case's launch writes into its phase's run directory (run/<phase>/, the case
// task of harness/cases/case_rank.cpp) for the parent (harness/cases/case_runner.cpp), read typed:
// timing_rank<r>.json (where the rank's time went), fault_rank<r>.json (whether it ran its fault's
// code) and init_from_failed_rank<r>.json (why it could not load the case's checkpoint). One
// validation where the file is read; a missing or mistyped field is a refusal naming the file and
// the field, never a default. Torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace mih::contract {

/// timing_rank<r>.json: seconds from the rank's start, by part of its phase.
struct RankTiming {
  double process_start_s = 0;  ///< exec or fork to main()
  double rendezvous_s = 0;     ///< the store and the process groups
  double build_s = 0;          ///< the model built, with the attach checks
  double steps_s = 0;          ///< the steps (and a save's checkpoint)
  double end_s = 0;            ///< the end: checkpoint hashes, parity cases, findings
  double session_s = 0;        ///< the session's checks and probes inside build and steps
  std::optional<double> init_from_s;                ///< loading the case's checkpoint, when it has one
  std::optional<int64_t> init_from_parameters;      ///< the parameters it loaded
};

/// fault_rank<r>.json: the fault the rank injected and whether its code ran.
struct RankFaultReach {
  std::string fault;
  bool reached = false;
};

/// init_from_failed_rank<r>.json: the checkpoint the rank could not load, the error's code name
/// ("INVALID_SPEC", ...) and its message.
struct RankInitFromFailure {
  std::string checkpoint;
  std::string code;
  std::string error;
};

/// Each reads its file.
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field ("run/train/
///   timing_rank0.json: 'steps_s' is missing ...") for a file that cannot be read, is not a JSON
///   object, lacks a field, has one of another type or one mih does not write: "not what a rank of
///   mih wrote (edited or damaged); rerun the case".
RankTiming read_rank_timing(const std::filesystem::path& file);
RankFaultReach read_rank_fault_reach(const std::filesystem::path& file);
RankInitFromFailure read_rank_init_from_failure(const std::filesystem::path& file);

}  // namespace mih::contract
