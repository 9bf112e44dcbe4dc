// StepLoader and EpochLoader: the Trainer's data loaders with state.
#include "harness/data/data_loader.h"

#include <limits>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/base/json_fields.h"

namespace mih {

void to_json(nlohmann::json& j, const SampleId& id) { j = nlohmann::json::array({id.epoch, id.index}); }

}  // namespace mih

namespace mih::data {

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// The state's "kind", checked against the loader's own.
void check_kind(const nlohmann::json& state, const std::string& kind, const char* loader) {
  MIH_CHECK(state.is_object(), "data loader state: expected a JSON object, got ", json_summary(state));
  const std::string saved = json_string(state, "kind", "", "data loader state");
  MIH_CHECK(saved == kind, "data loader state of kind '", saved, "': this run's loader is ", loader, " (kind '", kind,
            "'), which cannot continue it; resume with the data the checkpoint was trained on");
}

}  // namespace

StepLoader::StepLoader(BatchSource source) : source_(std::move(source)) {
  MIH_CHECK(static_cast<bool>(source_), "StepLoader: the batch source is empty");
}

Batch StepLoader::next() { return source_(next_step_++); }

nlohmann::json StepLoader::state_dict() const { return {{"kind", "steps"}, {"next_step", next_step_}}; }

void StepLoader::load_state_dict(const nlohmann::json& state) {
  check_kind(state, "steps", "a step counter over a pure batch source");
  check_known_fields(state, "data loader state", {"kind", "next_step"});
  MIH_CHECK(state.contains("next_step"), "data loader state: 'next_step' is missing");
  next_step_ = json_int(state, "next_step", 0, "data loader state", 0, kMax - 1);
}

EpochLoader::EpochLoader(TextPipeline pipeline) : pipeline_(std::move(pipeline)) {
  MIH_CHECK(pipeline_.options().epoch_samples() > 0, "EpochLoader: the text pipeline has no epochs; set ",
            "TextPipelineOptions::epoch_samples, or draw its batches by step (StepLoader)");
}

Batch EpochLoader::next() {
  const int64_t n = pipeline_.options().epoch_samples();
  const int64_t b = pipeline_.options().global_batch();
  MIH_CHECK(epoch_ < kMax / n - 1, "EpochLoader: epoch ", epoch_, " overflows the sample position");
  Batch batch = pipeline_.samples_batch(epoch_ * n + position_);
  position_ += b;
  epoch_ += position_ / n;
  position_ %= n;
  return batch;
}

nlohmann::json EpochLoader::state_dict() const {
  const TextPipelineOptions& o = pipeline_.options();
  return {{"kind", "epochs"},
          {"epoch", epoch_},
          {"position", position_},
          {"seed", o.seed()},
          {"shuffle", o.shuffle()},
          {"epoch_samples", o.epoch_samples()},
          {"samples_served", epoch_ * o.epoch_samples() + position_}};
}

void EpochLoader::load_state_dict(const nlohmann::json& state) {
  check_kind(state, "epochs", "a loader of epochs (TextPipelineOptions::epoch_samples)");
  const char* where = "data loader state";
  check_known_fields(state, where, {"kind", "epoch", "position", "seed", "shuffle", "epoch_samples", "samples_served"});
  for (const char* field : {"epoch", "position", "seed", "shuffle", "epoch_samples"}) {
    MIH_CHECK(state.contains(field), where, ": '", field, "' is missing");
  }
  const TextPipelineOptions& o = pipeline_.options();
  const int64_t n = json_int(state, "epoch_samples", 0, where, 1);
  MIH_CHECK(n == o.epoch_samples(), where, ": the checkpoint's epochs have ", n, " samples, this run's ",
            o.epoch_samples(), ": its positions mean other samples; resume with epoch_samples ", n);
  const nlohmann::json& seed_field = state.at("seed");
  MIH_CHECK(seed_field.is_number_unsigned() || (seed_field.is_number_integer() && seed_field.get<int64_t>() >= 0), where,
            ": 'seed' must be an integer >= 0, got ", json_summary(seed_field));
  const auto seed = seed_field.get<uint64_t>();
  MIH_CHECK(seed == o.seed(), where, ": the checkpoint's epochs were shuffled with seed ", seed, ", this run's with ",
            o.seed(), ": the epoch would continue in another order, serving samples twice or never; resume with seed ",
            seed);
  const bool shuffle = json_bool(state, "shuffle", true, where);
  MIH_CHECK(shuffle == o.shuffle(), where, ": the checkpoint's epochs were ", shuffle ? "" : "not ",
            "shuffled and this run's are ", o.shuffle() ? "" : "not ", "shuffled; resume with shuffle ",
            shuffle ? "true" : "false");
  const int64_t epoch = json_int(state, "epoch", 0, where, 0, kMax / n - 2);
  const int64_t position = json_int(state, "position", 0, where, 0, n - 1);
  if (state.contains("samples_served")) {
    const int64_t served = json_int(state, "samples_served", 0, where, 0);
    MIH_CHECK(served == epoch * n + position, where, ": 'samples_served' ", served, " is not epoch ", epoch,
              " * epoch_samples ", n, " + position ", position, ": the state was edited or corrupted");
  }
  // F43 (docs/fault-catalog.md): the sampler's epoch not in what the checkpoint restores (a
  // resumed loader calls set_epoch(0)): the position is kept, in epoch 0's order.
  epoch_ = fault::active(fault::Fault::kF43) ? 0 : epoch;
  position_ = position;
}

}  // namespace mih::data
