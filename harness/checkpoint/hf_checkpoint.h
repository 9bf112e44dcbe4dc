// A Hugging Face checkpoint directory, torch-free: config.json, model.safetensors or shards
// named by model.safetensors.index.json. Read as an inventory (every tensor's key, dtype and
// shape from the safetensors headers, the files' SHA-256) for `mih inspect`; written by `mih
// export` (one file, or shards with the index above a size). Never downloads anything.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/checkpoint/safetensors.h"

namespace mih::hf {

/// One tensor of the directory, from its shard's header.
struct TensorEntry {
  std::string key;
  /// safetensors dtype name: "F32", "BF16", ...
  std::string dtype;
  std::vector<int64_t> shape;
  /// The shard holding it, relative to the directory.
  std::string file;
};

/// One file the inventory read, with its fingerprint.
struct AssetFile {
  /// Relative to the directory.
  std::string path;
  uint64_t bytes = 0;
  /// SHA-256, 64 lower-case hex digits.
  std::string sha256;
  /// The file read_checkpoint read: every symlink resolved, inside the directory. Readers of
  /// the tensors open this path, never `path` again (a symlink swapped since is not followed).
  std::filesystem::path resolved;
};

struct Checkpoint {
  std::filesystem::path dir;
  /// config.json as read.
  nlohmann::json config;
  /// Every tensor, sorted by key.
  std::vector<TensorEntry> tensors;
  /// config.json, the index when present, every shard; sorted by path.
  std::vector<AssetFile> files;
  /// True when the weights are sharded (model.safetensors.index.json).
  bool sharded = false;

  const TensorEntry* find(const std::string& key) const;
  nlohmann::json to_json() const;
};

/// Reads the inventory of checkpoint directory `dir`: config.json, then the index's shards
/// (every file it names) or, without an index, model.safetensors (as Hugging Face's loaders:
/// other safetensors files there are not weights). Every file is resolved (symlinks followed)
/// before a byte of it is read and must be a regular file inside the directory's real path;
/// the one exception is a snapshot of the Hugging Face cache (`.../snapshots/<revision>`),
/// whose files may resolve into its repository's `blobs` directory.
/// Throws: mih::Error{kInvalidSpec} when `dir` is a URL (http://, https://, hf://: nothing is
///   downloaded; fetch it and give the local directory), config.json is missing, not a JSON
///   object or nested deeper than kMaxJsonDepth, a file it reads resolves outside the
///   directory (naming where) or is not a regular file (a FIFO, a device, a directory), a
///   shard is a Git LFS pointer (naming the file: run `git lfs pull`), a shard the index
///   names is missing (naming it and a key it should hold), the index and a shard disagree on
///   a key, a weights file (model.safetensors, model-*.safetensors) the index does not name is
///   there, two files hold one key, the path is not valid UTF-8, or a safetensors header is
///   malformed (as safetensors::Reader); kFailedPrecondition when `dir` is not a directory or
///   has neither model.safetensors nor the index (naming the .bin and other .safetensors
///   files there).
Checkpoint read_checkpoint(const std::filesystem::path& dir);

/// Hugging Face's default shard size for save_pretrained (5 GB).
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;

/// Writes `tensors` into `dir` as model.safetensors when their bytes fit in `max_shard_bytes`,
/// else as model-0000i-of-0000n.safetensors (tensors in the given order, a new shard when the
/// next one would overflow) plus model.safetensors.index.json ({"metadata": {"total_size"},
/// "weight_map": {key: shard}}), after removing the weights files of an earlier write
/// (model.safetensors, model-*.safetensors, the index). Returns the files written, relative
/// to `dir`.
/// Throws: as safetensors::write_file; kInvalidSpec if max_shard_bytes is 0.
std::vector<std::string> write_weights(const std::filesystem::path& dir,
                                       const std::vector<safetensors::TensorView>& tensors,
                                       uint64_t max_shard_bytes = kDefaultMaxShardBytes);

/// SHA-256 of a file's bytes, streamed. Throws: mih::Error{kFailedPrecondition} naming the
/// file when it cannot be read or is not a regular file (a FIFO is refused, never waited on).
std::string file_sha256(const std::filesystem::path& file);

}  // namespace mih::hf
