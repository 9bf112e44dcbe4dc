// The data checks: the data contract, the forward fields of the first micro-batch, and the
// input identity hash (see checks.h).
#include <algorithm>

#include <ATen/ATen.h>

#include "harness/base/error.h"
#include "harness/findings/codes.h"
#include "harness/base/sha256.h"
#include "harness/checks/checks.h"
#include "harness/runtime/communicator.h"

namespace mih::checks {
namespace {

using nlohmann::json;

constexpr int64_t kIgnoreIndex = -100;

bool contains(const std::vector<std::string>& list, const std::string& name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

// The named tensors of a batch, implicit fields first.
std::map<std::string, at::Tensor> named_fields(const Batch& b) {
  std::map<std::string, at::Tensor> out = b.fields;
  out["input_ids"] = b.input_ids;
  out["labels"] = b.labels;
  if (b.position_ids.defined()) out["position_ids"] = b.position_ids;
  return out;
}

// Values widened so that the storage dtype does not change the hash: integers and bools as
// int64, floating point as float64 (exact for every narrower float). CPU, contiguous.
at::Tensor canonical(const at::Tensor& t) {
  const at::ScalarType wide = at::isFloatingType(t.scalar_type()) ? at::kDouble : at::kLong;
  return t.detach().to(at::kCPU).to(wide).contiguous();
}

// SHA-256 of each row (dim 0) of `t`: the field name, the row's shape, then its values.
std::vector<std::string> row_digests(const std::string& name, const at::Tensor& t) {
  const at::Tensor c = canonical(t);
  std::vector<std::string> out;
  const int64_t rows = c.size(0);
  const size_t row_bytes = static_cast<size_t>(c.numel() / std::max<int64_t>(rows, 1)) * c.element_size();
  const auto* data = static_cast<const char*>(c.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {
    Sha256 h;
    h.update(name).update_int(c.dim() - 1);
    for (int64_t d = 1; d < c.dim(); ++d) h.update_int(c.size(d));
    h.update(data + static_cast<size_t>(r) * row_bytes, row_bytes);
    out.push_back(h.hex_digest());
  }
  return out;
}

// {"global", "fields"} from field -> row -> digest.
json combine(const std::map<std::string, std::map<int64_t, std::string>>& rows) {
  json fields = json::object();
  Sha256 global;
  int64_t n = 0;
  for (const auto& [name, by_row] : rows) {
    Sha256 h;
    for (const auto& [row, digest] : by_row) h.update_int(row).update(digest);
    const std::string field_hash = h.hex_digest();
    fields[name] = field_hash;
    global.update(name).update(field_hash);
    n = std::max<int64_t>(n, static_cast<int64_t>(by_row.size()));
  }
  return {{"global", global.hex_digest()}, {"fields", fields}, {"rows", n}};
}

// field -> row -> digest as JSON (object keys are strings).
json rows_json(const std::map<std::string, std::map<int64_t, std::string>>& rows) {
  json out = json::object();
  for (const auto& [name, by_row] : rows) {
    json& f = out[name] = json::object();
    for (const auto& [row, digest] : by_row) f[std::to_string(row)] = digest;
  }
  return out;
}

}  // namespace

CheckOutput check_data_contract(const spec::DataSpec& data, const Batch& batch) {
  CheckOutput out;
  json owners = json::object();
  owners["input_ids"] = "pipeline";
  owners["labels"] = "pipeline";
  owners["position_ids"] = batch.position_ids.defined() ? "pipeline" : "runtime (the Trainer fills 0..S-1)";
  for (const auto& name : data.runtime_fields) {
    const bool produced = batch.fields.count(name) || (name == "position_ids" && batch.position_ids.defined());
    owners[name] = produced ? json::array({"pipeline", "runtime"}) : json("runtime");
    if (produced) {
      out.findings.add({codes::kDataTwoOwners, "structure", name, Severity::kError,
                        "field '" + name + "' is produced by the pipeline and declared runtime-owned", json::object(),
                        "two owners write one field; which value the model sees depends on the order",
                        "drop it from the pipeline or from DataSpec::runtime_fields"});
    }
  }
  std::vector<std::string> declared;
  for (const auto& f : data.fields) declared.push_back(f.name);
  for (const auto& [name, t] : batch.fields) {
    if (contains(data.runtime_fields, name)) continue;
    owners[name] = "pipeline";
    if (!contains(declared, name)) {
      owners[name] = "none (undeclared)";
      out.findings.add({codes::kDataNoOwner, "structure", name, Severity::kError,
                        "the pipeline produces field '" + name + "' that the spec does not declare",
                        {{"shape", t.sizes().vec()}},
                        "an undeclared field has no declared sharding or role: it may be split wrongly under cp or "
                        "ignored by the checks",
                        "declare it in DataSpec::fields (forward, loss, cp sharding)"});
    }
  }
  for (const auto& f : data.fields) {
    if (!batch.fields.count(f.name) && !contains(data.runtime_fields, f.name)) {
      out.findings.add({codes::kDataNotProduced, "structure", f.name, Severity::kError,
                        "declared field '" + f.name + "' is not produced by the pipeline", json::object(),
                        "the model or loss reads a field that never arrives", "produce it, or remove the declaration"});
    }
  }
  json shift = json::object();
  if (data.causal_lm && batch.input_ids.defined() && batch.input_ids.size(1) > 1) {
    const at::Tensor ids = batch.input_ids.to(at::kCPU).to(at::kLong), labels = batch.labels.to(at::kCPU).to(at::kLong);
    const int64_t s = ids.size(1);
    const at::Tensor lab = labels.narrow(1, 0, s - 1), valid = lab.ne(kIgnoreIndex);
    const at::Tensor next = lab.eq(ids.narrow(1, 1, s - 1)).logical_and(valid);
    const at::Tensor same = lab.eq(ids.narrow(1, 0, s - 1)).logical_and(valid);
    const int64_t n_valid = valid.sum().item<int64_t>();
    const int64_t n_next = next.sum().item<int64_t>(), n_same = same.sum().item<int64_t>();
    const at::Tensor wrong = valid.logical_and(data.labels_are_shifted ? next.logical_not() : same.logical_not());
    shift = {{"declared_shifted", data.labels_are_shifted},
             {"valid_positions_checked", n_valid},
             {"labels_equal_next_input", n_next},
             {"labels_equal_same_input", n_same}};
    if (wrong.any().item<bool>()) {
      const at::Tensor first = wrong.nonzero()[0];
      shift["first_mismatch"] = {{"row", first[0].item<int64_t>()}, {"position", first[1].item<int64_t>()}};
      out.findings.add({codes::kDataLabelsShift, "structure", "labels", Severity::kError,
                        std::string("labels are declared ") + (data.labels_are_shifted ? "" : "not ") +
                            "shifted, but on " + std::to_string(wrong.sum().item<int64_t>()) + " of " +
                            std::to_string(n_valid) + " valid positions they are not the " +
                            (data.labels_are_shifted ? "next" : "same") + " input token (" + std::to_string(n_next) +
                            " equal the next token, " + std::to_string(n_same) + " the same token)",
                        shift,
                        "a double (or missing) shift trains the model to predict the wrong token while the loss "
                        "still falls",
                        "shift labels exactly once: in the pipeline (labels_are_shifted = true) or in the model"});
    }
  }
  out.findings.ran(codes::kCheckDataContract, static_cast<int64_t>(owners.size()), "fields of the global batch");
  out.evidence = {{"owners", owners}, {"labels_shift", shift}, {"declared", declared}};
  return out;
}

CheckOutput check_token_losses(const Batch& micro, const at::Tensor& token_losses) {
  CheckOutput out;
  if (!micro.labels.defined() || !token_losses.defined()) return out;
  out.findings.ran(codes::kCheckTokenLosses, micro.labels.numel(), "tokens");
  if (token_losses.sizes() != micro.labels.sizes()) {
    out.findings.add({codes::kDataLossLabels, "runtime", "labels", Severity::kError,
                      "the model's per-token losses have shape " + json(token_losses.sizes().vec()).dump() +
                          ", the labels " + json(micro.labels.sizes().vec()).dump(),
                      {{"token_losses", token_losses.sizes().vec()}, {"labels", micro.labels.sizes().vec()}},
                      "the loss is not computed one term per label as the data contract declares",
                      "return one loss per position of the labels ([B, S]) from token_losses"});
    return out;
  }
  const at::Tensor loss = token_losses.detach().to(at::kCPU), labels = micro.labels.to(at::kCPU);
  const at::Tensor ignored = labels.eq(kIgnoreIndex), valid = ignored.logical_not();
  const at::Tensor scored_ignored = ignored.logical_and(loss.ne(0));
  const bool exact = loss.scalar_type() == at::kDouble || loss.scalar_type() == at::kFloat;
  const at::Tensor unscored_valid = exact ? valid.logical_and(loss.eq(0)) : at::zeros_like(valid);
  const int64_t n_ignored = ignored.sum().item<int64_t>(), n_valid = valid.sum().item<int64_t>();
  const int64_t n_scored_ignored = scored_ignored.sum().item<int64_t>();
  const int64_t n_unscored_valid = unscored_valid.sum().item<int64_t>();
  const int64_t n_scored = loss.ne(0).sum().item<int64_t>();
  json facts = {{"valid_labels", n_valid},
                {"ignored_labels", n_ignored},
                {"positions_with_loss", n_scored},
                {"loss_at_ignored_positions", n_scored_ignored},
                {"no_loss_at_valid_positions", n_unscored_valid}};
  const at::Tensor wrong = scored_ignored.logical_or(unscored_valid);
  if (wrong.any().item<bool>()) {
    const at::Tensor first = wrong.nonzero()[0];
    facts["first"] = {{"row", first[0].item<int64_t>()}, {"position", first[1].item<int64_t>()}};
    out.findings.add({codes::kDataLossLabels, "runtime", "labels", Severity::kError,
                      "the model's per-token loss does not follow the labels it is given: " +
                          std::to_string(n_scored_ignored) + " of " + std::to_string(n_ignored) +
                          " positions whose label is -100 carry a loss and " + std::to_string(n_unscored_valid) +
                          " of " + std::to_string(n_valid) + " valid labels none (" + std::to_string(n_scored) +
                          " positions with a loss for " + std::to_string(n_valid) +
                          " valid labels); are the labels shifted again inside the model?",
                      facts,
                      "the model learns to predict another token than the pipeline's label while the loss still falls",
                      "shift labels exactly once: in the pipeline (labels_are_shifted) or in the model's loss"});
  }
  out.evidence = facts;
  return out;
}

CheckOutput check_forward_fields(const spec::DataSpec& data, const Batch& micro) {
  CheckOutput out;
  json observed = json::array({"input_ids", "labels"});
  if (micro.position_ids.defined()) observed.push_back("position_ids");
  json required = json::array({"input_ids", "labels"}), missing = json::array();
  for (const auto& [name, t] : micro.fields) observed.push_back(name);
  for (const char* name : {"input_ids", "labels"}) {
    const at::Tensor& t = std::string_view(name) == "input_ids" ? micro.input_ids : micro.labels;
    if (t.defined() && t.numel() > 0) continue;
    missing.push_back(name);
    out.findings.add({codes::kDataForwardField, "runtime", name, Severity::kError,
                      std::string("'") + name + "' is empty or undefined in the first micro-batch the model receives",
                      {{"observed", observed}}, "the model trains on nothing",
                      "fill input_ids and labels [B, S] in every batch"});
  }
  for (const auto& f : data.fields) {
    if (!f.forward) continue;
    required.push_back(f.name);
    if (!micro.fields.count(f.name)) {
      missing.push_back(f.name);
      out.findings.add({codes::kDataForwardField, "runtime", f.name, Severity::kError,
                        "required forward field '" + f.name + "' is missing from the first micro-batch the model receives",
                        {{"observed", observed}},
                        "the model runs without that input (a modality silently dropped) and still trains",
                        "pass every declared forward field through the collate and split into the model call"});
    }
  }
  out.findings.ran(codes::kCheckForwardFields, static_cast<int64_t>(required.size()), "required forward fields");
  out.evidence = {{"observed", observed}, {"required", required}, {"missing", missing}};
  return out;
}

InputIdentity::InputIdentity(std::vector<std::string> sequence_fields, std::vector<std::string> cp_replicated)
    : sequence_fields_(std::move(sequence_fields)), cp_replicated_(std::move(cp_replicated)) {}

void InputIdentity::add(int64_t first_row, const Batch& micro, Communicator* cp, CpLayout layout) {
  for (const auto& [name, t] : named_fields(micro)) {
    at::Tensor full = t;
    const bool sequence = name == "input_ids" || name == "labels" || name == "position_ids" || contains(sequence_fields_, name);
    if (cp != nullptr && cp->size() > 1) {
      if (sequence) {
        full = cp_unshard_sequence(cp->all_gather(t.contiguous(), 1, "mih.session.input_identity"), 1, cp->size(), layout);
      } else if (contains(cp_replicated_, name)) {
        std::vector<std::string> digests = row_digests(name, t);
        for (size_t i = 0; i < digests.size(); ++i) replicated_[name][first_row + static_cast<int64_t>(i)] = digests[i];
      }
    }
    std::vector<std::string> digests = row_digests(name, full);
    for (size_t i = 0; i < digests.size(); ++i) rows_[name][first_row + static_cast<int64_t>(i)] = digests[i];
  }
}

json InputIdentity::finish(DeviceMesh& mesh, int64_t step, FindingReport* findings, c10::Device device) {
  // Every data-parallel rank holds other rows: gather them all.
  std::map<std::string, std::map<int64_t, std::string>> all;
  for (const json& part : all_gather_json(mesh.comm(MeshAxis::kDp), rows_json(rows_), device, "mih.session.input_identity")) {
    for (const auto& [name, by_row] : part.items()) {
      for (const auto& [row, digest] : by_row.items()) all[name][std::stoll(row)] = digest.get<std::string>();
    }
  }
  json result = combine(all);
  // cp-replicated fields: every cp rank must hold the same rows.
  if (mesh.comm(MeshAxis::kCp).size() > 1) {
    const std::vector<json> parts = all_gather_json(mesh.comm(MeshAxis::kCp), rows_json(replicated_), device, "mih.session.input_identity");
    int64_t compared = 0;
    for (const auto& [name, by_row] : parts[0].items()) {
      for (size_t r = 1; r < parts.size(); ++r) {
        ++compared;
        if (parts[r].contains(name) && parts[r][name] == by_row) continue;
        findings->add({codes::kInputCpReplicated, "runtime", name, Severity::kError,
                       "cp-replicated field '" + name + "' differs between cp rank 0 and cp rank " + std::to_string(r) +
                           " at step " + std::to_string(step),
                       {{"step", step}},
                       "context-parallel ranks compute one sequence from different inputs",
                       "hand the whole field to every cp rank (TrainerOptions::cp_replicated_fields)"});
      }
    }
    findings->ran(codes::kCheckInputCp, compared, "cp-replicated fields compared with cp rank 0");
  }
  // Tensor-parallel ranks must have seen the same rows.
  if (mesh.comm(MeshAxis::kTp).size() > 1) {
    const std::vector<json> parts =
        all_gather_json(mesh.comm(MeshAxis::kTp), result["global"], device, "mih.session.input_identity");
    findings->ran(codes::kCheckInputTp, static_cast<int64_t>(parts.size()) - 1, "tp ranks compared with tp rank 0");
    for (size_t r = 1; r < parts.size(); ++r) {
      if (parts[r] == parts[0]) continue;
      findings->add({codes::kInputTpRanks, "runtime", "global_batch", Severity::kError,
                     "tp rank " + std::to_string(r) + " saw other inputs than tp rank 0 at step " + std::to_string(step),
                     {{"step", step}, {"tp0", parts[0]}, {"tp" + std::to_string(r), parts[r]}},
                     "tensor-parallel ranks compute one model from different data",
                     "split the batch over the data-parallel axes only"});
    }
  }
  result["step"] = step;
  rows_.clear();
  replicated_.clear();
  return result;
}

json input_identity_of(const Batch& global) {
  std::map<std::string, std::map<int64_t, std::string>> rows;
  Batch b = global;
  if (!b.position_ids.defined()) {
    const int64_t s = b.input_ids.size(1);
    b.position_ids = at::arange(s, at::kLong).unsqueeze(0).expand({b.input_ids.size(0), s});
  }
  for (const auto& [name, t] : named_fields(b)) {
    std::vector<std::string> digests = row_digests(name, t);
    for (size_t i = 0; i < digests.size(); ++i) rows[name][static_cast<int64_t>(i)] = digests[i];
  }
  return combine(rows);
}

}  // namespace mih::checks
