// TrainerSession's own collectives run on the device the world's backend moves (an NCCL group
// refuses CPU tensors): the choice (the CPU for Gloo, the current CUDA device for NCCL, or the
// one set) and its refusals, on CUDA device objects that need no GPU; a CUDA device this
// process does not see refused before any collective; and every hook on a real 2-rank Gloo
// world (threads as ranks, the trainer's own ProcessGroupGloo groups) through those
// collectives, their results read back right.
#include <cmath>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/optim/sgd.h>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"
#include "harness/contract/evidence_layout.h"
#include "harness/session/trainer_session.h"
#include "harness/session/trainer_session_internal.h"
#include "tests/support/temp_dir.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using compat::BackendKind;
using nlohmann::json;
using ::testing::HasSubstr;
using trainer_session_internal::check_parameter_device;
using trainer_session_internal::choose_collective_device;

const c10::Device kCpu(c10::DeviceType::CPU);
c10::Device cuda(int index) { return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)); }

// The mih::Error `fn` throws (code and text), or a failure when it throws none.
template <class Fn>
std::pair<Code, std::string> error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  ADD_FAILURE() << "no mih::Error thrown";
  return {Code::kInternal, ""};
}

TEST(TrainerSessionDeviceTest, TheWorldsBackendChoosesTheDeviceUnlessSet) {
  EXPECT_EQ(choose_collective_device(BackendKind::kGloo, std::nullopt, std::nullopt, 0), kCpu);
  // A Gloo world on a GPU machine still moves CPU tensors unless told otherwise.
  EXPECT_EQ(choose_collective_device(BackendKind::kGloo, std::nullopt, cuda(1), 2), kCpu);
  // NCCL: the current CUDA device (torch.distributed's choice for an NCCL group's objects).
  EXPECT_EQ(choose_collective_device(BackendKind::kNccl, std::nullopt, cuda(1), 2), cuda(1));
  EXPECT_EQ(choose_collective_device(BackendKind::kNccl, cuda(0), cuda(1), 2), cuda(0));
  EXPECT_EQ(choose_collective_device(BackendKind::kNccl, c10::Device(c10::DeviceType::CUDA), cuda(1), 2), cuda(1));
  EXPECT_EQ(choose_collective_device(BackendKind::kGloo, cuda(1), cuda(0), 2), cuda(1));
  EXPECT_EQ(choose_collective_device(BackendKind::kGloo, kCpu, cuda(0), 2), kCpu);
}

TEST(TrainerSessionDeviceTest, ADeviceTheWorldCannotMoveIsRefusedNamingTheFix) {
  auto refused = [](BackendKind world, std::optional<c10::Device> requested, std::optional<c10::Device> current,
                    int devices) {
    return error_of([&] { (void)choose_collective_device(world, requested, current, devices); });
  };
  auto [code, what] = refused(BackendKind::kNccl, kCpu, cuda(0), 1);
  EXPECT_EQ(code, Code::kInvalidSpec);
  EXPECT_THAT(what, HasSubstr("collective_device 'cpu' on an nccl world: NCCL moves CUDA tensors only"));
  std::tie(code, what) = refused(BackendKind::kNccl, std::nullopt, std::nullopt, 0);
  EXPECT_EQ(code, Code::kInvalidSpec);
  EXPECT_THAT(what, HasSubstr("no current CUDA device"));
  std::tie(code, what) = refused(BackendKind::kGloo, cuda(2), cuda(0), 2);
  EXPECT_EQ(code, Code::kInvalidSpec);
  EXPECT_THAT(what, HasSubstr("collective_device 'cuda:2', but this process sees 2 CUDA device(s)"));
  std::tie(code, what) = refused(BackendKind::kGloo, c10::Device(c10::DeviceType::CUDA), std::nullopt, 0);
  EXPECT_THAT(what, HasSubstr("this process has no CUDA device"));
  std::tie(code, what) = refused(BackendKind::kGloo, c10::Device(c10::DeviceType::Meta), std::nullopt, 0);
  EXPECT_EQ(code, Code::kInvalidSpec);
  EXPECT_THAT(what, HasSubstr("collective_device 'meta' is neither the CPU nor a CUDA device"));
}

TEST(TrainerSessionDeviceTest, AParameterOnAnotherGpuThanTheCurrentOneIsNamed) {
  auto [code, what] = error_of([] { check_parameter_device(cuda(0), false, cuda(1), "layers.0.up.weight"); });
  EXPECT_EQ(code, Code::kInvalidSpec);
  EXPECT_THAT(what, HasSubstr("parameter 'layers.0.up.weight' lives on cuda:1 but the session's collectives run on "
                              "the current CUDA device, cuda:0: call c10::cuda::set_device(1)"));
  // Set explicitly, on its device, on the CPU, or a Gloo world's CPU collectives: no refusal.
  EXPECT_NO_THROW(check_parameter_device(cuda(0), true, cuda(1), "w"));
  EXPECT_NO_THROW(check_parameter_device(cuda(1), false, cuda(1), "w"));
  EXPECT_NO_THROW(check_parameter_device(cuda(0), false, kCpu, "w"));
  EXPECT_NO_THROW(check_parameter_device(kCpu, false, cuda(1), "w"));
}

// ---- a real 2-rank Gloo world ----

constexpr int kWorld = 2;

c10::intrusive_ptr<compat::C10dBackend> gloo(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                             int rank) {
  static const auto device = c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(20));
  options->devices.push_back(device);
  return c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>(prefix, store), rank,
                                                     kWorld, options);
}

TrainerSessionOptions case_options(const fs::path& root) {
  TrainerSessionOptions o;
  o.case_dir = root / "tiny" / "DpReplicate2";
  o.case_name = "DpReplicate2";
  o.compare_to = "Reference";
  o.steps = 1;
  return o;
}

TEST(TrainerSessionTest, ACudaDeviceThisProcessDoesNotSeeIsRefusedBeforeAnyCollective) {
  const fs::path root = testing::temp_dir("trainer_session_unseen_cuda");
  auto store = c10::make_intrusive<c10d::HashStore>();
  // One past the devices this process sees, on any machine: refused on every rank at once,
  // before the start handshake (no rank waits for another) and before rank 0 writes anything.
  const int seen = compat::cuda_device_count();
  const std::vector<std::string> errors = testing::run_ranks(kWorld, [&](int rank) {
    TrainerSessionOptions o = case_options(root);
    o.collective_device = cuda(seen);
    TrainerSession session(o, gloo(store, "world", rank));
  });
  ASSERT_EQ(errors.size(), 2u);
  for (const std::string& e : errors) {
    EXPECT_THAT(e, HasSubstr("collective_device 'cuda:" + std::to_string(seen) + "', but this process sees " +
                             std::to_string(seen) + " CUDA device(s)"));
  }
  EXPECT_FALSE(fs::exists(case_options(root).case_dir));
}

struct RankView {
  c10::Device device = kCpu;
  double grad_norm = 0;
  at::Tensor weight_before, weight_after;
};

// One DDP step of y = x w + b over dp_replicate: rank r trains global rows 2r, 2r+1.
RankView train_one_step(int rank, const c10::intrusive_ptr<c10d::Store>& store, const fs::path& root) {
  RankView view;
  TrainerSession session(case_options(root), gloo(store, "world", rank));
  view.device = session.collective_device();
  Communicator dp = session.axis("dp_replicate", gloo(store, "dp", rank), {0, 1});
  at::Tensor w = at::arange(12, at::kDouble).reshape({4, 3}).div(7).requires_grad_();
  at::Tensor b = at::full({3}, 0.5, at::kDouble).requires_grad_();
  view.weight_before = w.detach().clone();
  auto entry = [](const std::string& fqn, const at::Tensor& t) {
    return ParameterEntry{fqn, t, {}, {AxisPlacement::replicate("dp_replicate")}, {"dp_replicate"}, ""};
  };
  session.describe_parameters({entry("proj.weight", w), entry("proj.bias", b)});
  torch::optim::SGD sgd({w, b}, torch::optim::SGDOptions(0.1));
  session.attach_optimizer(sgd);
  session.begin_step(0);
  const at::Tensor x = at::arange(16, at::kDouble).reshape({4, 4}).sin().narrow(0, 2 * rank, 2);
  const at::Tensor ids = at::arange(8, at::kLong).reshape({2, 4}).add(8 * rank);
  session.record_batch(0, 0, 2 * rank, {{"input_ids", ids}, {"labels", ids}});
  const at::Tensor y = session.mark_output("proj", x.matmul(w) + b);
  at::Tensor loss = y.pow(2).sum().div(4);  // over the 4 global rows: the gradients are summed
  loss.backward();
  for (const at::Tensor& p : {w, b}) {
    at::Tensor g = p.grad();
    dp.all_reduce(g);
  }
  session.after_backward_before_clip(0);
  view.grad_norm = std::sqrt(w.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>());
  session.after_clip(0, view.grad_norm);
  sgd.step();
  session.after_optimizer(0);
  at::Tensor total = loss.detach().clone();
  dp.all_reduce(total);
  session.end_step(0, total.item<double>());
  session.capture_checkpoint_payload("load", 1);
  session.finish();
  view.weight_after = w.detach().clone();
  return view;
}

std::vector<json> jsonl(const fs::path& file) {
  std::vector<json> rows;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  return rows;
}

TEST(TrainerSessionTest, EveryHookRunsOnATwoRankGlooWorldThroughCollectivesOnItsDevice) {
  const fs::path root = testing::temp_dir("trainer_session_gloo");
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<RankView> views(kWorld);
  const std::vector<std::string> errors =
      testing::run_ranks(kWorld, [&](int rank) { views[static_cast<size_t>(rank)] = train_one_step(rank, store, root); });
  ASSERT_TRUE(errors.empty()) << errors.front();
  for (const RankView& v : views) EXPECT_EQ(v.device, kCpu) << "a Gloo world's collectives run on the CPU";
  const fs::path dir = case_options(root).case_dir;
  // The start handshake and the table's gather passed; rank 0 wrote the case.
  EXPECT_EQ(read_json_file(dir / layout::kEnvironment).at("case").at("device"), "cpu");
  // The probes' sums (kSum) and extrema (kMax) over the world: the initial weight, counted once.
  const json before = jsonl(dir / layout::kProbes).front();
  ASSERT_EQ(before.at("stage"), "model_before");
  const json weight = before.at("tensors").at("proj.weight");
  EXPECT_NEAR(weight.at("sum").get<double>(), views[0].weight_before.sum().item<double>(), 1e-12);
  EXPECT_EQ(weight.at("numel"), 12);
  EXPECT_EQ(weight.at("defined_ranks"), 2);
  EXPECT_DOUBLE_EQ(weight.at("max").get<double>(), 11.0 / 7);
  EXPECT_DOUBLE_EQ(weight.at("min").get<double>(), 0.0);
  EXPECT_EQ(weight.at("values").get<std::vector<double>>().size(), 12u);
  // The grad norm's all-reduce, the identity's gather of both ranks' rows.
  const json metrics = jsonl(dir / layout::kMetrics).at(0);
  EXPECT_NEAR(metrics.at("grad_norm_post_clip").get<double>(), views[0].grad_norm, 1e-12);
  EXPECT_EQ(metrics.at("valid_tokens"), 16);
  EXPECT_EQ(jsonl(dir / layout::kInputIdentity).at(0).at("rows"), 4);
  // The digests' gather: both ranks' copies of the synchronized gradient agree.
  const json grads = read_json_file(dir / layout::gradient_replicas_step(0)).at("parameters").at("proj.weight");
  ASSERT_EQ(grads.at("digests").size(), 2u);
  EXPECT_EQ(grads.at("digests")[0], grads.at("digests")[1]);
  EXPECT_EQ(grads.at("replicas"), 2);
  // The checkpoint's full tensor, all-reduced from the counted copy: the stepped weight.
  const json saved = read_json_file(dir / layout::kRoundtripLoad).at("tensors").at("proj.weight");
  EXPECT_EQ(saved.at("sha256"), trainer_session_internal::tensor_sha256(views[0].weight_after));
  EXPECT_EQ(saved.at("shape"), json({4, 3}));
}

}  // namespace
}  // namespace mih
