// ParallelConfig: names, parsing, validation and JSON, all driven by kMeshDims.
#include "harness/base/parallel_config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <ostream>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"
#include "harness/base/strings.h"

namespace mih {
namespace {

// The most ranks a parallel config may name: the product of its degrees must fit in an int (and
// every product of some of them, dp_shard * cp, with it).
constexpr int64_t kMaxWorldSize = std::numeric_limits<int>::max();

std::string valid_dim_names() {
  std::string out = join(kMeshDims, ", ", [](const auto& d) { return std::string(d.name); });
  return "[" + out + ", ep]";
}

const MeshDim* find_dim(std::string_view name) {
  for (const auto& d : kMeshDims) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

constexpr std::array<std::pair<std::string_view, DType>, 4> kDTypes = {{
    {"float32", DType::kFloat32},
    {"float64", DType::kFloat64},
    {"bfloat16", DType::kBFloat16},
    {"float16", DType::kFloat16},
}};

// Strict typed reads: an integer is a JSON integer in range (2.5, true and 2^31 are errors),
// a boolean a JSON boolean, a string a JSON string.
int read_int(const nlohmann::json& v, const std::string& field, int min) {
  MIH_CHECK(v.is_number_integer(), "parallel config: '", field, "' must be an integer, got ", json_summary(v));
  const auto wide = v.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX))
                                           : v.get<int64_t>();
  MIH_CHECK(wide >= min && wide <= std::numeric_limits<int>::max(), "parallel config: '", field, "' must be an integer >= ",
            min, " that fits in 32 bits, got ", json_summary(v));
  return static_cast<int>(wide);
}

bool read_bool(const nlohmann::json& v, const std::string& field) {
  MIH_CHECK(v.is_boolean(), "parallel config: '", field, "' must be true or false, got ", json_summary(v));
  return v.get<bool>();
}

std::string read_string(const nlohmann::json& v, const std::string& field) {
  MIH_CHECK(v.is_string(), "parallel config: '", field, "' must be a string, got ", json_summary(v));
  return v.get<std::string>();
}

}  // namespace

std::string cp_layout_name(CpLayout layout) { return layout == CpLayout::kZigzag ? "zigzag" : "contiguous"; }

CpLayout parse_cp_layout(std::string_view name) {
  if (name == "contiguous") return CpLayout::kContiguous;
  if (name == "zigzag") return CpLayout::kZigzag;
  MIH_THROW(Code::kInvalidSpec, "unknown context-parallel layout '", name, "'; valid: contiguous, zigzag");
}

std::string dtype_name(DType dtype) {
  for (const auto& [name, d] : kDTypes) {
    if (d == dtype) return std::string(name);
  }
  return "?";
}

DType parse_dtype_name(std::string_view name) {
  for (const auto& [n, d] : kDTypes) {
    if (n == name) return d;
  }
  MIH_THROW(Code::kInvalidSpec, "unknown dtype '", name, "'; valid: [",
            join(kDTypes, ", ", [](const auto& row) { return std::string(row.first); }), "]");
}

// The product of the degrees, checked: each fits in 32 bits, their product need not (2^31 - 1
// five times is 2^155), and a wrapped product would pass for a small world (issue 53).
int ParallelConfig::world_size() const {
  int64_t n = 1;
  bool overflow = false;
  std::string arithmetic;
  for (const auto& d : kMeshDims) {
    overflow = overflow || __builtin_mul_overflow(n, int64_t{this->*d.degree}, &n) || n > kMaxWorldSize;
    arithmetic += internal::str(arithmetic.empty() ? "" : " * ", d.name, "(", this->*d.degree, ")");
  }
  MIH_CHECK(!overflow, "parallel config '", name(), "': ", arithmetic, " is more than ", kMaxWorldSize,
            " ranks; choose degrees whose product is the world size (at most ", kMaxWorldSize, ")");
  return static_cast<int>(n);
}

std::string ParallelConfig::name() const {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : "_") + part; };
  for (const auto& d : kMeshDims) {
    const int degree = this->*d.degree;
    if (degree <= 1) continue;
    std::string part = std::string(d.case_part) + std::to_string(degree);
    if (d.degree == &ParallelConfig::cp && cp_layout == CpLayout::kZigzag) part += "zz";
    add(part);
  }
  if (ep > 1) add("ep" + std::to_string(ep));
  if (vpp > 1) add("vpp" + std::to_string(vpp));
  if (pipelined() && pp_schedule == pp::ScheduleKind::kGPipe) add("gpipe");
  if (sequence_parallel) add("sp");
  if (activation_checkpointing) add("ac");
  if (micro_batches > 1) add("mb" + std::to_string(micro_batches));
  if (noise_twin) add("nt");
  return out.empty() ? "single" : out;
}

std::string ParallelConfig::mesh_str() const {
  std::string out;
  for (const auto& d : kMeshDims) {
    if (this->*d.degree == 1) continue;
    out += internal::str(out.empty() ? "" : ",", d.name, "=", this->*d.degree);
  }
  if (ep > 1) out += internal::str(out.empty() ? "" : ",", "ep=", ep);
  return out.empty() ? "1" : out;
}

bool ParallelConfig::same_mesh(const ParallelConfig& other) const {
  return ep == other.ep && std::all_of(kMeshDims.begin(), kMeshDims.end(),
                                       [&](const MeshDim& d) { return this->*d.degree == other.*d.degree; });
}

ParallelConfig ParallelConfig::parse_mesh(std::string_view text) {
  ParallelConfig config;
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
    const MeshDim* dim = find_dim(name);
    MIH_CHECK(dim != nullptr || name == "ep", "unknown mesh axis '", name, "'; valid: ", valid_dim_names(),
              name == "dp" || name == "dp_cp" || name == "dp_shard_cp"
                  ? internal::str("; '", name, "' is a combined axis: set its parts (dp_shard for FSDP, "
                                  "dp_replicate for DDP, cp)")
              : name == "edp" ? std::string("; 'edp' follows from the others: dp_shard * cp / ep")
                              : std::string());
    MIH_CHECK(std::find(seen.begin(), seen.end(), name) == seen.end(), "mesh axis '", name, "' is given twice");
    seen.push_back(name);
    int degree = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), degree);
    MIH_CHECK(ec == std::errc() && end == value.data() + value.size() && degree >= 1, "mesh axis '", name,
              "': degree '", value, "' is not an integer >= 1");
    if (dim == nullptr) {
      config.ep = degree;
    } else {
      config.*dim->degree = degree;
    }
  }
  return config;
}

ParallelConfig ParallelConfig::spread(int world_size) {
  MIH_CHECK(world_size >= 1, "world_size(", world_size, ") must be >= 1");
  ParallelConfig config;
  // Inner axes first: tp, cp, dp_shard, dp_replicate (never pp: the selftest runs no model).
  size_t next = 0;
  int n = world_size;
  constexpr size_t kSpread = kMeshDims.size() - 1;  // every dim but pp, the outermost
  static_assert(kMeshDims[0].degree == &ParallelConfig::pp);
  for (int p = 2; n > 1; ++p) {
    while (n % p == 0) {
      config.*kMeshDims[kMeshDims.size() - 1 - next % kSpread].degree *= p;
      ++next;
      n /= p;
    }
  }
  return config;
}

void ParallelConfig::validate_mesh(int world) const {
  std::string arithmetic;
  for (const auto& d : kMeshDims) {
    MIH_CHECK(this->*d.degree >= 1, "mesh axis '", d.name, "' has degree ", this->*d.degree,
              "; degrees must be >= 1 (1 disables the axis)");
    arithmetic += internal::str(arithmetic.empty() ? "" : " * ", d.name, "(", this->*d.degree, ")");
  }
  MIH_CHECK(world_size() == world, arithmetic, " = ", world_size(), " != world_size(", world,
            "); choose degrees whose product is ", world,
            ep > 1 ? internal::str(" (ep is carved out of dp_shard x cp, not a factor of the world size: e.g. dp_shard=",
                                   ep, ",ep=", ep, ")")
                   : std::string());
  MIH_CHECK(ep >= 1, "'ep' has degree ", ep, "; degrees must be >= 1 (1 disables expert parallelism)");
  if ((dp_shard * cp) % ep != 0) {
    std::string divisors;
    for (int d = 1; d <= dp_shard * cp; ++d) {
      if ((dp_shard * cp) % d == 0) divisors += internal::str(divisors.empty() ? "" : ", ", d);
    }
    MIH_THROW(Code::kInvalidSpec, "ep(", ep, ") does not divide dp_shard(", dp_shard, ") * cp(", cp, ") = ",
              dp_shard * cp, ": expert-parallel ranks are carved out of dp_shard x cp; choose ep among [", divisors,
              "] or raise dp_shard");
  }
}

void ParallelConfig::validate(int world) const {
  validate_mesh(world);
  MIH_CHECK(micro_batches >= 1, "parallel config '", name(), "': micro_batches must be >= 1, got ", micro_batches);
  MIH_CHECK(!sequence_parallel || tp > 1, "parallel config '", name(),
            "': sequence_parallel needs tp > 1 (it shards activations over tp)");
  MIH_CHECK(vpp >= 1, "parallel config '", name(), "': vpp must be >= 1 (1: one stage per pp rank), got ", vpp);
  // Before anything multiplies them in an int (pipelined(), the stage count).
  MIH_CHECK(static_cast<int64_t>(pp) * vpp <= 4096, "parallel config '", name(), "': pp(", pp, ") x vpp(", vpp,
            ") = ", static_cast<int64_t>(pp) * vpp, " pipeline stages; at most 4096 (each stage holds a decoder layer)");
  MIH_CHECK(pipelined() || pp_schedule == pp::ScheduleKind::k1F1B, "parallel config '", name(), "': pp_schedule '",
            pp::schedule_name(pp_schedule), "' without pipeline stages (pp(1) x vpp(1)) has no effect; remove it");
  MIH_CHECK(!pipelined() || ep == 1, "parallel config '", name(), "': pp(", pp, ") x vpp(", vpp, ") with ep(", ep,
            "): expert parallelism inside pipeline stages is not supported yet; drop ep or pp");
  if (pipelined()) {
    with_context(internal::str("parallel config '", name(), "'"), [&] { pp::validate(pp_schedule, pipeline_shape()); });
  }
}

void to_json(nlohmann::json& j, const ParallelConfig& c) {
  j = nlohmann::json::object();
  for (const auto& d : kMeshDims) j[std::string(d.name)] = c.*d.degree;
  j["ep"] = c.ep;
  j["cp_layout"] = cp_layout_name(c.cp_layout);
  j["sequence_parallel"] = c.sequence_parallel;
  j["activation_checkpointing"] = c.activation_checkpointing;
  j["micro_batches"] = c.micro_batches;
  j["vpp"] = c.vpp;
  j["pp_schedule"] = pp::schedule_name(c.pp_schedule);
  j["noise_twin"] = c.noise_twin;
  j["dtype"] = dtype_name(c.dtype);
  j["seed"] = c.seed;
  j["name"] = c.name();
}

void from_json(const nlohmann::json& j, ParallelConfig& c) {
  std::vector<std::string> fields;
  for (const auto& d : kMeshDims) fields.emplace_back(d.name);
  for (const char* f : {"ep", "cp_layout", "sequence_parallel", "activation_checkpointing", "micro_batches", "vpp", "pp_schedule", "noise_twin",
                        "dtype", "seed", "name"}) {
    fields.emplace_back(f);
  }
  check_known_fields(j, "parallel config", fields);
  ParallelConfig out;
  for (const auto& d : kMeshDims) {
    if (j.contains(d.name)) out.*d.degree = read_int(j.at(std::string(d.name)), std::string(d.name), 1);
  }
  if (j.contains("ep")) out.ep = read_int(j.at("ep"), "ep", 1);
  if (j.contains("cp_layout")) out.cp_layout = parse_cp_layout(read_string(j.at("cp_layout"), "cp_layout"));
  if (j.contains("sequence_parallel")) out.sequence_parallel = read_bool(j.at("sequence_parallel"), "sequence_parallel");
  if (j.contains("activation_checkpointing")) {
    out.activation_checkpointing = read_bool(j.at("activation_checkpointing"), "activation_checkpointing");
  }
  if (j.contains("micro_batches")) out.micro_batches = read_int(j.at("micro_batches"), "micro_batches", 1);
  if (j.contains("vpp")) out.vpp = read_int(j.at("vpp"), "vpp", 1);
  out.pp_schedule = j.contains("pp_schedule") ? pp::parse_schedule(read_string(j.at("pp_schedule"), "pp_schedule"))
                    : out.vpp > 1                ? pp::ScheduleKind::kInterleaved1F1B
                                                 : pp::ScheduleKind::k1F1B;
  if (j.contains("noise_twin")) out.noise_twin = read_bool(j.at("noise_twin"), "noise_twin");
  if (j.contains("dtype")) out.dtype = parse_dtype_name(read_string(j.at("dtype"), "dtype"));
  if (j.contains("seed")) {
    MIH_CHECK(j.at("seed").is_number_unsigned() || (j.at("seed").is_number_integer() && j.at("seed").get<int64_t>() >= 0),
              "parallel config: 'seed' must be a non-negative integer, got ", json_summary(j.at("seed")));
    out.seed = j.at("seed").get<uint64_t>();
  }
  c = out;
}

void PrintTo(const ParallelConfig& c, std::ostream* os) { *os << c; }

std::ostream& operator<<(std::ostream& out, const ParallelConfig& c) { return out << c.name() << " " << dtype_name(c.dtype); }

}  // namespace mih
