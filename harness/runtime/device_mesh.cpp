// Mesh layout arithmetic over kMeshDims and DeviceMesh group creation over kMeshAxes.
#include "harness/runtime/device_mesh.h"

#include <algorithm>
#include <map>
#include <ostream>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/strings.h"

namespace mih {
namespace {

constexpr size_t kDims = kMeshDims.size();

int degree(const ParallelConfig& c, size_t i) { return c.*kMeshDims[i].degree; }

// The mesh dims (indices into kMeshDims) `axis` varies, outer to inner.
std::vector<size_t> varying_dims(MeshAxis axis) {
  std::vector<size_t> out;
  const unsigned mask = kMeshAxes[static_cast<size_t>(axis)].dims;
  for (size_t i = 0; i < kDims; ++i) {
    if (mask & (1u << i)) out.push_back(i);
  }
  return out;
}

static_assert([] {
  for (size_t i = 0; i < kMeshAxes.size(); ++i) {
    if (static_cast<size_t>(kMeshAxes[i].axis) != i) return false;
  }
  return true;
}(), "kMeshAxes must list the MeshAxis enumerators in order (comms_ is indexed by them)");
static_assert([] {
  for (const auto& row : kMeshAxes) {
    if (row.dims == 0 || (row.dims & ~kAllMeshDims) != 0) return false;
  }
  return true;
}(), "every kMeshAxes row varies at least one mesh dim of kMeshDims (a misspelt dim name gives 0)");

}  // namespace

std::string_view mesh_axis_name(MeshAxis axis) {
  const size_t i = static_cast<size_t>(axis);
  return i < kMeshAxes.size() ? kMeshAxes[i].name : "unknown";
}

MeshAxis parse_mesh_axis(std::string_view name) {
  for (const auto& row : kMeshAxes) {
    if (row.name == name) return row.axis;
  }
  MIH_THROW(Code::kInvalidSpec, "unknown mesh axis '", name, "'; valid: [",
            join(kMeshAxes, ", ", [](const auto& row) { return std::string(row.name); }), "]");
}

MeshLayout::MeshLayout(const ParallelConfig& config, int world_size) : config_(config), world_size_(world_size) {
  config_.validate_mesh(world_size);
}

MeshCoordinates MeshLayout::coordinates(int rank) const {
  MIH_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " is outside the mesh of world_size ", world_size_);
  MeshCoordinates c{};
  for (size_t i = kDims; i-- > 0;) {
    const int d = degree(config_, i);
    c[i] = rank % d;
    rank /= d;
  }
  return c;
}

std::vector<int> MeshLayout::group_ranks(MeshAxis axis, int rank) const {
  MeshCoordinates base = coordinates(rank);
  std::vector<size_t> vary = varying_dims(axis);
  for (size_t i : vary) base[i] = 0;
  int count = 1;
  for (size_t i : vary) count *= degree(config_, i);
  // The expert axes take one half of their dims' ranks: the ep block of this rank's index
  // (kEpInner) or every ep-th index at its ep rank (kEpOuter).
  const AxisSplit split = kMeshAxes[static_cast<size_t>(axis)].split;
  const int ep = config_.ep;
  int index = 0;  // this rank's row-major index over the varying dims
  for (size_t v : vary) index = index * degree(config_, v) + coordinates(rank)[v];
  std::vector<int> ranks;
  ranks.reserve(static_cast<size_t>(count));
  for (int k = 0; k < count; ++k) {
    if (split == AxisSplit::kEpInner && k / ep != index / ep) continue;
    if (split == AxisSplit::kEpOuter && k % ep != index % ep) continue;
    // Row-major over the varying dims, outer to inner.
    MeshCoordinates c = base;
    int rest = k;
    for (size_t v = vary.size(); v-- > 0;) {
      const int d = degree(config_, vary[v]);
      c[vary[v]] = rest % d;
      rest /= d;
    }
    int r = 0;
    for (size_t i = 0; i < kDims; ++i) r = r * degree(config_, i) + c[i];
    ranks.push_back(r);
  }
  return ranks;
}

std::vector<std::vector<int>> MeshLayout::all_groups(MeshAxis axis) const {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_size_; ++r) {
    std::vector<int> g = group_ranks(axis, r);
    if (g.front() == r) groups.push_back(std::move(g));
  }
  return groups;
}

DeviceMesh::DeviceMesh(const ParallelConfig& config, const compat::Store& store, int rank, int world_size,
                       const MeshOptions& options)
    : layout_(config, world_size), rank_(rank), ledger_(options.ledger) {
  MIH_CHECK(rank >= 0 && rank < world_size, "device mesh: rank ", rank, " is not in [0, world_size(",
            world_size, "))");
  // A per-rank count of meshes with this name keeps the group keys of a second mesh on the
  // same store apart from the first; every rank builds meshes in the same order.
  compat::Store s = store;
  int64_t generation = s.add(internal::str("mih/mesh/", options.name, "/count/rank", rank), 1);
  std::string prefix = internal::str(options.name, ".", generation);

  std::map<std::vector<int>, compat::Group> built;
  comms_.reserve(kAllMeshAxes.size());
  for (MeshAxis axis : kAllMeshAxes) {
    std::string axis_name(mesh_axis_name(axis));
    std::vector<std::vector<int>> groups = layout_.all_groups(axis);
    std::optional<compat::Group> mine;
    for (size_t i = 0; i < groups.size(); ++i) {
      const std::vector<int>& members = groups[i];
      bool member = std::find(members.begin(), members.end(), rank) != members.end();
      if (!member) continue;  // only members construct a group
      // The world group is built on the backend even for one rank (a one-rank selftest
      // exercises it), except where this build lacks the backend: a one-rank group needs none
      // (the float64 CPU Reference of a GPU lane on a build without Gloo, a pip wheel's).
      if (members.size() == 1 && (axis != MeshAxis::kWorld || !compat::backend_available(options.group.backend))) {
        mine = compat::self_group(axis_name, rank);
      } else if (auto it = built.find(members); it != built.end()) {
        mine = it->second.renamed(axis_name);
      } else {
        compat::Group g = with_context(
            internal::str("while creating the '", axis_name, "' group of mesh ", config.mesh_str(), " on rank ", rank,
                          "/", world_size),
            [&] {
              return compat::new_group(store, internal::str(prefix, "/", axis_name, "/", i), members, rank,
                                       options.group);
            });
        built.emplace(members, g);
        mine = g.renamed(axis_name);
      }
    }
    MIH_INTERNAL_ASSERT(mine.has_value(), "rank ", rank, " is in no '", axis_name, "' group");
    comms_.emplace_back(axis_name, *mine, ledger_);
  }
  // Gloo connects a group's pairs asymmetrically: without this a rank could finish (and
  // close its sockets) while a peer is still completing the handshake of a later group.
  comm(MeshAxis::kWorld).barrier("mesh_built");
}

Communicator& DeviceMesh::comm(MeshAxis axis) { return comms_.at(static_cast<size_t>(axis)); }

const Communicator& DeviceMesh::comm(MeshAxis axis) const { return comms_.at(static_cast<size_t>(axis)); }

nlohmann::json DeviceMesh::to_json() const {
  auto c = layout_.coordinates(rank_);
  nlohmann::json coords;
  nlohmann::json dims;
  for (size_t i = 0; i < kDims; ++i) {
    coords[std::string(kMeshDims[i].name)] = c[i];
    dims[std::string(kMeshDims[i].name)] = degree(config(), i);
  }
  nlohmann::json axes;
  for (MeshAxis axis : kAllMeshAxes) {
    const Communicator& cm = comm(axis);
    axes[std::string(mesh_axis_name(axis))] = {
        {"ranks", cm.ranks()}, {"rank", cm.rank()}, {"pg_backend", compat::backend_name(cm.group().backend())}};
  }
  return {{"dims", dims}, {"rank", rank_}, {"world_size", world_size()}, {"coordinates", coords}, {"axes", axes}};
}

}  // namespace mih
