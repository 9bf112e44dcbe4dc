// TrainingBackend (DESIGN.md section 3): the one interface through which the conformance case
// runner drives training. mih's Trainer is the default implementation ("trainer"); a team
// with its own C++ trainer implements this interface (build the model on the mesh, run a step
// calling the session hooks, gather a full tensor, save and load a checkpoint), registers it
// with MIH_REGISTER_TRAINING_BACKEND, and every suite that applies runs on it. A team that cannot wrap
// its loop calls the TrainingHooks of a ValidationSession from the loop itself (the seed
// tool's trainer-owned mode); tests/conformance/plain_backend.cpp does both.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "harness/spec/model_spec.h"
#include "harness/training/trainer.h"

namespace mih {

class TrainingBackend {
 public:
  virtual ~TrainingBackend() = default;
  /// Why this backend cannot run `config` (e.g. "world size 1 only"), or "" when it can.
  /// `resume` is true for a case that saves and loads a checkpoint. The case runner rejects
  /// such a case before any rank starts.
  virtual std::string unsupported(const ParallelConfig& /*config*/, bool /*resume*/) const { return ""; }
  /// Builds the spec's model on `mesh` under `config` (the model, its sharding, the
  /// optimizer `options` names, the data split) and calls hooks.attach_optimizer and
  /// hooks.attach_data_pipeline. `spec`, `mesh` and `hooks` outlive the backend.
  /// Throws: mih::Error{kInvalidSpec} for a config it cannot run.
  virtual void build(const spec::ModelSpec& spec, DeviceMesh& mesh, const ParallelConfig& config,
                     const TrainerOptions& options, TrainingHooks& hooks) = 0;
  /// Runs the next step, calling every per-step hook in TrainingHooks order.
  virtual StepMetrics step() = 0;
  /// The index of the next step.
  virtual int64_t next_step() const = 0;
  /// What the session sees (parameter table, model, optimizer, config).
  virtual TrainingState state() = 0;
  /// The full value of a parameter ("param"), its gradient ("grad") or an optimizer
  /// state (compat::state_names: "exp_avg", "momentum_buffer" ...), on every rank. A collective.
  virtual at::Tensor gather_full(const ShardedParameter& p, const std::string& what) = 0;
  /// Saves / loads a checkpoint (model, optimizer, step) that any config of the spec can
  /// load; calls hooks.capture_checkpoint_payload. Collectives.
  virtual void save(const std::filesystem::path& dir) = 0;
  virtual void load(const std::filesystem::path& dir) = 0;
};

using BackendFactory = std::function<std::unique_ptr<TrainingBackend>()>;

/// Backends by name; "trainer" (mih's Trainer) is always registered.
class TrainingBackendRegistry {
 public:
  static TrainingBackendRegistry& instance();
  /// Throws: mih::Error{kInvalidSpec} for a duplicate name.
  void add(const std::string& name, BackendFactory factory);
  /// Throws: mih::Error{kInvalidSpec} for an unknown name, listing the registered ones.
  std::unique_ptr<TrainingBackend> make(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, BackendFactory> factories_;
};

/// mih's Trainer as a backend.
std::unique_ptr<TrainingBackend> make_trainer_backend();

/// Registers a backend from a static initializer: MIH_REGISTER_TRAINING_BACKEND(plain, PlainBackend)
/// registers "plain" made by std::make_unique<PlainBackend>().
#define MIH_REGISTER_TRAINING_BACKEND(name, Class)                                                        \
  static const bool mih_training_backend_registered_##name = (::mih::TrainingBackendRegistry::instance().add(    \
                                                         #name, [] { return std::make_unique<Class>(); }), \
                                                     true)

}  // namespace mih
