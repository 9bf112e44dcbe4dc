// The module parity engine (see module_parity.h).
#include "harness/spec/module_parity.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>

#include "harness/base/error.h"
#include "harness/compat/store.h"
#include "harness/parallel/parallel_context.h"
#include "harness/runtime/device_mesh.h"

namespace mih::spec {
namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

std::string quoted_list(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out.empty() ? "none" : out;
}

const std::string& reference_name(const ParityWeight& w) { return w.reference.empty() ? w.candidate : w.reference; }

double grad_tolerance_of(const ModuleParityCase& c) { return c.grad_tolerance < 0 ? c.tolerance : c.grad_tolerance; }

// An undefined side (a gradient that never reached the tensor) counts as zeros of `shape`.
ParityObservation observe(std::string name, const at::Tensor& candidate, const at::Tensor& reference,
                          at::IntArrayRef shape, double tolerance) {
  ParityObservation o;
  o.name = std::move(name);
  o.shape = shape.vec();
  o.tolerance = tolerance;
  if (!candidate.defined() && !reference.defined()) o.note = "neither side's gradient is defined (both count as zero)";
  else if (!candidate.defined()) o.note = "the candidate's gradient is undefined (counted as zero)";
  else if (!reference.defined()) o.note = "the reference's gradient is undefined: the tensor does not reach its output (counted as zero)";
  auto value = [&](const at::Tensor& t) {
    return t.defined() ? t.detach().to(at::kDouble) : at::zeros(shape, at::TensorOptions().dtype(at::kDouble));
  };
  const at::Tensor a = value(candidate), b = value(reference);
  MIH_CHECK(a.sizes() == b.sizes(), "observation '", o.name, "': expected the reference's shape ", b.sizes(),
            " for the candidate's, got ", a.sizes());
  if (a.numel() > 0) {
    o.max_abs_error = (a - b).abs().max().item<double>();
    const double scale = std::max(a.abs().max().item<double>(), b.abs().max().item<double>());
    o.relative_error = scale > 0 ? o.max_abs_error / scale : 0.0;
  }
  o.passed = std::isfinite(o.relative_error) && o.relative_error <= tolerance;
  return o;
}

// Backward from `cotangent` on the output and 1 on an aux loss that requires grad.
void backward(const ParityOutput& out, const at::Tensor& cotangent) {
  std::vector<at::Tensor> roots, grads;
  if (out.output.requires_grad()) {
    roots.push_back(out.output);
    grads.push_back(cotangent);
  }
  if (out.aux_loss.defined() && out.aux_loss.requires_grad()) {
    roots.push_back(out.aux_loss);
    grads.push_back(at::ones_like(out.aux_loss));
  }
  if (!roots.empty()) torch::autograd::backward(roots, grads);
}

void run_case(const ModuleParityCase& c, ModuleParityResult& r) {
  c.validate();
  // The caller may be inside a no-grad region: without a graph every gradient would be
  // undefined on both sides and compare equal.
  const at::AutoGradMode grad_mode(true);
  // A one-rank mesh: what the candidate's layers are built on (tp = cp = dp = 1).
  compat::Store store = compat::make_hash_store(std::chrono::seconds(30));
  MeshOptions options;
  options.group.gloo_hostname = "127.0.0.1";
  ParallelConfig config;
  config.dtype = DType::kFloat64;
  config.seed = c.seed;
  DeviceMesh mesh(config, store, 0, 1, options);
  ParallelContext ctx(mesh, config);
  const ParityCandidate candidate = with_context("while building the candidate", [&] { return c.candidate(ctx); });
  MIH_CHECK(static_cast<bool>(candidate.forward), "the candidate has no forward function");

  std::map<std::string, at::Tensor> by_fqn;
  std::vector<std::string> available;
  if (candidate.module) {
    for (const auto& p : candidate.module->named_parameters(/*recurse=*/true)) {
      by_fqn.emplace(p.key(), p.value());
      available.push_back(p.key());
      if (p.value().requires_grad()) r.trainable.push_back(p.key());
    }
    for (const auto& b : candidate.module->named_buffers(/*recurse=*/true)) {
      if (by_fqn.emplace(b.key(), b.value()).second) available.push_back(b.key());
    }
  }
  std::set<std::string> mapped;
  for (const auto& w : c.weights) {
    MIH_CHECK(by_fqn.count(w.candidate), "weight adapter entry '", w.candidate, "' -> '", reference_name(w),
              "': the candidate has no parameter or buffer '", w.candidate, "'; it has ", quoted_list(available));
    mapped.insert(w.candidate);
  }
  for (const auto& fqn : r.trainable) {
    if (!mapped.count(fqn)) r.unmapped.push_back(fqn);
  }
  if (!r.unmapped.empty()) return;

  // The reference reads copies of the candidate's tensors taken before the candidate runs, so
  // the candidate's forward cannot change what the reference sees.
  std::map<std::string, at::Tensor> leaves;
  for (const auto& fqn : mapped) {
    const at::Tensor& t = by_fqn.at(fqn);
    leaves[fqn] = t.detach().clone().requires_grad_(t.requires_grad());
  }
  std::map<std::string, at::Tensor> weights;
  for (const auto& w : c.weights) {
    const at::Tensor& leaf = leaves.at(w.candidate);
    weights[reference_name(w)] = w.transform ? with_context("in the adapter's transform of '" + w.candidate + "'",
                                                            [&] { return w.transform(leaf); })
                                             : leaf;
  }

  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(c.seed);
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  std::vector<at::Tensor> candidate_inputs, reference_inputs;
  for (const auto& shape : c.input_shapes) {
    const at::Tensor x = at::randn(shape, gen, f64);
    candidate_inputs.push_back(x.clone().requires_grad_(true));
    reference_inputs.push_back(x.clone().requires_grad_(true));
  }
  for (const auto& fqn : r.trainable) by_fqn.at(fqn).mutable_grad() = at::Tensor();

  const ParityOutput co = with_context("in the candidate's forward", [&] { return candidate.forward(candidate_inputs); });
  const ParityOutput ro =
      with_context("in the reference", [&] { return c.reference(ReferenceWeights(weights), reference_inputs); });
  MIH_CHECK(co.output.defined() && ro.output.defined(), "the ", co.output.defined() ? "reference" : "candidate",
            " returned no output");
  MIH_CHECK(co.output.sizes() == ro.output.sizes(), "output: expected the reference's shape ", ro.output.sizes(),
            " from the candidate, got ", co.output.sizes());
  // One upstream gradient for both sides: a fixed random cotangent, so every element of the
  // output weighs in (a sum would hide a gradient error orthogonal to the all-ones vector).
  const at::Tensor cotangent = at::randn(co.output.sizes(), gen, f64);
  r.observations.push_back(observe("output", co.output, ro.output, co.output.sizes(), c.tolerance));
  if (co.aux_loss.defined() && ro.aux_loss.defined()) {
    r.observations.push_back(observe("aux_loss", co.aux_loss, ro.aux_loss, co.aux_loss.sizes(), c.tolerance));
  }
  with_context("in the candidate's backward", [&] { backward(co, cotangent); });
  with_context("in the reference's backward", [&] { backward(ro, cotangent); });

  const double grad_tol = grad_tolerance_of(c);
  for (size_t i = 0; i < candidate_inputs.size(); ++i) {
    r.observations.push_back(observe("input_grad[" + std::to_string(i) + "]", candidate_inputs[i].grad(),
                                     reference_inputs[i].grad(), candidate_inputs[i].sizes(), grad_tol));
  }
  for (const auto& fqn : r.trainable) {
    const at::Tensor& p = by_fqn.at(fqn);
    r.observations.push_back(observe("grad:" + fqn, p.grad(), leaves.at(fqn).grad(), p.sizes(), grad_tol));
  }
}

}  // namespace

const at::Tensor& ReferenceWeights::at(const std::string& name) const {
  auto it = tensors_.find(name);
  MIH_CHECK(it != tensors_.end(), "reference weight '", name, "': the weight adapter produces no such name; it produces ",
            quoted_list(names()), " (add an entry {<candidate FQN>, \"", name, "\"} to the case's weights)");
  return it->second;
}

std::vector<std::string> ReferenceWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

void ModuleParityCase::validate() const {
  const std::string where = "module parity case '" + name + "'";
  MIH_CHECK(!name.empty(), "module parity case: the name is empty");
  MIH_CHECK(static_cast<bool>(candidate), where, ": candidate is empty");
  MIH_CHECK(static_cast<bool>(reference), where, ": reference is empty");
  MIH_CHECK(!input_shapes.empty(), where, ": input_shapes is empty; give the shape of each input");
  MIH_CHECK(tolerance > 0 && std::isfinite(tolerance), where, ": tolerance must be a positive number, got ", tolerance);
  MIH_CHECK(std::isfinite(grad_tolerance) && grad_tolerance != 0, where,
            ": grad_tolerance must be positive, or negative for `tolerance`, got ", grad_tolerance);
  std::set<std::string> names;
  for (const auto& w : weights) {
    MIH_CHECK(!w.candidate.empty(), where, ": a weight adapter entry has an empty candidate FQN");
    MIH_CHECK(names.insert(reference_name(w)).second, where, ": the weight adapter produces reference weight '",
              reference_name(w), "' twice");
  }
}

nlohmann::json ModuleParityCase::to_json() const {
  nlohmann::json adapter = nlohmann::json::array();
  for (const auto& w : weights) {
    adapter.push_back({{"candidate", w.candidate}, {"reference", reference_name(w)}, {"transform", static_cast<bool>(w.transform)}});
  }
  return {{"name", name},
          {"input_shapes", input_shapes},
          {"weights", adapter},
          {"tolerance", tolerance},
          {"grad_tolerance", grad_tolerance_of(*this)},
          {"seed", seed}};
}

bool ModuleParityResult::passed() const {
  if (!error.empty() || !unmapped.empty() || observations.empty()) return false;
  for (const auto& o : observations) {
    if (!o.passed) return false;
  }
  return true;
}

std::string ModuleParityResult::failure() const {
  const std::string where = "module parity case '" + name + "'";
  if (!error.empty()) return where + " raised: " + error;
  if (!unmapped.empty()) {
    return where + ": the weight adapter maps no reference weight from the candidate's trainable parameter" +
           (unmapped.size() > 1 ? "s " : " ") + quoted_list(unmapped) + "; add an entry {\"" + unmapped.front() +
           "\", <reference name>} to its weights";
  }
  if (observations.empty()) return where + " made no observation";
  for (const auto& o : observations) {
    if (o.passed) continue;
    return where + ": observation '" + o.name + "' relative error " + fmt(o.relative_error) + " > tolerance " +
           fmt(o.tolerance) + " (max abs error " + fmt(o.max_abs_error) + (o.note.empty() ? "" : "; " + o.note) + ")";
  }
  return "";
}

nlohmann::json ModuleParityResult::to_json() const {
  nlohmann::json obs = nlohmann::json::array();
  for (const auto& o : observations) {
    nlohmann::json j = {{"name", o.name},
                        {"shape", o.shape},
                        {"max_abs_error", o.max_abs_error},
                        {"relative_error", o.relative_error},
                        {"tolerance", o.tolerance},
                        {"passed", o.passed}};
    if (!o.note.empty()) j["note"] = o.note;
    obs.push_back(std::move(j));
  }
  nlohmann::json out = {{"passed", passed()}, {"trainable", trainable}, {"unmapped", unmapped}, {"observations", obs}};
  if (!error.empty()) out["error"] = error;
  if (!passed()) out["failure"] = failure();
  return out;
}

ModuleParityResult run_module_parity(const ModuleParityCase& c) {
  ModuleParityResult r;
  r.name = c.name;
  try {
    run_case(c, r);
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

}  // namespace mih::spec
