// The Foreign suites of `mih check` (foreign_check.cpp registers them): the checks of a foreign
// case's replica and gradient records before any test reads them, and each suite's body.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/json_fields.h"
#include "harness/base/strings.h"
#include "harness/cases/foreign_check_internal.h"
#include "harness/compare/compare.h"
#include "harness/evidence/evidence_store.h"
#include "harness/contract/step_rows.h"

namespace mih::cases::foreign {

namespace fs = std::filesystem;
using nlohmann::json;

// NumericParity on a foreign case: compare_evidence at the binary's tolerance for its dtype.
void numeric_parity(const ForeignCase& c, double tolerance) {
  CompareOptions o;
  o.tolerance = tolerance;
  // A resumed run (its load phase captured the checkpoint) starts at the step it resumed at.
  std::error_code ec;
  if (fs::exists(c.dir / layout::kRoundtripLoad, ec)) {
    const json loaded = read_json_file(c.dir / layout::kRoundtripLoad);
    if (loaded.contains("next_step") && loaded["next_step"].is_number_integer()) o.first_step = loaded["next_step"].get<int64_t>();
  }
  const Comparison cmp = compare_evidence(c.reference, c.dir, o);
  double worst = 0;
  std::string worst_name;
  int64_t first = -1, last = -1;
  for (const Measurement& m : cmp.measurements) {
    if (m.relative_error > worst) {
      worst = m.relative_error;
      worst_name = m.kind + " '" + m.name + "' step " + std::to_string(m.step) + " " + m.stage;
    }
    first = first < 0 ? m.step : std::min(first, m.step);
    last = std::max(last, m.step);
  }
  if (!cmp.passed()) {
    const Localization where = localize(cmp);
    ADD_FAILURE() << c.spec << "/" << c.name << " (" << c.writer << ") against " << c.reference.filename().string()
                  << ", tolerance " << tolerance << " (" << c.dtype << ", this mih's cross-topology default):\n  "
                  << cmp.summary() << (cmp.summary().find("localized to") == std::string::npos
                                           ? "\n  localized to '" + where.blamed + "': " + where.reason
                                           : std::string());
    return;
  }
  std::printf("  examined %lld quantities (loss, grad norms, lr, watched tensors, module activations) over steps %lld-%lld "
              "against %s: largest relative error %.3g (%s), tolerance %g (%s)\n",
              static_cast<long long>(cmp.measurements.size()), static_cast<long long>(first),
              static_cast<long long>(last), c.reference.filename().string().c_str(), worst,
              worst_name.empty() ? "none" : worst_name.c_str(), tolerance, c.dtype.c_str());
  EXPECT_GT(cmp.measurements.size(), 0u) << "nothing was compared";
}

// InputIdentity on a foreign case: every step of the reference's global batch, field by field.
void same_inputs(const ForeignCase& c) {
  const EvidenceDir mine = EvidenceDir::open_existing(c.dir), theirs = EvidenceDir::open_existing(c.reference);
  // Rows by step; two rows of one step are not one run's (the second would hide the first).
  auto by_step = [](const EvidenceDir& d) {
    return rows_by_step(d.read_jsonl(layout::kInputIdentity), (d.root() / layout::kInputIdentity).string());
  };
  std::error_code ec;
  ASSERT_TRUE(fs::exists(c.dir / layout::kInputIdentity, ec) && fs::exists(c.reference / layout::kInputIdentity, ec))
      << c.spec << "/" << c.name << ": " << (c.dir / layout::kInputIdentity).string() << " and "
      << (c.reference / layout::kInputIdentity).string() << " must both exist (one side recorded its inputs)";
  const std::map<int64_t, json> ref = by_step(theirs), seen = by_step(mine);
  int steps = 0;
  for (const auto& [step, row] : seen) {
    const auto it = ref.find(step);
    if (it == ref.end()) {
      ADD_FAILURE() << c.spec << "/" << c.name << ": step " << step << " has no input identity in the reference "
                    << c.reference.string();
      continue;
    }
    ++steps;
    // Every part: the global hash, each field's, the row count (a field edited under an
    // unchanged global hash is not the same batch).
    if (row.at("global") == it->second.at("global") && row.at("fields") == it->second.at("fields") &&
        row.at("rows") == it->second.at("rows")) {
      continue;
    }
    std::string fields;
    for (const auto& [field, hash] : row.at("fields").items()) {
      const json& other = it->second.at("fields");
      if (!other.contains(field) || other[field] != hash) fields += (fields.empty() ? "" : ", ") + field;
    }
    for (const auto& [field, hash] : it->second.at("fields").items()) {
      if (!row.at("fields").contains(field)) fields += (fields.empty() ? "" : ", ") + field + " (missing)";
    }
    ADD_FAILURE() << c.spec << "/" << c.name << " step " << step << ": the global batch differs from "
                  << c.reference.filename().string() << "'s in " << (fields.empty() ? "its row count" : fields)
                  << " (open " << (c.dir / layout::kInputIdentity).string() << ")";
  }
  ASSERT_GT(steps, 0) << c.spec << "/" << c.name << ": no step in common with the reference's input identity";
  std::printf("  examined the global batch of %d step(s) against %s\n", steps, c.reference.filename().string().c_str());
}

// The cases/runtime/<prefix><k>.json files of `dir` (replicas_step, gradient_replicas_step)
// whose records carry digests, by step.
std::map<int64_t, fs::path> replica_files(const fs::path& dir, const std::string& prefix) {
  std::map<int64_t, fs::path> out;
  std::error_code ec;
  const std::string example =
      fs::path(prefix == "replicas_step" ? layout::replicas_step(0) : layout::gradient_replicas_step(0)).filename().string();
  const std::string head = example.substr(0, example.find('0'));  // "replicas_step"
  for (const auto& f : fs::directory_iterator(dir / layout::kRuntimeDir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.rfind(head, 0) != 0 || name.size() <= head.size() || !std::isdigit(static_cast<unsigned char>(name[head.size()]))) continue;
    const json j = read_json_file(f.path());
    if (j.contains("step") && j["step"].is_number_integer()) out[j["step"].get<int64_t>()] = f.path();
  }
  return out;
}

// A box "[0:4, 8:16]" as (start, end) per dim; false when it is not one.
static bool parse_box(const std::string& text, std::vector<std::pair<int64_t, int64_t>>* dims) {
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
      size_t used = 0;
      const std::string a = part.substr(part.find_first_not_of(' ') == std::string::npos ? 0 : part.find_first_not_of(' '));
      const int64_t start = std::stoll(a, &used);
      const int64_t end = std::stoll(part.substr(colon + 1));
      if (start < 0 || end < start) return false;
      dims->emplace_back(start, end);
    } catch (const std::exception&) {
      return false;
    }
    at = comma + 1;
  }
  return true;
}

// The replica and gradient records of a foreign case say what they claim to, before a test
// reads them (bad evidence is exit 12, never a test that passes on what it skipped): one file
// per step of the metrics, named by its step; every parameter of check/structure.json in each;
// one digest (and box) per rank; boxes that tile their parameter's global shape exactly.
void check_records(const ForeignCase& c) {
  const json structure = read_json_file(c.dir / layout::kStructure);
  std::map<std::string, std::vector<int64_t>> shapes;
  if (structure.is_object() && structure.contains("parameters") && structure["parameters"].is_array()) {
    for (const json& row : structure["parameters"]) {
      if (row.is_object() && row.contains("fqn") && row["fqn"].is_string() && row.contains("global_shape") &&
          row["global_shape"].is_array()) {
        std::vector<int64_t> shape;
        for (const json& d : row["global_shape"]) shape.push_back(d.is_number_integer() ? d.get<int64_t>() : -1);
        shapes[row["fqn"].get<std::string>()] = shape;
      }
    }
  }
  std::set<int64_t> metric_steps;
  for (const auto& [step, row] :
       rows_by_step(EvidenceDir::open_existing(c.dir).read_jsonl(layout::kMetrics), (c.dir / layout::kMetrics).string())) {
    metric_steps.insert(step);
  }
  std::error_code ec;
  if (fs::exists(c.dir / layout::kInputIdentity, ec)) {  // indexed only for its refusals
    rows_by_step(EvidenceDir::open_existing(c.dir).read_jsonl(layout::kInputIdentity),
                 (c.dir / layout::kInputIdentity).string());
  }
  // A run that stopped early is not a run to judge: every step it was to train has its row.
  const json env = read_json_file(c.dir / layout::kEnvironment);
  const int64_t steps = env.contains("case") && env["case"].is_object() && env["case"].contains("steps") &&
                                env["case"]["steps"].is_number_integer()
                            ? env["case"]["steps"].get<int64_t>()
                            : 0;
  if (steps > 0 && !metric_steps.empty()) {
    const int64_t first = *metric_steps.begin();
    MIH_CHECK_CODE(static_cast<int64_t>(metric_steps.size()) == steps - first && *metric_steps.rbegin() == steps - 1,
                   Code::kFailedPrecondition, "evidence ", c.dir.string(), " records steps ", first, "-",
                   *metric_steps.rbegin(), " of a run of ", steps, " (environment.json case.steps): the run did not "
                   "finish; rerun it");
  }
  // The degrees the config names make the world the environment names.
  const json config = read_json_file(c.dir / layout::kConfigResolved);
  int64_t product = 1;
  for (const char* axis : {"pp", "dp_replicate", "dp_shard", "cp", "tp"}) {
    if (config.is_object() && config.contains(axis) && config[axis].is_number_integer()) product *= config[axis].get<int64_t>();
  }
  MIH_CHECK_CODE(product == c.world_size, Code::kFailedPrecondition, "evidence ", c.dir.string(), ": the degrees of ",
                 layout::kConfigResolved, " make ", product, " rank(s), and environment.json says world_size ", c.world_size);
  for (const std::string prefix : {"replicas_step", "gradient_replicas_step"}) {
    const std::map<int64_t, fs::path> files = replica_files(c.dir, prefix);
    if (files.empty()) continue;
    std::set<int64_t> steps;
    for (const auto& [step, file] : files) steps.insert(step);
    MIH_CHECK_CODE(steps == metric_steps, Code::kFailedPrecondition, "evidence ", c.dir.string(), ": cases/runtime/",
                   prefix, "<k>.json exists for ", steps.size(), " step(s) and metrics.jsonl has ", metric_steps.size(),
                   ": the writer records one per step");
    for (const auto& [step, file] : files) {
      const std::string name = file.filename().string();
      const std::string expected =
          fs::path(prefix == "replicas_step" ? layout::replicas_step(step) : layout::gradient_replicas_step(step))
              .filename()
              .string();
      MIH_CHECK_CODE(name == expected, Code::kFailedPrecondition, "evidence file ",
                     file.string(), " holds step ", step, ": a record is named by its step");
      const json j = read_json_file(file);
      MIH_CHECK_CODE(j.contains("parameters") && j["parameters"].is_object(), Code::kFailedPrecondition,
                     "evidence file ", file.string(), " has no 'parameters'");
      for (const auto& [fqn, shape] : shapes) {
        MIH_CHECK_CODE(j["parameters"].contains(fqn), Code::kFailedPrecondition, "evidence file ", file.string(),
                       ": parameter '", fqn, "' of check/structure.json has no record (a writer records every one)");
      }
      for (const auto& [fqn, record] : j["parameters"].items()) {
        const std::string where = "evidence file " + file.string() + ": parameter '" + fqn + "'";
        MIH_CHECK_CODE(record.is_object() && record.contains("digests") && record["digests"].is_array() &&
                           static_cast<int64_t>(record["digests"].size()) == c.world_size,
                       Code::kFailedPrecondition, where, ": digests must hold one entry per rank (", c.world_size, ")");
        if (!record.contains("boxes")) continue;
        MIH_CHECK_CODE(record["boxes"].is_array() && record["boxes"].size() == record["digests"].size(),
                       Code::kFailedPrecondition, where, ": boxes must hold one box per rank, as digests do");
        const auto shape = shapes.find(fqn);
        MIH_CHECK_CODE(shape != shapes.end(), Code::kFailedPrecondition, where, " is not in check/structure.json");
        // The distinct pieces must tile the global shape: inside it, disjoint, covering it.
        std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> pieces;
        for (const json& b : record["boxes"]) {
          std::vector<std::pair<int64_t, int64_t>> dims;
          const std::string text = b.is_string() ? b.get<std::string>() : "";
          MIH_CHECK_CODE(parse_box(text, &dims) && dims.size() == shape->second.size(), Code::kFailedPrecondition, where,
                         ": box '", text.substr(0, 80), "' is not a box of a ", shape->second.size(), "-dim tensor");
          for (size_t d = 0; d < dims.size(); ++d) {
            MIH_CHECK_CODE(dims[d].second <= shape->second[d], Code::kFailedPrecondition, where, ": box '", text,
                           "' leaves the global shape");
          }
          pieces[text] = dims;
        }
        long double covered = 0, numel = 1;
        for (int64_t d : shape->second) numel *= static_cast<long double>(d);
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
        MIH_CHECK_CODE(covered == numel, Code::kFailedPrecondition, where, ": its boxes cover ",
                       static_cast<double>(covered), " of its ", static_cast<double>(numel), " elements");
      }
    }
  }
}

// The ranks holding each piece of a replica record, by box ("" when the writer recorded no
// boxes: every rank holds the whole tensor), in rank order.
static std::map<std::string, std::vector<size_t>> holders(const json& record) {
  std::map<std::string, std::vector<size_t>> out;
  if (!record.is_object() || !record.contains("digests") || !record["digests"].is_array()) return out;
  const json& d = record["digests"];
  const bool boxed = record.contains("boxes") && record["boxes"].is_array();
  MIH_CHECK_CODE(!boxed || record["boxes"].size() == d.size(), Code::kFailedPrecondition,
                 "a replica record has ", d.size(), " digests and ", record["boxes"].size(), " boxes: one of each per rank");
  for (size_t r = 0; r < d.size(); ++r) out[boxed ? record["boxes"][r].get<std::string>() : ""].push_back(r);
  return out;
}

// Whether some piece of some record of `files` is held by two ranks or more.
bool any_compared(const std::map<int64_t, fs::path>& files) {
  for (const auto& [step, file] : files) {
    const json j = read_json_file(file);
    if (!j.contains("parameters") || !j["parameters"].is_object()) continue;
    for (const auto& [fqn, record] : j["parameters"].items()) {
      for (const auto& [box, ranks] : holders(record)) {
        if (ranks.size() > 1) return true;
      }
    }
  }
  return false;
}

// The ranks among `ranks` whose digest differs from the first one's, as text ("1, 3").
static std::string differing(const json& digests, const std::vector<size_t>& ranks) {
  std::string out;
  for (size_t i = 1; i < ranks.size(); ++i) {
    if (digests[ranks[i]] != digests[ranks[0]]) out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

// One failure per step of a check over many tensors: the first few, and how many more.
static void fail_step(const ForeignCase& c, int64_t step, const std::vector<std::string>& items, const std::string& what,
               const fs::path& file) {
  if (items.empty()) return;
  std::string text;
  for (size_t i = 0; i < items.size() && i < 6; ++i) text += "\n    " + items[i];
  if (items.size() > 6) text += "\n    and " + std::to_string(items.size() - 6) + " more";
  ADD_FAILURE() << c.spec << "/" << c.name << " step " << step << ": " << what << " (" << items.size() << "):" << text
                << "\n  (open " << file.string() << ")";
}

// ReplicaConsistency on a foreign case: after every step's optimizer, every rank holding a
// piece of a parameter (the same box; every rank when the writer records no boxes) holds the
// same bytes (the digests each rank computed of its own copy).
void replicas_agree(const ForeignCase& c) {
  int64_t compared = 0, steps = 0;
  for (const auto& [step, file] : replica_files(c.dir, "replicas_step")) {
    ++steps;
    const json j = read_json_file(file);
    if (!j.contains("parameters") || !j["parameters"].is_object()) continue;
    std::vector<std::string> bad;
    for (const auto& [fqn, record] : j["parameters"].items()) {
      for (const auto& [box, ranks] : holders(record)) {
        if (ranks.size() < 2) continue;
        ++compared;
        const std::string differ = differing(record["digests"], ranks);
        if (!differ.empty()) {
          bad.push_back("'" + fqn + "'" + (box.empty() ? "" : " piece " + box) + ": rank(s) " + differ +
                        " hold other bytes than rank " + std::to_string(ranks[0]));
        }
      }
    }
    fail_step(c, step, bad, "parameter copies differ after the optimizer", file);
  }
  ASSERT_GT(compared, 0) << c.spec << "/" << c.name << ": no parameter piece was held by two ranks or more in the replica "
                         << "records under " << (c.dir / layout::kRuntimeDir).string();
  std::printf("  examined %lld replicated parameter piece(s) over %lld step(s)\n", static_cast<long long>(compared),
              static_cast<long long>(steps));
}

// GradientSync on a foreign case: after the trainer's synchronization, every rank holding a
// piece of a gradient holds the same bytes (a gradient left unreduced over an axis whose ranks
// saw other rows differs between them), and every axis a gradient must be reduced over moved
// bytes in that step (the metrics' comm_bytes, from the trainer's ledgered collectives).
void gradients_agree(const ForeignCase& c) {
  // The degree of each axis (config.resolved.json, checked against the world by check_records).
  const json config = read_json_file(c.dir / layout::kConfigResolved);
  auto degree = [&](const std::string& axis) {
    return config.is_object() && config.contains(axis) && config[axis].is_number_integer() ? config[axis].get<int64_t>() : 1;
  };
  // Per axis, the bytes of rank 0's gradient pieces that must be reduced over it (its rows of
  // check/structure.json: local shape, dtype, grad_domain; requires_grad): a lower bound on what
  // its reducing collectives on that axis moved in a step, whatever its bucketing.
  const json structure = read_json_file(c.dir / layout::kStructure);
  std::map<std::string, int64_t> must_reduce;
  std::set<std::string> trainable;
  for (const json& row : structure.at("parameters")) {
    if (!row.value("requires_grad", true)) continue;
    trainable.insert(row.at("fqn").get<std::string>());
    int64_t numel = 1;
    for (const json& d : row.value("local_shape", json::array())) numel *= d.is_number_integer() ? d.get<int64_t>() : 0;
    const std::string dtype = row.value("dtype", "float32");
    const int64_t size = dtype == "float64" ? 8 : dtype == "bfloat16" || dtype == "float16" ? 2 : 4;
    for (const json& axis : row.value("grad_domain", json::array())) {
      if (axis.is_string() && degree(axis.get<std::string>()) > 1) must_reduce[axis.get<std::string>()] += numel * size;
    }
  }
  int64_t compared = 0, steps = 0, reductions = 0;
  for (const auto& [step, file] : replica_files(c.dir, "gradient_replicas_step")) {
    ++steps;
    const json j = read_json_file(file);
    std::vector<std::string> bad;
    const json reduced = j.value("reductions", json::object());
    for (const auto& [axis, bytes] : must_reduce) {
      ++reductions;
      const int64_t moved = reduced.is_object() ? reduced.value(axis, int64_t{0}) : 0;
      if (moved < bytes) {
        bad.push_back("over " + axis + ": rank 0's reducing collectives (all-reduce, reduce-scatter) moved " +
                      std::to_string(moved) + " bytes before its gradients were read, and the gradient pieces declared "
                      "reduced over it hold " + std::to_string(bytes) + " (a reduction skipped)");
      }
    }
    for (const auto& [fqn, record] : j.at("parameters").items()) {
      std::string domain;
      for (const json& axis : record.at("grad_domain")) domain += (domain.empty() ? "" : ", ") + axis.get<std::string>();
      for (const auto& [box, ranks] : holders(record)) {
        const json& d = record["digests"];
        if (trainable.count(fqn) &&
            std::all_of(ranks.begin(), ranks.end(), [&](size_t r) { return d[r].is_null(); })) {
          bad.push_back("the gradient of '" + fqn + "'" + (box.empty() ? "" : " piece " + box) + ": no rank holding it has one");
          continue;
        }
        if (ranks.size() < 2) continue;
        ++compared;
        const std::string differ = differing(d, ranks);
        if (!differ.empty()) {
          bad.push_back("the gradient of '" + fqn + "'" + (box.empty() ? "" : " piece " + box) + ": rank(s) " + differ +
                        " hold another than rank " + std::to_string(ranks[0]) + " (declared reduced over: " +
                        (domain.empty() ? "no axis" : domain) + ")");
        }
      }
    }
    fail_step(c, step, bad, "gradients after the trainer's synchronization are not reduced (copies differ, or a "
              "reduction is missing)", file);
  }
  ASSERT_GT(compared + reductions, 0)
      << c.spec << "/" << c.name << ": no gradient piece held by two ranks and no declared reduction to check";
  std::string axes;
  for (const auto& [axis, bytes] : must_reduce) axes += (axes.empty() ? "" : ", ") + axis + " (" + std::to_string(bytes) + " bytes)";
  std::printf("  examined %lld replicated gradient piece(s) over %lld step(s), and %lld step-axis reduction volume(s) "
              "against the gradient bytes declared reduced (%s)\n",
              static_cast<long long>(compared), static_cast<long long>(steps), static_cast<long long>(reductions),
              axes.empty() ? "none declared" : axes.c_str());
}

// CheckpointRoundTrip on a foreign case: what the load restored equals what the save saved,
// tensor by tensor (full tensors' SHA-256 and shapes), and the step it resumes at.
void checkpoint_round_trip(const ForeignCase& c) {
  const fs::path saved = c.dir / layout::before_save(layout::kRoundtripSave), loaded = c.dir / layout::kRoundtripLoad;
  std::error_code ec;
  ASSERT_TRUE(fs::exists(saved, ec) && fs::exists(loaded, ec))
      << c.spec << "/" << c.name << ": " << saved.string() << " and " << loaded.string()
      << " must both exist (the save phase's capture_checkpoint_payload(\"save\") and the load phase's \"load\")";
  const json a = read_json_file(saved), b = read_json_file(loaded);
  EXPECT_EQ(a.at("next_step"), b.at("next_step")) << c.spec << "/" << c.name << ": the load resumes at another step";
  int64_t same = 0;
  for (const auto& [name, t] : a.at("tensors").items()) {
    if (!b.at("tensors").contains(name)) {
      ADD_FAILURE() << c.spec << "/" << c.name << ": '" << name << "' was saved and not restored (" << loaded.string() << ")";
      continue;
    }
    const json& u = b.at("tensors")[name];
    if (u == t) {
      ++same;
      continue;
    }
    ADD_FAILURE() << c.spec << "/" << c.name << ": '" << name << "' restored " << (u.at("shape") == t.at("shape") ? "other values" : "another shape")
                  << " than were saved (" << saved.string() << " against " << loaded.string() << ")";
  }
  for (const auto& [name, t] : b.at("tensors").items()) {
    if (!a.at("tensors").contains(name)) ADD_FAILURE() << c.spec << "/" << c.name << ": '" << name << "' was restored, never saved";
  }
  ASSERT_GT(same, 0) << c.spec << "/" << c.name << ": no tensor was saved";
  int64_t states = 0;
  for (const auto& [name, t] : a.at("tensors").items()) states += name.find('/') != std::string::npos ? 1 : 0;
  std::printf("  examined %lld tensor(s) saved and restored (%s), resuming at step %s\n", static_cast<long long>(same),
              states ? (std::to_string(states) + " of them optimizer state").c_str()
                     : "parameters only: the writer captured no optimizer state (a TrainerSession captures AdamW's moments)",
              a.at("next_step").dump().c_str());
}

}  // namespace mih::cases::foreign
