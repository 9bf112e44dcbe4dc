// Data loaders with state: what the Trainer draws each step's global batch from, saves in its
// checkpoint and restores at a load (as torchdata's StatefulDataLoader: state_dict and
// load_state_dict). StepLoader counts the steps of a pure BatchSource; EpochLoader serves a
// TextPipeline's epochs (TextPipelineOptions::epoch_samples) and keeps the sampler's epoch,
// its position in the epoch and the shuffle seed.
#pragma once

#include <cstdint>
#include <memory>

#include <nlohmann/json_fwd.hpp>

#include "harness/data/batch.h"
#include "harness/data/text_pipeline.h"

namespace mih {

/// [epoch, index].
void to_json(nlohmann::json& j, const SampleId& id);

}  // namespace mih

namespace mih::data {

/// A source of global batches that keeps its place. Every rank holds one and draws the same
/// global batch; the Trainer splits it over dp, micro-batches and cp.
class DataLoader {
 public:
  virtual ~DataLoader() = default;
  /// The next global batch.
  virtual Batch next() = 0;
  /// The state after the batches served so far: a JSON object whose "kind" names the loader.
  virtual nlohmann::json state_dict() const = 0;
  /// Continues after the batches a state_dict() had served (of a loader of the same data on any
  /// rank and parallel config).
  /// Throws: mih::Error{kInvalidSpec} naming the field and the fix for a state of another kind
  ///   of loader or other data, or a malformed one; the loader is unchanged then.
  virtual void load_state_dict(const nlohmann::json& state) = 0;
};

/// Serves source(0), source(1), ...: state {"kind": "steps", "next_step": k}.
class StepLoader final : public DataLoader {
 public:
  /// Throws: mih::Error{kInvalidSpec} for an empty source.
  explicit StepLoader(BatchSource source);
  Batch next() override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 private:
  BatchSource source_;
  int64_t next_step_ = 0;
};

/// Serves a TextPipeline with epoch_samples N: the samples at positions p, p + 1, ... of its
/// sequence of epochs, B (global_batch) per batch (TextPipeline::samples_batch), Batch::samples
/// the ledger. State: {"kind": "epochs", "epoch", "position" (samples of the epoch served,
/// < N), "seed", "shuffle", "epoch_samples", "samples_served"}.
///
/// A resume under another data-parallel degree, or any other parallel config, is honoured
/// exactly: the state counts global samples and every dp rank takes its rows of the same
/// global batch. So is one with another global batch: the next batch starts at the first
/// sample not served. Refused, naming both values: another seed, shuffle or epoch_samples
/// (the epoch's order would not continue: samples would be served twice or never).
class EpochLoader final : public DataLoader {
 public:
  /// Throws: mih::Error{kInvalidSpec} when the pipeline has no epoch_samples.
  explicit EpochLoader(TextPipeline pipeline);
  Batch next() override;
  nlohmann::json state_dict() const override;
  void load_state_dict(const nlohmann::json& state) override;

 private:
  TextPipeline pipeline_;
  int64_t epoch_ = 0;
  int64_t position_ = 0;
};

}  // namespace mih::data
