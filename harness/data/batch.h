// The unit of data every pipeline produces and the Trainer consumes: one global batch of a
// step, with named fields. Torch-light (tensors only), so pipelines do not depend on the
// parallel runtime.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace mih {

/// Tokens [offset, offset + length) of one document, the document counted as its tokens
/// BOS + bytes + EOS (offset 0 is its BOS).
struct DocumentSpan {
  int64_t document = 0;
  int64_t offset = 0;
  int64_t length = 0;
};

/// Where the rows of a batch came from, for a pipeline that cuts them out of documents
/// (TextPipeline): enough to recompute every field of the batch from the documents' raw bytes
/// without the pipeline's code (checks::check_batch_documents, the PipelineOutputs suite).
struct BatchProvenance {
  /// Packed rows (documents concatenated, rows cut from the stream) or padded rows (one
  /// document per row, truncated or right-padded with `pad`).
  bool packed = true;
  /// Per row, the spans of its window of S + 1 tokens (the S inputs and the last one's
  /// target), in order; a padded row's one span may be shorter (the rest is padding).
  std::vector<std::vector<DocumentSpan>> rows;
  /// The raw bytes of a document, as the corpus holds them (before tokenization).
  std::function<std::string(int64_t document)> document_bytes;
  /// Token ids: byte b is token b; these specials start, end and pad a document.
  int64_t bos = 256, eos = 257, pad = 258;
  /// A modality's placeholders written over the first `prefix_tokens` inputs of every row (a
  /// VLM's image patches, in order): input `prefix_token`, no loss on predicting them or from
  /// them, positions counting on through them, and field `prefix_index_field` (if not empty)
  /// the patch index there and -1 elsewhere. 0: none.
  int64_t prefix_tokens = 0;
  int64_t prefix_token = 0;
  std::string prefix_index_field;
  /// The field (if not empty) that numbers each input's document in its row: the index of the
  /// row's span that holds the input (TextPipelineOptions::document_ids).
  std::string document_field;
};

/// A sample a loader with epochs served (TextPipelineOptions::epoch_samples): sample `index`
/// of its dataset, drawn in epoch `epoch` (0-based). The sample-id ledger of a step is its
/// batch's rows' samples, in row order.
struct SampleId {
  int64_t epoch = 0;
  int64_t index = 0;
  friend bool operator==(const SampleId&, const SampleId&) = default;
};

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
  /// Set by a pipeline that cuts rows out of documents (global batches only); null otherwise.
  std::shared_ptr<const BatchProvenance> provenance;
  /// Per row, the sample it holds (a global batch of a loader with epochs); empty otherwise.
  std::vector<SampleId> samples;
};

/// Returns the global batch of step `step` (0-based); the same whatever the parallel config.
using BatchSource = std::function<Batch(int64_t step)>;

}  // namespace mih
