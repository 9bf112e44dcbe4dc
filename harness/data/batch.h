// The unit of data every pipeline produces and the Trainer consumes: one global batch of a
// step, with named fields. Torch-light (tensors only), so pipelines do not depend on the
// parallel runtime.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>

namespace mih {

/// A batch of token sequences. `labels` are already shifted (labels[:, t] is the target of
/// input_ids[:, t]) and equal -100 where no loss is taken. `position_ids` are the rotary
/// positions (0..S-1 per row unless the pipeline packs documents); the Trainer fills them
/// when the source leaves them undefined. Under context parallelism the Trainer shards
/// input_ids, labels, position_ids and every field named in TrainerOptions::sequence_fields
/// on dim 1, and hands the fields named in cp_replicated_fields whole to every cp rank.
/// Shape: input_ids, labels, position_ids [B, S] int64 (a local batch: [b, S/CP]); every
///   other field [B, ...].
struct Batch {
  at::Tensor input_ids;
  at::Tensor labels;
  at::Tensor position_ids;
  std::map<std::string, at::Tensor> fields;
};

/// Returns the global batch of step `step` (0-based); the same whatever the parallel config.
using BatchSource = std::function<Batch(int64_t step)>;

}  // namespace mih
