// export_hf (see hf_interop.h): the port's weights as a Hugging Face checkpoint, the spec's
// first batch and the port's numbers on it, its training settings and config.json, written
// into a staging directory that replaces --out whole.
#include <unistd.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/owned_files.h"
#include "harness/cases/hf_interop.h"
#include "harness/cases/hf_interop_internal.h"
#include "harness/checkpoint/distributed_checkpoint.h"
#include "harness/checkpoint/key_map.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/compat/optim.h"
#include "harness/checks/checks.h"
#include "harness/contract/evidence_layout.h"
#include "harness/parallel/parallel_context.h"
#include "harness/training/trainer.h"

namespace mih::cases {
namespace fs = std::filesystem;
namespace {

// Views of (name, tensor) pairs for the safetensors writers; `keep` holds the contiguous CPU
// copies they point into. Undefined tensors are left out (e.g. position_ids of a pipeline that
// leaves them to the runtime).
template <typename Pairs>
std::vector<safetensors::TensorView> views_of(const Pairs& tensors, std::vector<at::Tensor>* keep) {
  std::vector<safetensors::TensorView> views;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) continue;
    at::Tensor c = t.detach().cpu().contiguous();
    keep->push_back(c);
    views.push_back({name, safetensors_dtype(c.scalar_type()), c.sizes().vec(), c.data_ptr(), c.nbytes()});
  }
  return views;
}

void write_tensors(const fs::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<at::Tensor> keep;
  safetensors::write_file(path, views_of(tensors, &keep), {{"format", "pt"}});
}

// --out, absolute and without a trailing slash, once the options are checked.
// Everything is written into a staging directory beside --out, which replaces --out only
// when the export is complete: a failed export leaves the earlier one whole, and no file
// of an earlier export (another shard count, another dtype) survives a new one. So --out
// must hold nothing but the files an earlier export wrote, as it wrote them (its
// mih_export.json lists each with its SHA-256): a tokenizer.json put beside it, or an
// edited config.json, is refused and left as it is.
fs::path export_target(const spec::ModelSpec& spec, const HfExportOptions& options) {
  MIH_CHECK(spec.checkpoint.hf.declared(), "spec '", spec.name, "' declares no Hugging Face config "
            "(CheckpointSpec::hf: model_type, architectures and the config.json fields from its options), so its "
            "export would not be a Hugging Face checkpoint; declare them in the spec");
  MIH_CHECK(!options.out.empty(), "export: --out DIR is required");
  MIH_CHECK(options.dtype == "float32" || options.dtype == "float64" || options.dtype == "bfloat16", "export: --dtype ",
            options.dtype, " is not one the ports compute in on CPU; use float32, float64 or bfloat16");
  fs::path target = fs::absolute(options.out).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  return target;
}

// The staging directory beside `target`, removed with this object (after the export moved it
// into place, nothing is left to remove).
struct StageDir {
  fs::path dir;
  ~StageDir() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

fs::path make_stage(const fs::path& target) {
  const fs::path stage = target.parent_path() / ("." + target.filename().string() + ".mih-export-" +
                                                 std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(stage, ec);
  fs::create_directories(stage, ec);
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "export: cannot create ", stage.string(), " beside --out: ",
                 ec.message());
  return stage;
}

// The complete export in place of `target`: an earlier export (`exists`) is moved aside first
// and put back if the move fails.
void move_into_place(const fs::path& stage, const fs::path& target, bool exists) {
  std::error_code ec;
  if (exists) {
    const fs::path old = target.parent_path() / ("." + target.filename().string() + ".mih-export-old-" +
                                                 std::to_string(::getpid()));
    fs::remove_all(old, ec);
    fs::rename(target, old, ec);
    MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "export: cannot replace the earlier export ", target.string(), ": ",
                   ec.message(), " (it is left as it was)");
    fs::rename(stage, target, ec);
    if (ec) {
      std::error_code restore;
      fs::rename(old, target, restore);  // the earlier export back in place
    } else {
      fs::remove_all(old, ec);
      ec.clear();
    }
  } else {
    fs::create_directories(target.parent_path(), ec);
    fs::rename(stage, target, ec);
  }
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "export: cannot move the export into ", target.string(), ": ",
                 ec.message());
}

// One tensor under two names is written once, under the first name's keys: refused unless
// the spec declares the tie (the original ties them too), and recorded either way.
void refuse_undeclared_aliases(const spec::ModelSpec& spec, const ParallelContext& ctx) {
  for (const checks::UndeclaredAlias& a : checks::undeclared_aliases(ctx, spec.checkpoint.tied)) {
    MIH_THROW(Code::kInvalidSpec, "export: spec '", spec.name, "': '", a.fqn, "' and '", a.alias,
              "' name the same tensor (one parameter registered under both names), but the spec does not declare "
              "them tied (checkpoint.tied), so the export would write it once, under the key(s) of '", a.fqn,
              "', and no key for '", a.alias, "'; give '", a.alias, "' its own parameter (build a second module "
              "instead of registering the first twice), or declare {\"", a.fqn, "\", \"", a.alias,
              "\"} in checkpoint.tied if the original ties them");
  }
}

// The declared ties, for the export record (each alias, the FQN written and their keys), also
// kept in result.aliases.
nlohmann::json alias_records(const spec::ModelSpec& spec, const KeyMap& map, const ParallelContext& ctx,
                             HfExportResult& result) {
  nlohmann::json aliases = nlohmann::json::array();
  for (const auto& p : ctx.parameters()) {
    if (matches_any(spec.checkpoint.training_only, p->fqn)) continue;
    for (const std::string& alias : p->aliases) {
      std::vector<std::string> keys;  // the alias's own keys, when the key map has a rule for it
      try {
        keys = map.external_keys(alias);
      } catch (const Error&) {
      }
      aliases.push_back({{"fqn", alias}, {"of", p->fqn}, {"keys", keys}, {"written_as", map.external_keys(p->fqn)}});
      result.aliases.emplace_back(p->fqn, alias);
    }
  }
  return aliases;
}

// The weights through the key map, training-only parameters left out.
void write_export_weights(const spec::ModelSpec& spec, const KeyMap& map, Trainer& trainer, const fs::path& stage,
                          uint64_t max_shard_bytes, HfExportResult& result) {
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : trainer.context().parameters()) {
    if (matches_any(spec.checkpoint.training_only, p->fqn)) continue;
    for (auto& [key, tensor] : map.to_external(p->fqn, trainer.gather_full(*p))) weights[key] = tensor;
  }
  std::vector<at::Tensor> keep;
  result.weight_files = hf::write_weights(stage, views_of(weights, &keep), max_shard_bytes);
  result.tensors = weights.size();
}

// The spec's first global batch, and the port's numbers on it (its logits when it has them,
// the token losses, the loss); returns the logits, undefined when the port has none.
at::Tensor write_batch_and_reference(const spec::ModelSpec& spec, Trainer& trainer, const fs::path& stage,
                                     HfExportResult& result) {
  BatchSource batches = spec.data.make_batches();
  Batch batch = batches(0);
  std::vector<std::pair<std::string, at::Tensor>> batch_tensors = {
      {"input_ids", batch.input_ids}, {"labels", batch.labels}, {"position_ids", batch.position_ids}};
  for (const auto& [name, t] : batch.fields) batch_tensors.emplace_back(name, t);
  write_tensors(stage / layout::kExportBatch, batch_tensors);

  at::Tensor logits, token_losses;
  {
    // The model gets the batch as the Trainer hands it over: position_ids 0..S-1 when the
    // pipeline leaves them to the runtime (a port with learned positions reads them).
    Batch model_batch = batch;
    if (!model_batch.position_ids.defined()) {
      model_batch.position_ids = at::arange(batch.input_ids.size(1), at::kLong).unsqueeze(0).expand_as(batch.input_ids);
    }
    at::NoGradGuard no_grad;
    logits = trainer.model().logits(model_batch);
    token_losses = trainer.model().token_losses(model_batch);
  }
  const double valid = batch.labels.ne(-100).sum().item<double>();
  at::Tensor loss = token_losses.sum() / valid;
  std::vector<std::pair<std::string, at::Tensor>> reference = {{"token_losses", token_losses}, {"loss", loss}};
  if (logits.defined()) reference.insert(reference.begin(), {"logits", logits});
  write_tensors(stage / layout::kExportReference, reference);
  result.loss = loss.item<double>();
  result.logits = logits.defined();
  return logits;
}

// Per external tensor, its weight-decay group as the Trainer built it (so a fused parameter's
// keys share their group) and whether it trains.
nlohmann::json training_tensors(const spec::ModelSpec& spec, const KeyMap& map, Trainer& trainer) {
  std::map<const void*, bool> decayed;
  for (const auto& group : trainer.optimizer().param_groups()) {
    const double wd = compat::weight_decay(group.options());
    for (const auto& t : group.params()) decayed[t.unsafeGetTensorImpl()] = wd != 0;
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& p : trainer.context().parameters()) {
    if (matches_any(spec.checkpoint.training_only, p->fqn)) continue;
    const auto it = decayed.find(p->local.unsafeGetTensorImpl());
    for (const std::string& key : map.external_keys(p->fqn)) {
      out[key] = {{"fqn", p->fqn},
                  {"weight_decay", it != decayed.end() && it->second},
                  {"trainable", p->local.requires_grad()}};
    }
  }
  return out;
}

// What a golden producer needs to take the port's optimizer step (docs/golden.md): the
// trainer options, the labels' convention, and training_tensors. Its own file, hashed whole
// into a golden's training_sha256.
nlohmann::json training_record(const spec::ModelSpec& spec, const KeyMap& map, Trainer& trainer) {
  const TrainerOptions& t = spec.trainer;
  return {{"trainer",
           {{"optimizer", optimizer_kind_name(t.optimizer())},
            {"lr", t.lr()},
            // The learning rate the golden's one step takes: the schedule's at step 0 (a warmup's
            // first fraction of lr).
            {"step_lr", scheduled_lr(t, 0)},
            {"momentum", t.momentum()},
            {"nesterov", t.nesterov()},
            {"beta1", t.beta1()},
            {"beta2", t.beta2()},
            {"eps", t.eps()},
            {"weight_decay", t.weight_decay()},
            {"max_grad_norm", t.max_grad_norm()}}},
          {"labels_are_shifted", spec.data.labels_are_shifted},
          {"tensors", training_tensors(spec, map, trainer)}};
}

// mih_export.json: what was exported, from what, and every file the stage holds with its
// SHA-256 (what a later export checks --out against).
nlohmann::json export_record(const spec::ModelSpec& spec, const HfExportOptions& options, const KeyMap& map,
                             const std::map<std::string, ExternalTensor>& expected, const nlohmann::json& aliases,
                             const at::Tensor& logits, const HfExportResult& result, const fs::path& stage) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [key, e] : expected) tensors[key] = {{"fqn", e.fqn}, {"shape", e.shape}};
  return {{"spec", spec.name},
          {"description", spec.description},
          {"dtype", options.dtype},
          {"seed", options.seed},
          {"init_from", options.init_from.empty() ? nlohmann::json()
                                                  : nlohmann::json(fs::absolute(options.init_from).string())},
          {"data_pipeline", spec.data.pipeline},
          {"logits_shape", logits.defined() ? nlohmann::json(logits.sizes().vec()) : nlohmann::json()},
          {"loss", result.loss},
          {"weight_files", result.weight_files},
          {"key_map", map.to_json()},
          {"tensors", tensors},
          {"aliases", aliases},
          {"files", file_digests(stage, layout::kExportRecord)}};
}

// Every file of the export into `stage`, from the port built at world size 1.
void write_export(const spec::ModelSpec& spec, const HfExportOptions& options, const KeyMap& map, Trainer& trainer,
                  const fs::path& stage, HfExportResult& result) {
  if (!options.init_from.empty()) load_hf_weights(spec, options.init_from, trainer.context());
  refuse_undeclared_aliases(spec, trainer.context());
  // The key map's own refusals (no rule for a parameter) come first, naming the parameter.
  const std::map<std::string, ExternalTensor> expected = expected_external(spec, map, trainer.context());
  const nlohmann::json aliases = alias_records(spec, map, trainer.context(), result);
  write_export_weights(spec, map, trainer, stage, options.max_shard_bytes, result);
  const at::Tensor logits = write_batch_and_reference(spec, trainer, stage, result);
  write_file_atomic(stage / layout::kExportTraining, training_record(spec, map, trainer).dump(2) + "\n");
  nlohmann::json config = hf_config_json(spec.checkpoint.hf);
  config["torch_dtype"] = options.dtype;
  write_file_atomic(stage / layout::kHfConfig, config.dump(2) + "\n");
  const nlohmann::json record = export_record(spec, options, map, expected, aliases, logits, result, stage);
  write_file_atomic(stage / layout::kExportRecord, record.dump(2) + "\n");
}

}  // namespace

HfExportResult export_hf(const spec::ModelSpec& spec, const HfExportOptions& options) {
  const fs::path target = export_target(spec, options);
  std::error_code ec;
  const bool exists = fs::exists(target, ec);
  check_owned(target, layout::kExportRecord, entries_under(target, layout::kExportRecord), "export");
  const StageDir stage{make_stage(target)};
  const KeyMap map(spec.checkpoint.key_map);
  HfExportResult result;
  with_one_rank(spec, options.dtype, options.seed,
                [&](Trainer& trainer) { write_export(spec, options, map, trainer, stage.dir, result); });
  move_into_place(stage.dir, target, exists);
  return result;
}

}  // namespace mih::cases
