// State one layer computes in forward and others read (a rotary cos/sin table, vision
// features, routing statistics), passed through one object so it can be traced: every publish
// and consume is an event (key, action, producer or consumer FQN, forward index, whether it
// happened in an activation-checkpoint recompute). A validation session turns recording on
// and checks the events against the spec's SharedStateSpec; off, it is a map lookup.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

namespace mih {

struct SharedStateEvent {
  std::string key;
  std::string action;  // "publish" or "consume"
  std::string layer;   // producer (publish) or consumer (consume) FQN
  /// consume: the producer of the value it received ("" if none was published).
  std::string source;
  /// Which publication: a counter over the run, the same for a publish and the consumes
  /// that read its value (-1: a consume that found nothing).
  int64_t state_id = -1;
  int64_t forward = 0;
  /// The activation-checkpoint region being recomputed when the event happened ("" outside a
  /// recompute; recompute_region()).
  std::string recompute_region;
};

void to_json(nlohmann::json& j, const SharedStateEvent& e);

class SharedState {
 public:
  /// Starts a forward (the Trainer calls it before each micro-batch): values of the previous
  /// forward are dropped, so a consume can only see this forward's publish.
  void begin_forward();
  /// How many forwards began (begin_forward calls) less one; -1 before the first.
  int64_t forward_index() const { return forward_; }
  /// Publishes `value` under `key` from layer `producer`.
  void publish(const std::string& key, const at::Tensor& value, const std::string& producer);
  /// The value published under `key` in this forward.
  /// Throws: mih::Error{kInvalidSpec} naming the key and the consumer if nothing was published
  ///   under it in this forward (a consume before its publish).
  at::Tensor consume(const std::string& key, const std::string& consumer);

  void set_recording(bool on) { recording_ = on; }
  const std::vector<SharedStateEvent>& events() const { return events_; }
  void clear_events() { events_.clear(); }

 private:
  struct Value {
    at::Tensor tensor;
    std::string producer;
    int64_t id = 0;
  };
  std::map<std::string, Value> values_;
  int64_t next_id_ = 0;
  std::vector<SharedStateEvent> events_;
  int64_t forward_ = -1;
  bool recording_ = false;
};

}  // namespace mih
