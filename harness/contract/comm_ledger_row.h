// One line of a rank's communication ledger, comm/ledger_rank<r>.jsonl of a launch's run
// directory (schemas/evidence/v1/run.comm.ledger_rank.schema.json), as a type and its JSON:
// what CommLedger appends and what the launcher's report reads back. A field the schema
// requires is required when read (a refusal naming it, never a default). Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih {

/// One ledger line. `event` is "begin" when a call starts, "end" when it returns, "error"
/// when it throws; begin/end pairs share `seq`.
struct CommRecord {
  int64_t seq = 0;
  std::string event;
  std::string axis;
  std::vector<int> ranks;  ///< global ranks of the group
  std::string op;
  std::string dtype;
  int64_t numel = 0;
  int64_t bytes = 0;  ///< payload of this rank: numel * element size of the input
  /// Wall clock at the start, microseconds since the Unix epoch (comparable across ranks).
  int64_t start_us = 0;
  /// end/error only: how long the call took, microseconds (absent from a begin line: 0).
  int64_t duration_us = 0;
  std::string site;
  std::string error;  ///< error only (absent from other lines: "")
};

void to_json(nlohmann::json& j, const CommRecord& r);
/// Every field to_json writes is required but duration_us and error, which only the lines
/// that have them hold (the schema's optional fields).
/// Throws: mih::Error{kFailedPrecondition} "ledger line (seq 3): 'dtype' must be a string, got
///   none: it is not a line of mih's comm ledger" for a missing or mistyped field.
void from_json(const nlohmann::json& j, CommRecord& r);

}  // namespace mih
