// replica_records (replica_digests_internal.h): every rank's (box, digest) of each parameter, gathered.
#include "harness/session/replica_digests_internal.h"

#include <algorithm>
#include <map>

#include "harness/base/error.h"

namespace mih::session_internal {

using nlohmann::json;

json replica_records(Communicator& world, const std::vector<PieceDigest>& mine, c10::Device device) {
  json local = json::object();
  for (const PieceDigest& p : mine) local[p.fqn] = {p.box, p.sha256 ? json(*p.sha256) : json()};
  const std::vector<json> every = all_gather_json(world, local, device, "mih.session.replicas");
  json out = json::object();
  for (const PieceDigest& p : mine) {
    json boxes = json::array(), digests = json::array();
    std::map<std::string, int> holders;
    for (size_t r = 0; r < every.size(); ++r) {
      MIH_CHECK_CODE(every[r].contains(p.fqn), Code::kInternal, "replica_records: rank ", r, " records no piece of '",
                     p.fqn, "'; every rank passes the same parameters in the same order");
      const json& rec = every[r].at(p.fqn);
      boxes.push_back(rec[0]);
      digests.push_back(rec[1]);
      ++holders[rec[0].get<std::string>()];
    }
    int replicas = 1;
    for (const auto& [box, n] : holders) replicas = std::max(replicas, n);
    json rec = {{"replicas", replicas}, {"compared", replicas > 1}, {"pieces", holders.size()},
                {"boxes", boxes}, {"digests", digests}};
    if (p.grad_domain) {
      rec["grad_domain"] = *p.grad_domain;
      rec["placements"] = p.placements;
    }
    out[p.fqn] = std::move(rec);
  }
  return out;
}

}  // namespace mih::session_internal
