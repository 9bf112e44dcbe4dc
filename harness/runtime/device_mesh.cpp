// ParallelDims parsing/validation, mesh layout arithmetic and DeviceMesh group creation.
#include "harness/runtime/device_mesh.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <ostream>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"

namespace mih {
namespace {

constexpr std::array<std::string_view, 4> kDimNames = {"dp_replicate", "dp_shard", "cp", "tp"};

int& dim_ref(ParallelDims& d, size_t i) {
  switch (i) {
    case 0: return d.dp_replicate;
    case 1: return d.dp_shard;
    case 2: return d.cp;
    default: return d.tp;
  }
}

int dim_value(const ParallelDims& d, size_t i) { return dim_ref(const_cast<ParallelDims&>(d), i); }

std::string valid_dim_names() {
  return "[dp_replicate, dp_shard, cp, tp]";
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The mesh axes (indices into kDimNames) each MeshAxis varies.
std::vector<size_t> varying_dims(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kWorld: return {0, 1, 2, 3};
    case MeshAxis::kDpReplicate: return {0};
    case MeshAxis::kDpShard: return {1};
    case MeshAxis::kCp: return {2};
    case MeshAxis::kTp: return {3};
    case MeshAxis::kDp: return {0, 1};
    case MeshAxis::kDpShardCp: return {1, 2};
    case MeshAxis::kDpCp: return {0, 1, 2};
  }
  return {};
}

}  // namespace

ParallelDims ParallelDims::parse(std::string_view text) {
  ParallelDims dims;
  std::vector<std::string_view> seen;
  text = trim(text);
  while (!text.empty()) {
    auto comma = text.find(',');
    std::string_view item = trim(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    if (item.empty()) continue;
    auto eq = item.find('=');
    MIH_CHECK(eq != std::string_view::npos, "mesh '", item, "': expected <axis>=<degree> such as 'tp=2'");
    std::string_view name = trim(item.substr(0, eq));
    std::string_view value = trim(item.substr(eq + 1));
    auto it = std::find(kDimNames.begin(), kDimNames.end(), name);
    MIH_CHECK(it != kDimNames.end(), "unknown mesh axis '", name, "'; valid: ", valid_dim_names(),
              name == "dp" || name == "dp_cp" || name == "dp_shard_cp"
                  ? internal::str("; '", name, "' is a combined axis: set its parts (dp_shard for FSDP, "
                                  "dp_replicate for DDP, cp)")
                  : std::string());
    MIH_CHECK(std::find(seen.begin(), seen.end(), name) == seen.end(), "mesh axis '", name,
              "' is given twice");
    seen.push_back(name);
    int degree = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), degree);
    MIH_CHECK(ec == std::errc() && end == value.data() + value.size() && degree >= 1, "mesh axis '", name,
              "': degree '", value, "' is not an integer >= 1");
    dim_ref(dims, static_cast<size_t>(it - kDimNames.begin())) = degree;
  }
  return dims;
}

ParallelDims ParallelDims::spread(int world_size) {
  MIH_CHECK(world_size >= 1, "world_size(", world_size, ") must be >= 1");
  ParallelDims dims;
  // Inner axes first: tp, cp, dp_shard, dp_replicate.
  const size_t order[4] = {3, 2, 1, 0};
  size_t next = 0;
  int n = world_size;
  for (int p = 2; n > 1; ++p) {
    while (n % p == 0) {
      dim_ref(dims, order[next % 4]) *= p;
      ++next;
      n /= p;
    }
  }
  return dims;
}

void ParallelDims::validate(int world_size) const {
  for (size_t i = 0; i < kDimNames.size(); ++i) {
    MIH_CHECK(dim_value(*this, i) >= 1, "mesh axis '", kDimNames[i], "' has degree ", dim_value(*this, i),
              "; degrees must be >= 1 (1 disables the axis)");
  }
  MIH_CHECK(product() == world_size, "dp_replicate(", dp_replicate, ") * dp_shard(", dp_shard, ") * cp(", cp,
            ") * tp(", tp, ") = ", product(), " != world_size(", world_size,
            "); choose degrees whose product is ", world_size);
}

std::string ParallelDims::str() const {
  std::string out;
  for (size_t i = 0; i < kDimNames.size(); ++i) {
    if (dim_value(*this, i) == 1) continue;
    out += internal::str(out.empty() ? "" : ",", kDimNames[i], "=", dim_value(*this, i));
  }
  return out.empty() ? "1" : out;
}

void to_json(nlohmann::json& j, const ParallelDims& d) {
  j = nlohmann::json{{"dp_replicate", d.dp_replicate}, {"dp_shard", d.dp_shard}, {"cp", d.cp}, {"tp", d.tp}};
}

void from_json(const nlohmann::json& j, ParallelDims& d) {
  MIH_CHECK(j.is_object(), "parallel dims: expected a JSON object like {\"tp\": 2}, got ", j.dump());
  d = ParallelDims{};
  for (const auto& [key, value] : j.items()) {
    auto it = std::find(kDimNames.begin(), kDimNames.end(), key);
    MIH_CHECK(it != kDimNames.end(), "parallel dims: unknown mesh axis '", key, "'; valid: ", valid_dim_names());
    MIH_CHECK(value.is_number_integer() && value.get<int>() >= 1, "parallel dims: '", key,
              "' must be an integer >= 1, got ", value.dump());
    dim_ref(d, static_cast<size_t>(it - kDimNames.begin())) = value.get<int>();
  }
}

std::ostream& operator<<(std::ostream& out, const ParallelDims& d) { return out << d.str(); }

std::string_view mesh_axis_name(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::kWorld: return "world";
    case MeshAxis::kDpReplicate: return "dp_replicate";
    case MeshAxis::kDpShard: return "dp_shard";
    case MeshAxis::kCp: return "cp";
    case MeshAxis::kTp: return "tp";
    case MeshAxis::kDp: return "dp";
    case MeshAxis::kDpShardCp: return "dp_shard_cp";
    case MeshAxis::kDpCp: return "dp_cp";
  }
  return "unknown";
}

MeshAxis parse_mesh_axis(std::string_view name) {
  for (MeshAxis axis : kAllMeshAxes) {
    if (mesh_axis_name(axis) == name) return axis;
  }
  MIH_THROW(Code::kInvalidSpec, "unknown mesh axis '", name,
            "'; valid: [world, dp_replicate, dp_shard, cp, tp, dp, dp_shard_cp, dp_cp]");
}

MeshLayout::MeshLayout(const ParallelDims& dims, int world_size) : dims_(dims), world_size_(world_size) {
  dims_.validate(world_size);
}

std::array<int, 4> MeshLayout::coordinates(int rank) const {
  MIH_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " is outside the mesh of world_size ", world_size_);
  std::array<int, 4> c{};
  for (size_t i = 4; i-- > 0;) {
    int degree = dim_value(dims_, i);
    c[i] = rank % degree;
    rank /= degree;
  }
  return c;
}

std::vector<int> MeshLayout::group_ranks(MeshAxis axis, int rank) const {
  std::array<int, 4> base = coordinates(rank);
  std::vector<size_t> vary = varying_dims(axis);
  for (size_t i : vary) base[i] = 0;
  int count = 1;
  for (size_t i : vary) count *= dim_value(dims_, i);
  std::vector<int> ranks;
  ranks.reserve(static_cast<size_t>(count));
  for (int k = 0; k < count; ++k) {
    // Row-major over the varying dims, outer to inner.
    std::array<int, 4> c = base;
    int rest = k;
    for (size_t v = vary.size(); v-- > 0;) {
      int degree = dim_value(dims_, vary[v]);
      c[vary[v]] = rest % degree;
      rest /= degree;
    }
    int r = 0;
    for (size_t i = 0; i < 4; ++i) r = r * dim_value(dims_, i) + c[i];
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

DeviceMesh::DeviceMesh(const ParallelDims& dims, const compat::Store& store, int rank, int world_size,
                       const MeshOptions& options)
    : layout_(dims, world_size), rank_(rank), ledger_(options.ledger) {
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
      if (members.size() == 1 && axis != MeshAxis::kWorld) {
        mine = compat::self_group(axis_name, rank);
      } else if (auto it = built.find(members); it != built.end()) {
        mine = it->second.renamed(axis_name);
      } else {
        compat::Group g = with_context(
            internal::str("while creating the '", axis_name, "' group of mesh ", dims.str(), " on rank ", rank,
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
  for (size_t i = 0; i < 4; ++i) coords[std::string(kDimNames[i])] = c[i];
  nlohmann::json axes;
  for (MeshAxis axis : kAllMeshAxes) {
    const Communicator& cm = comm(axis);
    axes[std::string(mesh_axis_name(axis))] = {
        {"ranks", cm.ranks()}, {"rank", cm.rank()}, {"backend", compat::backend_name(cm.group().backend())}};
  }
  return {{"dims", dims()}, {"rank", rank_}, {"world_size", world_size()}, {"coordinates", coords}, {"axes", axes}};
}

}  // namespace mih
