// Internal FQN <-> external checkpoint key mapping (e.g. to Hugging Face names), with the
// reversible layout transforms ports need: a fused projection split into parts along a dim
// ([gate; up] -> gate_proj, up_proj), Conv1D's transposed [in, out] layout, and fused heads
// interleaved per head ([heads, 3, head_dim] as GPT-NeoX's query_key_value) on either side.
// A CheckpointSpec's key map; `mih export` writes weights through it and `mih inspect`
// predicts an external checkpoint's keys, shapes and dtypes from it.
#pragma once

#include <cstdint>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

namespace mih {

/// Which side of a rule holds fused projections interleaved per head.
enum class Interleave {
  kNone,
  /// The internal tensor is laid out [heads, parts, head_dim] along `dim`, the external one(s)
  /// blocked [parts, heads, head_dim].
  kInternal,
  /// The external tensor (one template) is laid out [heads, parts, head_dim] along `dim`, the
  /// internal one blocked [parts, heads, head_dim].
  kExternal,
};

/// One rule: an ECMAScript regex matched against the whole internal FQN, the external key
/// template(s) ($1, $2 ... are its groups) and the layout transform between them.
///
/// Internal -> external, in this order (external -> internal undoes them in reverse):
///   1. interleave: with head_dim > 0, the fused projections along `dim` are reordered between
///      blocked [parts, heads, head_dim] and interleaved [heads, parts, head_dim] (`interleave`
///      says which side is interleaved; parts = the number of templates, or `parts` with one);
///   2. split: with k > 1 templates, the internal tensor is the concatenation along `dim` of k
///      equal parts, one per external key, in order;
///   3. transpose: each external tensor is its part transposed (2-D: Conv1D's [in, out] for a
///      Linear's [out, in]).
struct KeyRule {
  std::string internal;
  std::vector<std::string> external;
  /// The dim of the split and of the head interleave (of the internal tensor). Default 0.
  int64_t dim = 0;
  /// Each external tensor is the transpose of its (2-D) internal part.
  bool transpose = false;
  /// Fused heads: the size of one head along `dim`; 0: no head reordering.
  int64_t head_dim = 0;
  Interleave interleave = Interleave::kNone;
  /// With one template and interleave kExternal: how many projections are fused (3 for q, k,
  /// v). Ignored with more templates (their count is the parts).
  int64_t parts = 0;
};

class KeyMap {
 public:
  /// Throws: mih::Error{kInvalidSpec} naming the rule for a malformed regex, no template, a
  ///   negative dim, head_dim or parts, an interleave without head_dim (or the reverse),
  ///   kExternal with several templates or with fewer than 2 parts.
  explicit KeyMap(std::vector<KeyRule> rules);

  /// The external keys of `fqn`, from the first rule that matches.
  /// Throws: mih::Error{kInvalidSpec} if no rule matches `fqn`.
  std::vector<std::string> external_keys(const std::string& fqn) const;
  /// The rule that maps `fqn`. Throws: as external_keys.
  const KeyRule& rule(const std::string& fqn) const;
  /// The external tensors of internal tensor `full` (the logical, gathered value), contiguous.
  /// Throws: as external_keys; kInvalidSpec if `dim` is out of range, the split or the heads
  ///   do not divide its size, or a transposed part is not 2-D.
  std::vector<std::pair<std::string, at::Tensor>> to_external(const std::string& fqn, const at::Tensor& full) const;
  /// The shapes of the external tensors of an internal tensor of shape `internal` (what
  /// to_external would write). Throws: as to_external.
  std::vector<std::pair<std::string, std::vector<int64_t>>> external_shapes(const std::string& fqn,
                                                                             const std::vector<int64_t>& internal) const;
  /// The internal tensor of `fqn` rebuilt from external tensors (the inverse of to_external).
  /// Throws: as external_keys; kInvalidSpec naming a missing external key, or parts whose
  ///   shapes do not concatenate.
  at::Tensor from_external(const std::string& fqn, const std::map<std::string, at::Tensor>& external) const;

  const std::vector<KeyRule>& rules() const { return rules_; }
  /// The rules as JSON, for evidence and export metadata.
  nlohmann::json to_json() const;

 private:
  const KeyRule& match(const std::string& fqn, std::smatch* groups) const;
  std::vector<KeyRule> rules_;
  std::vector<std::regex> compiled_;
};

}  // namespace mih
