// own_trainer: a data-parallel / tensor-parallel trainer of its own, written with libtorch and
// c10d alone, that mih validates through mih::TrainerSession (docs/evidence.md, "Use mih with
// your own trainer"). It uses nothing of mih's runtime: it meets its peers through c10d's
// TCPStore (torchrun's agent store), builds its own ProcessGroupGloo groups, its own model
// (torch::nn), its own gradient synchronization, ZeRO-3 sharding, Megatron MLP and AdamW. The
// session's hooks are the only mih calls; they are marked `session.` below.
//
// The model (float64): embed -> 2 residual MLP blocks (x + down(gelu(up(ln(x))))) -> norm ->
// head, vocabulary 32, hidden 16. Each step trains on a global batch of 4 rows of 8 tokens whose
// rows 2-3 carry fewer targets than rows 0-1, so a loss averaged per rank is not the global mean.
//   --parallel none   one process (the Reference)
//   --parallel ddp    2 ranks along dp_replicate: rows split, every gradient all-reduced (sum)
//   --parallel zero3  2 ranks along dp_shard: every parameter a dim-0 shard, all-gathered before
//                     the forward, its gradient reduce-scattered; AdamW steps the shards
//   --parallel tp     2 ranks along tp: the MLPs column- (up) and row-parallel (down), with the
//                     two conjugate operators f and g as autograd functions; same rows on both
//   --bug skip_allreduce   ddp: layers.1.up.weight's gradient is never all-reduced
//   --bug per_rank_mean    each rank's loss is its own tokens' mean, the gradients averaged
//   --bug skip_optimizer_load  --load restores the parameters, not AdamW's state
// Checkpoint: --save-at K --ckpt DIR saves each rank's stepped tensors and AdamW state after
// step K-1 and stops; --load --ckpt DIR resumes from them at step K.
//
// Usage: own_trainer --case-dir DIR --case NAME [--compare-to NAME] --parallel MODE
//                    [--bug BUG] [--steps N] [--save-at K --ckpt DIR | --load --ckpt DIR]
// Exit 0 on success; 1 with `own_trainer: <what>` on stderr otherwise.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include "harness/compat/adopt.h"
#include "harness/session/trainer_session.h"

namespace {

constexpr int64_t kVocab = 32, kHidden = 16, kSeq = 8, kRows = 4, kBlocks = 2;
constexpr double kLr = 1e-2, kWeightDecay = 0.01, kMaxNorm = 1.0;
constexpr auto kTimeout = std::chrono::seconds(60);

using Backend = mih::compat::C10dBackend;  // c10d::ProcessGroup in libtorch 1.13
using mih::AxisPlacement;
using mih::ReduceOp;

enum class Mode { kNone, kDdp, kZero3, kTp };
enum class Bug { kNone, kSkipAllreduce, kPerRankMean, kSkipOptimizerLoad };

struct Args {
  std::string case_dir, case_name, compare_to, ckpt;
  Mode mode = Mode::kNone;
  Bug bug = Bug::kNone;
  int64_t steps = 3, save_at = 0;
  bool load = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  std::string parallel, bug = "none";
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--case-dir") a.case_dir = value();
    else if (flag == "--case") a.case_name = value();
    else if (flag == "--compare-to") a.compare_to = value();
    else if (flag == "--parallel") parallel = value();
    else if (flag == "--bug") bug = value();
    else if (flag == "--steps") a.steps = std::stoll(value());
    else if (flag == "--save-at") a.save_at = std::stoll(value());
    else if (flag == "--ckpt") a.ckpt = value();
    else if (flag == "--load") a.load = true;
    else throw std::invalid_argument("unknown argument '" + flag + "'");
  }
  const std::map<std::string, Mode> modes{{"none", Mode::kNone}, {"ddp", Mode::kDdp}, {"zero3", Mode::kZero3}, {"tp", Mode::kTp}};
  const std::map<std::string, Bug> bugs{{"none", Bug::kNone}, {"skip_allreduce", Bug::kSkipAllreduce}, {"per_rank_mean", Bug::kPerRankMean},
                                  {"skip_optimizer_load", Bug::kSkipOptimizerLoad}};
  if (!modes.count(parallel)) throw std::invalid_argument("--parallel must be none, ddp, zero3 or tp");
  if (!bugs.count(bug)) throw std::invalid_argument("--bug must be none, skip_allreduce, per_rank_mean or skip_optimizer_load");
  a.mode = modes.at(parallel);
  a.bug = bugs.at(bug);
  if (a.case_dir.empty() || a.case_name.empty()) throw std::invalid_argument("--case-dir and --case are required");
  if ((a.save_at > 0 || a.load) && a.ckpt.empty()) throw std::invalid_argument("--save-at and --load need --ckpt");
  if (a.save_at > 0 && a.load) throw std::invalid_argument("--save-at and --load exclude each other");
  if (a.save_at < 0 || a.save_at > a.steps) throw std::invalid_argument("--save-at must be in [1, --steps]");
  if (a.bug == Bug::kSkipOptimizerLoad && !a.load) throw std::invalid_argument("skip_optimizer_load is a --load bug");
  if (a.bug == Bug::kSkipAllreduce && a.mode != Mode::kDdp) throw std::invalid_argument("skip_allreduce is a ddp bug");
  if (a.bug == Bug::kPerRankMean && a.mode != Mode::kDdp && a.mode != Mode::kZero3)
    throw std::invalid_argument("per_rank_mean needs a data axis (ddp or zero3)");
  return a;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : fallback;
}

// ---- Rendezvous and process groups (c10d) ------------------------------------------------

struct World {
  int rank = 0, size = 1;
  c10::intrusive_ptr<c10d::Store> store;
};

// torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR/PORT. Under its static rendezvous
// (TORCHELASTIC_USE_AGENT_STORE=True) the agent hosts the TCPStore and each attempt of the
// workers meets under its own prefix, as torch.distributed's env:// does; otherwise rank 0
// hosts it. Without RANK: one process on an in-memory store.
World rendezvous() {
  World w;
  if (!std::getenv("RANK")) {
    w.store = c10::make_intrusive<c10d::HashStore>();
    return w;
  }
  w.rank = std::stoi(env_or("RANK", "0"));
  w.size = std::stoi(env_or("WORLD_SIZE", "1"));
  const std::string agent = env_or("TORCHELASTIC_USE_AGENT_STORE", "False");
  const bool agent_hosts = agent == "True" || agent == "1";
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(std::stoi(env_or("MASTER_PORT", "29500")));
  o.isServer = !agent_hosts && w.rank == 0;
  o.numWorkers = static_cast<size_t>(w.size);
  o.waitWorkers = false;  // the Gloo groups below wait for every member
  o.timeout = kTimeout;
  w.store = c10::make_intrusive<c10d::TCPStore>(env_or("MASTER_ADDR", "127.0.0.1"), o);
  if (agent_hosts)
    w.store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + env_or("TORCHELASTIC_RESTART_COUNT", "0"), w.store);
  return w;
}

// A Gloo group of `size` members on its own key prefix of the store, bound to the loopback.
c10::intrusive_ptr<Backend> gloo_group(const World& w, const std::string& prefix, int rank, int size) {
  static const auto device = c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  auto options = c10d::ProcessGroupGloo::Options::create(kTimeout);
  options->devices.push_back(device);
  auto store = c10::make_intrusive<c10d::PrefixStore>(prefix, w.store);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

// ---- Model -------------------------------------------------------------------------------

struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})))),
        up(register_module("up", torch::nn::Linear(kHidden, 4 * kHidden))),
        down(register_module("down", torch::nn::Linear(4 * kHidden, kHidden))) {}
  torch::nn::LayerNorm ln;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

struct ModelImpl : torch::nn::Module {
  ModelImpl()
      : embed(register_module("embed", torch::nn::Embedding(kVocab, kHidden))),
        layers(register_module("layers", torch::nn::ModuleList())),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kHidden})))),
        head(register_module("head", torch::nn::Linear(torch::nn::LinearOptions(kHidden, kVocab).bias(false)))) {
    for (int64_t i = 0; i < kBlocks; ++i) layers->push_back(Block());
  }
  torch::nn::Embedding embed;
  torch::nn::ModuleList layers;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
};
TORCH_MODULE(Model);

// Megatron's conjugate operators around a tensor-parallel MLP. An autograd context holds
// IValues only, so the tp axis's Communicator is reached through this pointer.
mih::Communicator* tp_comm = nullptr;

// f: identity forward; backward sums the input gradient's partial contributions over tp.
struct CopyToTp : torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    at::Tensor sum = g[0].contiguous().clone();
    tp_comm->all_reduce(sum, ReduceOp::kSum, "tp.f");
    return {sum};
  }
};

// g: sums the row-parallel partial outputs over tp forward; identity backward.
struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    at::Tensor sum = x.contiguous().clone();
    tp_comm->all_reduce(sum, ReduceOp::kSum, "tp.g");
    return sum;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    return {g[0]};
  }
};

// The forward of every mode; under tp the up/down weights are this rank's pieces. Each module
// output is marked for the session's localization, in the 1-rank model's names.
at::Tensor forward(Model& model, const at::Tensor& input_ids, mih::TrainerSession& session, bool tp) {
  at::Tensor x = session.mark_output("embed", model->embed(input_ids));
  for (int64_t i = 0; i < kBlocks; ++i) {
    auto block = model->layers->ptr<BlockImpl>(static_cast<size_t>(i));
    const std::string name = "layers." + std::to_string(i);
    at::Tensor h = block->ln(x);
    if (tp) h = CopyToTp::apply(h);
    const std::vector<AxisPlacement> up_placement =
        tp ? std::vector<AxisPlacement>{AxisPlacement::sharded("tp", 2)} : std::vector<AxisPlacement>{};
    at::Tensor u = session.mark_output(name + ".up", torch::linear(h, block->up->weight, block->up->bias), up_placement);
    at::Tensor d = torch::linear(torch::gelu(u), block->down->weight);
    if (tp) d = ReduceFromTp::apply(d);
    d = session.mark_output(name + ".down", d + block->down->bias);  // the bias after the sum
    x = session.mark_output(name, x + d);
  }
  x = session.mark_output("norm", model->norm(x));
  return session.mark_output("head", model->head(x));
}

// ---- Data --------------------------------------------------------------------------------

// The global batch of `step`: labels are the next token, -100 where there is none; rows 2-3
// are padded after their first 3 targets (3 targets each, rows 0-1 have 7).
std::pair<at::Tensor, at::Tensor> global_batch(int64_t step) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 + step));
  at::Tensor ids = torch::randint(0, kVocab, {kRows, kSeq}, gen, torch::kLong);
  at::Tensor labels = torch::full({kRows, kSeq}, -100, torch::kLong);
  labels.narrow(1, 0, kSeq - 1).copy_(ids.narrow(1, 1, kSeq - 1));
  labels.narrow(0, 2, 2).narrow(1, 3, kSeq - 3).fill_(-100);
  return {ids, labels};
}

// ---- Parameters: what the forward reads and what AdamW steps -------------------------------

struct Piece {
  std::string fqn;
  at::Tensor param;  // the module's parameter the forward reads (tp: this rank's piece)
  at::Tensor local;  // the tensor AdamW steps: param itself, or the ZeRO-3 shard
  std::vector<int64_t> global_shape;
  int64_t shard_dim = -1;  // the dim cut over the mode's axis; -1: replicated
};

// Axis rank r's chunk of `full` along `dim`, as torch.chunk cuts it (ceil(n / size) each).
at::Tensor chunk_of(const at::Tensor& full, int64_t dim, int r, int size) {
  const int64_t n = full.size(dim), c = (n + size - 1) / size;
  const int64_t start = std::min(n, r * c), len = std::min(c, n - start);
  return full.detach().narrow(dim, start, len).clone(at::MemoryFormat::Contiguous);
}

int64_t tp_shard_dim(const std::string& fqn) {
  auto ends_with = [&](const std::string& s) { return fqn.size() >= s.size() && fqn.compare(fqn.size() - s.size(), s.size(), s) == 0; };
  if (ends_with(".up.weight") || ends_with(".up.bias")) return 0;  // column-parallel
  if (ends_with(".down.weight")) return 1;                          // row-parallel
  return -1;
}

// The ZeRO-3 unit of a parameter: its block ("layers.0") or its top-level module ("embed").
std::string fsdp_unit(const std::string& fqn) {
  const auto first = fqn.find('.');
  if (fqn.rfind("layers.", 0) == 0) return fqn.substr(0, fqn.find('.', first + 1));
  return fqn.substr(0, first);
}

// Cuts the full, identically seeded model into this rank's pieces.
std::vector<Piece> make_pieces(Model& model, Mode mode, int r, int size) {
  std::vector<Piece> pieces;
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    Piece p{item.key(), item.value(), item.value(), item.value().sizes().vec(), -1};
    if (mode == Mode::kZero3) {
      p.shard_dim = 0;
      p.local = chunk_of(p.param, 0, r, size).set_requires_grad(true);
    } else if (mode == Mode::kTp && tp_shard_dim(p.fqn) >= 0) {
      p.shard_dim = tp_shard_dim(p.fqn);
      p.param.set_data(chunk_of(p.param, p.shard_dim, r, size));  // the module now holds its piece
    }
    pieces.push_back(std::move(p));
  }
  return pieces;
}

std::vector<mih::ParameterEntry> parameter_table(const std::vector<Piece>& pieces, Mode mode) {
  std::vector<mih::ParameterEntry> table;
  for (const Piece& p : pieces) {
    mih::ParameterEntry e;
    e.fqn = p.fqn;
    e.local = p.local;
    e.global_shape = p.global_shape;
    if (mode == Mode::kDdp) {
      e.placements = {AxisPlacement::replicate("dp_replicate")};
      e.grad_reduce_axes = {"dp_replicate"};
    } else if (mode == Mode::kZero3) {
      e.placements = {AxisPlacement::sharded("dp_shard", 0)};
      e.grad_reduce_axes = {"dp_shard"};
      e.fsdp_unit = fsdp_unit(p.fqn);
    } else if (mode == Mode::kTp) {
      e.placements = {p.shard_dim >= 0 ? AxisPlacement::sharded("tp", p.shard_dim) : AxisPlacement::replicate("tp")};
    }
    table.push_back(std::move(e));
  }
  return table;
}

// ZeRO-3 before the forward: every parameter's shards gathered into the module's full tensor.
void gather_parameters(std::vector<Piece>& pieces, mih::Communicator& comm) {
  for (Piece& p : pieces) {
    const int64_t n = p.global_shape[0], c = (n + comm.size() - 1) / comm.size();
    std::vector<int64_t> shape = p.global_shape;
    shape[0] = c;
    at::Tensor padded = torch::zeros(shape);
    padded.narrow(0, 0, p.local.size(0)).copy_(p.local.detach());
    shape[0] = c * comm.size();
    at::Tensor full = torch::empty(shape);
    comm.all_gather_into_tensor(full, padded, "zero3.all_gather");
    torch::NoGradGuard no_grad;
    p.param.copy_(full.narrow(0, 0, n));
  }
}

// The mode's gradient synchronization after backward.
void sync_gradients(std::vector<Piece>& pieces, Mode mode, Bug bug, mih::Communicator* comm) {
  const ReduceOp op = bug == Bug::kPerRankMean ? ReduceOp::kAvg : ReduceOp::kSum;
  for (Piece& p : pieces) {
    if (mode == Mode::kDdp) {
      if (bug == Bug::kSkipAllreduce && p.fqn == "layers.1.up.weight") continue;  // the planted bug
      at::Tensor g = p.param.grad();
      comm->all_reduce(g, op, "ddp.grad");
    } else if (mode == Mode::kZero3) {
      const int64_t n = p.global_shape[0], c = (n + comm->size() - 1) / comm->size();
      std::vector<int64_t> shape = p.global_shape;
      shape[0] = c * comm->size();
      at::Tensor padded = torch::zeros(shape);
      padded.narrow(0, 0, n).copy_(p.param.grad());
      shape[0] = c;
      at::Tensor mine = torch::empty(shape);
      comm->reduce_scatter_tensor(mine, padded, op, "zero3.reduce_scatter");
      p.local.mutable_grad() = mine.narrow(0, 0, p.local.size(0)).clone();
    }
  }
}

// The global gradient norm over the pieces: a replicated piece counted once, the pieces of a
// sharded parameter summed over the axis. Clips the stepped gradients to kMaxNorm; returns
// the norm before clipping.
double clip_gradients(std::vector<Piece>& pieces, mih::Communicator* comm) {
  at::Tensor replicated = torch::zeros({}), sharded = torch::zeros({});
  for (const Piece& p : pieces) (p.shard_dim >= 0 ? sharded : replicated) += p.local.grad().pow(2).sum();
  if (comm) comm->all_reduce(sharded, ReduceOp::kSum, "clip.norm");
  const double norm = std::sqrt((replicated + sharded).item<double>());
  const double coef = kMaxNorm / (norm + 1e-6);
  if (coef < 1.0)
    for (Piece& p : pieces) p.local.grad().mul_(coef);
  return norm;
}

// ---- Checkpoint --------------------------------------------------------------------------

std::string ckpt_file(const std::string& dir, int rank) { return dir + "/rank" + std::to_string(rank) + ".pt"; }
std::string ckpt_key(std::string fqn) {
  std::replace(fqn.begin(), fqn.end(), '.', '/');  // archive keys name attributes: no dots
  return "param/" + fqn;
}

void save_checkpoint(const std::string& dir, int rank, const std::vector<Piece>& pieces, torch::optim::Optimizer& opt,
                     int64_t next_step) {
  torch::serialize::OutputArchive archive;
  archive.write("next_step", torch::tensor(next_step));
  for (const Piece& p : pieces) archive.write(ckpt_key(p.fqn), p.local.detach());
  torch::serialize::OutputArchive optimizer(archive.compilation_unit());
  opt.save(optimizer);
  archive.write("optimizer", optimizer);
  std::filesystem::create_directories(dir);
  archive.save_to(ckpt_file(dir, rank));
}

// Returns the step the run resumes at.
int64_t load_checkpoint(const std::string& dir, int rank, std::vector<Piece>& pieces, torch::optim::Optimizer& opt,
                        Bug bug) {
  torch::serialize::InputArchive archive;
  archive.load_from(ckpt_file(dir, rank));
  at::Tensor next_step;
  archive.read("next_step", next_step);
  torch::NoGradGuard no_grad;
  for (Piece& p : pieces) {
    at::Tensor saved;
    archive.read(ckpt_key(p.fqn), saved);
    if (!saved.sizes().equals(p.local.sizes())) throw std::runtime_error("checkpoint: " + p.fqn + " has another shape");
    p.local.copy_(saved);
  }
  torch::serialize::InputArchive optimizer;
  archive.read("optimizer", optimizer);
  if (bug != Bug::kSkipOptimizerLoad) opt.load(optimizer);  // the planted bug: AdamW starts afresh
  return next_step.item<int64_t>();
}

// ---- Training ----------------------------------------------------------------------------

int train(const Args& args) {
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());  // float64 everywhere
  const World world = rendezvous();
  const bool parallel = args.mode != Mode::kNone;
  if (parallel != (world.size == 2))
    throw std::invalid_argument("--parallel none runs on 1 process, the others on 2 (torchrun --nproc_per_node 2)");
  const auto world_group = gloo_group(world, "world", world.rank, world.size);

  // The one mesh axis of a parallel mode spans the world: ranks 0..size-1 in order.
  const std::string axis_name = args.mode == Mode::kDdp ? "dp_replicate" : args.mode == Mode::kZero3 ? "dp_shard" : "tp";
  const bool data_axis = args.mode == Mode::kDdp || args.mode == Mode::kZero3;  // ranks see other rows
  const int axis_rank = world.rank, axis_size = world.size;
  std::vector<int> axis_members(static_cast<size_t>(axis_size));
  std::iota(axis_members.begin(), axis_members.end(), 0);

  torch::manual_seed(0);
  Model model;
  std::vector<Piece> pieces = make_pieces(model, args.mode, axis_rank, axis_size);
  std::vector<at::Tensor> stepped;
  for (const Piece& p : pieces) stepped.push_back(p.local);
  torch::optim::AdamW opt(stepped, torch::optim::AdamWOptions(kLr).weight_decay(kWeightDecay));

  mih::TrainerSessionOptions options;
  options.case_dir = args.case_dir;
  options.case_name = args.case_name;
  options.compare_to = args.compare_to;
  options.trainer = "own_trainer 1.0";
  // Summed gradients: each rank's loss is its share of the global loss. The per-rank-mean bug
  // averages them, so its author declares the data-parallel size (what DDP users believe).
  options.loss_scale = args.bug == Bug::kPerRankMean ? axis_size : 1.0;
  options.steps = args.steps;
  mih::TrainerSession session(options, world_group);  // session.

  // Every collective of the axis goes through the session's recording wrapper of the axis's
  // own Gloo group (a group of its own, as a real trainer builds, though its members are the world's).
  std::optional<mih::Communicator> comm;
  if (parallel) {
    comm = session.axis(axis_name, gloo_group(world, "axis_" + axis_name, axis_rank, axis_size), axis_members);  // session.
    if (args.mode == Mode::kTp) tp_comm = &*comm;
  }
  session.describe_parameters(parameter_table(pieces, args.mode));  // session.
  session.attach_optimizer(opt);                                    // session.

  int64_t first_step = 0;
  if (args.load) {
    first_step = load_checkpoint(args.ckpt, world.rank, pieces, opt, args.bug);
    session.capture_checkpoint_payload("load", first_step);  // session.
  }
  const int64_t rows = data_axis ? kRows / axis_size : kRows;
  const int64_t first_row = data_axis ? axis_rank * rows : 0;
  double loss_value = 0;
  for (int64_t step = first_step; step < args.steps; ++step) {
    session.begin_step(step);  // session.
    for (Piece& p : pieces) {
      p.param.mutable_grad().reset();
      p.local.mutable_grad().reset();
    }
    if (args.mode == Mode::kZero3) gather_parameters(pieces, *comm);
    const auto [all_ids, all_labels] = global_batch(step);
    const at::Tensor ids = all_ids.narrow(0, first_row, rows), labels = all_labels.narrow(0, first_row, rows);
    session.record_batch(step, 0, first_row, {{"input_ids", ids}, {"labels", labels}});  // session.

    const at::Tensor logits = forward(model, ids, session, args.mode == Mode::kTp);
    const at::Tensor local_sum = torch::nn::functional::cross_entropy(
        logits.reshape({-1, kVocab}), labels.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
    const at::Tensor local_tokens = labels.ne(-100).sum().to(torch::kFloat64);
    at::Tensor global_tokens = local_tokens.clone();
    if (data_axis) comm->all_reduce(global_tokens, ReduceOp::kSum, "loss.tokens");
    // The rank's share of the global token mean; the bug: its own tokens' mean.
    const at::Tensor denominator = args.bug == Bug::kPerRankMean ? local_tokens : global_tokens;
    (local_sum / denominator).backward();

    sync_gradients(pieces, args.mode, args.bug, parallel ? &*comm : nullptr);
    session.after_backward_before_clip(step);  // session.
    const double norm = clip_gradients(pieces, args.mode == Mode::kZero3 || args.mode == Mode::kTp ? &*comm : nullptr);
    session.after_clip(step, norm);  // session.
    opt.step();
    session.after_optimizer(step);  // session.

    // The loss over the global batch (what the buggy trainer believes: the ranks' mean of means).
    at::Tensor loss = (local_sum / denominator).detach();
    if (data_axis) comm->all_reduce(loss, args.bug == Bug::kPerRankMean ? ReduceOp::kAvg : ReduceOp::kSum, "loss");
    loss_value = loss.item<double>();
    session.end_step(step, loss_value);  // session.

    if (args.save_at > 0 && step + 1 == args.save_at) {
      save_checkpoint(args.ckpt, world.rank, pieces, opt, step + 1);
      session.capture_checkpoint_payload("save", step + 1);  // session.
      break;
    }
  }
  session.finish();  // session.
  if (world.rank == 0)
    std::cout << "own_trainer: " << args.case_name << " (" << world.size << " rank(s)) trained steps " << first_step
              << ".." << (args.save_at > 0 ? args.save_at : args.steps) - 1 << ", last loss " << loss_value << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return train(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "own_trainer: " << e.what() << "\n";
    return 1;
  }
}
