// session_internal::write_replica_digests (session_internal.h): every rank's digest of its piece of each
// parameter after the optimizer, or of each gradient after the synchronization, through the one
// writer TrainerSession uses too (replica_digests_internal.h), so that ReplicaConsistency and GradientSync
// judge mih's cases and another writer's with the same verdicts.
#include "harness/session/session_internal.h"

#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "harness/base/sha256.h"
#include "harness/contract/evidence_layout.h"
#include "harness/session/replica_digests_internal.h"

namespace mih {

using nlohmann::json;

namespace {

// Where a rank's piece lies in the global tensor: "[0:4, 8:16]", several boxes (a partitioned
// tp shard) joined by "+", "" for none (FSDP padding rows only).
std::string box_text(const std::vector<Box>& boxes) {
  std::string out;
  for (const Box& b : boxes) {
    if (b.numel() == 0) continue;
    std::string s = "[";
    for (size_t d = 0; d < b.lengths.size(); ++d) {
      s += (d ? ", " : "") + std::to_string(b.global_offset[d]) + ":" + std::to_string(b.global_offset[d] + b.lengths[d]);
    }
    out += (out.empty() ? "" : "+") + s + "]";
  }
  return out;
}

std::string sha256_of(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  return Sha256().update(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size()).hex_digest();
}

// This rank's pieces of every parameter (or of their gradients).
std::vector<session_internal::PieceDigest> pieces(const ParallelContext& ctx, bool gradients) {
  std::vector<session_internal::PieceDigest> out;
  for (const auto& p : ctx.parameters()) {
    const at::Tensor t = gradients ? p->local.grad() : p->local;
    session_internal::PieceDigest d{p->fqn, box_text(ctx.local_boxes(*p)), std::nullopt};
    if (t.defined()) d.sha256 = sha256_of(t);
    if (gradients) {
      d.grad_domain = p->grad_domain();
      d.placements = json::object();
      for (const auto& [axis, placement] : p->placements()) d.placements[axis] = placement.str();
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

void session_internal::write_replica_digests(ParallelContext& ctx, DeviceMesh& mesh, EvidenceDir* evidence,
                                             size_t ledger_from, int64_t step, bool gradients) {
  const json records = replica_records(mesh.comm(MeshAxis::kWorld), pieces(ctx, gradients), ctx.device());
  if (!evidence || mesh.rank() != 0) return;
  if (!gradients) {
    evidence->write_json(layout::replicas_step(step), {{"step", step}, {"parameters", records}}, Durability::kDeferred);
    return;
  }
  // What rank 0's reducing collectives moved per axis since the last step (GradientSync's lower
  // bound: at least the bytes of its gradient pieces declared reduced over the axis).
  std::map<std::string, int64_t> reductions;
  if (const auto& ledger = mesh.ledger()) {
    const std::vector<CommRecord> done = ledger->completed();
    for (size_t i = ledger_from; i < done.size(); ++i) {
      const CommRecord& r = done[i];
      if (r.event != "end" || r.site.rfind("mih.session", 0) == 0) continue;
      if (r.op.rfind("all_reduce", 0) == 0 || r.op.rfind("reduce_scatter", 0) == 0) {
        reductions[r.axis] += r.bytes;
      }
    }
  }
  evidence->write_json(layout::gradient_replicas_step(step),
                        {{"step", step}, {"reductions", reductions}, {"parameters", records}}, Durability::kDeferred);
}

}  // namespace mih
