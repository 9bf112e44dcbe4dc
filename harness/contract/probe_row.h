// probes/rank0.jsonl read typed (schemas/evidence/v1/probes.rank.schema.json): one ProbeRow per
// step and stage, validated against the contract's schema once where the file is read, indexed
// by (step, stage) with the one refusal of two rows for one key (step_rows.h). The tensors'
// statistics records stay JSON, validated by the schema (sum, sum_sq, sketch, numel, nonfinite
// present and typed): tensor_error (harness/compare/compare.h) compares them with a golden's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/step_rows.h"

namespace mih::contract {

struct ProbeRow {
  int64_t step = 0;
  std::string stage;       ///< model_before, grad_before_clip, ..., forward_output, output_grad
  nlohmann::json tensors;  ///< tensor (parameter or module FQN) -> its statistics record
  /// Activation stages: the observed modules in forward order (the schema requires it there);
  /// empty for a parameter stage.
  std::vector<std::string> order;
  /// Activation stages: modules whose output the writer saw but could not place on the mesh
  /// (a plain tensor the ranks of a tp or cp group hold differently: a piece of unknown
  /// layout); they are in neither order nor tensors, and are not compared.
  std::vector<std::string> unplaced;
};

/// The lines of probes/rank0.jsonl (as an evidence store read them) by (step, stage). `file`
/// names the file in a refusal.
/// Throws: mih::Error{kFailedPrecondition} naming the file, the line and step and the field for
///   a line the schema refuses, and for two rows of one step and stage.
std::map<StepKey, ProbeRow> probe_rows(const std::vector<nlohmann::json>& lines, const std::string& file);

}  // namespace mih::contract
