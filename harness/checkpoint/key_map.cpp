// KeyMap (see key_map.h).
#include "harness/checkpoint/key_map.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"

namespace mih {

KeyMap::KeyMap(std::vector<KeyRule> rules) : rules_(std::move(rules)) {
  for (const KeyRule& r : rules_) {
    MIH_CHECK(!r.external.empty(), "key map rule '", r.internal, "': no external key template");
    try {
      compiled_.emplace_back(r.internal, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      MIH_THROW(Code::kInvalidSpec, "key map rule '", r.internal, "': not a valid regex (", e.what(), ")");
    }
  }
}

const KeyRule& KeyMap::match(const std::string& fqn, std::smatch* groups) const {
  for (size_t i = 0; i < rules_.size(); ++i) {
    if (std::regex_match(fqn, *groups, compiled_[i])) return rules_[i];
  }
  MIH_THROW(Code::kInvalidSpec, "key map: no rule maps the parameter '", fqn,
            "'; add a rule for it (or declare it training-only)");
}

std::vector<std::string> KeyMap::external_keys(const std::string& fqn) const {
  std::smatch groups;
  const KeyRule& rule = match(fqn, &groups);
  std::vector<std::string> out;
  for (const auto& t : rule.external) out.push_back(groups.format(t));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> KeyMap::to_external(const std::string& fqn, const at::Tensor& full) const {
  const std::vector<std::string> keys = external_keys(fqn);
  if (keys.size() == 1) return {{keys[0], full}};
  const auto parts = static_cast<int64_t>(keys.size());
  MIH_CHECK(full.dim() >= 1 && full.size(0) % parts == 0, "key map: '", fqn, "' of shape ", full.sizes(),
            " does not split into ", parts, " equal parts on dim 0 for ", keys.front(), " ...");
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto chunks = full.chunk(parts, 0);
  for (int64_t i = 0; i < parts; ++i) out.emplace_back(keys[i], chunks[i].contiguous());
  return out;
}

at::Tensor KeyMap::from_external(const std::string& fqn, const std::map<std::string, at::Tensor>& external) const {
  std::vector<at::Tensor> parts;
  for (const auto& key : external_keys(fqn)) {
    auto it = external.find(key);
    MIH_CHECK(it != external.end(), "key map: the external checkpoint has no '", key, "' (needed for '", fqn, "')");
    parts.push_back(it->second);
  }
  return parts.size() == 1 ? parts[0] : at::cat(parts, 0);
}

nlohmann::json KeyMap::to_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rules_) out.push_back({{"internal", r.internal}, {"external", r.external}});
  return out;
}

}  // namespace mih
