// KeyMap (see key_map.h).
#include "harness/checkpoint/key_map.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"

namespace mih {
namespace {

std::string interleave_name(Interleave i) {
  switch (i) {
    case Interleave::kNone: return "none";
    case Interleave::kInternal: return "internal";
    case Interleave::kExternal: return "external";
  }
  return "?";
}

// The number of fused projections a rule's head reordering acts on.
int64_t fused_parts(const KeyRule& r) {
  return r.external.size() > 1 ? static_cast<int64_t>(r.external.size()) : r.parts;
}

// Along `dim` of `t`: [from0, from1, head_dim] -> [from1, from0, head_dim] (a permutation of
// whole heads). blocked -> interleaved is (parts, heads) -> (heads, parts).
at::Tensor swap_head_blocks(const at::Tensor& t, int64_t dim, int64_t from0, int64_t head_dim) {
  std::vector<int64_t> shape = t.sizes().vec();
  const int64_t from1 = shape[dim] / (from0 * head_dim);
  std::vector<int64_t> split(shape.begin(), shape.begin() + dim);
  split.insert(split.end(), {from0, from1, head_dim});
  split.insert(split.end(), shape.begin() + dim + 1, shape.end());
  return t.reshape(split).transpose(dim, dim + 1).reshape(shape).contiguous();
}

}  // namespace

KeyMap::KeyMap(std::vector<KeyRule> rules) : rules_(std::move(rules)) {
  for (const KeyRule& r : rules_) {
    MIH_CHECK(!r.external.empty(), "key map rule '", r.internal, "': no external key template");
    MIH_CHECK(r.dim >= 0 && r.head_dim >= 0 && r.parts >= 0, "key map rule '", r.internal,
              "': dim, head_dim and parts must be >= 0, got ", r.dim, ", ", r.head_dim, ", ", r.parts);
    MIH_CHECK((r.head_dim > 0) == (r.interleave != Interleave::kNone), "key map rule '", r.internal,
              "': head_dim (", r.head_dim, ") and interleave (", interleave_name(r.interleave),
              ") go together: give both for fused heads, neither otherwise");
    if (r.interleave == Interleave::kExternal) {
      MIH_CHECK(r.external.size() == 1, "key map rule '", r.internal, "': interleave 'external' needs one external "
                "key (the fused tensor), got ", r.external.size(), "; with one key per projection use 'internal'");
      MIH_CHECK(r.parts >= 2, "key map rule '", r.internal, "': interleave 'external' needs parts >= 2 (how many "
                "projections are fused, e.g. 3 for q, k, v), got ", r.parts);
    }
    if (r.interleave == Interleave::kInternal) {
      MIH_CHECK(fused_parts(r) >= 2, "key map rule '", r.internal, "': interleave 'internal' needs >= 2 parts (one "
                "external key per projection, or parts with one key), got ", fused_parts(r));
    }
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

const KeyRule& KeyMap::rule(const std::string& fqn) const {
  std::smatch groups;
  return match(fqn, &groups);
}

std::vector<std::string> KeyMap::external_keys(const std::string& fqn) const {
  std::smatch groups;
  const KeyRule& rule = match(fqn, &groups);
  std::vector<std::string> out;
  for (const auto& t : rule.external) out.push_back(groups.format(t));
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> KeyMap::to_external(const std::string& fqn, const at::Tensor& full) const {
  const KeyRule& r = rule(fqn);
  const std::vector<std::string> keys = external_keys(fqn);
  const auto parts = static_cast<int64_t>(keys.size());
  const bool reshapes = parts > 1 || r.head_dim > 0;
  MIH_CHECK(!reshapes || r.dim < full.dim(), "key map: '", fqn, "' of shape ", full.sizes(), " has no dim ", r.dim,
            " to split or reorder for ", keys.front());
  at::Tensor t = full;
  if (r.head_dim > 0) {
    const int64_t p = fused_parts(r);
    MIH_CHECK(full.size(r.dim) % (p * r.head_dim) == 0, "key map: '", fqn, "' of shape ", full.sizes(), " does not hold ",
              p, " fused projections of whole heads of ", r.head_dim, " on dim ", r.dim, " for ", keys.front());
    const int64_t heads = full.size(r.dim) / (p * r.head_dim);
    // kInternal: [heads, parts, hd] -> blocked; kExternal: blocked [parts, heads, hd] -> interleaved.
    t = r.interleave == Interleave::kInternal ? swap_head_blocks(t, r.dim, heads, r.head_dim)
                                              : swap_head_blocks(t, r.dim, p, r.head_dim);
  }
  std::vector<at::Tensor> pieces;
  if (parts == 1) {
    pieces.push_back(t);
  } else {
    MIH_CHECK(t.size(r.dim) % parts == 0, "key map: '", fqn, "' of shape ", full.sizes(), " does not split into ", parts,
              " equal parts on dim ", r.dim, " for ", keys.front(), " ...");
    pieces = t.chunk(parts, r.dim);
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (int64_t i = 0; i < parts; ++i) {
    at::Tensor piece = pieces[i];
    if (r.transpose) {
      MIH_CHECK(piece.dim() == 2, "key map: '", fqn, "' maps to ", keys[i], " transposed, which needs a 2-D tensor; got ",
                piece.sizes());
      piece = piece.t();
    }
    out.emplace_back(keys[i], piece.contiguous());
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> KeyMap::external_shapes(
    const std::string& fqn, const std::vector<int64_t>& internal) const {
  // The head reordering keeps the shape and the split keeps every dim but `dim`: a stand-in
  // of one element per index along `dim` (and one along the others) checks what to_external
  // checks without allocating the tensor.
  const KeyRule& r = rule(fqn);
  std::vector<int64_t> small(internal.size(), 1);
  const auto d = static_cast<size_t>(r.dim);
  if (d < internal.size()) small[d] = internal[d];
  at::Tensor stand_in = at::zeros({}, at::kByte).expand(small);
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [key, t] : to_external(fqn, stand_in)) {
    std::vector<int64_t> shape = internal;
    if (d < shape.size()) shape[d] = r.transpose ? t.size(1 - static_cast<int64_t>(d)) : t.size(static_cast<int64_t>(d));
    if (r.transpose) std::swap(shape[0], shape[1]);
    out.emplace_back(key, shape);
  }
  return out;
}

at::Tensor KeyMap::from_external(const std::string& fqn, const std::map<std::string, at::Tensor>& external) const {
  const KeyRule& r = rule(fqn);
  std::vector<at::Tensor> parts;
  for (const auto& key : external_keys(fqn)) {
    auto it = external.find(key);
    MIH_CHECK(it != external.end(), "key map: the external checkpoint has no '", key, "' (needed for '", fqn, "')");
    at::Tensor piece = it->second;
    if (r.transpose) {
      MIH_CHECK(piece.dim() == 2, "key map: '", key, "' is read transposed into '", fqn, "', which needs a 2-D tensor; got ",
                piece.sizes());
      piece = piece.t();
    }
    parts.push_back(piece);
  }
  at::Tensor t;
  if (parts.size() == 1) {
    t = parts[0];
  } else {
    for (const auto& p : parts) {
      MIH_CHECK(p.dim() > r.dim && p.sizes() == parts[0].sizes(), "key map: the parts of '", fqn, "' (",
                external_keys(fqn).front(), " ...) must have one shape with a dim ", r.dim, "; got ", parts[0].sizes(),
                " and ", p.sizes());
    }
    t = at::cat(parts, r.dim);
  }
  if (r.head_dim > 0) {
    const int64_t p = fused_parts(r);
    MIH_CHECK(t.dim() > r.dim && t.size(r.dim) % (p * r.head_dim) == 0, "key map: '", fqn, "' rebuilt with shape ",
              t.sizes(), " does not hold ", p, " fused projections of whole heads of ", r.head_dim, " on dim ", r.dim);
    const int64_t heads = t.size(r.dim) / (p * r.head_dim);
    // The inverse permutations of to_external's.
    t = r.interleave == Interleave::kInternal ? swap_head_blocks(t, r.dim, p, r.head_dim)
                                              : swap_head_blocks(t, r.dim, heads, r.head_dim);
  }
  return t.contiguous();
}

nlohmann::json KeyMap::to_json() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rules_) {
    nlohmann::json j = {{"internal", r.internal}, {"external", r.external}};
    if (r.external.size() > 1 || r.head_dim > 0) j["dim"] = r.dim;
    if (r.transpose) j["transpose"] = true;
    if (r.head_dim > 0) {
      j["head_dim"] = r.head_dim;
      j["interleave"] = interleave_name(r.interleave);
      if (r.external.size() == 1) j["parts"] = r.parts;
    }
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace mih
