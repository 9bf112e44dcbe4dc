// TrainerSession (trainer_session.h): the evidence contract written from a foreign libtorch
// trainer's hooks. Rank 0 writes every file but its own ledger and performance lines; the
// statistics are global (trainer_session_stats.cpp), finished with collectives over the world.
#include "harness/session/trainer_session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/optim/optimizer.h>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/sha256.h"
#include "harness/base/version.h"
#include "harness/compat/optim.h"
#include "harness/contract/contract.h"
#include "harness/evidence/evidence_store.h"
#include "harness/session/replica_digests_internal.h"
#include "harness/session/trainer_session_internal.h"
#include "harness/session/writer_lock.h"

namespace mih {

using nlohmann::json;
using namespace trainer_session_internal;
namespace fs = std::filesystem;

namespace {

const std::set<std::string>& known_axes() {
  static const std::set<std::string> axes = {"dp_replicate", "dp_shard", "cp", "tp", "ep"};
  return axes;
}

bool is_data_axis(const std::string& axis) { return axis == "dp_replicate" || axis == "dp_shard"; }

struct Param {
  ParameterEntry entry;
  std::vector<int64_t> global;
  Box box;
  at::Tensor index;
  bool counts = true;
  int64_t total = -1;  // numel when small enough to record values
};

json placements_json(const std::vector<AxisPlacement>& placements, const std::map<std::string, AxisInfo>& axes) {
  json out = json::object();
  for (const auto& [name, axis] : axes) out[name] = "Replicate()";
  for (const AxisPlacement& p : placements) out[p.axis] = p.str();
  return out;
}

}  // namespace

struct TrainerSession::Impl {
  TrainerSessionOptions o;
  compat::Group world_group;
  WorldCollectives world;  // the session's own collectives, on the world's device: not ledgered
  std::map<std::string, AxisInfo> axes;
  std::shared_ptr<CommLedger> ledger;
  std::unique_ptr<EvidenceDir> dir;  // made once rank 0 found the case directory free
  std::optional<session_internal::WriterLock> lock;  // rank 0's, for the session's life
  std::vector<Param> params;
  bool described = false, probed_initial = false;
  torch::optim::Optimizer* optimizer = nullptr;
  // The step in flight, and the last hook called in it (the order of the seed's hooks).
  enum class Hook { kNone, kBegin, kBackward, kClip, kOptimizer, kEnd };
  Hook last = Hook::kNone;
  int64_t step = -1;
  int64_t first_row = 0;
  size_t ledger_mark = 0;
  std::chrono::steady_clock::time_point started;
  std::map<std::string, std::vector<std::pair<int64_t, at::Tensor>>> rows;
  std::vector<std::string> order;
  std::map<std::string, Stats> activations, output_grads;
  double grad_norm = NAN;
  std::string input_hash;
  int64_t valid_tokens = 0;

  Impl(TrainerSessionOptions options, compat::Group g, c10::Device device)
      : o(std::move(options)), world_group(g), world(g, device) {}

  int rank() const { return world_group.rank(); }
  bool writer() const { return rank() == 0; }

  // Checks that `hook` of step `at_step` follows the hook before it, and records it.
  void advance(const char* hook, int64_t at_step, Hook expected_last, Hook now) {
    static const char* names[] = {"(none)", "begin_step", "after_backward_before_clip", "after_clip", "after_optimizer",
                                  "end_step"};
    MIH_CHECK(at_step == step, "TrainerSession::", hook, ": step ", at_step, " is not the step begun (", step, ")");
    MIH_CHECK(last == expected_last, "TrainerSession::", hook, "(", at_step, "): called after ",
              names[static_cast<int>(last)], "; the hooks of a step are begin_step, record_batch (per micro-batch), "
              "after_backward_before_clip, after_clip, after_optimizer, end_step, in this order, on every rank");
    last = now;
  }

  // The trainer's collectives completed since begin_step (this rank's ledger).
  std::vector<CommRecord> step_collectives() const {
    std::vector<CommRecord> out;
    if (!ledger) return out;
    const std::vector<CommRecord> done = ledger->completed();
    for (size_t i = ledger_mark; i < done.size(); ++i) {
      if (done[i].event == "end") out.push_back(done[i]);
    }
    return out;
  }

  void require_described(const char* hook) const {
    MIH_CHECK(described, "TrainerSession::", hook, ": call describe_parameters(table) first, once, after the model is "
              "built (the session cannot probe parameters it was not told about)");
  }

  void probe_parameters(const std::string& stage, int64_t at_step, bool gradients) {
    std::vector<std::pair<std::string, Stats>> stats;
    for (const Param& p : params) {
      Stats s;
      s.total = p.total;
      const at::Tensor t = gradients ? p.entry.local.grad() : p.entry.local;
      s.defined = t.defined() ? 1 : 0;
      if (t.defined() && p.counts) s.add(t, p.index);
      stats.emplace_back(p.entry.fqn, std::move(s));
    }
    json tensors = finish_stats(world, stats, true);
    if (writer()) dir->append_jsonl(layout::kProbes, {{"stage", stage}, {"step", at_step}, {"tensors", tensors}});
  }

  // Every rank's (box, digest) of each parameter or gradient, recorded by rank 0.
  json replica_records(bool gradients) {
    std::vector<session_internal::PieceDigest> mine;
    for (const Param& p : params) {
      const at::Tensor t = gradients ? p.entry.local.grad() : p.entry.local;
      session_internal::PieceDigest d{p.entry.fqn, p.box.str(), std::nullopt};
      if (t.defined()) d.sha256 = tensor_sha256(t);
      if (gradients) {
        d.grad_domain = p.entry.grad_reduce_axes;
        d.placements = placements_json(p.entry.placements, axes);
      }
      mine.push_back(std::move(d));
    }
    return world.replica_records(mine);
  }

  // The full tensor a piece belongs to, on every rank (each counted piece added once).
  at::Tensor full(const Param& p, const at::Tensor& piece) {
    at::Tensor whole = at::zeros(p.global, at::TensorOptions().dtype(at::kDouble));
    if (p.counts && piece.defined()) {
      at::Tensor view = whole;
      for (size_t d = 0; d < p.global.size(); ++d) {
        view = view.narrow(static_cast<int64_t>(d), p.box.offset[d], p.box.length[d]);
      }
      view.copy_(piece.detach().to(at::kCPU, at::kDouble));
    }
    return world.all_reduce(whole, ReduceOp::kSum, "mih.session.checkpoint");
  }

  void write_identity(int64_t at_step) {
    // Every rank's rows, as bytes; only the ranks that count a row's copy (the first along
    // every axis whose ranks see the same rows) send it.
    const bool counts = counts_piece({}, axes, true);
    json mine = json::object();
    int64_t tokens = 0;
    for (const auto& [field, pieces] : rows) {
      json list = json::array();
      for (const auto& [first, t] : pieces) {
        const at::Tensor c = t.contiguous();
        if (field == "labels") tokens += c.ne(-100).sum().item<int64_t>();
        if (!counts) continue;
        const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
        static const char* hex = "0123456789abcdef";
        std::string text;
        text.reserve(static_cast<size_t>(c.numel() * c.element_size() * 2));
        for (int64_t i = 0; i < c.numel() * c.element_size(); ++i) {
          text.push_back(hex[bytes[i] >> 4]);
          text.push_back(hex[bytes[i] & 15]);
        }
        list.push_back({first, c.size(0), std::move(text)});
      }
      mine[field] = std::move(list);
    }
    const std::vector<json> every = world.all_gather_json({{"rows", counts ? mine : json::object()},
                                                           {"tokens", counts ? tokens : 0}}, "mih.session.identity");
    std::map<std::string, std::vector<std::pair<int64_t, std::pair<int64_t, std::string>>>> fields;
    valid_tokens = 0;
    for (const json& r : every) {
      valid_tokens += r.at("tokens").get<int64_t>();
      for (const auto& [field, list] : r.at("rows").items()) {
        for (const json& piece : list) {
          fields[field].push_back({piece[0].get<int64_t>(), {piece[1].get<int64_t>(), piece[2].get<std::string>()}});
        }
      }
    }
    json hashes = json::object();
    int64_t total_rows = 0;
    for (auto& [field, pieces] : fields) {
      std::sort(pieces.begin(), pieces.end());
      Sha256 h;
      int64_t field_rows = 0;
      for (const auto& [first, rest] : pieces) {
        MIH_CHECK(first == field_rows, "TrainerSession::record_batch: step ", at_step, " field '", field,
                  "': the ranks' rows do not tile the global batch (a piece starts at row ", first, ", expected row ",
                  field_rows, "): pass each rank's first global row");
        const std::string& text = rest.second;
        std::string raw(text.size() / 2, '\0');
        auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
        for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<char>(nibble(text[2 * i]) * 16 + nibble(text[2 * i + 1]));
        h.update(raw);
        field_rows += rest.first;
      }
      hashes[field] = h.hex_digest();
      total_rows = std::max(total_rows, field_rows);
    }
    Sha256 global;
    for (const auto& [field, digest] : hashes.items()) {
      global.update(field).update("\0", 1).update(digest.get<std::string>()).update("\0", 1);
    }
    input_hash = global.hex_digest();
    if (writer()) {
      dir->append_jsonl(layout::kInputIdentity,
                       {{"step", at_step}, {"global", input_hash}, {"fields", hashes}, {"rows", total_rows}});
    }
  }

  void write_activations(int64_t at_step) {
    for (const auto& [stage, table] : {std::pair<const char*, std::map<std::string, Stats>*>{"forward_output", &activations},
                                       {"output_grad", &output_grads}}) {
      std::vector<std::pair<std::string, Stats>> stats;
      for (const std::string& name : order) {
        auto it = table->find(name);
        stats.emplace_back(name, it == table->end() ? Stats{} : it->second);
      }
      if (stats.empty()) continue;
      json tensors = finish_stats(world, stats, false);
      if (writer()) {
        dir->append_jsonl(layout::kProbes, {{"stage", stage}, {"step", at_step}, {"order", order}, {"tensors", tensors}});
      }
    }
  }
};

TrainerSession::TrainerSession(TrainerSessionOptions options, const c10::intrusive_ptr<compat::C10dBackend>& world) {
  MIH_CHECK(world, "TrainerSession: the world process group is null; pass the trainer's group of every rank");
  std::vector<int> ranks(static_cast<size_t>(world->getSize()));
  std::iota(ranks.begin(), ranks.end(), 0);
  MIH_CHECK(!options.case_dir.empty() && !options.case_name.empty(),
            "TrainerSession: set case_dir (<root>/<spec>/<case>) and case_name");
  MIH_CHECK(options.case_dir.filename() == options.case_name ||
                (options.case_dir.filename() == layout::kBeforeSave &&
                 options.case_dir.parent_path().filename() == options.case_name),
            "TrainerSession: case_dir ", options.case_dir.string(), " must end in the case's name '", options.case_name,
            "' (or <case>/", layout::kBeforeSave, " for a resume's save phase): mih check reads a case where it is named");
  MIH_CHECK(options.compare_to.find_first_of("/\\") == std::string::npos && options.compare_to != options.case_name,
            "TrainerSession: compare_to '", options.compare_to, "' must be another case's name (a sibling directory)");
  MIH_CHECK(options.loss_scale > 0 && std::isfinite(options.loss_scale), "TrainerSession: loss_scale ",
            options.loss_scale, " must be positive");
  compat::Group group = compat::adopt_group(world, "world", ranks);
  const c10::Device device = collective_device_of(group.backend(), options.collective_device);
  impl_ = std::make_unique<Impl>(std::move(options), std::move(group), device);
  // Nothing is overwritten or appended to: every rank learns whether rank 0 found files there
  // (a load phase's case directory holds its save phase's before_save/ only).
  at::Tensor taken = at::zeros({1}, at::kLong);
  std::string found;
  if (impl_->writer()) {
    std::error_code ec;
    found = session_internal::earlier_file(impl_->o.case_dir);
    taken[0] = found.empty() ? 0 : 1;
    // A directory rank 0 cannot create fails every rank here, not the others at a later collective.
    if (found.empty() && !fs::create_directories(impl_->o.case_dir, ec) && ec) {
      taken[0] = 2;
      found = ec.message();
    }
    // Looked at again under the lock: another writer may have found it free too (issue 53).
    try {
      if (taken[0].item<int64_t>() == 0) impl_->lock.emplace(impl_->o.case_dir);
      if (impl_->lock && !(found = session_internal::earlier_file(impl_->o.case_dir)).empty()) taken[0] = 1;
    } catch (const Error& e) {
      taken[0] = 3;
      found = e.what();
    }
  }
  if (impl_->writer() && taken[0].item<int64_t>() == 1) found += session_internal::held_by(impl_->o.case_dir);
  taken = impl_->world.all_reduce(taken, ReduceOp::kSum, "mih.session.start");
  MIH_CHECK_CODE(taken[0].item<int64_t>() != 2, Code::kFailedPrecondition, "TrainerSession: rank 0 cannot create ",
                 impl_->o.case_dir.string(), found.empty() ? "" : " (" + found + ")");
  MIH_CHECK_CODE(taken[0].item<int64_t>() != 3, Code::kFailedPrecondition,
                 found.empty() ? "TrainerSession: rank 0 found " + impl_->o.case_dir.string() +
                                     " locked by another writer (" + session_internal::kWriterLock + ")"
                               : found);
  MIH_CHECK_CODE(taken[0].item<int64_t>() == 0, Code::kFailedPrecondition, "TrainerSession: ",
                 impl_->o.case_dir.string(), " holds files already", found.empty() ? "" : " (" + found + ")",
                 ": write each run to a new case directory (nothing is overwritten)");
  // Only now: an EvidenceDir probes that its directory is writable with a file of its own,
  // which rank 0's look for files above would have seen.
  impl_->dir = std::make_unique<EvidenceDir>(impl_->o.case_dir);
  if (impl_->lock) impl_->lock->name_holder();
}

TrainerSession::~TrainerSession() = default;
int TrainerSession::rank() const { return impl_->rank(); }
int TrainerSession::world_size() const { return impl_->world_group.size(); }
c10::Device TrainerSession::collective_device() const { return impl_->world.device(); }

Communicator TrainerSession::axis(const std::string& axis, const c10::intrusive_ptr<compat::C10dBackend>& group,
                                  const std::vector<int>& global_ranks) {
  MIH_CHECK(known_axes().count(axis), "TrainerSession::axis: '", axis, "' is not a mesh axis mih knows (dp_replicate, "
            "dp_shard, cp, tp, ep)");
  MIH_CHECK(!impl_->described, "TrainerSession::axis('", axis, "'): register every axis before describe_parameters");
  MIH_CHECK(!impl_->axes.count(axis), "TrainerSession::axis: '", axis, "' is registered already");
  compat::Group g = compat::adopt_group(group, axis, global_ranks);
  MIH_CHECK(g.ranks()[static_cast<size_t>(g.rank())] == impl_->rank(), "TrainerSession::axis('", axis,
            "'): global_ranks[", g.rank(), "] is ", g.ranks()[static_cast<size_t>(g.rank())], " but this process is "
            "world rank ", impl_->rank(), ": list the members' world ranks in the group's rank order");
  if (!impl_->ledger) {
    impl_->ledger = std::make_shared<CommLedger>(impl_->o.case_dir / layout::run_phase_dir("train") /
                                                 layout::ledger_rank(impl_->rank()));
  }
  impl_->axes[axis] = {g.size(), g.rank(), is_data_axis(axis)};
  return Communicator(axis, g, impl_->ledger);
}

void TrainerSession::describe_parameters(std::vector<ParameterEntry> table) {
  Impl& s = *impl_;
  MIH_CHECK(!s.described, "TrainerSession::describe_parameters: called twice; describe the parameters once");
  MIH_CHECK(!table.empty(), "TrainerSession::describe_parameters: the table is empty");
  std::set<std::string> seen;
  int64_t elements = 0;
  for (ParameterEntry& e : table) {
    MIH_CHECK(!e.fqn.empty() && seen.insert(e.fqn).second, "TrainerSession::describe_parameters: FQN '", e.fqn,
              "' is empty or repeated");
    MIH_CHECK(e.local.defined(), "parameter '", e.fqn, "': its local tensor is undefined");
    check_parameter_device(s.world.device(), s.o.collective_device.has_value(), e.local.device(), e.fqn);
    for (const AxisPlacement& p : e.placements) {
      MIH_CHECK(known_axes().count(p.axis), "parameter '", e.fqn, "': placement over unknown axis '", p.axis, "'");
    }
    for (const std::string& a : e.grad_reduce_axes) {
      MIH_CHECK(known_axes().count(a), "parameter '", e.fqn, "': gradient reduced over unknown axis '", a, "'");
    }
    Param p;
    p.global = e.global_shape.empty() ? e.local.sizes().vec() : e.global_shape;
    p.box = piece_box(p.global, e.placements, s.axes, "parameter '" + e.fqn + "'");
    MIH_CHECK(e.local.sizes().vec() == p.box.length, "parameter '", e.fqn, "': the local tensor is ",
              e.local.sizes(), " but its placements cut the global ", at::IntArrayRef(p.global), " into ",
              at::IntArrayRef(p.box.length), " on this rank (", p.box.str(), "): fix global_shape or placements "
              "(Shard cuts as torch.chunk does)");
    p.index = global_index(p.global, p.box);
    p.counts = counts_piece(e.placements, s.axes, false);
    const int64_t numel = std::accumulate(p.global.begin(), p.global.end(), int64_t{1}, std::multiplies<>());
    p.total = numel <= s.o.values_up_to ? numel : -1;
    elements += numel;
    p.entry = std::move(e);
    s.params.push_back(std::move(p));
  }
  // Every rank describes the same table (the probes sum its entries in this order over the
  // world): FQNs, global shapes and placements, rank 0's against each rank's.
  json mine = json::array();
  for (const Param& p : s.params) {
    json placements = json::array();
    for (const AxisPlacement& a : p.entry.placements) placements.push_back(a.axis + "=" + a.str());
    mine.push_back({p.entry.fqn, p.global, placements, p.entry.grad_reduce_axes});
  }
  const std::vector<json> every = s.world.all_gather_json(mine, "mih.session.parameters");
  for (size_t r = 1; r < every.size(); ++r) {
    if (every[r] == every[0]) continue;
    std::string first;
    for (size_t i = 0; i < std::max(every[0].size(), every[r].size()) && first.empty(); ++i) {
      if (i >= every[0].size() || i >= every[r].size() || every[0][i] != every[r][i]) {
        first = "entry " + std::to_string(i) + ": rank 0 " + (i < every[0].size() ? every[0][i].dump() : "none") +
                ", rank " + std::to_string(r) + " " + (i < every[r].size() ? every[r][i].dump() : "none");
      }
    }
    MIH_CHECK(false, "TrainerSession::describe_parameters: rank ", r, " describes another parameter table than rank 0 (",
              first.substr(0, 400), "): every rank passes the same FQNs, global shapes, placements and reduction axes, "
              "in one order");
  }
  s.described = true;
  if (!s.writer()) return;
  json degrees = {{"pp", 1}, {"dp_replicate", 1}, {"dp_shard", 1}, {"cp", 1}, {"tp", 1}, {"ep", 1}};
  for (const auto& [name, a] : s.axes) degrees[name] = a.size;
  const at::ScalarType type = s.params.front().entry.local.scalar_type();
  const std::string dtype = type == at::kDouble ? "float64" : type == at::kBFloat16 ? "bfloat16"
                            : type == at::kHalf  ? "float16" : "float32";
  json config = degrees;
  config.update({{"cp_layout", "contiguous"}, {"sequence_parallel", false}, {"activation_checkpointing", false},
                 {"micro_batches", 1}, {"vpp", 1}, {"pp_schedule", "1f1b"}, {"noise_twin", false}, {"dtype", dtype},
                 {"seed", 0}, {"name", s.o.case_name}});
  const json c = {{"name", s.o.case_name}, {"kind", s.o.compare_to.empty() ? "reference" : "train"},
                  {"group", s.o.compare_to.empty() ? "reference" : "axis"}, {"config", config},
                  {"steps", s.o.steps}, {"compare_to", s.o.compare_to},
                  {"device", s.params.front().entry.local.is_cuda() ? "cuda" : "cpu"},
                  {"pg_backend", std::string(compat::backend_name(s.world_group.backend()))},
                  {"world_size", s.world_group.size()}};
  const std::string writer = "mih-trainer-session " + std::string(harness_version()) + " (" + s.o.trainer + ")";
  s.dir->write_json(layout::kEnvironment, {{contract::kStampKey, contract::stamp(writer)}, {"case", c},
                                          {"world_size", s.world_group.size()},
                                          {"versions", {{"torch", compat::torch_version()},
                                                        {"mih_trainer_session", std::string(harness_version())}}}});
  s.dir->write_json(layout::kConfigResolved, config);
  json rows = json::array(), watch = json::array();
  for (const Param& p : s.params) {
    json row = {{"fqn", p.entry.fqn}, {"global_shape", p.global}, {"local_shape", p.box.length},
                {"dtype", dtype}, {"requires_grad", p.entry.local.requires_grad()},
                {"placements", placements_json(p.entry.placements, s.axes)}, {"gradient_kind", "DENSE"},
                {"grad_domain", p.entry.grad_reduce_axes}};
    if (!p.entry.fsdp_unit.empty()) row["fsdp_unit"] = p.entry.fsdp_unit;
    rows.push_back(std::move(row));
    watch.push_back({{"fqn", p.entry.fqn}, {"global_shape", p.global},
                     {"reason", "whole model (" + std::to_string(elements) + " elements)"}});
  }
  s.dir->write_json(layout::kStructure, {{"parameters", rows}});
  s.dir->write_json(layout::kParameterWatchlist, watch);
}

void TrainerSession::attach_optimizer(torch::optim::Optimizer& optimizer) {
  impl_->require_described("attach_optimizer");
  MIH_CHECK(!optimizer.param_groups().empty(), "TrainerSession::attach_optimizer: the optimizer has no parameters");
  impl_->optimizer = &optimizer;
}

void TrainerSession::begin_step(int64_t step) {
  Impl& s = *impl_;
  s.require_described("begin_step");
  MIH_CHECK(step >= 0 && step > s.step, "TrainerSession::begin_step(", step, "): steps must increase (the last was ",
            s.step, ")");
  MIH_CHECK(s.last == Impl::Hook::kNone || s.last == Impl::Hook::kEnd, "TrainerSession::begin_step(", step,
            "): step ", s.step, " did not reach end_step");
  s.step = step;
  s.last = Impl::Hook::kBegin;
  s.first_row = 0;
  s.rows.clear();
  s.activations.clear();
  s.output_grads.clear();
  s.grad_norm = NAN;
  s.ledger_mark = s.ledger ? s.ledger->completed().size() : 0;
  // The parameters the first step starts from (after a checkpoint's load for a resumed run).
  if (!s.probed_initial) s.probe_parameters("model_before", step, false);
  s.probed_initial = true;
  s.started = std::chrono::steady_clock::now();
}

void TrainerSession::record_batch(int64_t step, int micro_batch, int64_t first_row,
                                  const std::map<std::string, at::Tensor>& batch) {
  Impl& s = *impl_;
  MIH_CHECK(step == s.step && s.last == Impl::Hook::kBegin, "TrainerSession::record_batch: step ", step,
            " is not a step begun and not yet past its backward (step ", s.step, ")");
  MIH_CHECK(micro_batch >= 0 && first_row >= 0, "TrainerSession::record_batch: micro_batch and first_row must be >= 0");
  s.first_row = first_row;
  for (const auto& [field, t] : batch) {
    MIH_CHECK(t.defined() && t.dim() >= 1, "TrainerSession::record_batch: field '", field, "' is not a [b, ...] tensor");
    s.rows[field].emplace_back(first_row, t.detach().to(at::kCPU).clone());
  }
}

at::Tensor TrainerSession::mark_output(const std::string& module, const at::Tensor& output,
                                       const std::vector<AxisPlacement>& placements) {
  Impl& s = *impl_;
  if (!output.defined() || !at::GradMode::is_enabled() || s.step < 0) return output;
  MIH_CHECK(output.dim() >= 1, "TrainerSession::mark_output('", module, "'): the output has no row dim");
  std::vector<int64_t> global = output.sizes().vec();
  for (const AxisPlacement& p : placements) {
    MIH_CHECK(known_axes().count(p.axis) && (!p.shard || (p.dim >= 1 && p.dim < output.dim())),
              "TrainerSession::mark_output('", module, "'): placement ", p.str(), " over '", p.axis, "' must shard a "
              "dim after the rows (dim 0 is this rank's rows) over a mesh axis mih knows");
    const auto it = s.axes.find(p.axis);
    if (p.shard && it != s.axes.end()) global[static_cast<size_t>(p.dim)] *= it->second.size;
  }
  global[0] = s.first_row + output.size(0);
  Box box = piece_box(global, placements, s.axes, "output of '" + module + "'");
  box.offset[0] = s.first_row;
  box.length[0] = output.size(0);
  MIH_CHECK(box.length == output.sizes().vec(), "TrainerSession::mark_output('", module, "'): ", output.sizes(),
            " is not an even share of ", at::IntArrayRef(global), " under its placements");
  const at::Tensor index = global_index(global, box);
  const bool counts = counts_piece(placements, s.axes, true);
  if (std::find(s.order.begin(), s.order.end(), module) == s.order.end()) s.order.push_back(module);
  if (counts) s.activations[module].add(output, index);
  if (counts && output.requires_grad()) {
    Impl* self = &s;
    const double scale = s.o.loss_scale;
    output.register_hook([self, module, index, scale](const at::Tensor& grad) {
      self->output_grads[module].add(grad / scale, index);
    });
  }
  return output;
}

void TrainerSession::after_backward_before_clip(int64_t step) {
  Impl& s = *impl_;
  MIH_CHECK(!s.rows.empty(), "TrainerSession::after_backward_before_clip(", step, "): no record_batch in this step: "
            "record each micro-batch's rows before its forward");
  s.advance("after_backward_before_clip", step, Impl::Hook::kBegin, Impl::Hook::kBackward);
  s.write_identity(step);
  s.probe_parameters("grad_before_clip", step, true);
  s.write_activations(step);
  json grads = s.replica_records(true);
  // What this rank's reducing collectives moved per axis since begin_step (GradientSync's
  // lower bound: at least the bytes of the gradient pieces declared reduced over the axis).
  json reductions = json::object();
  for (const auto& [name, axis] : s.axes) reductions[name] = int64_t{0};
  for (const CommRecord& r : s.step_collectives()) {
    if (r.op.rfind("all_reduce", 0) == 0 || r.op.rfind("reduce_scatter", 0) == 0) {
      reductions[r.axis] = reductions.value(r.axis, int64_t{0}) + r.bytes;
    }
  }
  if (s.writer()) {
    s.dir->write_json(layout::gradient_replicas_step(step),
                     {{"step", step}, {"reductions", reductions}, {"parameters", grads}});
  }
}

void TrainerSession::after_clip(int64_t step, double grad_norm) {
  Impl& s = *impl_;
  s.advance("after_clip", step, Impl::Hook::kBackward, Impl::Hook::kClip);
  s.grad_norm = grad_norm;
  s.probe_parameters("grad_after_clip", step, true);
}

void TrainerSession::after_optimizer(int64_t step) {
  Impl& s = *impl_;
  s.advance("after_optimizer", step, Impl::Hook::kClip, Impl::Hook::kOptimizer);
  s.probe_parameters("after_optimizer", step, false);
  json params = s.replica_records(false);
  if (s.writer()) s.dir->write_json(layout::replicas_step(step), {{"step", step}, {"parameters", params}});
}

void TrainerSession::end_step(int64_t step, double loss) {
  Impl& s = *impl_;
  s.advance("end_step", step, Impl::Hook::kOptimizer, Impl::Hook::kEnd);
  MIH_CHECK(s.optimizer, "TrainerSession::end_step: call attach_optimizer(optimizer) first");
  // The gradient norm after clipping, over every piece counted once.
  at::Tensor sq = at::zeros({1}, at::kDouble);
  for (const Param& p : s.params) {
    const at::Tensor g = p.entry.local.grad();
    if (p.counts && g.defined()) sq += g.detach().to(at::kCPU, at::kDouble).pow(2).sum();
  }
  sq = s.world.all_reduce(sq, ReduceOp::kSum, "mih.session.grad_norm");
  json comm_bytes = json::object(), comm_sites = json::object();
  for (const CommRecord& r : s.step_collectives()) {
    const std::string site = r.site.substr(0, r.site.find(" @"));
    comm_bytes[r.axis] = comm_bytes.value(r.axis, int64_t{0}) + r.bytes;
    if (!comm_sites.contains(r.axis)) comm_sites[r.axis] = json::object();
    comm_sites[r.axis][site] = comm_sites[r.axis].value(site, int64_t{0}) + r.bytes;
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.started).count();
  s.dir->append_jsonl(layout::performance_rank(s.rank()), {{"step", step}, {"step_ms", ms}});
  double lr = NAN;
  try {
    lr = s.optimizer->param_groups().front().options().get_lr();
  } catch (const std::exception& e) {
    MIH_CHECK(false, "TrainerSession::end_step: the optimizer's options give no learning rate (get_lr: ",
              std::string(e.what()).substr(0, 200), "); an optimizer of your own must implement OptimizerOptions::get_lr");
  }
  if (s.writer()) {
    json row = {{"step", step}, {"loss", std::isfinite(loss) ? json(loss) : json()},
                {"grad_norm_pre_clip", std::isfinite(s.grad_norm) ? json(s.grad_norm) : json()},
                {"grad_norm_post_clip", std::sqrt(sq[0].item<double>())}, {"lr", lr}, {"input_hash", s.input_hash},
                {"valid_tokens", s.valid_tokens}, {"comm_bytes", comm_bytes}, {"comm_sites", comm_sites}, {"step_ms", ms}};
    if (!std::isfinite(row["grad_norm_post_clip"].get<double>())) row["grad_norm_post_clip"] = nullptr;
    s.dir->append_jsonl(layout::kMetrics, row);
  }
}

void TrainerSession::capture_checkpoint_payload(const std::string& event, int64_t next_step) {
  Impl& s = *impl_;
  s.require_described("capture_checkpoint_payload");
  MIH_CHECK(event == "save" || event == "load", "TrainerSession::capture_checkpoint_payload: event '", event,
            "' is neither save nor load");
  MIH_CHECK(next_step >= 0, "TrainerSession::capture_checkpoint_payload: next_step must be >= 0");
  const bool nested = s.o.case_dir.filename() == layout::kBeforeSave;
  MIH_CHECK(nested == (event == "save"), "TrainerSession::capture_checkpoint_payload('", event, "'): the save is "
            "captured by the save phase's run, whose case_dir is <case>/", layout::kBeforeSave, ", the load by the load "
            "phase's, whose case_dir is <case>; this session's is ", s.o.case_dir.string());
  // The state of an optimizer compat reads (AdamW, Adam, SGD); another one's is not recorded.
  const std::vector<std::string> states =
      compat::state_readable(*s.optimizer) ? compat::state_names(*s.optimizer) : std::vector<std::string>{};
  json tensors = json::object();
  auto record = [&](const std::string& name, const at::Tensor& whole) {
    tensors[name] = {{"sha256", tensor_sha256(whole)}, {"shape", whole.sizes().vec()}};
  };
  for (const Param& p : s.params) {
    record(p.entry.fqn, s.full(p, p.entry.local));
    if (!p.entry.local.requires_grad()) continue;
    for (const std::string& name : states) {
      record(p.entry.fqn + "/" + name, s.full(p, compat::optimizer_state(*s.optimizer, p.entry.local, name)));
    }
  }
  if (!s.writer()) return;
  const std::string file = event == "save" ? layout::kRoundtripSave : layout::kRoundtripLoad;
  s.dir->write_json(file, {{"tensors", tensors}, {"next_step", next_step}});
}

void TrainerSession::finish() { impl_->world.barrier("mih.session.finish"); }

}  // namespace mih
