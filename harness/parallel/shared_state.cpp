// SharedState (see shared_state.h).
#include "harness/parallel/shared_state.h"

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/parallel/activation_checkpoint.h"

namespace mih {

void to_json(nlohmann::json& j, const SharedStateEvent& e) {
  j = {{"key", e.key}, {"action", e.action}, {"layer", e.layer}, {"forward", e.forward}, {"recompute", e.recompute}};
}

void SharedState::begin_forward() {
  values_.clear();
  ++forward_;
}

void SharedState::publish(const std::string& key, const at::Tensor& value, const std::string& producer) {
  if (recording_) events_.push_back({key, "publish", producer, forward_, in_recompute()});
  values_[key] = value;
}

at::Tensor SharedState::consume(const std::string& key, const std::string& consumer) {
  if (recording_) events_.push_back({key, "consume", consumer, forward_, in_recompute()});
  auto it = values_.find(key);
  MIH_CHECK(it != values_.end(), "shared state '", key, "' is consumed by '", consumer,
            "' before any layer published it in this forward; publish it first (or fix the key)");
  return it->second;
}

}  // namespace mih
