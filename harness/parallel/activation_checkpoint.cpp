// The checkpoint Function (see activation_checkpoint.h). Backward, in order
// (docs/spike-ac-cp.md section 1.6): unpack the saved inputs (this fails if one was modified in
// place); fork the RNG (save current, set the forward's); re-enter the forward's autocast
// state under grad mode; recompute on detached inputs; restore RNG and autocast; walk the
// recomputed graph; grad() for the inputs that need it.
#include "harness/parallel/activation_checkpoint.h"

#include <mutex>
#include <set>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/compat/autocast.h"

namespace mih {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

thread_local std::string t_recompute_region;
thread_local int t_recompute_depth = 0;

// What backward needs from forward: held in a capsule in saved_data, so it lives exactly as
// long as the graph node.
struct Region : torch::CustomClassHolder {
  std::string name;
  RegionForward forward;
  size_t num_inputs = 0;
  std::set<const void*> declared_leaves;  // TensorImpls of the params
  at::Tensor cpu_rng;
  c10::optional<c10::Device> cuda_device;
  at::Tensor cuda_rng;
  compat::AutocastState autocast;
  std::vector<at::Generator> generators;
  std::vector<at::Tensor> generator_states;
};

at::Tensor get_rng_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

at::Generator cuda_generator(const c10::Device& device) { return at::globalContext().defaultGenerator(device); }

// Marks the calling thread as recomputing `name` for the scope's lifetime.
class RecomputeScope {
 public:
  explicit RecomputeScope(const std::string& name) : previous_(t_recompute_region) {
    t_recompute_region = name;
    ++t_recompute_depth;
  }
  ~RecomputeScope() {
    t_recompute_region = previous_;
    --t_recompute_depth;
  }

 private:
  std::string previous_;
};

// Every leaf reached must be declared and every other node created by the recompute
// (sequence numbers are per thread and increase; AccumulateGrad nodes have none).
void check_recomputed_graph(const Region& region, const at::Tensor& out, const std::set<const void*>& allowed,
                            uint64_t seq_begin, uint64_t seq_end) {
  std::vector<torch::autograd::Node*> stack;
  std::set<torch::autograd::Node*> seen;
  if (out.grad_fn()) stack.push_back(out.grad_fn().get());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      MIH_CHECK(allowed.count(acc->variable.unsafeGetTensorImpl()), "activation checkpoint region '", region.name,
                "' uses a tensor of shape ", acc->variable.sizes(),
                " that requires grad but is neither one of its params nor one of its inputs: its gradient would be "
                "lost in the recompute. Pass it in the params (a tied or shared parameter) or the inputs");
      continue;
    }
    const uint64_t seq = node->sequence_nr();
    MIH_CHECK(seq >= seq_begin && seq < seq_end, "activation checkpoint region '", region.name,
              "' reaches autograd node '", node->name(),
              "' created outside the region: a tensor computed outside and captured by the region loses its "
              "gradient. Pass it to checkpoint() as an input");
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
}

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs, at::TensorList params,
                            c10::intrusive_ptr<Region> region) {
    region->num_inputs = inputs.size();
    for (const auto& p : params) region->declared_leaves.insert(p.unsafeGetTensorImpl());
    region->cpu_rng = get_rng_state(at::detail::getDefaultCPUGenerator());
    for (const auto& x : inputs) {
      if (x.defined() && x.is_cuda()) {
        region->cuda_device = x.device();
        region->cuda_rng = get_rng_state(cuda_generator(x.device()));
        break;
      }
    }
    region->autocast = compat::autocast_state();
    for (const auto& g : region->generators) region->generator_states.push_back(get_rng_state(g));
    std::vector<at::Tensor> saved(inputs.begin(), inputs.end());
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["region"] = c10::IValue::make_capsule(region);
    return region->forward(std::vector<at::Tensor>(inputs.begin(), inputs.end()));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto region = c10::static_intrusive_pointer_cast<Region>(ctx->saved_data["region"].toCapsule());
    MIH_CHECK(!at::GradMode::is_enabled(), "activation checkpoint region '", region->name,
              "': backward with create_graph=true (double backward) through a checkpoint is not supported");
    variable_list saved;
    try {
      saved = ctx->get_saved_variables();
    } catch (const c10::Error& e) {
      MIH_THROW(Code::kInvalidSpec, "activation checkpoint region '", region->name,
                "': an input was modified in place between forward and backward, so the recompute would see "
                "other values (",
                e.what_without_backtrace(), ")");
    }
    const size_t n_in = region->num_inputs;
    std::vector<at::Tensor> inputs;
    std::set<const void*> allowed = region->declared_leaves;
    for (size_t i = 0; i < n_in; ++i) {
      at::Tensor d = saved[i].defined() ? saved[i].detach() : at::Tensor();
      if (d.defined()) {
        d.requires_grad_(saved[i].requires_grad());
        allowed.insert(d.unsafeGetTensorImpl());
      }
      inputs.push_back(d);
    }

    // Fork the RNG: replay the forward's stream, then put the current one back.
    at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
    const at::Tensor cpu_now = get_rng_state(cpu_gen);
    at::Tensor cuda_now;
    // F14 (docs/fault-catalog.md): the recompute runs on the current streams, not the forward's, so
    // dropout draws other masks than the forward did.
    const bool replay = !fault::active(fault::Fault::kF14);
    if (replay) set_rng_state(cpu_gen, region->cpu_rng);
    if (region->cuda_device) {
      cuda_now = get_rng_state(cuda_generator(*region->cuda_device));
      if (replay) set_rng_state(cuda_generator(*region->cuda_device), region->cuda_rng);
    }
    std::vector<at::Tensor> generators_now;
    for (size_t i = 0; i < region->generators.size(); ++i) {
      generators_now.push_back(get_rng_state(region->generators[i]));
      if (replay) set_rng_state(region->generators[i], region->generator_states[i]);
    }
    at::Tensor out;
    uint64_t seq_begin = 0, seq_end = 0;
    auto restore = [&] {
      set_rng_state(cpu_gen, cpu_now);
      if (region->cuda_device) set_rng_state(cuda_generator(*region->cuda_device), cuda_now);
      for (size_t i = 0; i < region->generators.size(); ++i) set_rng_state(region->generators[i], generators_now[i]);
    };
    try {
      RecomputeScope scope(region->name);
      at::AutoGradMode grad_on(true);
      compat::AutocastScope autocast(region->autocast);
      seq_begin = at::sequence_number::peek();
      out = region->forward(inputs);
      seq_end = at::sequence_number::peek();
    } catch (...) {
      restore();
      throw;
    }
    restore();
    check_recomputed_graph(*region, out, allowed, seq_begin, seq_end);

    std::vector<at::Tensor> wanted;
    std::vector<size_t> positions;
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!ctx->needs_input_grad(i)) continue;
      wanted.push_back(i < n_in ? inputs[i] : saved[i]);
      positions.push_back(i);
    }
    variable_list result(saved.size() + 1);  // + the region argument
    if (!wanted.empty() && out.requires_grad()) {
      variable_list grads = torch::autograd::grad({out}, wanted, {grad_outputs[0]}, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t j = 0; j < positions.size(); ++j) result[positions[j]] = grads[j];
    }
    return result;
  }
};

}  // namespace

at::Tensor checkpoint(const std::string& region, const RegionForward& forward, const std::vector<at::Tensor>& inputs,
                      const std::vector<at::Tensor>& params, const std::vector<at::Generator>& generators) {
  MIH_CHECK(static_cast<bool>(forward), "activation checkpoint region '", region, "': the forward function is empty");
  auto r = c10::make_intrusive<Region>();
  r->name = region;
  r->forward = forward;
  r->generators = generators;
  // One entry per leaf: a tensor listed twice (a module registered under two names, a tie
  // inside the region; torch::nn::Module::parameters() keeps both) would get the region's
  // whole gradient once per entry, and AccumulateGrad would sum them into twice the gradient.
  std::vector<at::Tensor> unique_params;
  std::set<const void*> seen;
  for (const auto& p : params) {
    if (!p.defined() || seen.insert(p.unsafeGetTensorImpl()).second) unique_params.push_back(p);
  }
  return CheckpointFunction::apply(at::TensorList(inputs), at::TensorList(unique_params), r);
}

bool in_recompute() { return t_recompute_depth > 0; }

const std::string& recompute_region() { return t_recompute_region; }

}  // namespace mih
