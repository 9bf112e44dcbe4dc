// The verdicts of ReplicaConsistency and GradientSync on the digests a writer recorded of every
// rank's copies (verdicts.h: replica_digests_agree, gradient_digests_agree), read typed and
// checked against the case by contract::replica_steps.
#include "harness/compare/verdicts.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "harness/base/parallel_config.h"
#include "harness/base/strings.h"
#include "harness/compare/verdicts_internal.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/metrics_row.h"
#include "harness/contract/replica_records.h"
#include "harness/contract/structure_table.h"

namespace mih::verdicts {
namespace {

using contract::ReplicaKind;
using contract::ReplicaRecord;
using contract::ReplicaStep;

// The records of `kind` of the case, checked against its structure, metrics and world.
std::map<int64_t, ReplicaStep> records(const CaseEvidence& ev, ReplicaKind kind) {
  contract::ReplicaFrame frame;
  frame.shapes = contract::global_shapes(ev.json(layout::kStructure), rel_path(ev, layout::kStructure));
  for (const auto& [step, row] : contract::metrics_rows(ev.jsonl(layout::kMetrics), rel_path(ev, layout::kMetrics))) {
    frame.steps.insert(step);
  }
  frame.world_size = ev.config().world_size();
  return contract::replica_steps(ev.dir(), kind, frame);
}

// The ranks among `ranks` whose digest differs from the first one's, as text ("1, 3").
std::string differing(const ReplicaRecord& r, const std::vector<size_t>& ranks) {
  std::string out;
  for (size_t i = 1; i < ranks.size(); ++i) {
    if (r.digests[ranks[i]] != r.digests[ranks[0]]) out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
  }
  return out;
}

// One step's problems over many tensors: the first few, how many more, and the file.
std::string step_problems(const ReplicaStep& s, const std::vector<std::string>& items, const std::string& what) {
  std::string text = "step " + std::to_string(s.step) + ": " + what + " (" + std::to_string(items.size()) + "):";
  for (size_t i = 0; i < items.size() && i < 6; ++i) text += "\n    " + items[i];
  if (items.size() > 6) text += "\n    and " + std::to_string(items.size() - 6) + " more";
  return text + "\n  (open " + s.file.string() + ")";
}

std::string piece(const std::string& fqn, const std::string& box) {
  return "'" + fqn + "'" + (box.empty() ? "" : " piece " + box);
}

// Per axis of degree > 1, the bytes of rank 0's gradient pieces declared reduced over it (its
// rows of check/structure.json), and the trainable parameters: a lower bound on what its
// reducing collectives on that axis moved in a step, whatever its bucketing.
std::map<std::string, int64_t> must_reduce(const CaseEvidence& ev, std::set<std::string>* trainable) {
  std::map<std::string, int64_t> out;
  const ParallelConfig& config = ev.config();
  for (const contract::ParameterRow& row :
       contract::structure_parameters(ev.json(layout::kStructure), rel_path(ev, layout::kStructure))) {
    if (!row.requires_grad) continue;
    trainable->insert(row.fqn);
    int64_t n = 1;
    for (int64_t d : row.local_shape) n *= d;
    for (const std::string& axis : row.grad_domain.value_or(std::vector<std::string>{})) {
      for (const MeshDim& d : kMeshDims) {
        if (d.name == axis && config.*d.degree > 1) out[axis] += n * element_size(row.dtype);
      }
    }
  }
  return out;
}

// One step's gradient problems: reductions short of their bytes, missing or differing copies.
std::vector<std::string> gradient_problems(const ReplicaStep& s, const std::map<std::string, int64_t>& reduce,
                                           const std::set<std::string>& trainable, int64_t* compared) {
  std::vector<std::string> bad;
  for (const auto& [axis, bytes] : reduce) {
    const auto moved = s.reductions.find(axis);
    const int64_t got = moved == s.reductions.end() ? 0 : moved->second;
    if (got < bytes) {
      bad.push_back("over " + axis + ": rank 0's reducing collectives (all-reduce, reduce-scatter) moved " +
                    std::to_string(got) + " bytes before its gradients were read, and the gradient pieces declared "
                    "reduced over it hold " + std::to_string(bytes) + " (a reduction skipped)");
    }
  }
  for (const auto& [fqn, r] : s.parameters) {
    std::string domain;
    for (const std::string& axis : r.grad_domain) domain += (domain.empty() ? "" : ", ") + axis;
    for (const auto& [box, ranks] : r.holders()) {
      if (box.empty() && !r.boxes.empty()) continue;  // ranks holding no piece
      if (trainable.count(fqn) && std::all_of(ranks.begin(), ranks.end(), [&](size_t k) { return !r.digests[k]; })) {
        bad.push_back("the gradient of " + piece(fqn, box) + ": no rank holding it has one");
        continue;
      }
      if (ranks.size() < 2 || (box.empty() && !r.boxes.empty())) continue;  // "": ranks holding none
      ++*compared;
      const std::string differ = differing(r, ranks);
      if (!differ.empty()) {
        bad.push_back("the gradient of " + piece(fqn, box) + ": rank(s) " + differ + " hold another than rank " +
                      std::to_string(ranks[0]) + " (declared reduced over: " + (domain.empty() ? "no axis" : domain) + ")");
      }
    }
  }
  return bad;
}

}  // namespace

std::string replica_digests_compared(const CaseEvidence& ev) {
  for (const auto& [step, s] : records(ev, ReplicaKind::kParameters)) {
    for (const auto& [fqn, r] : s.parameters) {
      for (const auto& [box, ranks] : r.holders()) {
        if (ranks.size() > 1 && !(box.empty() && !r.boxes.empty())) return "";
      }
    }
  }
  return "no parameter piece is held by two ranks or more in " + rel_path(ev, layout::replicas_step(0)) +
         " and the other steps' records";
}

Verdict replica_digests_agree(const CaseEvidence& ev) {
  int64_t compared = 0, steps = 0;
  std::vector<std::string> failures;
  for (const auto& [step, s] : records(ev, ReplicaKind::kParameters)) {
    ++steps;
    std::vector<std::string> bad;
    for (const auto& [fqn, r] : s.parameters) {
      for (const auto& [box, ranks] : r.holders()) {
        if (ranks.size() < 2 || (box.empty() && !r.boxes.empty())) continue;  // "": ranks holding none
        ++compared;
        const std::string differ = differing(r, ranks);
        if (!differ.empty()) {
          bad.push_back(piece(fqn, box) + ": rank(s) " + differ + " hold other bytes than rank " + std::to_string(ranks[0]));
        }
      }
    }
    if (!bad.empty()) failures.push_back(step_problems(s, bad, "parameter copies differ after the optimizer"));
  }
  if (!failures.empty()) return Verdict::fail(join(failures, "\n"));
  if (compared == 0) return Verdict::fail(replica_digests_compared(ev));
  return Verdict::pass("examined " + std::to_string(compared) + " replicated parameter piece(s) over " +
                       std::to_string(steps) + " step(s)");
}

std::string gradient_digests_examinable(const CaseEvidence& ev) {
  std::set<std::string> trainable;
  if (!must_reduce(ev, &trainable).empty()) return "";
  for (const auto& [step, s] : records(ev, ReplicaKind::kGradients)) {
    for (const auto& [fqn, r] : s.parameters) {
      for (const auto& [box, ranks] : r.holders()) {
        if (ranks.size() > 1 && !(box.empty() && !r.boxes.empty())) return "";
      }
    }
  }
  return "no gradient piece is held by two ranks and no axis of degree > 1 has a gradient declared reduced over it "
         "(check/structure.json grad_domain)";
}

Verdict gradient_digests_agree(const CaseEvidence& ev) {
  std::set<std::string> trainable;
  const std::map<std::string, int64_t> reduce = must_reduce(ev, &trainable);
  int64_t compared = 0, steps = 0;
  std::vector<std::string> failures;
  for (const auto& [step, s] : records(ev, ReplicaKind::kGradients)) {
    ++steps;
    const std::vector<std::string> bad = gradient_problems(s, reduce, trainable, &compared);
    if (!bad.empty()) {
      failures.push_back(step_problems(s, bad, "gradients after the trainer's synchronization are not reduced (copies "
                                               "differ, or a reduction is missing)"));
    }
  }
  if (!failures.empty()) return Verdict::fail(join(failures, "\n"));
  if (compared + static_cast<int64_t>(reduce.size()) * steps == 0) {
    return Verdict::fail("no gradient piece held by two ranks and no declared reduction to check (open " +
                         rel_path(ev, layout::gradient_replicas_step(0)) + ")");
  }
  std::string axes;
  for (const auto& [axis, bytes] : reduce) axes += (axes.empty() ? "" : ", ") + axis + " (" + std::to_string(bytes) + " bytes)";
  return Verdict::pass("examined " + std::to_string(compared) + " replicated gradient piece(s) over " + std::to_string(steps) +
                       " step(s), and " + std::to_string(reduce.size() * steps) + " step-axis reduction volume(s) against "
                       "the gradient bytes declared reduced (" + (axes.empty() ? "none declared" : axes) + ")");
}

}  // namespace mih::verdicts
