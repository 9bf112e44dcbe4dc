// Goldens of the original model: reading and checking them, and resolving a run's goldens
// (see golden.h); the comparison and its verdict are in golden_compare.cpp.
#include "harness/cases/golden.h"

#include <fnmatch.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include <ATen/ATen.h>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/json_fields.h"
#include "harness/cases/hf_interop.h"
#include "harness/cases/memo.h"
#include "harness/checkpoint/hf_checkpoint.h"
#include "harness/checkpoint/key_map.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/evidence/evidence_store.h"
#include "harness/parallel/activations.h"
#include "harness/base/strings.h"

namespace mih::cases {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool hex64(const json& v) {
  if (!v.is_string() || v.get<std::string>().size() != 64) return false;
  for (char c : v.get<std::string>()) {
    if (!std::isxdigit(static_cast<unsigned char>(c)) || std::isupper(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Noise above the cap is a golden's honest claim only for a gradient that is rounding residue:
// zero in exact arithmetic (CLIP's key bias, which softmax ignores), where the run and its twin
// disagree in every digit (measured: 0.7-1.8). Such a gradient is at most kResidueEpsilons
// float64 epsilons of the golden's whole gradient norm G (measured: 190 for transformers'
// LLaVA, 4e-7 for the builtin's); a real gradient is far above (the smallest of the vlm's,
// 7e-7 G). Its tolerance, k x noise x its own norm, then stays below 20 x 10 x 1e4 x 2.2e-16 x G
// = 4.4e-10 G in absolute terms.
constexpr double kResidueEpsilons = 1e4;
constexpr double kResidueMaxNoise = 10;

// Throws: mih::Error{kInvalidSpec} naming a non-finite gradient, or the first noise above the
// cap that is not such a gradient's (quoting it as golden.json has it).
void check_residue_noise(const fs::path& tensors, const std::map<std::string, json>& above, double cap,
                         const std::string& where, const std::string& cap_text, const std::string& fix) {
  if (above.empty()) return;
  const safetensors::Reader reader(tensors);
  std::map<std::string, double> norms;
  double all = 0;
  for (const auto& name : reader.names()) {
    if (name.rfind("grad.", 0) != 0) continue;
    MIH_CHECK(reader.info(name).dtype == "F64", where, ": tensor '", name, "' is ", reader.info(name).dtype,
              "; a golden holds float64", fix);
    at::Tensor x = at::empty(reader.info(name).shape, at::TensorOptions().dtype(at::kDouble));
    reader.read(name, x.data_ptr());
    norms[name] = x.norm().item<double>();
    MIH_CHECK(std::isfinite(norms[name]), where, ": tensor '", name, "' holds non-finite value(s) (NaN or Inf): the "
              "original did not compute this golden, or it diverged; nothing of the port is compared with it", fix);
    all += norms[name] * norms[name];
  }
  const double bound = kResidueEpsilons * std::numeric_limits<double>::epsilon() * std::sqrt(all);
  for (const auto& [name, v] : above) {
    const auto it = norms.find(name);
    const bool residue = it != norms.end() && v.get<double>() <= kResidueMaxNoise && it->second <= bound;
    MIH_CHECK(residue, where, ": noise of '", name, "' must be a number in [0, ", cap, "] (", cap_text, "), got ",
              v.dump(), " (more, up to ", kResidueMaxNoise, ", only for a gradient at float64 rounding level: at most ",
              kResidueEpsilons, " float64 epsilons of the golden's whole gradient norm, a gradient zero in exact "
              "arithmetic)", fix);
  }
}

}  // namespace

fs::path Golden::tensors_file() const { return dir / manifest.value("tensors_file", std::string(layout::kGoldenTensors)); }

Golden read_golden(const fs::path& dir) {
  const fs::path abs = fs::absolute(dir).lexically_normal();
  std::error_code ec;
  const std::string fix = "; `mih golden --spec NAME --out " + abs.string() +
                          "` writes one (docs/golden.md), or run every other suite without the comparison with the "
                          "original model: `mih test --no-golden`";
  MIH_CHECK_CODE(fs::is_directory(abs, ec), Code::kFailedPrecondition, "golden ", abs.string(),
                 " is not a directory", fix);
  const fs::path file = abs / layout::kGoldenManifest;
  MIH_CHECK_CODE(fs::is_regular_file(file, ec), Code::kFailedPrecondition, "golden ", abs.string(),
                 " has no golden.json", fix);
  Golden g;
  g.dir = abs;
  g.manifest = read_json_file(file);
  const std::string where = file.string();
  const json& m = g.manifest;
  MIH_CHECK(m.is_object(), where, ": expected a JSON object, got ", m.type_name());
  MIH_CHECK(m.contains("format") && m["format"] == kGoldenFormat, where, ": \"format\" is ",
            m.contains("format") ? m["format"].dump() : std::string("missing"), ", not \"", kGoldenFormat,
            "\": this is not a mih golden", fix);
  MIH_CHECK(m.contains("version") && m["version"].is_number_integer(), where,
            ": \"version\" must be an integer, got ", m.contains("version") ? m["version"].dump() : std::string("none"));
  const int64_t version = m["version"].get<int64_t>();
  MIH_CHECK(version == kGoldenVersion, where, ": golden format version ", version, " is not one this mih reads (it reads ",
            "version ", kGoldenVersion, "); write the golden again with this mih (`mih golden`), or check it with the ",
            "mih that reads version ", version);
  MIH_CHECK(m.value("dtype", json()) == "float64", where, ": \"dtype\" is ", m.value("dtype", json()).dump(),
            "; a golden is computed in float64");
  const json impl = m.value("implementation", json());
  MIH_CHECK(impl.is_object() && impl.value("name", json()).is_string(), where,
            ": \"implementation\" must be an object with a \"name\", got ", impl.dump());
  auto text = [&](const char* field) {
    const json v = impl.value(field, json("?"));
    return v.is_string() ? v.get<std::string>() : v.dump();
  };
  g.implementation = text("name") + " " + text("version") + " (" + text("architecture") + "; torch " + text("torch") + ")";
  for (auto [field, out] : {std::pair{"checkpoint_sha256", &g.checkpoint_sha256}, std::pair{"batch_sha256", &g.batch_sha256},
                            std::pair{"training_sha256", &g.training_sha256},
                            std::pair{"tensors_sha256", &g.tensors_sha256}}) {
    MIH_CHECK(m.contains(field) && hex64(m[field]), where, ": \"", field, "\" must be a SHA-256 (64 lower-case hex ",
              "digits), got ", m.contains(field) ? m[field].dump() : std::string("none"));
    *out = m[field].get<std::string>();
  }
  g.spec = m.value("spec", json()).is_string() ? m["spec"].get<std::string>() : "";
  g.num_hidden_layers = json_int(m, "num_hidden_layers", -1, where, 0, 1 << 20);
  MIH_CHECK(g.num_hidden_layers >= 0, where, ": \"num_hidden_layers\" is missing");
  MIH_CHECK(m.contains("compute_epsilon") && m["compute_epsilon"].is_number() && m["compute_epsilon"].get<double>() > 0 &&
                m["compute_epsilon"].get<double>() < 1,
            where, ": \"compute_epsilon\" must be a number in (0, 1), got ",
            m.contains("compute_epsilon") ? m["compute_epsilon"].dump() : std::string("none"));
  g.compute_epsilon = m["compute_epsilon"].get<double>();
  // The tolerances follow from these two fields, which no hash covers: each must be what the
  // implementation can honestly claim, or a golden could make every comparison pass.
  const double eps64 = std::numeric_limits<double>::epsilon(), eps32 = std::numeric_limits<float>::epsilon();
  const bool transformers = impl.value("name", json()) == "transformers";
  MIH_CHECK(std::abs(g.compute_epsilon - eps64) <= 1e-3 * eps64 ||
                (transformers && std::abs(g.compute_epsilon - eps32) <= 1e-3 * eps32),
            where, ": \"compute_epsilon\" is ", g.compute_epsilon, "; a golden's is float64's epsilon ", eps64,
            transformers ? internal::str(" or, for transformers (which casts norms and rotary tables to float32), "
                                         "float32's ", eps32)
                         : std::string(" (the builtin computes in float64)"),
            fix);
  const json noise = m.value("noise", json::object());
  MIH_CHECK(noise.is_object(), where, ": \"noise\" must be an object of numbers");
  // The builtin's noise twin differs in float64 reduction orders: its relative error is a few
  // thousand float64 epsilons at most (the reference goldens' largest, gpt2's, is 1500).
  // transformers' twin rounds every module's output to float32 where the original computes in
  // float32 inside: tens of float32 epsilons at most (the reference goldens' largest, a parameter after
  // the step of qwen3, is 18).
  const bool float32_inside = std::abs(g.compute_epsilon - eps32) <= 1e-3 * eps32;
  const double noise_cap = float32_inside ? 1e2 * eps32 : 1e5 * eps64;
  const char* cap_text = float32_inside ? "transformers' float32-rounded noise twin: at most 100 float32 epsilons"
                                        : "a float64 noise twin's relative error: at most 1e5 epsilons";
  std::map<std::string, json> above_cap;
  for (const auto& [name, v] : noise.items()) {
    MIH_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0, where, ": noise of '", name,
              "' must be a number in [0, ", noise_cap, "] (", cap_text, "), got ", v.dump(), fix);
    g.noise[name] = v.get<double>();
    if (v.get<double>() > noise_cap) above_cap[name] = v;
  }
  const std::string tensors = json_string(m, "tensors_file", layout::kGoldenTensors, where);
  MIH_CHECK(!tensors.empty() && tensors.find('/') == std::string::npos && tensors != "." && tensors != "..", where,
            ": \"tensors_file\" must be a file name in the golden's directory, got \"", tensors, "\"");
  const fs::path tf = g.tensors_file();
  MIH_CHECK(fs::is_regular_file(tf, ec), "golden ", abs.string(), ": its tensors file ", tf.string(),
            " is missing or not a regular file", fix);
  const std::string now = hf::file_sha256(tf);
  MIH_CHECK(now == g.tensors_sha256, "golden ", abs.string(), ": ", tf.filename().string(),
            " is not the file golden.json was written with (tensors_sha256 ", g.tensors_sha256, " in the manifest, ",
            now, " now): a stale or edited golden", fix);
  check_residue_noise(tf, above_cap, noise_cap, where, cap_text, fix);
  return g;
}

namespace {

// Before any rank starts: every tensor a comparison reads is there, of the shape it must
// have, float64 and finite (a corrupt header is refused by the reader itself).
void check_golden_tensors(const Golden& g) {
  const std::string fix = "; write it again with `mih golden` (docs/golden.md)";
  const std::string where = "golden " + g.dir.string() + ": " + g.tensors_file().filename().string();
  const safetensors::Reader reader = with_context(where, [&] { return safetensors::Reader(g.tensors_file()); });
  auto info = [&](const std::string& name) -> const safetensors::TensorInfo& {
    MIH_CHECK(reader.contains(name), where, " has no tensor '", name, "'", fix);
    return reader.info(name);
  };
  using Shape = std::vector<int64_t>;
  MIH_CHECK(info("loss").shape.empty(), where, ": 'loss' must be a scalar, has shape ", json(info("loss").shape).dump(), fix);
  const Shape h0 = info("hidden_states.0").shape;
  MIH_CHECK(h0.size() == 3, where, ": 'hidden_states.0' must be [B, S, H], has shape ", json(h0).dump(), fix);
  for (int64_t i = 1; i <= g.num_hidden_layers + 1; ++i) {
    const std::string name = "hidden_states." + std::to_string(i);
    MIH_CHECK(info(name).shape == h0, where, ": '", name, "' has shape ", json(info(name).shape).dump(),
              ", hidden_states.0 ", json(h0).dump(), " (every hidden state is [B, S, H])", fix);
  }
  const Shape logits = info("logits").shape;
  MIH_CHECK(logits.size() == 3 && logits[0] == h0[0] && logits[1] == h0[1], where, ": 'logits' has shape ",
            json(logits).dump(), "; [B, S, V] with the hidden states' B, S ", json(h0).dump(), fix);
  for (const auto& name : reader.names()) {
    const safetensors::TensorInfo& t = reader.info(name);
    MIH_CHECK(t.dtype == "F64", where, ": tensor '", name, "' is ", t.dtype, "; a golden holds float64", fix);
    for (const std::string prefix : {"grad.", "param_after_step."}) {
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string other = (prefix == "grad." ? "param_after_step." : "grad.") + name.substr(prefix.size());
      MIH_CHECK(!reader.contains(other) || reader.info(other).shape == t.shape, where, ": '", name, "' has shape ",
                json(t.shape).dump(), " and '", other, "' ", json(reader.info(other).shape).dump(),
                " (a parameter's gradient and its value after the step have its shape)", fix);
    }
    at::Tensor x = at::empty(t.shape, at::TensorOptions().dtype(at::kDouble));
    reader.read(name, x.data_ptr());
    const int64_t bad = x.numel() - at::isfinite(x).sum().item<int64_t>();
    MIH_CHECK(bad == 0, where, ": tensor '", name, "' holds ", bad, " non-finite value(s) (NaN or Inf): the original "
              "did not compute this golden, or it diverged; nothing of the port is compared with it", fix);
  }
}

}  // namespace

ExportDigests export_digests(const spec::ModelSpec& spec, uint64_t seed, const fs::path& init_from) {
  static std::atomic<int> counter{0};
  std::error_code ec;
  const fs::path scratch = fs::temp_directory_path(ec) / ("mih-golden-check-" + std::to_string(::getpid()) + "-" +
                                                          std::to_string(counter++));
  fs::remove_all(scratch, ec);
  struct Remove {
    fs::path dir;
    ~Remove() {
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  } cleanup{scratch};
  HfExportOptions o;
  o.out = scratch / layout::kExportDir;
  o.dtype = "float64";
  o.seed = seed;
  o.init_from = init_from;
  export_hf(spec, o);
  return {checkpoint_digest(hf::read_checkpoint(o.out)), hf::file_sha256(o.out / layout::kExportBatch),
          hf::file_sha256(o.out / layout::kExportTraining), seed, init_from};
}

void check_golden_matches(const spec::ModelSpec& spec, const Golden& golden, const ExportDigests& now) {
  // The golden of this run's start (its seed and checkpoint), into a directory of its own.
  const std::string fix = "; write the golden of this run's export: `mih golden --spec " + spec.name +
                          (now.seed != 0 ? " --seed " + std::to_string(now.seed) : std::string()) +
                          (now.init_from.empty() ? std::string() : " --init-from " + now.init_from.string()) +
                          " --out NEW_DIR` and pass --golden NEW_DIR (docs/golden.md)";
  MIH_CHECK(golden.spec.empty() || golden.spec == spec.name, "golden ", golden.dir.string(),
            " was computed from an export of spec '", golden.spec, "', not of '", spec.name, "'", fix);
  const struct {
    const char* field;
    const std::string& golden;
    const std::string& run;
    const char* covers;
  } hashes[] = {{"checkpoint_sha256", golden.checkpoint_sha256, now.checkpoint_sha256,
                 "config.json and the weights the reference starts from"},
                {"batch_sha256", golden.batch_sha256, now.batch_sha256, "batch.safetensors, the first global batch"},
                {"training_sha256", golden.training_sha256, now.training_sha256,
                 "training.json, the trainer options and weight-decay groups"}};
  for (const auto& h : hashes) {
    MIH_CHECK(h.golden == h.run, "golden ", golden.dir.string(), " does not belong to this run of spec '", spec.name,
              "': its ", h.field, " is ", h.golden, ", and this run's export (", h.covers, ") hashes to ", h.run,
              " (another checkpoint, batch or trainer options, or a stale golden)", fix);
  }
  for (const auto& [module, index] : spec.golden.layers) {
    MIH_CHECK(index <= golden.num_hidden_layers + 1, "spec '", spec.name, "': golden.layers maps '", module,
              "' to hidden state ", index, ", and golden ", golden.dir.string(), " of ", golden.num_hidden_layers,
              " decoder layers holds hidden states 0 .. ", golden.num_hidden_layers + 1,
              " (0 the embeddings, i decoder layer i - 1's output, L + 1 the final norm's)");
  }
}

std::map<std::string, fs::path> resolve_goldens(const RunOptions& o, const std::function<bool(const std::string& spec)>& compared) {
  std::map<std::string, fs::path> goldens;
  std::set<std::string> specs;
  for (const auto& r : registrations()) {
    if (selected(r)) specs.insert(r.spec);
  }
  MIH_CHECK(!o.no_golden || o.golden_dirs.empty(), "--golden and --no-golden: give one (--golden DIR compares the "
            "port with the original model, --no-golden runs every other suite without that comparison)");
  if (o.no_golden) {
    // No golden is read: every spec's is "" (spec_of_run: golden.dir "", no MatchesOriginal).
    for (const auto& name : specs) goldens[name].clear();
    if (!specs.empty()) progress(std::string(kMatchesOriginalNotRun));
    return goldens;
  }
  std::string selected_names;
  for (const auto& n : specs) selected_names += (selected_names.empty() ? "'" : ", '") + n + "'";
  std::map<std::string, fs::path> given;
  for (const auto& d : o.golden_dirs) {
    const Golden g = with_context("--golden " + d.string(), [&] { return read_golden(d); });
    std::string name = g.spec;
    if (name.empty()) {
      MIH_CHECK(specs.size() == 1, "--golden ", d.string(), ": its golden.json names no spec, and this run selects ",
                specs.size(), " (", selected_names.empty() ? "none" : selected_names, "); add --only-spec NAME");
      name = *specs.begin();
    }
    MIH_CHECK(specs.count(name), "--golden ", d.string(), " is a golden of spec '", name,
              "', which this run does not select (it selects ", selected_names.empty() ? "none" : selected_names, ")");
    MIH_CHECK(!given.count(name), "--golden: two goldens of spec '", name, "' (", given[name].string(), " and ",
              d.string(), "); give one");
    given[name] = g.dir;
  }
  for (const auto& name : specs) {
    const spec::ModelSpec s = spec::SpecRegistry::instance().get(name);
    const fs::path dir = given.count(name) ? given[name] : fs::path(s.golden.dir);
    if (dir.empty()) continue;
    const std::string what = "spec '" + name + "': golden " + dir.string();
    MIH_CHECK(!s.golden.layers.empty(), what, ": the spec declares no golden.layers, the map from its modules to the "
              "golden's hidden states (e.g. {\"layers.0\", 1}); declare it to compare the port with the golden");
    const Golden g = with_context(what, [&] { return read_golden(dir); });
    goldens[name] = g.dir;
  }
  std::vector<std::string> dropped;
  for (const auto& [name, dir] : goldens) {
    if (!compared(name)) continue;
    const spec::ModelSpec s = spec::SpecRegistry::instance().get(name);
    const std::string what = "spec '" + name + "': golden " + dir.string();
    const Golden g = with_context(what, [&] { return read_golden(dir); });
    {
      progress(name + ": checking golden " + g.dir.string() + " against this run's export");
      with_context(what, [&] { check_golden_tensors(g); });
      const Registration* r = nullptr;
      for (const auto& x : registrations()) {
        if (selected(x) && x.spec == name) r = &x;
      }
      MIH_INTERNAL_ASSERT(r != nullptr, "no selected registration of spec ", name);
      const spec::CaseMatrix& m = resolved_matrix(name, matrix_of(*r));
      const InitSource* init = init_source_of(name);
      const uint64_t seed = m.at("Reference").config.seed;
      const ExportDigests now = with_context(what + ": exporting the spec to check the golden's hashes", [&] {
        return export_digests(s, seed, init ? init->dir : fs::path());
      });
      const json& golden_seed = g.manifest.contains("seed") ? g.manifest["seed"] : json();
      const bool other_start = init != nullptr || !golden_seed.is_number_unsigned() || golden_seed.get<uint64_t>() != seed;
      if (!given.count(name) && other_start && g.checkpoint_sha256 != now.checkpoint_sha256) {
        // The spec's own golden (the build's) is of another start than this run's (--init-from,
        // --seed): there is no golden of this run to compare with, so MatchesOriginal is not
        // instantiated (nothing to check), never compared with another model's numbers.
        progress(name + ": its golden " + g.dir.string() + " is of another start than this run's (" +
                 (init ? "the checkpoint " + init->dir.string() : "seed " + std::to_string(seed)) +
                 "): MatchesOriginal is not instantiated; make a golden of this start with `mih golden` and pass "
                 "--golden DIR");
        dropped.push_back(name);
        continue;
      }
      with_context(what, [&] { check_golden_matches(s, g, now); });
    }
  }
  for (const auto& name : dropped) goldens[name].clear();  // spec_of_run: golden.dir "", no suite
  return goldens;
}

}  // namespace mih::cases
