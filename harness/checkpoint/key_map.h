// Internal FQN <-> external checkpoint key mapping (e.g. to Hugging Face names), with the one
// reversible transform ports need most: a fused projection split into equal parts along dim 0
// ([gate; up] -> gate_proj, up_proj). A CheckpointSpec's key map; `mih export` writes weights
// through it.
#pragma once

#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

namespace mih {

/// One rule: an ECMAScript regex matched against the whole internal FQN, and the external
/// key template(s) ($1, $2 ... are its groups). With k > 1 templates the internal tensor is
/// the concatenation along dim 0 of k equal parts, one per external key, in order.
struct KeyRule {
  std::string internal;
  std::vector<std::string> external;
};

class KeyMap {
 public:
  /// Throws: mih::Error{kInvalidSpec} naming the rule for a malformed regex or no template.
  explicit KeyMap(std::vector<KeyRule> rules);

  /// The external keys of `fqn`, from the first rule that matches.
  /// Throws: mih::Error{kInvalidSpec} if no rule matches `fqn`.
  std::vector<std::string> external_keys(const std::string& fqn) const;
  /// The external tensors of internal tensor `full` (the logical, gathered value).
  /// Throws: as external_keys; kInvalidSpec if a split's dim 0 does not divide into the parts.
  std::vector<std::pair<std::string, at::Tensor>> to_external(const std::string& fqn, const at::Tensor& full) const;
  /// The internal tensor of `fqn` rebuilt from external tensors (the inverse of to_external).
  /// Throws: as external_keys; kInvalidSpec naming a missing external key.
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
