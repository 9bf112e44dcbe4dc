// SharedState (see shared_state.h).
#include "harness/parallel/shared_state.h"

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/parallel/activation_checkpoint.h"

namespace mih {

void to_json(nlohmann::json& j, const SharedStateEvent& e) {
  j = {{"key", e.key},          {"action", e.action},   {"layer", e.layer},        {"source", e.source},
       {"state_id", e.state_id}, {"forward", e.forward}, {"recompute", !e.recompute_region.empty()}, {"recompute_region", e.recompute_region}};
}

void SharedState::begin_forward() {
  values_.clear();
  ++forward_;
}

void SharedState::publish(const std::string& key, const at::Tensor& value, const std::string& producer) {
  const int64_t id = next_id_++;
  if (recording_) events_.push_back({key, "publish", producer, producer, id, forward_, recompute_region()});
  values_[key] = Value{value, producer, id};
}

at::Tensor SharedState::consume(const std::string& key, const std::string& consumer) {
  auto it = values_.find(key);
  if (recording_) {
    const bool found = it != values_.end();
    events_.push_back({key, "consume", consumer, found ? it->second.producer : "", found ? it->second.id : -1, forward_,
                       recompute_region()});
  }
  MIH_CHECK(it != values_.end(), "shared state '", key, "' is consumed by '", consumer,
            "' before any layer published it in this forward; publish it first (or fix the key)");
  return it->second.tensor;
}

}  // namespace mih
