// Distributed checkpoints that reshard: each rank writes the pieces of parameters, persistent
// buffers and optimizer state it alone holds into one safetensors file, and rank 0 writes an
// index of every tensor's global shape, dtype and chunks (PyTorch Distributed Checkpoint's
// design: a chunk is a box of the logical tensor, see mih::Box). Loading under any other
// ParallelConfig reads, for each box a rank now holds, the parts of the saved chunks that
// overlap it. The files open with any safetensors reader.
//
// Layout of a checkpoint directory:
//   rank00000.safetensors ...  one per rank; tensors named "<key>@<offsets>", e.g.
//                              "model/layers.0.q.weight@8,0" (a chunk at global offset [8, 0])
//   index.json                 written last: its presence marks a complete checkpoint
// Keys: "model/<fqn>" (parameters), "buffer/<fqn>" (persistent buffers),
// "optim/<fqn>/<state>" (the optimizer's per-parameter state, laid out like the parameter:
// "exp_avg" and "exp_avg_sq" of AdamW and Adam, "momentum_buffer" of SGD; compat::state_names).
// Non-persistent buffers (rotary inv_freq) are not saved; a load rebuilds them.
#pragma once

#include <filesystem>
#include <string>

#include <c10/core/ScalarType.h>

#include <nlohmann/json.hpp>

namespace torch::optim {
class Optimizer;
}

namespace mih {

class ParallelContext;

/// The index file's format name and version.
inline constexpr const char* kCheckpointFormat = "mih.distributed_checkpoint";
inline constexpr int kCheckpointVersion = 1;

/// Saves the model of `ctx` (and the state of `optimizer`, if not null) to `dir`, with
/// `trainer_state` (step, config: any JSON) stored in the index. A collective: call it on every
/// rank of the mesh, with the same `dir` (a filesystem every rank sees). An existing
/// checkpoint in `dir` is replaced: its index is removed first, so a save that fails midway
/// never leaves a directory that looks complete.
/// Throws: mih::Error{kFailedPrecondition} on every rank naming the path and the OS error if a
///   rank cannot create the directory or write its file.
void save_checkpoint(const std::filesystem::path& dir, ParallelContext& ctx, torch::optim::Optimizer* optimizer,
                     const nlohmann::json& trainer_state);

/// Loads a checkpoint written by save_checkpoint under any parallel config into the current
/// layout of `ctx` (and `optimizer`'s state when not null), rebuilds the non-persistent
/// buffers, and returns the saved trainer_state. All or nothing: every rank first reads and
/// checks everything it needs into new tensors, the ranks agree that all succeeded, and only
/// then is anything copied into the model. A collective.
/// Throws (on every rank, nothing loaded): mih::Error{kFailedPrecondition} if `dir` has no
///   index.json (not a checkpoint, or an incomplete save) or a file cannot be read;
///   kInvalidSpec naming the file and tensor for a truncated or corrupt file, a file from
///   another checkpoint, a tensor whose shape or dtype differs from the model's, a parameter
///   or state the checkpoint lacks, a key the model does not have, or chunks that do not cover
///   a piece this rank needs.
nlohmann::json load_checkpoint(const std::filesystem::path& dir, ParallelContext& ctx,
                               torch::optim::Optimizer* optimizer);

/// The safetensors dtype name of a torch dtype ("F64", "F32", "BF16", "I64", ...).
/// Throws: mih::Error{kUnimplemented} for a dtype safetensors has no name for here.
std::string safetensors_dtype(c10::ScalarType dtype);

/// Reads and checks `dir`/index.json (format, version, fields).
/// Throws: as load_checkpoint for the index.
nlohmann::json read_checkpoint_index(const std::filesystem::path& dir);

}  // namespace mih
