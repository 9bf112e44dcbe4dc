// replica_steps (see replica_records.h): the records read, typed, and checked against the case.
#include "harness/contract/replica_records.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <utility>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"

namespace mih::contract {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Box = std::vector<std::pair<int64_t, int64_t>>;

std::string file_of(ReplicaKind kind, int64_t step) {
  return kind == ReplicaKind::kParameters ? layout::replicas_step(step) : layout::gradient_replicas_step(step);
}

// A box "[0:4, 8:16]" as (start, end) per dim; false when it is not one.
bool parse_box(const std::string& text, Box* dims) {
  dims->clear();
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return false;
  const std::string body = text.substr(1, text.size() - 2);
  size_t at = 0;
  while (at < body.size()) {
    const size_t comma = std::min(body.find(',', at), body.size());
    const std::string part = body.substr(at, comma - at);
    const size_t colon = part.find(':');
    if (colon == std::string::npos) return false;
    try {
      const int64_t start = std::stoll(part.substr(0, colon)), end = std::stoll(part.substr(colon + 1));
      if (start < 0 || end < start) return false;
      dims->emplace_back(start, end);
    } catch (const std::exception&) {
      return false;
    }
    at = comma + 1;
  }
  return true;
}

// The distinct pieces of `boxes` tile `shape`: inside it, disjoint, covering it.
void check_tiling(const std::vector<std::string>& boxes, const std::vector<int64_t>& shape, const std::string& where) {
  std::map<std::string, Box> pieces;
  std::set<std::string> parts;  // a rank's piece: one box, several joined by '+', none ("")
  for (const std::string& held : boxes) {
    for (size_t at = 0; at < held.size();) {
      const size_t plus = std::min(held.find('+', at), held.size());
      parts.insert(held.substr(at, plus - at));
      at = plus + 1;
    }
  }
  for (const std::string& text : parts) {
    Box dims;
    MIH_CHECK_CODE(parse_box(text, &dims) && dims.size() == shape.size(), Code::kFailedPrecondition, where, ": box '",
                   text.substr(0, 80), "' is not a box of a ", shape.size(), "-dim tensor");
    for (size_t d = 0; d < dims.size(); ++d) {
      MIH_CHECK_CODE(dims[d].second <= shape[d], Code::kFailedPrecondition, where, ": box '", text, "' leaves the global shape");
    }
    pieces[text] = dims;
  }
  long double covered = 0, numel = 1;
  for (int64_t d : shape) numel *= static_cast<long double>(d);
  for (auto a = pieces.begin(); a != pieces.end(); ++a) {
    long double volume = 1;
    for (const auto& [lo, hi] : a->second) volume *= static_cast<long double>(hi - lo);
    covered += volume;
    for (auto b = std::next(a); b != pieces.end(); ++b) {
      bool overlap = volume > 0;
      for (size_t d = 0; d < a->second.size() && overlap; ++d) {
        overlap = a->second[d].first < b->second[d].second && b->second[d].first < a->second[d].second;
      }
      MIH_CHECK_CODE(!overlap, Code::kFailedPrecondition, where, ": boxes '", a->first, "' and '", b->first,
                     "' overlap: ranks holding one piece record one box");
    }
  }
  MIH_CHECK_CODE(covered == numel, Code::kFailedPrecondition, where, ": its boxes cover ", static_cast<double>(covered),
                 " of its ", static_cast<double>(numel), " elements");
}

// One parameter's record, typed and checked against the frame.
ReplicaRecord read_record(const std::string& fqn, const json& record, ReplicaKind kind, const ReplicaFrame& frame,
                          const fs::path& file) {
  const std::string where = "evidence file " + file.string() + ": parameter '" + fqn + "'";
  MIH_CHECK_CODE(record.contains("digests") && static_cast<int64_t>(record["digests"].size()) == frame.world_size,
                 Code::kFailedPrecondition, where, ": digests must hold one entry per rank (", frame.world_size, ")");
  ReplicaRecord out;
  for (const json& d : record["digests"]) out.digests.push_back(d.is_string() ? std::optional(d.get<std::string>()) : std::nullopt);
  if (kind == ReplicaKind::kGradients) out.grad_domain = record["grad_domain"].get<std::vector<std::string>>();
  if (!record.contains("boxes")) return out;
  out.boxes = record["boxes"].get<std::vector<std::string>>();
  MIH_CHECK_CODE(out.boxes.size() == out.digests.size(), Code::kFailedPrecondition, where,
                 ": boxes must hold one box per rank, as digests do");
  const auto shape = frame.shapes.find(fqn);
  MIH_CHECK_CODE(shape != frame.shapes.end(), Code::kFailedPrecondition, where, " is not in check/structure.json");
  check_tiling(out.boxes, shape->second, where);
  return out;
}

// The record of one file, typed and checked against the frame.
ReplicaStep read_step(const fs::path& file, const std::string& relative, ReplicaKind kind, const ReplicaFrame& frame) {
  const json j = read_json_file(file);
  require_schema(relative, j, file.string());
  ReplicaStep out;
  out.step = j["step"].get<int64_t>();
  out.file = file;
  MIH_CHECK_CODE(fs::path(file_of(kind, out.step)).filename() == file.filename(), Code::kFailedPrecondition,
                 "evidence file ", file.string(), " holds step ", out.step, ": a record is named by its step");
  MIH_CHECK_CODE(j.contains("parameters"), Code::kFailedPrecondition, "evidence file ", file.string(), " has no 'parameters'");
  for (const auto& [fqn, shape] : frame.shapes) {
    MIH_CHECK_CODE(j["parameters"].contains(fqn), Code::kFailedPrecondition, "evidence file ", file.string(),
                   ": parameter '", fqn, "' of check/structure.json has no record (a writer records every one)");
  }
  for (const auto& [fqn, record] : j["parameters"].items()) out.parameters[fqn] = read_record(fqn, record, kind, frame, file);
  if (kind == ReplicaKind::kGradients) out.reductions = j["reductions"].get<std::map<std::string, int64_t>>();
  return out;
}

}  // namespace

std::map<std::string, std::vector<size_t>> ReplicaRecord::holders() const {
  std::map<std::string, std::vector<size_t>> out;
  for (size_t r = 0; r < digests.size(); ++r) out[boxes.empty() ? "" : boxes[r]].push_back(r);
  return out;
}

std::map<std::string, std::vector<int64_t>> global_shapes(const json& structure, const std::string& file) {
  require_schema(layout::kStructure, structure, file);
  std::map<std::string, std::vector<int64_t>> out;
  for (const json& row : structure["parameters"]) {
    if (row.contains("global_shape")) out[row["fqn"].get<std::string>()] = row["global_shape"].get<std::vector<int64_t>>();
  }
  return out;
}

std::map<int64_t, ReplicaStep> replica_steps(const fs::path& dir, ReplicaKind kind, const ReplicaFrame& frame) {
  const std::string example = fs::path(file_of(kind, 0)).filename().string();
  const std::string head = example.substr(0, example.find('0'));  // "replicas_step"
  std::map<int64_t, ReplicaStep> out;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir / layout::kRuntimeDir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.rfind(head, 0) != 0 || name.size() <= head.size() || !std::isdigit(static_cast<unsigned char>(name[head.size()]))) continue;
    ReplicaStep s = read_step(f.path(), std::string(layout::kRuntimeDir) + "/" + name, kind, frame);
    out.emplace(s.step, std::move(s));
  }
  if (out.empty()) return out;
  std::set<int64_t> steps;
  for (const auto& [step, s] : out) steps.insert(step);
  MIH_CHECK_CODE(steps == frame.steps, Code::kFailedPrecondition, "evidence ", dir.string(), ": ", layout::kRuntimeDir, "/",
                 head, "<k>.json exists for ", steps.size(), " step(s) and metrics.jsonl has ", frame.steps.size(),
                 ": the writer records one per step");
  return out;
}

}  // namespace mih::contract
