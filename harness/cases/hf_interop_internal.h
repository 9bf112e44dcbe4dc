// What export_hf (hf_export.cpp) shares with inspect_hf and the init_from checks
// (hf_interop.cpp): the port built at world size 1 and the external keys it writes. Not
// installed.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/checkpoint/key_map.h"
#include "harness/spec/model_spec.h"

namespace mih {
class ParallelContext;
class Trainer;
}  // namespace mih

namespace mih::cases {

/// Whether `name` matches one of the fnmatch `globs`.
bool matches_any(const std::vector<std::string>& globs, const std::string& name);

/// Runs `body` on `spec`'s model built at world size 1 (its initial weights, eval mode).
void with_one_rank(const spec::ModelSpec& spec, const std::string& dtype, uint64_t seed,
                   const std::function<void(Trainer&)>& body);

/// An external (Hugging Face) tensor: the parameter it comes from and its shape.
struct ExternalTensor {
  std::string fqn;
  std::vector<int64_t> shape;
};

/// The external keys the port writes and loads: key -> (FQN, shape), training-only parameters
/// left out. Throws: as the key map; kInvalidSpec for two parameters on one key.
std::map<std::string, ExternalTensor> expected_external(const spec::ModelSpec& spec, const KeyMap& map,
                                                        ParallelContext& context);

/// The spec's config.json: its fields with model_type and architectures.
nlohmann::json hf_config_json(const spec::HfConfig& hf);

}  // namespace mih::cases
