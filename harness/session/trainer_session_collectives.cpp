// The device TrainerSession's own collectives run on, and those collectives
// (trainer_session_internal.h): every tensor they hand the world group is made on that device,
// since an NCCL group refuses CPU tensors, and every result is read back on the CPU.
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include "harness/base/error.h"
#include "harness/session/trainer_session_internal.h"

namespace mih::trainer_session_internal {

std::optional<c10::Device> current_cuda_device() {
  // The CUDA hooks answer -1 (1.13: int64_t, 2.x: DeviceIndex) on a libtorch without CUDA.
  const auto index = static_cast<int64_t>(at::detail::getCUDAHooks().current_device());
  if (index < 0 || at::detail::getCUDAHooks().getNumGPUs() <= 0) return std::nullopt;
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
}

c10::Device choose_collective_device(compat::BackendKind world, std::optional<c10::Device> requested,
                                     std::optional<c10::Device> current_cuda, int cuda_devices) {
  const std::string backend(compat::backend_name(world));
  if (!requested) {
    if (world != compat::BackendKind::kNccl) return c10::Device(c10::DeviceType::CPU);
    MIH_CHECK(current_cuda.has_value(), "TrainerSession: the world group is nccl, which moves CUDA tensors only, but "
              "this process has no current CUDA device (a libtorch without CUDA, or no GPU visible): run on the GPUs "
              "the group was built on, or set TrainerSessionOptions::collective_device");
    requested = current_cuda;
  }
  const c10::Device d = *requested;
  MIH_CHECK(d.is_cpu() || d.is_cuda(), "TrainerSession: collective_device '", d.str(), "' is neither the CPU nor a "
            "CUDA device; the world's collectives (", backend, ") move CPU or CUDA tensors");
  MIH_CHECK(d.is_cuda() || world != compat::BackendKind::kNccl, "TrainerSession: collective_device '", d.str(),
            "' on an nccl world: NCCL moves CUDA tensors only; set the CUDA device of this rank (cuda:<local rank>) "
            "or leave collective_device unset for the current CUDA device");
  if (d.is_cpu()) return c10::Device(c10::DeviceType::CPU);
  if (!d.has_index()) {
    MIH_CHECK(current_cuda.has_value(), "TrainerSession: collective_device 'cuda' (the current CUDA device), but this "
              "process has no CUDA device (", cuda_devices, " visible): use the CPU on a gloo world");
    return *current_cuda;
  }
  MIH_CHECK(d.index() < cuda_devices, "TrainerSession: collective_device '", d.str(), "', but this process sees ",
            cuda_devices, " CUDA device(s)", cuda_devices == 0 ? " (a libtorch without CUDA, or no GPU visible)" : "",
            ": name a device in [0, ", cuda_devices, ") or the CPU (gloo)");
  return d;
}

c10::Device collective_device_of(compat::BackendKind world, std::optional<c10::Device> requested) {
  // Asked only where CUDA is involved: the device count initializes CUDA's driver, which a
  // Gloo trainer on the CPU that forks afterwards must not have done.
  const bool cuda = world == compat::BackendKind::kNccl || (requested && requested->is_cuda());
  return choose_collective_device(world, requested, cuda ? current_cuda_device() : std::nullopt,
                                  cuda ? compat::cuda_device_count() : 0);
}

void check_parameter_device(const c10::Device& collectives, bool requested, const c10::Device& parameter,
                            const std::string& fqn) {
  if (requested || !collectives.is_cuda() || !parameter.is_cuda() || !parameter.has_index()) return;
  MIH_CHECK(parameter.index() == collectives.index(), "TrainerSession::describe_parameters: parameter '", fqn,
            "' lives on ", parameter.str(), " but the session's collectives run on the current CUDA device, ",
            collectives.str(), ": call c10::cuda::set_device(", static_cast<int>(parameter.index()),
            ") before constructing the session (ProcessGroupNCCL expects each rank's device current), or set "
            "TrainerSessionOptions::collective_device");
}

WorldCollectives::WorldCollectives(compat::Group world, c10::Device device)
    : comm_("world", std::move(world), nullptr), device_(device) {}

at::Tensor WorldCollectives::all_reduce(const at::Tensor& host, ReduceOp op, CallSite site) {
  at::Tensor staged = host.detach().to(device_, /*non_blocking=*/false, /*copy=*/true);
  comm_.all_reduce(staged, op, site);
  // The copy to the CPU also waits for an NCCL stream's reduction.
  return staged.to(at::kCPU);
}

std::vector<nlohmann::json> WorldCollectives::all_gather_json(const nlohmann::json& value, CallSite site) {
  return mih::all_gather_json(comm_, value, device_, site);
}

nlohmann::json WorldCollectives::replica_records(const std::vector<session_internal::PieceDigest>& mine) {
  return session_internal::replica_records(comm_, mine, device_);
}

void WorldCollectives::barrier(CallSite site) {
  // A one-element all-reduce on the session's device rather than the group's barrier: an
  // adopted NCCL group's barrier would pick a device of its own.
  all_reduce(at::zeros({1}, at::kDouble), ReduceOp::kSum, site);
}

}  // namespace mih::trainer_session_internal
