// The case matrix (see case_matrix.h).
#include "harness/spec/case_matrix.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <ostream>
#include <set>
#include <sstream>

#include <ATen/core/Tensor.h>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/runtime/dtypes.h"
#include "harness/spec/case_trainer.h"
#include "harness/base/strings.h"

namespace mih::spec {
namespace {

using nlohmann::json;

// The presets. cpu-smoke, cpu-smoke-variants and cpu-full are float64 on CPU: the oracle lane,
// where parity holds to 1e-10.
// cpu-smoke, the main job's matrix: each axis alone at degree 2 (dp_shard, dp_replicate, tp
// without and with sequence parallelism, cp), the combinations and features, and, with the
// variants' lane, every reduction path of the runtime a mesh of 4 ranks can take
// (reduction_paths.h; `mih reach` and ctest `reference/reach` check it): plain DDP
// (DpReplicate2), FSDP shards summed over cp (DpShard2Cp2, also the contiguous cp layout),
// expert gradients over dp_replicate (DpReplicate2DpShard2Ep2) and over edp without FSDP
// (Cp4ZzEp2: ep carved out of cp). pp: 1F1B alone (four micro-batches), with FSDP, with tp
// under sequence parallelism (four ranks), with activation checkpointing (a recompute in the
// backward of an earlier micro-batch than the last forward's), one micro-batch (Pp2: the one pp
// case whose numbers a moe can be held to, its load-balancing loss depending on the
// micro-batching; also the uninterrupted twin of the resume into pp), and a resume from pp stages
// into FSDP and back. Tp4: tp above the 2 key/value heads of every GQA spec (each KV head
// replicated over 2 tp ranks, a Qwen3 or Llama job's 4-8 KV heads at tp 8). SGD with momentum
// and no clipping, a step linear in the gradient's scale, at a warmup-then-cosine schedule
// across a resume: ResumeDpShard2SgdCosine (its twin and ReferenceSgdCosine added). Cp2ZzTp2
// and DpReplicate2DpShard2 are cpu-full's (cp zigzag and tp stay here; HSDP's paths in moe's Ep2).
const char* kCpuSmoke = R"({
  "name": "cpu-smoke", "dtype": "float64", "device": "cpu", "pg_backend": "gloo", "steps": 3, "max_world_size": 4,
  "cases": [
    {"dp_shard": 2}, {"dp_replicate": 2},
    {"tp": 2}, {"tp": 2, "sequence_parallel": true}, {"tp": 4},
    {"cp": 2, "cp_layout": "zigzag"}, {"dp_shard": 2, "cp": 2},
    {"dp_shard": 2, "tp": 2, "sequence_parallel": true},
    {"dp_shard": 2, "activation_checkpointing": true}, {"dp_shard": 2, "micro_batches": 2},
    {"pp": 2}, {"pp": 2, "micro_batches": 4},
    {"dp_shard": 2, "pp": 2, "micro_batches": 2},
    {"pp": 2, "tp": 2, "sequence_parallel": true, "micro_batches": 2},
    {"pp": 2, "micro_batches": 4, "activation_checkpointing": true},
    {"kind": "resume", "config": {"dp_shard": 2}, "resume_at": 2},
    {"kind": "cross_resume", "save": {"dp_shard": 2}, "load": {"tp": 2}, "resume_at": 2},
    {"dp_shard": 2, "ep": 2},
    {"dp_shard": 4, "ep": 2},
    {"dp_shard": 2, "tp": 2, "sequence_parallel": true, "ep": 2},
    {"dp_shard": 2, "ep": 2, "activation_checkpointing": true},
    {"dp_replicate": 2, "dp_shard": 2, "ep": 2},
    {"cp": 4, "cp_layout": "zigzag", "ep": 2},
    {"kind": "cross_resume", "save": {"dp_shard": 2, "ep": 2}, "load": {"dp_shard": 2}, "resume_at": 2},
    {"kind": "cross_resume", "save": {"dp_shard": 2}, "load": {"dp_shard": 2, "ep": 2}, "resume_at": 2},
    {"kind": "cross_resume", "save": {"pp": 2}, "load": {"dp_shard": 2}, "resume_at": 2},
    {"kind": "cross_resume", "save": {"dp_shard": 2}, "load": {"pp": 2}, "resume_at": 2},
    {"kind": "resume", "config": {"dp_shard": 2}, "resume_at": 2,
     "trainer": {"optimizer": "sgd", "warmup_steps": 2, "decay_steps": 3, "max_grad_norm": 0}}
  ]})";

// The model variants' lane (tied embedding and head, row-parallel biases, four layers): the
// layouts their features change, FSDP, tp with SGD (momentum, no clipping; compared with
// ReferenceSgd) and with sequence parallelism, tp 4 with it
// (above the 2 KV heads: replicated k/v weights and biases, their input gathered over tp), and
// pp (a tie across the first and last stage; the interleaved schedule and pp 4, which only the
// four-layer llama_deep can take).
const char* kCpuSmokeVariants = R"({
  "name": "cpu-smoke-variants", "dtype": "float64", "device": "cpu", "pg_backend": "gloo", "steps": 3,
  "max_world_size": 4, "cases": [
    {"dp_shard": 2}, {"tp": 2, "trainer": {"optimizer": "sgd", "max_grad_norm": 0}},
    {"tp": 2, "sequence_parallel": true},
    {"tp": 4, "sequence_parallel": true},
    {"pp": 2, "micro_batches": 2},
    {"pp": 2, "vpp": 2, "micro_batches": 4},
    {"pp": 4, "micro_batches": 4}
  ]})";

// The packed-documents lane (llama_docs, qwen3_docs): the cases that split the sequence.
const char* kCpuSmokeDocuments = R"({"name": "cpu-smoke-documents", "dtype": "float64", "device": "cpu", "steps": 3,
  "pg_backend": "gloo", "max_world_size": 4, "cases": [{"cp": 2}, {"cp": 2, "cp_layout": "zigzag"}, {"tp": 2,
  "sequence_parallel": true}]})";

// The reduced-precision lane's CI cases (float32 unless `@bfloat16` or --dtype says otherwise):
// the lane's reference and noise twin are added by resolve_matrix; one case per way a
// parallel run reorders the reductions (the batch over FSDP ranks, the contraction over tp,
// the sequence over cp).
const char* kCpuPrecision = R"({
  "name": "cpu-precision", "dtype": "float32", "device": "cpu", "pg_backend": "gloo", "steps": 3,
  "max_world_size": 4,
  "cases": [
    {"dp_shard": 2},
    {"tp": 2, "sequence_parallel": true},
    {"cp": 2, "cp_layout": "zigzag"}
  ]})";

// The GPU smoke lane (scripts/gpu-smoke; docs/gpu-nightly.md): world size 1 on one GPU, float32
// unless `@bfloat16` or --dtype says otherwise. resolve_matrix adds the float64 Reference (on
// the CPU, the oracle) and the lane's reference and noise twin (on the GPU, compared with the
// oracle at the oracle factor); the cases below are compared with the lane's reference at the
// calibrated tolerances: activation checkpointing (recomputation restores the CUDA RNG state)
// and a resume (a checkpoint of CUDA tensors saved and loaded), with its uninterrupted twin.
const char* kGpuSmoke = R"({
  "name": "gpu-smoke", "dtype": "float32", "device": "cuda", "pg_backend": "nccl", "steps": 2, "max_world_size": 1,
  "cases": [
    {"activation_checkpointing": true},
    {"kind": "resume", "config": {}, "resume_at": 1}
  ]})";

const char* kCpuFull = R"({
  "name": "cpu-full", "dtype": "float64", "device": "cpu", "pg_backend": "gloo", "steps": 3, "max_world_size": 4,
  "cases": [
    {"dp_replicate": 2}, {"dp_shard": 2}, {"dp_shard": 4}, {"tp": 2}, {"tp": 2, "sequence_parallel": true},
    {"cp": 2}, {"cp": 2, "cp_layout": "zigzag"}, {"cp": 4, "cp_layout": "zigzag"},
    {"dp_replicate": 2, "dp_shard": 2}, {"dp_shard": 2, "tp": 2, "sequence_parallel": true},
    {"dp_shard": 2, "cp": 2, "cp_layout": "zigzag"}, {"cp": 2, "cp_layout": "zigzag", "tp": 2},
    {"tp": 2, "sequence_parallel": true, "activation_checkpointing": true},
    {"dp_shard": 2, "activation_checkpointing": true}, {"cp": 2, "cp_layout": "zigzag", "activation_checkpointing": true},
    {"dp_shard": 2, "micro_batches": 2}, {"tp": 2, "micro_batches": 4},
    {"kind": "resume", "config": {"dp_shard": 2}, "resume_at": 2},
    {"kind": "resume", "config": {"tp": 2, "sequence_parallel": true}, "resume_at": 1},
    {"kind": "cross_resume", "save": {"dp_shard": 2}, "load": {"tp": 2}, "resume_at": 2},
    {"kind": "cross_resume", "save": {"tp": 2}, "load": {"cp": 2, "cp_layout": "zigzag"}, "resume_at": 2},
    {"kind": "cross_resume", "save": {}, "load": {"dp_shard": 4}, "resume_at": 2},
    {"pp": 2, "micro_batches": 4, "pp_schedule": "gpipe"}, {"pp": 2, "dp_replicate": 2, "micro_batches": 2},
    {"pp": 2, "cp": 2, "cp_layout": "zigzag", "micro_batches": 2}, {"pp": 4, "micro_batches": 4},
    {"pp": 2, "vpp": 2, "micro_batches": 4}, {"kind": "resume", "config": {"pp": 2, "micro_batches": 2}, "resume_at": 2},
    {"kind": "resume", "config": {"tp": 2, "sequence_parallel": true}, "resume_at": 1, "trainer": {"optimizer": "sgd",
     "warmup_steps": 1, "decay_steps": 2, "max_grad_norm": 0}}, {"dp_shard": 2, "trainer": {"optimizer": "adam"}}
  ]})";

// "dp_shard2_cp2zz_tp2_sp" -> "DpShard2Cp2ZzTp2Sp".
std::string camel(const std::string& snake) {
  std::string out;
  bool up = true;
  for (char ch : snake) {
    if (ch == '_') {
      up = true;
      continue;
    }
    const bool letter_after_digit = !out.empty() && std::isdigit(static_cast<unsigned char>(out.back())) &&
                                    std::isalpha(static_cast<unsigned char>(ch));
    out += (up || letter_after_digit) ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch;
    up = false;
  }
  return out;
}

std::string group_of(const ParallelConfig& c) {
  if (c.pipelined()) return "pipeline";  // its micro-batches are the schedule's
  if (c.micro_batches > 1) return "grad_accumulation";
  if (c.activation_checkpointing) return "activation_checkpoint";
  if (c.ep > 1) return "expert_parallel";
  int axes = 0;
  for (const auto& d : kMeshDims) axes += c.*d.degree > 1;
  return axes > 1 ? "combined" : "axis";
}

ParallelConfig config_from(const json& j, const json& defaults, const std::string& where) {
  json merged = defaults;
  for (const auto& [k, v] : j.items()) merged[k] = v;
  ParallelConfig c;
  try {
    from_json(merged, c);
  } catch (const nlohmann::json::exception& e) {
    MIH_THROW(Code::kInvalidSpec, where, ": ", e.what());
  } catch (Error& e) {
    e.add_context(where);
    throw;
  }
  with_context(where, [&] { c.validate(c.world_size()); });
  return c;
}

}  // namespace

const Case& CaseMatrix::at(const std::string& name) const {
  for (const auto& c : cases) {
    if (c.name == name) return c;
  }
  MIH_THROW(Code::kInvalidSpec, "matrix '", this->name, "' has no case '", name, "'; cases: ",
            join(cases, ", ", [](const Case& c) { return c.name; }));
}

// The EP=1 control of an ep case (the same config with ep = 1), which resolve_matrix adds; "".
static std::string ep1_control(const Case& c) {
  if (c.config.ep <= 1 || c.kind != CaseKind::kTrain) return "";
  ParallelConfig plain = c.config;
  plain.ep = 1;
  return camel(plain.name());
}

json CaseMatrix::to_json() const {
  json rej = json::array();
  for (const auto& r : rejected) rej.push_back({{"name", r.name}, {"reason", r.reason}});
  json out = {{"name", name}, {"spec", spec}, {"cases", cases}, {"rejected", rej}, {"listed", listed}};
  for (size_t i = 0; i < cases.size(); ++i) {
    if (const std::string control = ep1_control(cases[i]); !control.empty()) out["cases"][i]["ep1_control"] = control;
  }
  return out;
}

std::string CaseMatrix::table() const {
  std::ostringstream os;
  os << "matrix " << name << " for spec " << spec << ": " << cases.size() << " cases, " << rejected.size()
     << " rejected\n";
  // A matrix with a case off the CPU says where every case runs (the float64 Reference stays
  // on the CPU when the lane runs on a GPU).
  const bool devices = std::any_of(cases.begin(), cases.end(), [](const Case& c) { return c.device != "cpu"; });
  for (const auto& c : cases) {
    char line[256];
    std::string what = c.config.name() + " " + dtype_name(c.config.dtype);
    if (devices) what += " on " + c.device + " (" + c.pg_backend + ")";
    if (c.save_config) what = c.save_config->name() + " -> " + what + ", save at step " + std::to_string(c.resume_at);
    std::string vs = c.compare_to.empty() ? "-" : c.compare_to;
    if (const std::string control = ep1_control(c); !control.empty()) vs += "; EP=1 control " + control;
    for (const auto& o : cases) {
      if (ep1_control(o) == c.name) {
        vs += "; the EP=1 control of " + o.name;
        break;
      }
    }
    std::snprintf(line, sizeof line, "  %-27s %-12s %-22s %d rank%s  %s (vs %s)\n", c.name.c_str(),
                  case_kind_name(c.kind).c_str(), c.group.c_str(), c.world_size(), c.world_size() == 1 ? " " : "s",
                  what.c_str(), vs.c_str());
    os << line;
  }
  for (const auto& r : rejected) os << "  rejected " << r.name << ": " << r.reason << "\n";
  if (listed.empty()) {
    os << "  no case the matrix lists can run spec " << spec << ": the cases it adds (the references, a noise twin, "
       << "twins and controls) check nothing it asked for\n";
  }
  return os.str();
}

bool CaseMatrix::is_listed(const std::string& name) const { return std::find(listed.begin(), listed.end(), name) != listed.end(); }

std::vector<std::string> preset_names() {
  return {"cpu-smoke", "cpu-smoke-variants", "cpu-smoke-documents", "cpu-precision", "cpu-full", "gpu-smoke"};
}

namespace {
// "cpu-smoke, cpu-smoke-variants, ...": the presets for a message.
std::string preset_list() { return join(preset_names(), ", "); }

// The most cases a matrix lists (its own ones; the presets list under 40): every case is a
// launch, so a file past this is a mistake, refused before any case is resolved.
constexpr size_t kMaxMatrixCases = 4096;

// Refuses a key an object repeats, in one linear SAX pass (nlohmann's DOM parser with a
// callback, parse_json_strict's, walks the enclosing array at each object's end: quadratic in
// the cases of a matrix, an hour for 200 MB of them).
class UniqueKeys : public nlohmann::json_sax<json> {
 public:
  explicit UniqueKeys(const std::string& where) : where_(where) {}
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    MIH_CHECK(keys_.back().insert(k).second, where_, ": the key '", k.substr(0, 200),
              "' appears twice in one object; give each field once");
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  const std::string& where_;
  std::vector<std::set<std::string>> keys_;
};

// parse_json_strict's refusals (not JSON, nested deeper than kMaxJsonDepth, a repeated key),
// in time linear in the text.
json parse_matrix_file(const std::string& text, const std::string& where) {
  json j;
  std::string problem;
  MIH_CHECK(parse_json_bounded(text, &j, &problem), where, " is not JSON: ", problem);
  UniqueKeys keys(where);
  json::sax_parse(text, &keys);
  return j;
}
}  // namespace

json preset_json(const std::string& name) {
  if (name == "cpu-smoke") return json::parse(kCpuSmoke);
  if (name == "cpu-smoke-variants") return json::parse(kCpuSmokeVariants);
  if (name == "cpu-smoke-documents") return json::parse(kCpuSmokeDocuments);
  if (name == "cpu-precision") return json::parse(kCpuPrecision);
  if (name == "cpu-full") return json::parse(kCpuFull);
  if (name == "gpu-smoke") return json::parse(kGpuSmoke);
  MIH_THROW(Code::kInvalidSpec, "unknown preset '", name, "'; presets: ", preset_list(), " (or a JSON matrix file)");
}

std::string topology_problem(const ModelSpec& spec, const ParallelConfig& c, int64_t global_batch, int max_world_size) {
  if (c.world_size() > max_world_size) {
    return "needs " + std::to_string(c.world_size()) + " ranks (" + c.mesh_str() + "), the matrix allows at most " +
           std::to_string(max_world_size);
  }
  for (int64_t n : spec.tp_divides) {
    if (n % c.tp != 0) {
      return "tp=" + std::to_string(c.tp) + " does not divide " + std::to_string(n) + " (spec '" + spec.name +
             "' tp_divides: " + std::to_string(n) + " % " + std::to_string(c.tp) + " = " + std::to_string(n % c.tp) + ")";
    }
  }
  if (const int64_t kv = spec.num_key_value_heads; kv > 0 && kv % c.tp != 0 && c.tp % kv != 0) {
    return "tp=" + std::to_string(c.tp) + " neither divides the " + std::to_string(kv) + " key/value heads of spec '" +
           spec.name + "' nor is a multiple of them (" + std::to_string(kv) + " % " + std::to_string(c.tp) + " = " +
           std::to_string(kv % c.tp) + ", " + std::to_string(c.tp) + " % " + std::to_string(kv) + " = " +
           std::to_string(c.tp % kv) + "): each tp rank holds whole KV heads, or one replicated over tp / " +
           std::to_string(kv) + " ranks";
  }
  if (c.cp > 1 && spec.seq_len > 0) {
    const int64_t chunks = c.cp_layout == CpLayout::kZigzag ? 2 * c.cp : c.cp;
    if (spec.seq_len % chunks != 0) {
      return "cp=" + std::to_string(c.cp) + " (" + cp_layout_name(c.cp_layout) + ") splits the sequence into " +
             std::to_string(chunks) + " chunks; seq_len " + std::to_string(spec.seq_len) + " % " +
             std::to_string(chunks) + " = " + std::to_string(spec.seq_len % chunks);
    }
  }
  if (c.ep > 1 && spec.num_experts == 0) {
    return "ep=" + std::to_string(c.ep) + " shards routed experts, and spec '" + spec.name +
           "' has none (ModelSpec::num_experts is 0)";
  }
  if (c.ep > 1 && spec.num_experts % c.ep != 0) {
    return "ep=" + std::to_string(c.ep) + " does not divide the " + std::to_string(spec.num_experts) +
           " experts of spec '" + spec.name + "' (" + std::to_string(spec.num_experts) + " % " + std::to_string(c.ep) +
           " = " + std::to_string(spec.num_experts % c.ep) + "): every ep rank must own the same number of experts";
  }
  if (c.ep > 1 && (c.dp_shard * c.cp) % c.ep != 0) {
    return "ep(" + std::to_string(c.ep) + ") does not divide dp_shard(" + std::to_string(c.dp_shard) + ") * cp(" +
           std::to_string(c.cp) + ") = " + std::to_string(c.dp_shard * c.cp);
  }
  if (c.pipelined() && spec.pipeline_layers == 0) {
    return "pp(" + std::to_string(c.pp) + ") x vpp(" + std::to_string(c.vpp) + ") splits the model into pipeline stages, " +
           "and spec '" + spec.name + "' declares no layers to split (ModelSpec::pipeline_layers is 0: the port builds " +
           "no stages)";
  }
  if (c.pipelined() && spec.pipeline_layers % (int64_t{c.pp} * c.vpp) != 0) {
    return "pp(" + std::to_string(c.pp) + ") x vpp(" + std::to_string(c.vpp) + ") = " + std::to_string(c.pp * c.vpp) +
           " stages do not divide the " + std::to_string(spec.pipeline_layers) + " layers of spec '" + spec.name +
           "' (ModelSpec::pipeline_layers)";
  }
  const int64_t split = static_cast<int64_t>(c.dp_replicate) * c.dp_shard * c.micro_batches;
  if (global_batch % split != 0) {
    return "the global batch of " + std::to_string(global_batch) + " rows does not split over dp_replicate(" +
           std::to_string(c.dp_replicate) + ") x dp_shard(" + std::to_string(c.dp_shard) + ") x micro_batches(" +
           std::to_string(c.micro_batches) + ") = " + std::to_string(split) + " (remainder " +
           std::to_string(global_batch % split) + ")";
  }
  return "";
}

namespace {

// A matrix being resolved: its settings, read once, and the cases the spec can take.
struct MatrixResolver {
  const ModelSpec& spec;
  CaseMatrix out;
  std::string where, device, backend, lane_target;
  int64_t steps = 0, global_batch = 0;
  int max_world = 0;
  json defaults;
  DType lane = DType::kFloat64;
  bool reduced = false;
  uint64_t seed = 0;
  std::map<std::string, size_t> index;  // case name -> its place in out.cases

  MatrixResolver(const ModelSpec& s, const json& m);
  bool add(Case c);
  void add_references(const json& m);
  Case listed_case(const json& j, const std::string& at) const;
  void add_resume_twins();
  void add_ep1_controls();
};

MatrixResolver::MatrixResolver(const ModelSpec& s, const json& m) : spec(s) {
  MIH_CHECK(m.is_object(), "case matrix: expected a JSON object, got ", m.type_name());
  check_known_fields(m, "case matrix",
                     {"name", "dtype", "seed", "device", "pg_backend", "steps", "max_world_size", "reference", "cases"});
  out.name = json_string(m, "name", "matrix", "case matrix");
  // The name heads tables, reports and JUnit suites: a control character (a NUL cuts a C
  // string, an escape repaints a terminal) would garble each of them.
  for (const unsigned char ch : out.name) {
    MIH_CHECK(ch >= 0x20 && ch != 0x7f, "case matrix: 'name' holds a control character (code ", static_cast<int>(ch),
              "); give a printable name such as \"nightly\"");
  }
  out.spec = spec.name;
  where = "case matrix '" + out.name + "'";
  device = json_string(m, "device", "cpu", where);
  backend = json_string(m, "pg_backend", "gloo", where);
  MIH_CHECK(device == "cpu" || device == "cuda", where, ": device must be cpu or cuda, got '", device, "'");
  MIH_CHECK(backend == "gloo" || backend == "nccl", where, ": pg_backend must be gloo or nccl, got '", backend, "'");
  steps = json_int(m, "steps", 3, where, 1, 1000000);
  max_world = static_cast<int>(json_int(m, "max_world_size", 4, where, 1, 4096));
  MIH_CHECK(m.contains("cases") && m["cases"].is_array(), where, ": 'cases' must be an array of cases");
  MIH_CHECK(!m["cases"].empty(), where, ": 'cases' is empty; list at least one parallel case (the Reference is implicit)");
  MIH_CHECK(m["cases"].size() <= kMaxMatrixCases, where, ": 'cases' lists ", m["cases"].size(),
            " cases: expected at most ", kMaxMatrixCases, " (each is a launch); split the matrix into several files");
  // float64 unless the matrix names a reduced lane: a user's file without "dtype" is compared
  // with the float64 reference as the presets are, never silently a float32 lane.
  const std::string dtype = json_string(m, "dtype", "float64", where);
  seed = static_cast<uint64_t>(json_int(m, "seed", 0, where, 0, int64_t{1} << 53));
  lane = with_context(where, [&] { return parse_dtype_name(dtype); });
  defaults = {{"dtype", dtype}};
  if (m.contains("seed")) defaults["seed"] = seed;
  // A reduced-precision lane compares its cases with the lane's own world-size-1 reference,
  // at tolerances calibrated from that reference's noise twin (DESIGN.md section 7).
  reduced = lane != DType::kFloat64 && json_bool(m, "reference", true, where);
  lane_target = reduced ? kLaneReference : "Reference";
  global_batch = spec.data.make_batches ? spec.data.make_batches()(0).input_ids.size(0) : 0;
}

// Adds `c` unless the spec cannot take it; returns whether the matrix holds it now.
bool MatrixResolver::add(Case c) {
  c.steps = steps;  // the matrix's: a case has no steps of its own
  if (const auto it = index.find(c.name); it != index.end()) {
    const Case& existing = out.cases[it->second];
    // The same case listed twice runs once; two different cases under one name would lose one.
    MIH_CHECK(json(existing) == json(c), where, ": two cases are both named ", c.name, " but differ (",
              json_summary(json(existing), 400), " vs ", json_summary(json(c), 400), "); a name comes from the mesh "
              "and its knobs, not the seed or dtype: give them distinct configs or drop one");
    return true;
  }
  std::string problem = topology_problem(spec, c.config, global_batch, max_world);
  if (problem.empty() && c.save_config) problem = topology_problem(spec, *c.save_config, global_batch, max_world);
  if (problem.empty()) problem = case_trainer_lane_problem(c.trainer, reduced);
  if (!problem.empty()) {
    out.rejected.push_back({c.name, problem});
    return false;
  }
  index[c.name] = out.cases.size();
  out.cases.push_back(std::move(c));
  return true;
}

// The float64 Reference, and in a reduced lane the lane's reference (world size 1, the lane's
// dtype, on the matrix's device) and its noise twin (the same with the linear layers'
// contractions summed in two halves): both compared with the float64 oracle at the spec's
// dtype tolerance; their difference is the noise every other case's tolerance is calibrated from.
void MatrixResolver::add_references(const json& m) {
  if (json_bool(m, "reference", true, where)) {
    Case ref;
    ref.name = "Reference";
    ref.kind = CaseKind::kReference;
    ref.group = "reference";
    ref.config.dtype = DType::kFloat64;  // the oracle lane, always on CPU
    ref.config.seed = seed;
    add(ref);
  }
  if (!reduced) return;
  for (const bool twin : {false, true}) {
    Case c;
    c.name = twin ? kNoiseTwin : kLaneReference;
    c.kind = CaseKind::kTrain;
    c.group = twin ? "noise_twin" : "lane_reference";
    c.config.dtype = lane;
    c.config.seed = seed;
    c.config.noise_twin = twin;
    c.device = device;
    c.pg_backend = backend;
    c.compare_to = "Reference";
    add(c);
  }
}

// A case the matrix lists (`at` names it in messages): a train, resume or cross_resume case.
Case MatrixResolver::listed_case(const json& j, const std::string& at) const {
  MIH_CHECK(j.is_object(), at, ": expected an object, got ", json_summary(j));
  const CaseKind kind = parse_case_kind(json_string(j, "kind", "train", at));
  Case c;
  c.kind = kind;
  c.device = device;
  c.pg_backend = backend;
  c.compare_to = lane_target;
  if (kind == CaseKind::kTrain) {
    json cfg = j;
    for (const char* own : {"kind", "trainer"}) cfg.erase(own);
    c.config = config_from(cfg, defaults, at);
    c.name = camel(c.config.name());
    c.group = group_of(c.config);
  } else if (kind == CaseKind::kResume || kind == CaseKind::kCrossResume) {
    const bool cross = kind == CaseKind::kCrossResume;
    check_known_fields(j, at, cross ? std::vector<std::string>{"kind", "save", "load", "resume_at", "trainer"}
                                    : std::vector<std::string>{"kind", "config", "resume_at", "trainer"});
    MIH_CHECK(j.contains(cross ? "save" : "config"), at, ": a ", case_kind_name(kind), " case needs '",
              cross ? "save" : "config", "'");
    c.resume_at = json_int(j, "resume_at", 0, at);
    MIH_CHECK(c.resume_at > 0 && c.resume_at < steps, at, ": resume_at must be in [1, ", steps - 1, "] (steps ",
              steps, "), got ", c.resume_at);
    c.save_config = config_from(cross ? j["save"] : j["config"], defaults, at);
    c.config = cross ? config_from(j.value("load", json::object()), defaults, at) : *c.save_config;
    c.name = "Resume" + camel(c.save_config->name()) + (cross ? "To" + camel(c.config.name()) : "");
    c.group = cross ? "cross_resume" : "resume";
    // Compared with the uninterrupted run of the config it continues under.
    c.compare_to = camel(c.config.name());
  } else {
    MIH_THROW(Code::kInvalidSpec, at, ": the reference case is implicit; set \"reference\": false to omit it");
  }
  read_case_trainer(j, c, at);  // a case's own optimizer or schedule: suffixed, with its twin
  return c;
}

// A resume is compared with its uninterrupted twin: add the twin when the matrix lacks it.
void MatrixResolver::add_resume_twins() {
  std::vector<Case> twins;
  for (const auto& c : out.cases) {
    if (c.kind != CaseKind::kResume && c.kind != CaseKind::kCrossResume) continue;
    const bool present = std::any_of(out.cases.begin(), out.cases.end(), [&](const Case& o) { return o.name == c.compare_to; });
    if (present) continue;
    Case twin;
    twin.name = c.compare_to;
    twin.kind = CaseKind::kTrain;
    twin.group = group_of(c.config);
    twin.config = c.config;
    twin.device = c.device;
    twin.pg_backend = c.pg_backend;
    twin.trainer = c.trainer;
    twin.compare_to = lane_target + case_trainer_suffix(c.trainer);
    twins.push_back(twin);
  }
  for (auto& t : twins) add(std::move(t));
}

// The EP=1 control of every case with ep > 1: the same config with the experts replicated, so
// a divergence that only the ep case shows is the expert parallelism's.
void MatrixResolver::add_ep1_controls() {
  std::vector<Case> controls;
  for (const auto& c : out.cases) {
    const std::string name = ep1_control(c);
    if (name.empty()) continue;
    ParallelConfig plain = c.config;
    plain.ep = 1;
    const bool present = std::any_of(out.cases.begin(), out.cases.end(), [&](const Case& o) { return o.name == name; }) ||
                         std::any_of(controls.begin(), controls.end(), [&](const Case& o) { return o.name == name; });
    if (present) continue;
    Case control;
    control.name = name;
    control.kind = CaseKind::kTrain;
    control.group = group_of(plain);
    control.config = plain;
    control.device = c.device;
    control.pg_backend = c.pg_backend;
    control.compare_to = lane_target;
    controls.push_back(control);
  }
  for (auto& c : controls) add(std::move(c));
}

}  // namespace

CaseMatrix resolve_matrix(const ModelSpec& spec, const json& m) {
  MatrixResolver r(spec, m);
  r.add_references(m);
  for (size_t i = 0; i < m["cases"].size(); ++i) {
    Case c = r.listed_case(m["cases"][i], r.where + " case " + std::to_string(i));
    const std::string name = c.name;
    if (r.add(std::move(c)) && !r.out.is_listed(name)) r.out.listed.push_back(name);
  }
  r.add_resume_twins();
  for (Case& ref : case_trainer_references(r.out.cases, r.seed)) r.add(std::move(ref));
  r.add_ep1_controls();
  return std::move(r.out);
}

CaseMatrix resolve_matrix_source(const ModelSpec& spec, const std::string& source) {
  return resolve_matrix_source(spec, MatrixSource::parse(source));
}

CaseMatrix resolve_matrix_source(const ModelSpec& spec, const MatrixSource& source) {
  CaseMatrix out = resolve_matrix_base(spec, source.base, source.lane);
  if (!source.lane.empty()) out.name = source.text();
  return out;
}

CaseMatrix resolve_matrix_base(const ModelSpec& spec, const std::string& preset_or_path, const Lane& lane) {
  const std::vector<std::string> presets = preset_names();
  const bool preset = std::find(presets.begin(), presets.end(), preset_or_path) != presets.end();
  std::error_code ec;
  if (!preset && (std::filesystem::exists(preset_or_path, ec) || preset_or_path.find('/') != std::string::npos ||
                  preset_or_path.find(".json") != std::string::npos)) {
    const std::string where = "case matrix file " + preset_or_path;
    MIH_CHECK(std::filesystem::exists(preset_or_path, ec), where, " does not exist; give a JSON matrix file or a preset (",
              preset_list(), ")");
    MIH_CHECK(std::filesystem::is_regular_file(preset_or_path, ec), where, " is not a file (a directory?); give a JSON ",
              "matrix file or a preset");
    std::string text;
    MIH_CHECK(read_file(preset_or_path, &text), where, " cannot be read");
    json j = parse_matrix_file(text, where);
    if (j.is_object()) j.update(lane.overrides());
    return with_context(where, [&] { return resolve_matrix(spec, j); });
  }
  json j = preset_json(preset_or_path);
  j.update(lane.overrides());
  return resolve_matrix(spec, j);
}

}  // namespace mih::spec
