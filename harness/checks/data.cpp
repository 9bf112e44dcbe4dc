// The data checks: the data contract, the batch recomputed from its documents, the forward
// fields of the first micro-batch, and the input identity hash (see checks.h).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

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

namespace {

// One row as the model should get it, rebuilt from the documents (check_batch_documents).
struct ExpectedRow {
  std::map<std::string, std::vector<int64_t>> fields;
};

// The token at `j` of a document whose bytes are `bytes`, counted as BOS + bytes + EOS.
int64_t document_token(const BatchProvenance& pv, const std::string& bytes, int64_t j) {
  if (j == 0) return pv.bos;
  if (j == static_cast<int64_t>(bytes.size()) + 1) return pv.eos;
  return static_cast<unsigned char>(bytes[static_cast<size_t>(j - 1)]);
}

// Row `r` of S inputs rebuilt from its spans; "" or why the spans cannot be the row's.
std::string expected_row(const BatchProvenance& pv, int64_t r, int64_t s, ExpectedRow* out) {
  // The window of S + 1 tokens, each with the span (one document's occurrence) it came from
  // (-1: padding) and whether it is its document's first token.
  std::vector<int64_t> token, span_of;
  std::vector<bool> starts_document;
  const auto& spans = pv.rows[static_cast<size_t>(r)];
  for (size_t k = 0; k < spans.size(); ++k) {
    const DocumentSpan& span = spans[k];
    const std::string bytes = pv.document_bytes(span.document);
    const int64_t length = static_cast<int64_t>(bytes.size()) + 2;
    const std::string at = "span " + std::to_string(k) + " (document " + std::to_string(span.document) + ", tokens " +
                           std::to_string(span.offset) + ".." + std::to_string(span.offset + span.length - 1) + ")";
    if (span.offset < 0 || span.length < 1 || span.offset + span.length > length) {
      return at + " does not fit the document's " + std::to_string(length) + " tokens (BOS + bytes + EOS)";
    }
    if (pv.packed && k > 0 && span.offset != 0) {
      return at + " starts inside its document: the window skips its first tokens";
    }
    if (pv.packed && k + 1 < spans.size() && span.offset + span.length != length) {
      return at + " ends inside its document: the window skips its last tokens";
    }
    if (!pv.packed && (k > 0 || span.offset != 0)) return at + ": a padded row holds one document from its start";
    for (int64_t j = span.offset; j < span.offset + span.length; ++j) {
      token.push_back(document_token(pv, bytes, j));
      span_of.push_back(static_cast<int64_t>(k));
      starts_document.push_back(j == 0);
    }
  }
  const auto n = static_cast<int64_t>(token.size());
  if (pv.packed ? n != s + 1 : n > s + 1) {
    return "its spans hold " + std::to_string(n) + " tokens, the window of a row " + std::to_string(s + 1) +
           " (S inputs and the last one's target)";
  }
  for (int64_t t = n; t < s + 1; ++t) {
    token.push_back(pv.pad);
    span_of.push_back(-1);
    starts_document.push_back(false);
  }
  const int64_t p = pv.prefix_tokens;
  auto& f = out->fields;
  for (const char* name : {"input_ids", "labels", "position_ids", "loss_mask", "attention_mask"}) f[name].assign(s, 0);
  if (!pv.prefix_index_field.empty()) f[pv.prefix_index_field].assign(s, -1);
  // A document field numbers the spans of the row: the input's span, wherever it starts.
  if (!pv.document_field.empty()) f[pv.document_field].assign(span_of.begin(), span_of.begin() + s);
  for (int64_t t = 0; t < s; ++t) {
    const bool placeholder = t < p;
    const bool padding = span_of[t] < 0;
    f["input_ids"][t] = placeholder ? pv.prefix_token : token[t];
    // The target of t is the next token of t's own document: -100 across a boundary, at and
    // after padding, and at and just before placeholders (no loss on them or from them).
    const bool same_document = !padding && span_of[t + 1] == span_of[t];
    f["labels"][t] = placeholder || !same_document ? -100 : token[t + 1];
    f["loss_mask"][t] = f["labels"][t] != -100;
    f["attention_mask"][t] = placeholder || !padding;
    if (pv.packed) {
      const bool restart = t == 0 || (starts_document[t] && t >= p);
      f["position_ids"][t] = restart ? 0 : f["position_ids"][t - 1] + 1;
    } else {
      f["position_ids"][t] = t;
    }
    if (placeholder && !pv.prefix_index_field.empty()) f[pv.prefix_index_field][t] = t;
  }
  return "";
}

// "document 12 tokens 40..63, document 7 tokens 0..41": a row's spans for a message.
std::string spans_text(const std::vector<DocumentSpan>& spans) {
  std::string out;
  for (const auto& sp : spans) {
    out += (out.empty() ? "" : ", ") + std::string("document ") + std::to_string(sp.document) + " tokens " +
           std::to_string(sp.offset) + ".." + std::to_string(sp.offset + sp.length - 1);
  }
  return out;
}

// What a field that differs from its recomputation most likely means, and the fix.
std::pair<std::string, std::string> document_field_advice(const std::string& field, const BatchProvenance& pv) {
  if (field == "position_ids") {
    return {"every document after the first of a packed row is placed as the continuation of the one before it (or a "
            "position jumps), so rotary positions and any mask derived from them cross document boundaries",
            "restart position_ids at 0 at every document start (and at the row's start), count up by one otherwise"};
  }
  if (field == "labels") {
    return {"the model is trained to predict across a document boundary (or not trained where it should be)",
            "label each input with the next token of its own document; -100 where the next token starts another "
            "document, is padding, or is a placeholder"};
  }
  if (field == pv.document_field) {
    return {"attention masked by these ids either crosses a document boundary (two documents share an id) or cuts a "
            "document in two, so a token attends to another document or not to its own",
            "number each input by the span of the row that holds it: 0 for the row's first document, one more at "
            "every document start after it"};
  }
  if (field == "input_ids") {
    return {"the model reads other tokens than the documents hold (a dropped, repeated or misplaced token)",
            "cut each row as the documents' tokens back to back (BOS + bytes + EOS each), in the order of the spans"};
  }
  return {"the model or the loss reads a mask that does not follow the documents",
          "derive the field from the labels and the padding: loss_mask = (labels != -100), attention_mask 1 on every "
          "input but padding, a placeholder index 0.. on the placeholders and -1 elsewhere"};
}

}  // namespace

CheckOutput check_batch_documents(const spec::DataSpec& data, const Batch& batch) {
  CheckOutput out;
  if (!data.rows_from_documents) return out;
  const BatchProvenance* pv = batch.provenance.get();
  const bool shaped = batch.input_ids.defined() && batch.input_ids.dim() == 2;
  const int64_t rows = shaped ? batch.input_ids.size(0) : 0, s = shaped ? batch.input_ids.size(1) : 0;
  auto problem = [&](const std::string& owner, const std::string& message, const json& facts) {
    out.findings.add({codes::kDataNotFromDocuments, "structure", owner, Severity::kError, message, facts,
                      "nothing else compares the batch with its documents: the reference is fed by the same pipeline",
                      "attach the spans each row was cut from (Batch::provenance, as TextPipeline does), or clear "
                      "DataSpec::rows_from_documents for a pipeline without documents"});
  };
  if (pv == nullptr || !shaped || static_cast<int64_t>(pv->rows.size()) != rows || !pv->document_bytes) {
    problem("provenance",
            pv == nullptr ? "the spec declares rows_from_documents, but the pipeline's batch carries no provenance"
                          : "the batch's provenance does not describe its " + std::to_string(rows) + " rows (" +
                                std::to_string(pv->rows.size()) + " rows of spans" +
                                (pv->document_bytes ? "" : ", no document_bytes") + ")",
            json::object());
    out.findings.ran(codes::kCheckBatchDocuments, std::max<int64_t>(rows * s, 1),
                     "positions recomputed from the documents");
    out.evidence = {{"rows", rows}, {"provenance", pv != nullptr}};
    return out;
  }
  // The pipeline's fields as the model gets them; position_ids the Trainer's 0..S-1 when the
  // pipeline leaves them out.
  std::map<std::string, at::Tensor> got = {{"input_ids", batch.input_ids}, {"labels", batch.labels}};
  got["position_ids"] = batch.position_ids.defined() ? batch.position_ids
                                                     : at::arange(s, at::kLong).unsqueeze(0).expand({rows, s});
  std::vector<std::string> names = {"input_ids", "labels", "position_ids"};
  for (const std::string& name :
       std::vector<std::string>{"loss_mask", "attention_mask", pv->prefix_index_field, pv->document_field}) {
    if (name.empty()) continue;
    if (auto it = batch.fields.find(name); it != batch.fields.end()) {
      got[name] = it->second;
      names.push_back(name);
    } else if (name == pv->prefix_index_field || name == pv->document_field) {
      problem(name, std::string("the provenance names ") + (name == pv->document_field ? "document" : "placeholder index") +
                        " field '" + name + "', which the batch does not hold",
              json::object());
    }
  }
  for (auto& [name, t] : got) t = t.detach().to(at::kCPU).to(at::kLong).contiguous();
  json fields = json::object(), spans = json::array();
  for (const auto& name : names) fields[name] = {{"differing", 0}};
  for (int64_t r = 0; r < rows; ++r) {
    json row_spans = json::array();
    for (const auto& sp : pv->rows[static_cast<size_t>(r)]) row_spans.push_back({sp.document, sp.offset, sp.length});
    spans.push_back(row_spans);
    ExpectedRow want;
    if (const std::string why = expected_row(*pv, r, s, &want); !why.empty()) {
      problem("input_ids", "row " + std::to_string(r) + " cannot be rebuilt from its provenance: " + why,
              {{"row", r}, {"spans", row_spans}});
      continue;
    }
    for (const auto& name : names) {
      const at::Tensor& t = got[name];
      if (t.dim() != 2 || t.size(0) != rows || t.size(1) != s) continue;  // the data contract names the shape
      const int64_t* values = t.data_ptr<int64_t>() + r * s;
      json& f = fields[name];
      for (int64_t i = 0; i < s; ++i) {
        if (values[i] == want.fields[name][i]) continue;
        f["differing"] = f["differing"].get<int64_t>() + 1;
        if (!f.contains("first")) {
          f["first"] = {{"row", r}, {"position", i}, {"recomputed", want.fields[name][i]}, {"pipeline", values[i]},
                        {"spans", row_spans}};
        }
      }
    }
  }
  for (const auto& name : names) {
    const json& f = fields[name];
    if (f["differing"].get<int64_t>() == 0) continue;
    const json& first = f["first"];
    const auto [why, fix] = document_field_advice(name, *pv);
    out.findings.add({codes::kDataNotFromDocuments, "structure", name, Severity::kError,
                      "field '" + name + "' differs from its recomputation from the raw documents at " +
                          std::to_string(f["differing"].get<int64_t>()) + " of " + std::to_string(rows * s) +
                          " positions; first at row " + std::to_string(first["row"].get<int64_t>()) + ", position " +
                          std::to_string(first["position"].get<int64_t>()) + ": recomputed " +
                          std::to_string(first["recomputed"].get<int64_t>()) + ", the pipeline gave " +
                          std::to_string(first["pipeline"].get<int64_t>()) + " (the row holds " +
                          spans_text(pv->rows[static_cast<size_t>(first["row"].get<int64_t>())]) + ")",
                      f, why + "; the reference is fed by the same pipeline, so the comparison with it cannot see it",
                      fix});
  }
  out.findings.ran(codes::kCheckBatchDocuments, rows * s, "positions recomputed from the documents");
  out.evidence = {{"rows", rows},
                  {"seq_len", s},
                  {"packed", pv->packed},
                  {"prefix_tokens", pv->prefix_tokens},
                  {"fields", fields},
                  {"spans", spans}};
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
