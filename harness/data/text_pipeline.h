// The text data pipeline: a byte-level tokenizer and a corpus of text files turned into the
// global batch of each step, packed (documents concatenated) or padded (one per row). A batch
// is a pure function of (options, step), so every rank and every parallel config sees the
// same global batch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>
#include <torch/arg.h>

#include "harness/data/batch.h"

namespace mih::data {

/// The label of a position that takes no loss (torch.nn.CrossEntropyLoss's ignore_index).
inline constexpr int64_t kIgnoreIndex = -100;

/// The field TextPipelineOptions::document_ids adds: which document of its row each input is.
inline constexpr const char* kDocumentIdsField = "document_ids";

/// Bytes as tokens: byte b is token b (0..255), plus three specials. No merges, no unknowns:
/// every string encodes, and decode(encode(s)) == s.
class ByteTokenizer {
 public:
  /// Starts every document.
  static constexpr int64_t kBos = 256;
  /// Ends every document.
  static constexpr int64_t kEos = 257;
  /// Fills the tail of a padded row.
  static constexpr int64_t kPad = 258;
  /// Tokens in the vocabulary: 256 bytes + BOS, EOS, PAD.
  static constexpr int64_t kVocab = 259;

  /// The bytes of `text` as tokens 0..255, without specials.
  static std::vector<int64_t> encode(std::string_view text);
  /// The bytes of `tokens`, skipping BOS, EOS and PAD.
  /// Throws: mih::Error{kInvalidSpec} for a token outside [0, kVocab).
  static std::string decode(std::span<const int64_t> tokens);
};

/// Options of a TextPipeline.
struct TextPipelineOptions {
  TextPipelineOptions() = default;
  explicit TextPipelineOptions(std::filesystem::path corpus) : corpus_(std::move(corpus)) {}

  /// Directory of text files, read recursively (symlinks followed). Default: the license
  /// texts every Debian system ships.
  TORCH_ARG(std::filesystem::path, corpus) = "/usr/share/common-licenses";
  /// S: tokens per row. Default 128.
  TORCH_ARG(int64_t, seq_len) = 128;
  /// B: rows per step (the global batch, before any data-parallel split). Default 8.
  TORCH_ARG(int64_t, global_batch) = 8;
  /// true: documents concatenated into one stream cut into rows; false: one document per
  /// row, truncated or right-padded with PAD. Default true.
  TORCH_ARG(bool, packing) = true;
  /// Shuffle the document order once per pass over the corpus (seeded by `seed` and the
  /// pass); false keeps the file order. Default true.
  TORCH_ARG(bool, shuffle) = true;
  /// Seed of the per-pass document order. Default 0.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Documents shorter than this many bytes are dropped (>= 1). Default 1: only empty ones.
  TORCH_ARG(int64_t, min_document_bytes) = 1;
  /// Add fields["document_ids"] (kDocumentIdsField) [B, S] int64: which document of its row
  /// each input belongs to, 0 for the row's first (possibly partial) document and one more at
  /// every document start after it; a port masks attention by it (block-causal: a key only in
  /// the query's own document). Needs packing. Default false.
  TORCH_ARG(bool, document_ids) = false;
  /// A document longer than this many bytes is cut into documents of this many bytes each (the
  /// last one the rest), in order: short documents, several to a row (documents of every
  /// length, starting anywhere in a row). 0 (default): documents as the files hold them.
  TORCH_ARG(int64_t, max_document_bytes) = 0;
  /// N > 0: a map-style dataset of N samples served in epochs, as a sampler with set_epoch
  /// (torch.utils.data.DistributedSampler, torchdata's StatefulDataLoader): sample i is the
  /// packed window of S + 1 tokens at token i * S of the first pass; epoch e serves all N, in
  /// the order of a Fisher-Yates shuffle seeded from (seed, e) (sample order without shuffle);
  /// the epochs follow each other, and step k's rows are positions k * B .. k * B + B - 1 of
  /// that sequence, so a step may straddle two epochs. Batch::samples names each row's
  /// (epoch, index); data::EpochLoader serves the same sequence with a state a checkpoint
  /// saves. Needs packing; at most num_windows(). 0 (default): the endless stream, no epochs.
  TORCH_ARG(int64_t, epoch_samples) = 0;
};

void to_json(nlohmann::json& j, const TextPipelineOptions& o);
/// Throws: mih::Error{kInvalidSpec} for a field that is not one of the options.
void from_json(const nlohmann::json& j, TextPipelineOptions& o);
/// gtest printer: the options as JSON.
void PrintTo(const TextPipelineOptions& o, std::ostream* os);

namespace internal {
struct TextCorpus;
}

/// A text corpus loaded once and cut into global batches on demand.
///
/// The corpus: every regular file under `corpus` (recursively, symlinks followed, each
/// directory visited once), in path order. A file splits into documents at blank lines (lines
/// empty or only whitespace); a document is its lines joined by "\n", tokenized as
/// BOS + bytes + EOS. Documents shorter than min_document_bytes are dropped; with
/// max_document_bytes, the others are cut into documents of at most that many bytes.
///
/// The document order of pass p over the corpus (p = 0, 1, ...) is a Fisher-Yates shuffle
/// driven by splitmix64 seeded from (seed, p) (identity when shuffle is false): it is the
/// same on every platform and standard library.
///
/// batch(step) with packing = true: the passes are concatenated into one endless token
/// stream; row r of step k is the window of S + 1 tokens starting at (k * B + r) * S, so rows
/// and steps take consecutive windows (each window's last token is the next one's first) and
/// every stream token is an input exactly once and a label exactly once.
///   input_ids = window[0:S], labels = window[1:S+1] (shifted here, once);
///   labels = -100 where the label is BOS (no loss on guessing the next document's start);
///   position_ids count from 0 at the row's first token and restart at 0 at every BOS input,
///     so they stay in [0, S) (document-relative except for a row's leading fragment);
///   attention_mask all 1; loss_mask = (labels != -100);
///   with document_ids: fields["document_ids"] counts from 0 at the row's first token and
///     adds 1 at every BOS input after it (the span index of each input in the provenance).
/// batch(step) with packing = false: row r of step k is document k * B + r of the cycled
/// passes: BOS + bytes + EOS truncated to S + 1 tokens and right-padded with PAD.
///   input_ids = tokens[0:S], labels = tokens[1:S+1] with -100 where the label is PAD;
///   position_ids 0..S-1; attention_mask = (input_ids != PAD); loss_mask = (labels != -100).
///
/// Shapes: input_ids, labels, position_ids, fields["loss_mask"], fields["attention_mask"]
///   [B, S] int64 on the CPU.
///
/// Every batch carries its provenance (Batch::provenance): per row the (document, offset,
/// length) spans its window was cut from, and each document's raw bytes, so the data contract
/// recomputes every field above from the documents with code of its own
/// (checks::check_batch_documents). Without document_ids packed rows attend across the
/// documents they hold (attention_mask is the padding mask); position_ids restart at every
/// document start either way, so a port may also derive the boundaries from them (Hugging
/// Face's packing with position_ids and flash-attention varlen).
///
/// Copies share the loaded corpus (immutable), so copies and source() are cheap and
/// thread-safe.
class TextPipeline {
 public:
  /// Loads the corpus.
  /// Throws: mih::Error{kInvalidSpec} for seq_len, global_batch or min_document_bytes < 1,
  ///   max_document_bytes < 0, or document_ids without packing;
  ///   mih::Error{kFailedPrecondition} naming the path when the corpus is missing, is not a
  ///   directory, has an unreadable file or directory, or holds no document.
  explicit TextPipeline(TextPipelineOptions options = {});

  /// The global batch of step `step` (0-based): a pure function of (options, step).
  /// Throws: mih::Error{kInvalidSpec} for step < 0.
  Batch batch(int64_t step) const;

  /// batch() as a BatchSource; the functor holds a copy of this pipeline (sharing the corpus).
  BatchSource source() const;

  /// With epoch_samples: the sample at position `position` (0-based) of the sequence of
  /// epochs: {position / N, the epoch's order[position % N]}.
  /// Throws: mih::Error{kInvalidSpec} without epoch_samples or for a negative position.
  SampleId sample_at(int64_t position) const;
  /// With epoch_samples: the global batch of the samples at positions first .. first + B - 1
  /// (batch(k) is samples_batch(k * B)), Batch::samples naming them.
  /// Throws: as sample_at.
  Batch samples_batch(int64_t first_position) const;
  /// Windows of S + 1 tokens that start in one pass, (num_tokens() - 1) / S: the most
  /// epoch_samples can be.
  int64_t num_windows() const;

  const TextPipelineOptions& options() const { return options_; }
  /// Documents kept after splitting and filtering.
  int64_t num_documents() const;
  /// Tokens of one pass over the corpus: sum over documents of (bytes + 2).
  int64_t num_tokens() const;
  /// Evidence: {"corpus", "files": [{"path", "bytes", "documents"}], "documents", "tokens",
  /// "vocab", "options"}.
  nlohmann::json describe() const;

 private:
  /// The batch of one row per start: a token offset in the endless stream (packed) or a
  /// document index in the cycled passes (padded).
  Batch rows(const std::vector<int64_t>& starts) const;

  TextPipelineOptions options_;
  std::shared_ptr<const internal::TextCorpus> corpus_;
};

}  // namespace mih::data
