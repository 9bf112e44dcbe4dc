// A registered spec against Hugging Face checkpoints: `mih export` writes the port's initial
// weights as a Hugging Face checkpoint directory (through the spec's key map, with the
// architecture's config.json), `mih inspect` compares a checkpoint directory with what the
// port would load (keys, shapes, dtypes, config fields) and leaves the inventory as evidence.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/cases/registrations.h"
#include "harness/checkpoint/hf_checkpoint.h"
#include "harness/spec/model_spec.h"

namespace mih::cases {

struct HfExportOptions {
  std::filesystem::path out;
  /// A Hugging Face checkpoint directory to take the weights from (load_hf_weights) instead of
  /// the seed's initialization: the export then reproduces that checkpoint's numbers.
  std::filesystem::path init_from;
  /// float32, float64 or bfloat16: the parameters' dtype, so the file's.
  std::string dtype = "float32";
  uint64_t seed = 0;
  /// Above this many bytes of weights: model-0000i-of-0000n.safetensors with the index.
  uint64_t max_shard_bytes = hf::kDefaultMaxShardBytes;
};

/// What export_hf wrote.
struct HfExportResult {
  std::vector<std::string> weight_files;
  size_t tensors = 0;
  /// Mean cross entropy of the spec's first global batch over labels != -100.
  double loss = 0;
  bool logits = false;
  /// The declared ties written once: {FQN written, its alias (no key of its own)}.
  std::vector<std::pair<std::string, std::string>> aliases;
};

/// Builds `spec`'s model at world size 1 with its initial weights (seed, dtype; or the weights
/// of options.init_from) and writes to options.out:
///   config.json            the spec's HfConfig: model_type, architectures, its fields and
///                          torch_dtype (what a Hugging Face loader reads)
///   model.safetensors      every parameter but the training-only ones, under its external
///                          key(s) through the key map (sharded with the index above
///                          max_shard_bytes)
///   batch.safetensors      the spec's first global batch: input_ids, labels, position_ids
///                          (when the pipeline makes them), its fields
///   reference.safetensors  logits [B, S, V] when the model exposes them, token_losses [B, S]
///                          and loss (the mean over labels != -100)
///   mih_export.json        mih's own description: spec, dtype, seed, data pipeline, key map,
///                          the external tensors with the FQN each came from, the loss,
///                          "aliases": each declared tie written once ({fqn: the alias, of:
///                          the FQN written, keys: the alias's own keys by the key map, or
///                          none, written_as: the keys written}), and "files": the SHA-256 of
///                          every other file it wrote
/// Everything is written into a staging directory beside `out` that replaces `out` only when
/// complete, so a failed export leaves an earlier one whole and no file of an earlier export
/// survives a new one; `out` must therefore hold only what an earlier export wrote, unedited
/// (check_owned in harness/base/owned_files.h).
/// Throws: mih::Error{kInvalidSpec} when the spec declares no HfConfig (naming the spec and
///   the fix), for a dtype other than float32, float64, bfloat16;
///   kFailedPrecondition, with nothing written or removed, when `out` is a file, or a
///   non-empty directory that is not an earlier mih export (no mih_export.json listing its
///   files), or holds a file that export's mih_export.json does not list (a tokenizer.json put
///   beside it) or one edited since (naming the file); a parameter has no key-map rule and is
///   not training-only, or two parameters map to one key; a parameter registered under two
///   names the spec does not declare tied (checkpoint.tied; naming both names and the fix); as
///   the key map, the Trainer and the writers otherwise.
HfExportResult export_hf(const spec::ModelSpec& spec, const HfExportOptions& options);

/// Sets every parameter of `ctx` (the model of `spec`, built under any parallel config:
/// tp, FSDP, ep pieces alike) from checkpoint directory `dir` through the spec's key map:
/// each rank reads the external tensors of every parameter but the training-only ones,
/// rebuilds each full internal tensor (KeyMap::from_external), checks its shape against the
/// parameter's, converts it to the parameter's dtype, and only when every parameter passed
/// copies its boxes (ParallelContext::local_boxes) into this rank's piece. Not a collective;
/// every rank reads the same files. Returns the number of parameters set.
/// `expected_sha256`, when not empty, is the digest the run checked before any rank started
/// (InitSource::sha256): files that differ now are refused, so a case's fingerprint always
/// names the weights it trained from.
/// Throws (nothing set on this rank): mih::Error as hf::read_checkpoint; kFailedPrecondition
///   when the files' digest is not `expected_sha256`; kInvalidSpec naming the key and the
///   parameter for a key the checkpoint lacks, a dtype it cannot read, or a rebuilt shape that
///   differs (with "likely transposed" when it is the reverse).
size_t load_hf_weights(const spec::ModelSpec& spec, const std::filesystem::path& dir, ParallelContext& ctx,
                       const std::string& expected_sha256 = "");

/// SHA-256 (64 hex digits) over a checkpoint's files: each file's SHA-256 and its path
/// relative to the directory, in path order (so one changed byte of any weight, the config or
/// the index changes it, and a copy of the directory elsewhere keeps it).
std::string checkpoint_digest(const hf::Checkpoint& checkpoint);

/// Checks checkpoint directory `dir` against `spec`'s port before any rank starts, from the
/// safetensors headers (no tensor is read): every key the port loads through the key map is
/// there with the shape the port's parameter needs and a dtype a parameter loads from (F64,
/// F32, F16, BF16). The port's shapes come from its model built at world size 1. Keys the
/// port does not load are left to the SourceCheckpoint suite (check_checkpoint_coverage).
/// Returns the absolute directory and its checkpoint_digest.
/// Throws: mih::Error as hf::read_checkpoint (a URL, a Git LFS pointer, a missing shard...:
///   kInvalidSpec; a missing directory: kFailedPrecondition); kInvalidSpec listing every
///   missing key, shape mismatch (with "likely transposed") and unreadable dtype, each with
///   the parameter it is for, and naming `mih inspect` for the full diff.
InitSource check_init_from(const spec::ModelSpec& spec, const std::filesystem::path& dir);

struct HfInspectOptions {
  /// The checkpoint directory (local; URLs are refused).
  std::filesystem::path checkpoint;
  /// The evidence directory: inventory/candidate.json, inventory/reference.json,
  /// inventory/structure_diff.json, inventory/fingerprints.sha256 (sha256sum -c format),
  /// integration_state.json.
  std::filesystem::path out;
  /// The dtype the port loads the weights in (a checkpoint tensor of another dtype differs).
  std::string dtype = "float32";
};

/// The outcome of inspect_hf: the structure diff and how many things differ.
struct HfInspectResult {
  nlohmann::json diff;
  size_t differences = 0;
  size_t matched = 0;
};

/// Compares checkpoint directory options.checkpoint with what `spec` loads: the port's
/// parameters mapped through the key map give the expected external keys, shapes and dtypes;
/// the directory's safetensors headers and config.json what is there. Reports, each naming
/// the key (and the FQN it maps from): missing keys, unexpected keys (neither expected nor
/// inference-only), shape mismatches (with "likely transposed" when the shape is the reverse),
/// dtype differences, and config fields the spec declares that the directory's config.json
/// lacks or gives another value (nested, by dotted path; HfConfig::ignored skipped; integers
/// exactly, floats to 1e-6 relative), and warns (config_warnings, not differences) for each
/// field the architecture's forward reads that the spec's config leaves out (rope_theta,
/// rms_norm_eps, hidden_act, norm_topk_prob, output_router_logits, activation_function, ...
/// per model_type), so an undeclared option cannot silently default on the original's side.
/// Removes an earlier inspect's inventory and state from
/// options.out, writes the inventory and, when nothing differs, moves the integration state to
/// DISCOVERED (with differences the directory has no state: each inspect's verdict stands
/// alone, so a fixed port is inspected again into the same directory).
/// Throws: mih::Error as hf::read_checkpoint, the Trainer and the evidence store.
HfInspectResult inspect_hf(const spec::ModelSpec& spec, const HfInspectOptions& options);

}  // namespace mih::cases
