// The checks of the built model: structure, optimizer layout, checkpoint coverage, state
// invariants (see checks.h).
#include <fnmatch.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include "harness/base/error.h"
#include "harness/findings/codes.h"
#include "harness/checks/checks.h"
#include "harness/compat/optim.h"
#include "harness/runtime/dtypes.h"

namespace mih::checks {
namespace {

using nlohmann::json;

Finding error(std::string code, std::string phase, std::string owner, std::string message, json facts,
              std::string why_unsafe, std::string remediation) {
  return Finding{std::move(code),  std::move(phase),      std::move(owner),      Severity::kError,
                 std::move(message), std::move(facts), std::move(why_unsafe), std::move(remediation)};
}

std::string owner_module(const std::string& fqn) {
  const auto dot = fqn.rfind('.');
  return dot == std::string::npos ? "" : fqn.substr(0, dot);
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "x" : "") << shape[i];
  return os.str() + ']';
}

std::string placements_str(const ShardedParameter& p) {
  std::vector<std::string> parts;
  for (const auto& [axis, placement] : p.placements()) parts.push_back(axis + "=" + placement.str());
  return join(parts, " ");
}

// What the placements say the local shape must be, or "" when it is.
std::string shape_inconsistency(const ShardedParameter& p, int64_t tp) {
  const size_t rank = p.global_shape.size();
  if (p.local.sizes().vec() != p.local_shape) {
    return "the registered tensor is " + shape_str(p.local.sizes().vec()) + " but the table says " + shape_str(p.local_shape);
  }
  if (p.padded_shape.size() != rank || p.tp_local_shape.size() != rank || p.local_shape.size() != rank) {
    return "global, padded, tp-local and local shapes have different ranks";
  }
  for (size_t d = 0; d < rank; ++d) {
    if (p.padded_shape[d] < p.global_shape[d] || (d > 0 && p.padded_shape[d] != p.global_shape[d])) {
      return "padded shape " + shape_str(p.padded_shape) + " does not extend global " + shape_str(p.global_shape) +
             " on dim 0 only";
    }
    const bool sharded = p.tp.is_shard() && static_cast<size_t>(p.tp.dim()) == d;
    int64_t expected = sharded ? p.padded_shape[d] / tp : p.padded_shape[d];
    if (d == 0 && p.expert_parallel()) expected /= p.mesh.ep;  // this ep rank's experts
    if (p.tp_local_shape[d] != expected || (sharded && p.padded_shape[d] % tp != 0)) {
      return "tp piece " + shape_str(p.tp_local_shape) + " is not " + p.tp.str() + " of " + shape_str(p.padded_shape) +
             " over tp=" + std::to_string(tp);
    }
    const int64_t local = (p.fsdp && d == 0) ? p.fsdp_range.size : p.tp_local_shape[d];
    if (p.local_shape[d] != local) {
      return "local shape " + shape_str(p.local_shape) + " is not " + (p.fsdp ? "the FSDP rows of " : "") +
             "the tp piece " + shape_str(p.tp_local_shape);
    }
  }
  return "";
}

bool all_finite(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0 || !at::isFloatingType(t.scalar_type())) return true;
  return at::isfinite(t.detach()).all().item<bool>();
}

// Whether a glob of `patterns` matches the parameter's FQN or one of its aliases.
bool named_by_any(const std::vector<std::string>& patterns, const ShardedParameter& p) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& pat) {
    if (::fnmatch(pat.c_str(), p.fqn.c_str(), 0) == 0) return true;
    return std::any_of(p.aliases.begin(), p.aliases.end(),
                       [&](const std::string& a) { return ::fnmatch(pat.c_str(), a.c_str(), 0) == 0; });
  });
}

const ShardedParameter* find_parameter(const ParallelContext& ctx, const std::string& fqn) {
  for (const auto& p : ctx.parameters()) {
    if (p->fqn == fqn || std::find(p->aliases.begin(), p->aliases.end(), fqn) != p->aliases.end()) return p.get();
  }
  return nullptr;
}

}  // namespace

bool glob_match(const std::string& pattern, const std::string& name) {
  return ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

std::vector<UndeclaredAlias> undeclared_aliases(const ParallelContext& ctx,
                                                const std::vector<std::pair<std::string, std::string>>& tied) {
  // An alias is declared when a tied pair joins it to another name of the same tensor (in
  // either order): a chain of pairs (a = b, b = c) declares a tensor of three names. Names
  // compare exactly, as the tie's own check (MIH-STRUCT-004) finds them: a glob pair
  // ("layers.*.q_norm.weight", "layers.*.k_norm.weight") would also declare layer 1's q_norm
  // an alias of layer 0's k_norm.
  auto joins = [&](const std::string& x, const std::string& y) {
    return std::any_of(tied.begin(), tied.end(), [&](const auto& pair) {
      return (pair.first == x && pair.second == y) || (pair.first == y && pair.second == x);
    });
  };
  std::vector<UndeclaredAlias> out;
  for (const auto& p : ctx.parameters()) {
    std::vector<std::string> names = {p->fqn};
    names.insert(names.end(), p->aliases.begin(), p->aliases.end());
    for (const auto& alias : p->aliases) {
      const bool declared = std::any_of(names.begin(), names.end(),
                                        [&](const std::string& other) { return other != alias && joins(other, alias); });
      if (!declared) out.push_back({p->fqn, alias});
    }
  }
  return out;
}

CheckOutput check_loaded_values(const ParallelContext& ctx, const std::string& weights) {
  CheckOutput out;
  json non_finite = json::array();
  for (const auto& p : ctx.parameters()) {
    if (all_finite(p->local)) continue;
    const int64_t count = p->local.numel() - at::isfinite(p->local.detach()).sum().item<int64_t>();
    non_finite.push_back(p->fqn);
    out.findings.add(error(codes::kStructNonFinite, "materialization", p->fqn,
                           "parameter holds " + std::to_string(count) + " NaN or Inf element(s) in the weights of " +
                               weights,
                           {{"weights", weights}, {"non_finite_elements", count}},
                           "a corrupted weight poisons every later step",
                           "fix the checkpoint (a NaN or an overflow of its conversion) or the load"));
  }
  out.evidence = {{"weights", weights}, {"parameters", ctx.parameters().size()}, {"non_finite", non_finite}};
  return out;
}

namespace {

// Every parameter's row (owner, device, whether it trains), each checked: its local shape
// against its placements, its dtype and device against the run's, its values finite.
json checked_parameters(const ParallelContext& ctx, FindingReport& findings) {
  const int64_t tp = ctx.tp_size();
  json params = json::array();
  for (const auto& p : ctx.parameters()) {
    json row = *p;
    row["owner"] = owner_module(p->fqn);
    row["device"] = p->local.device().str();
    row["requires_grad"] = p->local.requires_grad();
    params.push_back(row);
    if (const std::string why = shape_inconsistency(*p, tp); !why.empty()) {
      findings.add(error(codes::kStructLocalShape, "structure", p->fqn, "local shape inconsistent with placements: " + why,
                         row, "each rank would compute with, save and load a different piece than its placements say",
                         "make the layer's ParamSpec (shape, tp placement, padding) match how it shards the tensor"));
    }
    if (p->local.scalar_type() != ctx.param_dtype() || p->local.device() != ctx.device()) {
      findings.add(error(codes::kStructDtypeDevice, "structure", p->fqn,
                         "parameter is " + dtype_name(p->local.scalar_type()) + " on " + p->local.device().str() +
                             ", the run's parameters are " + dtype_name(ctx.param_dtype()) + " on " +
                             ctx.device().str(),
                         row, "mixed master-weight dtypes or devices change numerics and break collectives",
                         "create the parameter through ParallelContext::make_parameter and do not cast it afterwards"));
    }
    if (!all_finite(p->local)) {
      findings.add(error(codes::kStructNonFinite, "materialization", p->fqn, "parameter holds NaN or Inf after initialization",
                         row, "an uninitialized or corrupted parameter poisons every later step",
                         "initialize every parameter (ParamSpec::init) and check any custom materialization"));
    }
  }
  return params;
}

// Every buffer's row, each checked finite.
json checked_buffers(const ParallelContext& ctx, FindingReport& findings) {
  json buffers = json::array();
  for (const auto& b : ctx.buffers()) {
    buffers.push_back({{"fqn", b.fqn},
                       {"shape", b.tensor.sizes().vec()},
                       {"dtype", dtype_name(b.tensor.scalar_type())},
                       {"persistent", b.persistent}});
    if (!all_finite(b.tensor)) {
      findings.add(error(codes::kStructNonFinite, "materialization", b.fqn, "buffer holds NaN or Inf", buffers.back(),
                         "an uninitialized buffer (a rotary table left empty) silently corrupts the forward",
                         "compute the buffer at construction and mark it non-persistent if it is derived"));
    }
  }
  return buffers;
}

// The declared ties are one tensor each, and one tensor under two names is a declared tie: a
// module registered twice or a layer reused by mistake trains one tensor where the original has
// two (the structure check's run covers it: every parameter's names are examined).
void check_ties(const ParallelContext& ctx, const spec::ModelSpec& spec, FindingReport& findings) {
  for (const auto& [a, b] : spec.checkpoint.tied) {
    const ShardedParameter* pa = find_parameter(ctx, a);
    const ShardedParameter* pb = find_parameter(ctx, b);
    if (pa == nullptr || pb == nullptr || pa != pb) {
      findings.add(error(codes::kStructTie, "structure", a,
                         "'" + a + "' and '" + b + "' are declared tied but are " +
                             (pa && pb ? "two parameters" : "not both parameters of the model"),
                         {{"tied", {a, b}}, {"found", {pa != nullptr, pb != nullptr}}},
                         "untied copies train apart: the head and the embedding diverge and the checkpoint "
                         "holds two tensors where the model expects one",
                         "register the same tensor in both modules after sharding (tie after fully_shard)"));
    }
  }
  for (const UndeclaredAlias& a : undeclared_aliases(ctx, spec.checkpoint.tied)) {
    findings.add(error(codes::kStructAliasUndeclared, "structure", a.fqn,
                       "'" + a.fqn + "' and '" + a.alias + "' name the same tensor (one parameter registered under "
                       "both names), but the spec does not declare them tied (checkpoint.tied)",
                       {{"aliases", {a.fqn, a.alias}}, {"declared_tied", spec.checkpoint.tied}},
                       "one tensor trains where the original has two: the gradients of both uses add into it, the "
                       "optimizer steps it once, and an export writes one key for both names",
                       "give '" + a.alias + "' its own parameter (build a second module instead of registering "
                       "the first twice); if the original ties them, declare {\"" + a.fqn + "\", \"" + a.alias +
                       "\"} in ModelSpec checkpoint.tied"));
  }
}

// FSDP units: every sharded parameter in exactly one declared unit; one dtype and mesh each.
// Returns the units' rows.
json checked_fsdp_units(const ParallelContext& ctx, FindingReport& findings) {
  const std::vector<std::string>& units = ctx.fsdp_units();
  json unit_json = json::object();
  for (const auto& u : units) unit_json[u] = {{"parameters", json::array()}, {"dtypes", json::array()}};
  int64_t fsdp_parameters = 0;
  for (const auto& p : ctx.parameters()) {
    if (!p->fsdp) continue;
    ++fsdp_parameters;
    if (p->unit.empty() || !unit_json.contains(p->unit)) {
      findings.add(error(codes::kStructFsdpUnit, "structure", p->fqn,
                         "parameter is sharded by FSDP but belongs to no declared unit ('" + p->unit + "')",
                         {{"units", units}},
                         "its gradient is reduce-scattered outside any unit's schedule",
                         "call fully_shard on a module that registers it"));
      continue;
    }
    json& u = unit_json[p->unit];
    u["parameters"].push_back(p->fqn);
    // The seed's HP-FSDP-005: routed experts under ep get their own unit, never the root's
    // (which is never resharded, and whose reduce-scatter runs over dp_shard).
    if (p->expert_parallel() && p->unit == ctx.root_unit()) {
      findings.add(error(codes::kStructExpertInRoot, "structure", p->fqn,
                         "expert parameter (sharded over ep, FSDP over edp) is in the root FSDP unit '" + p->unit + "'",
                         {{"unit", p->unit}, {"fsdp_axis", mesh_axis_name(p->fsdp_axis)}},
                         "the root unit's parameters stay gathered and are reduced with the dense ones: the "
                         "experts' gradients would be reduced over the dense gradient domain",
                         "fully_shard the experts module as a unit of its own before its layer and the root"));
    }
    // One unit, one flat reduce-scatter: one dtype, one mesh and one gradient domain (the
    // seed's HP-FSDP-004: never dense and expert parameters together).
    const std::string dt = dtype_name(p->local.scalar_type()) + "@" + p->mesh.mesh_str() + "/" + p->gradient_kind();
    if (std::find(u["dtypes"].begin(), u["dtypes"].end(), dt) == u["dtypes"].end()) u["dtypes"].push_back(dt);
  }
  for (auto& [name, u] : unit_json.items()) {
    if (u["dtypes"].size() > 1) {
      findings.add(error(codes::kStructUnitMixed, "structure", name,
                         "FSDP unit mixes dtypes, meshes or gradient domains (dtype@mesh/DENSE|EXPERT): " +
                             u["dtypes"].dump(),
                         u, "one flat reduce-scatter per unit cannot carry two dtypes or two gradient domains",
                         "split the unit so each holds one dtype, one mesh and one gradient domain (the routed "
                         "experts a unit of their own)"));
    }
  }
  findings.ran(codes::kCheckFsdpUnits, fsdp_parameters, "FSDP-sharded parameters");
  return unit_json;
}

}  // namespace

CheckOutput check_structure(const TrainingState& state, const spec::ModelSpec& spec) {
  const ParallelContext& ctx = *state.context;
  CheckOutput out;
  const json params = checked_parameters(ctx, out.findings);
  const json buffers = checked_buffers(ctx, out.findings);
  out.findings.ran(codes::kCheckStructure, static_cast<int64_t>(ctx.parameters().size()), "parameters");
  out.findings.ran(codes::kCheckTies, static_cast<int64_t>(spec.checkpoint.tied.size()), "declared tied pairs");
  check_ties(ctx, spec, out.findings);
  const json units = checked_fsdp_units(ctx, out.findings);
  out.evidence = {{"parameters", params}, {"buffers", buffers}, {"fsdp_units", units}};
  return out;
}

std::string parameter_ownership_csv(const ParallelContext& ctx) {
  std::string csv =
      "fqn,owner,aliases,gradient_kind,grad_domain,placements,global_shape,local_shape,dtype,device,fsdp_unit\n";
  // RFC 4180: a field holding a comma or a quote is quoted, its quotes doubled (a placement
  // "Shard(0, partitions=2|3)" has a comma), so every row has the header's 11 fields.
  auto field = [](const std::string& f) {
    if (f.find_first_of(",\"\n") == std::string::npos) return f;
    std::string q = "\"";
    for (char ch : f) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    return q + "\"";
  };
  for (const auto& p : ctx.parameters()) {
    csv += field(p->fqn) + "," + field(owner_module(p->fqn)) + "," + field(join(p->aliases, ";")) + "," +
           field(p->gradient_kind()) + "," + field(join(p->grad_domain(), ";")) + "," + field(placements_str(*p)) + "," +
           field(shape_str(p->global_shape)) + "," + field(shape_str(p->local_shape)) + "," +
           field(dtype_name(p->local.scalar_type())) + "," + field(p->local.device().str()) + "," + field(p->unit) + "\n";
  }
  return csv;
}

CheckOutput check_optimizer_layout(const TrainingState& state, const TrainerOptions& options, spec::Phase phase_id,
                                   const std::vector<std::string>& decayed_1d) {
  const std::string phase = spec::phase_name(phase_id);
  const ParallelContext& ctx = *state.context;
  torch::optim::Optimizer& optimizer = *state.optimizer;
  CheckOutput out;
  std::map<const void*, const ShardedParameter*> live;
  for (const auto& p : ctx.parameters()) live[p->local.unsafeGetTensorImpl()] = p.get();
  std::map<const void*, int> seen;
  json groups = json::array(), state_shapes = json::object();
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    auto& group = optimizer.param_groups()[g];
    const double wd = compat::weight_decay(group.options());
    json names = json::array();
    for (const at::Tensor& t : group.params()) {
      const auto it = live.find(t.unsafeGetTensorImpl());
      const json facts = {{"group", g}, {"shape", t.sizes().vec()}, {"requires_grad", t.requires_grad()}};
      if (it == live.end()) {
        names.push_back("<not a live parameter " + shape_str(t.sizes().vec()) + ">");
        out.findings.add(error(codes::kOptimNotLive, phase, "optimizer group " + std::to_string(g),
                               "holds a tensor of shape " + shape_str(t.sizes().vec()) +
                                   " that is not a live sharded parameter of the model",
                               facts, "the optimizer updates a tensor the model never reads: training silently stops",
                               "build the optimizer after sharding (fully_shard), over ParallelContext::parameters()"));
        continue;
      }
      const ShardedParameter& p = *it->second;
      names.push_back(p.fqn);
      if (++seen[t.unsafeGetTensorImpl()] == 2) {
        out.findings.add(error(codes::kOptimTwoGroups, phase, p.fqn, "parameter appears in more than one optimizer group or twice",
                               facts, "it is updated twice per step", "list every parameter once (tied aliases once)"));
      }
      if (!t.requires_grad()) {
        out.findings.add(error(codes::kOptimFrozen, phase, p.fqn, "frozen parameter (requires_grad false) in the optimizer",
                               facts, "weight decay still moves a parameter declared frozen",
                               "leave frozen parameters out of the optimizer groups"));
      }
      const bool no_decay = named_by_any(options.no_weight_decay(), p);
      const double expected = no_decay ? 0.0 : options.weight_decay();
      if (wd != expected) {
        out.findings.add(error(codes::kOptimWeightDecay, phase, p.fqn,
                               "weight decay " + std::to_string(wd) + ", declared " + std::to_string(expected) +
                                   (no_decay ? " (matches no_weight_decay)" : ""),
                               facts, "decaying norms and biases (or not decaying weights) changes the trained model",
                               "group the parameters by TrainerOptions::no_weight_decay"));
      }
      const bool decay_declared = named_by_any(decayed_1d, p);
      // A no-decay parameter that is decayed is MIH-OPTIM-005 (the groups against the options).
      if (wd > 0 && p.global_shape.size() == 1 && !no_decay && !decay_declared) {
        out.findings.add(error(codes::kOptimDecayOnNorm, phase, p.fqn,
                               "1-D parameter (a norm scale or a bias, shape " + shape_str(p.global_shape) +
                                   ") has weight decay " + std::to_string(wd) +
                                   ": its name matches none of the no-weight-decay patterns " +
                                   json(options.no_weight_decay()).dump(),
                               facts, "decay pulls a norm's scale towards 0 and a bias towards 0 every step",
                               "add its name pattern to the spec's trainer no_weight_decay (ModelSpec::trainer), or "
                               "declare it in ModelSpec::decayed_1d if the decay is intended"));
      }
      for (const std::string& m : compat::state_names(optimizer)) {
        const at::Tensor s = compat::optimizer_state(optimizer, t, m);
        if (s.defined()) state_shapes[p.fqn][m] = s.sizes().vec();  // judged from the file by any writer's rule
        if (s.defined() && s.sizes() != t.sizes()) {
          out.findings.add(error(codes::kOptimStateShape, phase, p.fqn,
                                 m + " has shape " + shape_str(s.sizes().vec()) + ", the local parameter " +
                                     shape_str(t.sizes().vec()),
                                 facts, "the update mixes elements of different positions (state not resharded)",
                                 "reshard optimizer state with the parameters when loading under another topology"));
        }
      }
    }
    groups.push_back({{"index", g}, {"lr", group.options().get_lr()}, {"weight_decay", wd}, {"parameters", names}});
  }
  for (const auto& p : ctx.parameters()) {
    if (p->local.requires_grad() && !seen.count(p->local.unsafeGetTensorImpl())) {
      out.findings.add(error(codes::kOptimMissing, phase, p->fqn, "trainable parameter is in no optimizer group",
                             {{"shape", p->local_shape}}, "it gets gradients but never changes",
                             "build the optimizer over every trainable ParallelContext parameter"));
    }
  }
  out.findings.ran(codes::kCheckOptimizer, static_cast<int64_t>(ctx.parameters().size()), "parameters");
  out.evidence = {{"phase", phase}, {"groups", groups}, {"state", state_shapes}};
  return out;
}

CheckOutput check_frozen_parameters(const TrainingState& state, const std::vector<std::string>& frozen,
                                    FrozenPoint point, int64_t step) {
  const char* where = point == FrozenPoint::kBuilt           ? "built"
                      : point == FrozenPoint::kAfterBackward ? "after_backward"
                                                             : "after_optimizer";
  const std::string phase = point == FrozenPoint::kBuilt ? "structure" : "runtime";
  const std::string at_step = point == FrozenPoint::kBuilt ? "" : " at step " + std::to_string(step);
  CheckOutput out;
  json declared = json::array();
  int64_t trainable = 0;
  for (const auto& p : state.context->parameters()) {
    const bool is_declared = named_by_any(frozen, *p);
    const bool requires_grad = p->local.requires_grad();
    const json facts = {{"point", where}, {"step", step}, {"requires_grad", requires_grad},
                        {"local_shape", p->local_shape}, {"declared_frozen", is_declared}};
    if (is_declared) declared.push_back(p->fqn);
    if (requires_grad) ++trainable;
    if (is_declared && requires_grad) {
      out.findings.add(error(codes::kFrozenTrainable, phase, p->fqn,
                             "declared frozen (ModelSpec::frozen) but requires_grad is true on this rank" + at_step, facts,
                             "the parameter gets gradients and optimizer updates the port says it must not",
                             "set requires_grad false on every rank after sharding (TrainerOptions::frozen does), or "
                             "remove it from ModelSpec::frozen"));
    }
    if (!is_declared && !requires_grad) {
      out.findings.add(error(codes::kFrozenUndeclared, phase, p->fqn,
                             "requires_grad is false on this rank" + at_step + " and no ModelSpec::frozen pattern names it",
                             facts, "a parameter silently not trained: the run is green and the model never learns it",
                             "declare it in ModelSpec::frozen if freezing is intended, else find what turned off its "
                             "requires_grad (a detach, a reload, a module built under no_grad)"));
    }
    if (!is_declared) continue;
    if (point == FrozenPoint::kAfterBackward && p->local.grad().defined()) {
      out.findings.add(error(codes::kFrozenGradient, phase, p->fqn,
                             "declared frozen and has a gradient after backward" + at_step +
                                 (p->local.grad().count_nonzero().item<int64_t>() == 0 ? " (all zeros: filled in, "
                                                                                           "not computed)"
                                                                                         : ""),
                             facts, "a frozen parameter's gradient costs memory and communication, and an optimizer "
                                    "that finds it updates the parameter",
                             "leave frozen parameters out of the backward and of the gradient synchronization"));
    }
    if (point == FrozenPoint::kAfterOptimizer && state.optimizer) {
      for (const std::string& m : compat::state_names(*state.optimizer)) {
        if (!compat::optimizer_state(*state.optimizer, p->local, m).defined()) continue;
        out.findings.add(error(codes::kFrozenOptimizerState, phase, p->fqn,
                               "declared frozen and has " + compat::optimizer_kind(*state.optimizer) + " state '" + m +
                                   "'" + at_step,
                               facts,
                               "the optimizer steps a frozen parameter (weight decay moves it even with a zero "
                               "gradient), and its state is saved in checkpoints",
                               "build the optimizer over the trainable parameters only"));
        break;
      }
    }
  }
  out.findings.ran(codes::kCheckFrozen, static_cast<int64_t>(state.context->parameters().size()), "parameters");
  out.evidence = {{"point", where}, {"step", step}, {"frozen", declared}, {"trainable", trainable}};
  return out;
}

std::vector<CoverageTarget> coverage_targets(const ParallelContext& ctx) {
  std::vector<CoverageTarget> out;
  for (const auto& p : ctx.parameters()) out.push_back({p->fqn, p->aliases, p->global_shape});
  for (const auto& b : ctx.buffers()) {
    if (b.persistent) out.push_back({b.fqn, {}, b.tensor.sizes().vec()});
  }
  return out;
}

CheckOutput check_checkpoint_coverage(const ParallelContext& ctx, const spec::CheckpointSpec& checkpoint,
                                      const std::vector<std::string>* source_keys) {
  return check_checkpoint_coverage(coverage_targets(ctx), checkpoint, source_keys);
}

CheckOutput check_checkpoint_coverage(const std::vector<CoverageTarget>& tensors, const spec::CheckpointSpec& checkpoint,
                                      const std::vector<std::string>* source_keys) {
  CheckOutput out;
  const KeyMap map(checkpoint.key_map);
  json targets = json::object();
  std::set<std::string> expected;
  auto training_only = [&](const std::string& fqn) {
    return std::any_of(checkpoint.training_only.begin(), checkpoint.training_only.end(),
                       [&](const std::string& pat) { return glob_match(pat, fqn); });
  };
  auto cover = [&](const std::string& fqn, const std::vector<int64_t>& shape) {
    if (training_only(fqn)) {
      targets[fqn] = {{"status", "training_only"}};
      return;
    }
    std::vector<std::string> keys;
    try {
      keys = map.external_keys(fqn);
    } catch (const Error&) {
      targets[fqn] = {{"status", "missing"}};
      out.findings.add(error(codes::kCkptTargetKey, "checkpoint", fqn,
                             "no key-map rule maps it and it is not declared training-only", {{"shape", shape}},
                             "loading an external checkpoint leaves it at its initial value without any error",
                             "add a KeyRule for it to CheckpointSpec::key_map, or list it in training_only"));
      return;
    }
    expected.insert(keys.begin(), keys.end());
    // Round trip a test tensor of the parameter's shape through the transform.
    const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    at::Tensor probe = at::arange(n, at::kDouble).mul(0.5).sub(n / 3.0).reshape(shape);
    bool round_trips = false;
    std::string why;
    try {
      std::map<std::string, at::Tensor> external;
      for (auto& [k, t] : map.to_external(fqn, probe)) external[k] = t;
      round_trips = at::equal(map.from_external(fqn, external), probe);
      why = round_trips ? "" : "values differ after to_external then from_external";
    } catch (const Error& e) {
      why = e.what();
    }
    targets[fqn] = {{"status", keys.size() > 1 ? "transformed" : "loaded"}, {"external", keys}, {"round_trip", round_trips}};
    if (!round_trips) {
      out.findings.add(error(codes::kCkptRoundTrip, "checkpoint", fqn, "key-map transform does not round-trip: " + why,
                             {{"external", keys}, {"shape", shape}},
                             "export then import changes the weights (a split along the wrong dim or order)",
                             "fix the KeyRule so to_external and from_external are inverse"));
    }
  };
  std::set<std::string> named;  // every name of the targets covered so far
  for (const CoverageTarget& t : tensors) {
    if (named.count(t.fqn)) continue;
    named.insert(t.fqn);
    named.insert(t.aliases.begin(), t.aliases.end());
    cover(t.fqn, t.shape);
  }
  out.findings.ran(codes::kCheckCoverage, static_cast<int64_t>(targets.size()), "parameters and persistent buffers");
  json sources = json::object();
  if (source_keys) {
    out.findings.ran(codes::kCheckSource, static_cast<int64_t>(source_keys->size()), "source checkpoint keys");
    std::set<std::string> present(source_keys->begin(), source_keys->end());
    for (const auto& key : *source_keys) {
      if (expected.count(key)) {
        sources[key] = "expected";
      } else if (std::any_of(checkpoint.inference_only.begin(), checkpoint.inference_only.end(),
                             [&](const std::string& pat) { return glob_match(pat, key); })) {
        sources[key] = "inference_only";
      } else {
        sources[key] = "unexpected";
        out.findings.add(error(codes::kCkptUnexpectedSource, "checkpoint", key, "source key is neither mapped nor declared inference-only",
                               json::object(), "a tensor the model should load is dropped silently",
                               "map it in CheckpointSpec::key_map or list it in inference_only"));
      }
    }
    for (const auto& key : expected) {
      if (!present.count(key)) {
        sources[key] = "absent";
        out.findings.add(error(codes::kCkptMissingSource, "checkpoint", key, "mapped key is absent from the source checkpoint",
                               json::object(), "its parameter would stay at initialization",
                               "check the key map's external names against the checkpoint"));
      }
    }
  }
  out.evidence = {{"targets", targets}, {"sources", sources}, {"key_map", map.to_json()}};
  return out;
}

CheckOutput run_invariants(const std::vector<spec::StateInvariant>& invariants, spec::Phase phase,
                           const TrainingState& state) {
  CheckOutput out;
  const std::string phase_str = spec::phase_name(phase);
  out.findings.ran(codes::kCheckInvariants,
                   std::count_if(invariants.begin(), invariants.end(), [&](const auto& i) { return i.phase == phase; }),
                   "invariants");
  for (const auto& inv : invariants) {
    if (inv.phase != phase) continue;
    spec::CheckResult r;
    std::string thrown;
    try {
      r = inv.check(state);
    } catch (const std::exception& e) {
      thrown = e.what();
    }
    if (!r.facts.is_object()) r.facts = {{"value", r.facts}};  // findings carry facts as an object
    out.evidence[inv.name] = {{"passed", thrown.empty() && r.passed}, {"facts", r.facts}};
    if (!thrown.empty()) {
      out.findings.add(error(codes::kInvarThrew, phase_str, inv.name, "state invariant threw: " + thrown,
                             {{"exception", thrown}}, "the state it guards could not be verified",
                             "fix the invariant or the state it reads"));
    } else if (!r.passed) {
      out.findings.add(error(codes::kInvarFailed, phase_str, inv.name, "state invariant '" + inv.name + "' failed: " + r.facts.dump(),
                             r.facts, "the model's state breaks a property its author declared",
                             "see the facts; fix the model port (or the invariant)"));
    }
  }
  return out;
}

}  // namespace mih::checks
