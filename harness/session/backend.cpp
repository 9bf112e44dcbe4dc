// The backend registry and mih's Trainer as a TrainingBackend (see backend.h).
#include "harness/session/backend.h"

#include "harness/base/error.h"
#include "harness/base/strings.h"

namespace mih {
namespace {

class TrainerBackend : public TrainingBackend {
 public:
  void build(const spec::ModelSpec& spec, DeviceMesh& mesh, const ParallelConfig& config, const TrainerOptions& options,
             TrainingHooks& hooks) override {
    trainer_ = std::make_unique<Trainer>(mesh, config, spec.factory, spec.data.make_batches(), options, &hooks,
                                         spec.data.make_loader ? spec.data.make_loader() : nullptr);
  }
  StepMetrics step() override { return trainer().step(); }
  int64_t next_step() const override { return trainer_ ? trainer_->next_step() : 0; }
  TrainingState state() override { return trainer().state(); }
  at::Tensor gather_full(const ShardedParameter& p, const std::string& what) override {
    return trainer().gather_full(p, what);
  }
  void save(const std::filesystem::path& dir) override { trainer().save(dir); }
  void load(const std::filesystem::path& dir) override { trainer().load(dir); }

 private:
  Trainer& trainer() {
    MIH_CHECK_CODE(trainer_ != nullptr, Code::kFailedPrecondition, "the trainer backend was used before build()");
    return *trainer_;
  }
  std::unique_ptr<Trainer> trainer_;
};

}  // namespace

TrainingBackendRegistry& TrainingBackendRegistry::instance() {
  static TrainingBackendRegistry* registry = [] {
    auto* r = new TrainingBackendRegistry;
    r->add("trainer", make_trainer_backend);
    return r;
  }();
  return *registry;
}

void TrainingBackendRegistry::add(const std::string& name, BackendFactory factory) {
  MIH_CHECK(!name.empty() && factory, "a backend needs a name and a factory");
  MIH_CHECK(factories_.emplace(name, std::move(factory)).second, "backend '", name, "' is registered twice");
}

std::unique_ptr<TrainingBackend> TrainingBackendRegistry::make(const std::string& name) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::string known = join(names(), ", ");
    MIH_THROW(Code::kInvalidSpec, "unknown training backend '", name, "'; registered: ", known);
  }
  return it->second();
}

std::vector<std::string> TrainingBackendRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : factories_) out.push_back(n);
  return out;
}

std::unique_ptr<TrainingBackend> make_trainer_backend() { return std::make_unique<TrainerBackend>(); }

}  // namespace mih
