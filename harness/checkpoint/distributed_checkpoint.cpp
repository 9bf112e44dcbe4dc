// save_checkpoint / load_checkpoint (see distributed_checkpoint.h).
#include "harness/checkpoint/distributed_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <random>
#include <set>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/optimizer.h>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/compat/optim.h"
#include "harness/parallel/parallel_context.h"
#include "harness/base/strings.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kIndexFile = layout::kDistributedCheckpointIndex;
// The optimizer's per-parameter state saved with the parameter: every state the optimizer
// keeps (compat::state_names), but under F41.
std::vector<std::string> saved_states(torch::optim::Optimizer& optimizer) {
  // F41 (docs/fault-catalog.md): a checkpoint writer that knows the Adam moments only, so
  // another optimizer's state (SGD's momentum buffer) is neither saved nor restored.
  std::vector<std::string> names = compat::state_names(optimizer);
  if (fault::active(fault::Fault::kF41)) {
    std::erase_if(names, [](const std::string& n) { return n != "exp_avg" && n != "exp_avg_sq"; });
  }
  return names;
}

std::string rank_file(int rank) { return layout::checkpoint_rank_file(rank); }

}  // namespace

std::string safetensors_dtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "F64";
    case at::kFloat: return "F32";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: MIH_THROW(Code::kUnimplemented, "checkpoint: no safetensors dtype for ", t);
  }
}

namespace {

at::ScalarType torch_dtype(const std::string& st) {
  static const std::map<std::string, at::ScalarType> kMap = {
      {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
      {"I32", at::kInt},    {"I16", at::kShort}, {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool}};
  auto it = kMap.find(st);
  MIH_CHECK(it != kMap.end(), "checkpoint: unsupported dtype '", st, "'");
  return it->second;
}

// "[37, 16]".
std::string shape_str(const std::vector<int64_t>& v) {
  return "[" + mih::join(v, ", ") + "]";
}

// Every rank runs `fn`; then all agree, over `device` (the group's: CUDA for NCCL, which
// moves no CPU tensor). If any rank failed, every rank throws: the failing ones their own
// error, the others one naming the failed ranks.
template <class Fn>
void on_every_rank(Communicator& world, c10::Device device, const std::string& what, Fn&& fn) {
  std::exception_ptr error;
  try {
    fn();
  } catch (...) {
    error = std::current_exception();
  }
  at::Tensor flags = at::zeros({world.size()}, at::kInt);
  if (error) flags[world.rank()] = 1;
  at::Tensor on_device = flags.to(device);
  world.all_reduce(on_device, ReduceOp::kSum, "checkpoint.agree");
  if (error) std::rethrow_exception(error);
  const at::Tensor failed = on_device.cpu();
  if (failed.sum().item<int>() == 0) return;
  std::string ranks;
  for (int r = 0; r < world.size(); ++r) {
    if (failed[r].item<int>()) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  MIH_THROW(Code::kFailedPrecondition, what, " failed on rank(s) ", ranks, "; see their error. Nothing was changed here");
}

// A tensor this rank contributes to the checkpoint: its key, global shape, and boxes.
struct Piece {
  std::string key;
  at::Tensor local;
  std::vector<int64_t> global_shape;
  std::vector<Box> boxes;
};

std::vector<Piece> pieces_to_save(ParallelContext& ctx, torch::optim::Optimizer* optimizer, json* steps) {
  std::vector<Piece> out;
  for (const auto& p : ctx.parameters()) {
    if (optimizer && compat::has_state(*optimizer, p->local)) (*steps)[p->fqn] = compat::optimizer_step(*optimizer, p->local);
    if (!ctx.writes_piece(*p)) continue;
    const std::vector<Box> boxes = ctx.local_boxes(*p);
    out.push_back({"model/" + p->fqn, p->local.detach(), p->global_shape, boxes});
    if (!optimizer) continue;
    for (const auto& m : saved_states(*optimizer)) {
      at::Tensor state = compat::optimizer_state(*optimizer, p->local, m);
      if (state.defined()) out.push_back({"optim/" + p->fqn + "/" + m, state, p->global_shape, boxes});
    }
  }
  if (ctx.mesh().config().pp > 1 && ctx.mesh().axis_rank(MeshAxis::kPp) > 0) {
    for (const auto& b : ctx.buffers()) {
      MIH_CHECK(!b.persistent, "checkpoint: the persistent buffer '", b.fqn, "' is on pipeline rank ",
                ctx.mesh().axis_rank(MeshAxis::kPp), ", and only the first stage's buffers are saved so far; ",
                "make it non-persistent (rebuilt from the config) or save without pp");
    }
  }
  if (ctx.mesh().rank() == 0) {
    for (const auto& b : ctx.buffers()) {
      if (!b.persistent) continue;
      Box whole{std::vector<int64_t>(b.tensor.dim(), 0), std::vector<int64_t>(b.tensor.dim(), 0), b.tensor.sizes().vec()};
      out.push_back({"buffer/" + b.fqn, b.tensor.detach(), b.tensor.sizes().vec(), {whole}});
    }
  }
  return out;
}

at::Tensor narrow_box(at::Tensor t, const std::vector<int64_t>& offset, const std::vector<int64_t>& lengths) {
  for (size_t d = 0; d < lengths.size(); ++d) t = t.narrow(static_cast<int64_t>(d), offset[d], lengths[d]);
  return t;
}

void write_rank_file(const fs::path& dir, ParallelContext& ctx, torch::optim::Optimizer* optimizer,
                     const std::string& checkpoint_id) {
  json steps = json::object();
  std::vector<Piece> pieces = pieces_to_save(ctx, optimizer, &steps);
  std::vector<at::Tensor> keep;  // contiguous CPU copies the views point into
  std::vector<safetensors::TensorView> views;
  json chunks = json::array();
  for (const Piece& piece : pieces) {
    for (const Box& box : piece.boxes) {
      at::Tensor data = narrow_box(piece.local, box.local_offset, box.lengths).to(at::kCPU).contiguous();
      keep.push_back(data);
      const std::string name = piece.key + "@" + mih::join(box.global_offset, ",");
      views.push_back({name, safetensors_dtype(data.scalar_type()), box.lengths, data.data_ptr(), data.nbytes()});
      chunks.push_back({{"key", piece.key},
                        {"name", name},
                        {"dtype", safetensors_dtype(data.scalar_type())},
                        {"shape", piece.global_shape},
                        {"offsets", box.global_offset},
                        {"lengths", box.lengths}});
    }
  }
  safetensors::write_file(dir / rank_file(ctx.mesh().rank()), views,
                          {{"mih.checkpoint_id", checkpoint_id}, {"mih.chunks", chunks.dump()}, {"mih.optim_steps", steps.dump()}});
}

// Rank 0: the index from every rank file's metadata.
json build_index(const fs::path& dir, int world_size, const std::string& checkpoint_id, const json& trainer_state) {
  json tensors = json::object(), steps = json::object(), files = json::array();
  for (int r = 0; r < world_size; ++r) {
    safetensors::Reader reader(dir / rank_file(r));
    const auto& meta = reader.metadata();
    const std::string where = "checkpoint " + (dir / rank_file(r)).string() + " metadata";
    const json chunks = parse_json_strict(meta.at("mih.chunks"), where + " 'mih.chunks'");
    const json rank_steps = parse_json_strict(meta.at("mih.optim_steps"), where + " 'mih.optim_steps'");
    for (const auto& [fqn, step] : rank_steps.items()) {
      MIH_INTERNAL_ASSERT(!steps.contains(fqn) || steps[fqn] == step, "ranks disagree on the optimizer step of '", fqn, "'");
      steps[fqn] = step;
    }
    if (chunks.empty()) continue;
    files.push_back(rank_file(r));
    for (const auto& c : chunks) {
      json& t = tensors[c.at("key").get<std::string>()];
      if (t.is_null()) t = {{"dtype", c.at("dtype")}, {"shape", c.at("shape")}, {"chunks", json::array()}};
      t["chunks"].push_back({{"file", rank_file(r)}, {"name", c.at("name")}, {"offsets", c.at("offsets")}, {"lengths", c.at("lengths")}});
    }
  }
  return {{"format", kCheckpointFormat},
          {"version", kCheckpointVersion},
          {"checkpoint_id", checkpoint_id},
          {"world_size", world_size},
          {"files", files},
          {"trainer_state", trainer_state},
          {"optimizer_steps", steps},
          {"tensors", tensors}};
}

std::string new_checkpoint_id(Communicator& world, c10::Device device) {
  at::Tensor id = at::zeros({2}, at::kLong);
  if (world.rank() == 0) {
    std::random_device rd;
    id[0] = static_cast<int64_t>((static_cast<uint64_t>(rd()) << 32 | rd()) >> 1);
    id[1] = std::chrono::system_clock::now().time_since_epoch().count();
  }
  at::Tensor on_device = id.to(device);
  world.broadcast(on_device, 0, "checkpoint.id");
  id = on_device.cpu();
  char text[48];
  std::snprintf(text, sizeof(text), "%016llx-%016llx", static_cast<unsigned long long>(id[0].item<int64_t>()),
                static_cast<unsigned long long>(id[1].item<int64_t>()));
  return text;
}

// Reads the parts of `entry`'s chunks that overlap `box` into `dst` (laid out like the local
// tensor). Returns the number of elements filled.
int64_t fill_box(const fs::path& dir, const std::string& key, const json& entry, const Box& box, at::Tensor& dst,
                 std::map<std::string, safetensors::Reader>& readers, const std::string& checkpoint_id) {
  int64_t filled = 0;
  const size_t rank = box.lengths.size();
  for (const auto& c : entry.at("chunks")) {
    const auto offsets = c.at("offsets").get<std::vector<int64_t>>();
    const auto lengths = c.at("lengths").get<std::vector<int64_t>>();
    MIH_CHECK(offsets.size() == rank && lengths.size() == rank, "checkpoint ", dir.string(), ": chunk '",
              c.at("name").get<std::string>(), "' of '", key, "' has ", offsets.size(), " dims, the tensor ", rank);
    std::vector<int64_t> from(rank), len(rank);
    bool overlaps = true;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t a = std::max(offsets[d], box.global_offset[d]);
      const int64_t e = std::min(offsets[d] + lengths[d], box.global_offset[d] + box.lengths[d]);
      if (a >= e) overlaps = false;
      from[d] = a;
      len[d] = std::max<int64_t>(e - a, 0);
    }
    if (!overlaps) continue;
    const std::string file = c.at("file").get<std::string>();
    auto it = readers.find(file);
    if (it == readers.end()) {
      it = readers.emplace(file, safetensors::Reader(dir / file)).first;
      auto id = it->second.metadata().find("mih.checkpoint_id");
      MIH_CHECK(id != it->second.metadata().end() && id->second == checkpoint_id, "checkpoint ", dir.string(),
                ": file ", file, " belongs to another checkpoint (id ",
                id == it->second.metadata().end() ? std::string("none") : id->second, ", the index says ", checkpoint_id,
                "); the directory mixes files of two saves");
    }
    const std::string name = c.at("name").get<std::string>();
    const safetensors::TensorInfo& info = it->second.info(name);
    MIH_CHECK(info.shape == lengths && torch_dtype(info.dtype) == dst.scalar_type(), "checkpoint ", dir.string(), ": file ",
              file, " tensor '", name, "' has dtype ", info.dtype, " and shape ", shape_str(info.shape),
              ", the index says ", safetensors_dtype(dst.scalar_type()), " ", shape_str(lengths));
    std::vector<int64_t> in_chunk(rank), in_local(rank);
    for (size_t d = 0; d < rank; ++d) {
      in_chunk[d] = from[d] - offsets[d];
      in_local[d] = box.local_offset[d] + (from[d] - box.global_offset[d]);
    }
    at::Tensor part = at::empty(len, at::TensorOptions().dtype(dst.scalar_type()));
    it->second.read_box(name, in_chunk, len, part.data_ptr());
    narrow_box(dst, in_local, len).copy_(part);
    filled += part.numel();
  }
  return filled;
}

// Reads the piece with `boxes` of tensor `key` into a new tensor of `local_shape`.
at::Tensor read_piece(const fs::path& dir, const json& index, const std::string& key, at::ScalarType dtype,
                      const std::vector<int64_t>& global_shape, const std::vector<int64_t>& local_shape,
                      const std::vector<Box>& boxes, std::map<std::string, safetensors::Reader>& readers) {
  const json& tensors = index.at("tensors");
  MIH_CHECK(tensors.contains(key), "checkpoint ", dir.string(), " has no tensor '", key,
            "' that the model needs; was it saved from another model or without the optimizer?");
  const json& entry = tensors.at(key);
  MIH_CHECK(entry.at("shape").get<std::vector<int64_t>>() == global_shape, "checkpoint ", dir.string(), ": '", key,
            "' has shape ", shape_str(entry.at("shape").get<std::vector<int64_t>>()), ", the model's is ", shape_str(global_shape));
  MIH_CHECK(entry.at("dtype").get<std::string>() == safetensors_dtype(dtype), "checkpoint ", dir.string(), ": '", key, "' is ",
            entry.at("dtype").get<std::string>(), ", the model's is ", safetensors_dtype(dtype),
            " (load into a model of the saved dtype)");
  at::Tensor dst = at::zeros(local_shape, at::TensorOptions().dtype(dtype));
  for (const Box& box : boxes) {
    const int64_t filled = fill_box(dir, key, entry, box, dst, readers, index.at("checkpoint_id").get<std::string>());
    MIH_CHECK(filled == box.numel(), "checkpoint ", dir.string(), ": the chunks of '", key, "' fill ", filled, " of the ",
              box.numel(), " elements at offset ", shape_str(box.global_offset), " size ", shape_str(box.lengths),
              " this rank needs (chunks missing or overlapping)");
  }
  return dst;
}

}  // namespace

json read_checkpoint_index(const fs::path& dir) {
  std::string text;
  MIH_CHECK_CODE(read_file(dir / kIndexFile, &text), Code::kFailedPrecondition, "checkpoint ", dir.string(), ": no ",
                 kIndexFile, " (not a checkpoint directory, or a save that did not complete)");
  json index;
  std::string problem;
  MIH_CHECK(parse_json_bounded(text, &index, &problem), "checkpoint ", (dir / kIndexFile).string(),
            ": not valid JSON (", problem, ")");
  MIH_CHECK(index.is_object() && index.value("format", "") == kCheckpointFormat, "checkpoint ",
            (dir / kIndexFile).string(), ": not a ", kCheckpointFormat, " index");
  MIH_CHECK(index.value("version", 0) == kCheckpointVersion, "checkpoint ", (dir / kIndexFile).string(), ": version ",
            index.value("version", 0), ", this build reads version ", kCheckpointVersion);
  for (const char* field : {"checkpoint_id", "tensors", "trainer_state", "optimizer_steps"}) {
    MIH_CHECK(index.contains(field), "checkpoint ", (dir / kIndexFile).string(), ": missing field '", field, "'");
  }
  return index;
}

void save_checkpoint(const fs::path& dir, ParallelContext& ctx, torch::optim::Optimizer* optimizer,
                     const json& trainer_state) {
  Communicator& world = ctx.mesh().comm(MeshAxis::kWorld);
  const std::string where = "saving checkpoint " + dir.string();
  on_every_rank(world, ctx.device(), where, [&] {
    std::error_code ec;
    fs::create_directories(dir, ec);
    MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "checkpoint: cannot create directory ", dir.string(), ": ", ec.message());
    if (world.rank() == 0) {
      fs::remove(dir / kIndexFile, ec);
      MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "checkpoint: cannot remove the old ", (dir / kIndexFile).string(),
                     ": ", ec.message());
    }
  });
  const std::string id = new_checkpoint_id(world, ctx.device());
  on_every_rank(world, ctx.device(), where, [&] { write_rank_file(dir, ctx, optimizer, id); });
  on_every_rank(world, ctx.device(), where, [&] {
    if (world.rank() == 0) {
      write_file_atomic(dir / kIndexFile, build_index(dir, world.size(), id, trainer_state).dump(1));
    }
  });
}

// This rank's pieces of the optimizer state of `p` (state name -> tensor laid out like p.local),
// each key it read added to `used`. Throws: mih::Error naming a state the checkpoint lacks.
std::map<std::string, at::Tensor> read_optimizer_state(const fs::path& dir, const json& index, const ShardedParameter& p,
                                                       const std::vector<Box>& boxes, torch::optim::Optimizer& optimizer,
                                                       int rank, std::map<std::string, safetensors::Reader>& readers,
                                                       std::set<std::string>& used) {
  const at::ScalarType dtype = p.local.scalar_type();
  std::map<std::string, at::Tensor> out;
  for (const auto& m : saved_states(optimizer)) {
    const std::string key = "optim/" + p.fqn + "/" + m;
    if (m == "max_exp_avg_sq" && !index.at("tensors").contains(key)) continue;  // saved without amsgrad
    MIH_CHECK(index.at("tensors").contains(key), "checkpoint ", dir.string(), " has optimizer state for '", p.fqn,
              "' but no '", key, "' that this ", compat::optimizer_kind(optimizer), " optimizer needs; was it ",
              "saved with another optimizer?");
    if (fault::active(fault::Fault::kF12)) {
      // F12 (docs/fault-catalog.md): the moments restored as this rank's flat shard of the saved
      // layout (FSDP1's flat optimizer state loaded by rank), not resharded to the
      // parameter's box under the new topology.
      const Box whole{std::vector<int64_t>(p.global_shape.size(), 0), std::vector<int64_t>(p.global_shape.size(), 0),
                      p.global_shape};
      at::Tensor flat = read_piece(dir, index, key, dtype, p.global_shape, p.global_shape, {whole}, readers).flatten();
      const int64_t n = p.local.numel(), start = std::min<int64_t>(rank * n, flat.numel() - n);
      if (start >= 0) {
        out[m] = flat.narrow(0, start, n).reshape(p.local_shape).clone();
        used.insert(key);
        continue;
      }
    }
    out[m] = read_piece(dir, index, key, dtype, p.global_shape, p.local_shape, boxes, readers);
    used.insert(key);
  }
  return out;
}

json load_checkpoint(const fs::path& dir, ParallelContext& ctx, torch::optim::Optimizer* optimizer) {
  Communicator& world = ctx.mesh().comm(MeshAxis::kWorld);
  json index;
  struct Staged {
    std::shared_ptr<ShardedParameter> param;
    at::Tensor value;
    std::map<std::string, at::Tensor> moments;  // by state name; empty when not in the checkpoint
    int64_t step = 0;
  };
  std::vector<Staged> staged;
  std::vector<std::pair<at::Tensor, at::Tensor>> buffers;  // (model buffer, loaded value)
  std::vector<std::string> keys;  // the index's tensors, and whether this rank read each
  std::vector<int64_t> wanted;
  on_every_rank(world, ctx.device(), "loading checkpoint " + dir.string(), [&] {
    index = read_checkpoint_index(dir);
    std::map<std::string, safetensors::Reader> readers;
    std::set<std::string> used;
    const json& steps = index.at("optimizer_steps");
    for (const auto& p : ctx.parameters()) {
      const std::vector<Box> boxes = ctx.local_boxes(*p);
      const at::ScalarType dtype = p->local.scalar_type();
      Staged s{p, read_piece(dir, index, "model/" + p->fqn, dtype, p->global_shape, p->local_shape, boxes, readers), {}, 0};
      used.insert("model/" + p->fqn);
      if (optimizer && steps.contains(p->fqn)) {
        s.step = steps.at(p->fqn).get<int64_t>();
        s.moments = read_optimizer_state(dir, index, *p, boxes, *optimizer, world.rank(), readers, used);
      }
      staged.push_back(std::move(s));
    }
    for (const auto& b : ctx.buffers()) {
      if (!b.persistent) continue;
      const std::string key = "buffer/" + b.fqn;
      Box whole{std::vector<int64_t>(b.tensor.dim(), 0), std::vector<int64_t>(b.tensor.dim(), 0), b.tensor.sizes().vec()};
      buffers.emplace_back(b.tensor, read_piece(dir, index, key, b.tensor.scalar_type(), b.tensor.sizes().vec(),
                                                b.tensor.sizes().vec(), {whole}, readers));
      used.insert(key);
    }
    for (const auto& [key, entry] : index.at("tensors").items()) {
      const bool optim_state = key.rfind("optim/", 0) == 0;
      keys.push_back(key);
      wanted.push_back(used.count(key) || (optim_state && !optimizer) ? 1 : 0);
    }
  });
  // Under pp each stage reads its own parameters: a tensor is unexpected when no pp rank
  // read it (every rank read the same index, so the key lists agree; every rank reaches this
  // collective, after on_every_rank, and takes the same decision).
  at::Tensor read_somewhere = at::tensor(wanted, at::kLong);
  if (ctx.mesh().config().pp > 1) {
    read_somewhere = read_somewhere.to(ctx.device());
    ctx.mesh().comm(MeshAxis::kPp).all_reduce(read_somewhere, ReduceOp::kSum, "checkpoint.load.pp");
    read_somewhere = read_somewhere.cpu();
  }
  std::vector<std::string> unexpected;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (read_somewhere[static_cast<int64_t>(i)].item<int64_t>() == 0) unexpected.push_back(keys[i]);
  }
  MIH_CHECK(unexpected.empty(), "checkpoint ", dir.string(), " has ", unexpected.size(),
            " tensor(s) the model does not have, e.g. '", unexpected.empty() ? "" : unexpected.front(),
            "'; was it saved from another model?");
  // Every rank read everything: commit.
  at::NoGradGuard no_grad;
  const c10::Device device = ctx.device();
  for (Staged& s : staged) {
    s.param->local.copy_(s.value);
    if (!s.moments.empty()) {
      for (auto& [name, t] : s.moments) t = t.to(device);
      compat::set_optimizer_state(*optimizer, s.param->local, s.step, s.moments);
    }
  }
  for (auto& [buffer, value] : buffers) buffer.copy_(value);
  // The model's state after a load is the checkpoint's alone: the buffers it does not hold
  // (non-persistent: rotary tables, masks) are reset to NaN, as undefined as what to_empty()
  // leaves, and rebuilt from their formulas. A missing rebuild then shows as NaN, not as a
  // stale value that happens to be right on this topology.
  for (const auto& b : ctx.buffers()) {
    if (!b.persistent && b.tensor.is_floating_point()) b.tensor.fill_(std::numeric_limits<double>::quiet_NaN());
  }
  // F11 (docs/fault-catalog.md): the rebuild after the load forgotten.
  if (!fault::active(fault::Fault::kF11)) ctx.rebuild_non_persistent_buffers();
  return index.at("trainer_state");
}

}  // namespace mih
