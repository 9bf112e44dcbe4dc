// The module parity engine (harness/spec/module_parity.h) on the shipped cases' real modules,
// and every check it makes failing once: a trainable parameter the adapter leaves unmapped
// fails naming it; a reference whose backward alone is wrong (a detached weight, a doubled
// gradient, a dropped aux loss gradient) fails on that gradient while the output passes; a
// forward bug fails on the output; the evidence lists each observation's error and tolerance.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/spec/model_spec.h"
#include "harness/spec/module_parity.h"

namespace mih {
namespace {

using spec::ModuleParityCase;
using spec::ModuleParityResult;
using spec::ParityObservation;
using spec::ParityOutput;
using spec::ReferenceWeights;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

ModuleParityCase shipped_case(const std::string& spec_name, const std::string& case_name) {
  for (const auto& c : spec::SpecRegistry::instance().get(spec_name).parity_cases) {
    if (c.name == case_name) return c;
  }
  ADD_FAILURE() << "spec '" << spec_name << "' has no parity case '" << case_name << "'";
  return {};
}

std::vector<std::string> names_of(const ModuleParityResult& r) {
  std::vector<std::string> out;
  for (const auto& o : r.observations) out.push_back(o.name);
  return out;
}

// The observations that failed, by name.
std::vector<std::string> failed(const ModuleParityResult& r) {
  std::vector<std::string> out;
  for (const auto& o : r.observations) {
    if (!o.passed) out.push_back(o.name);
  }
  return out;
}

// The case with its reference wrapped by `plant` (a bug in the independent implementation).
ModuleParityCase with_reference(
    ModuleParityCase c, std::function<ParityOutput(const ReferenceWeights&, const std::vector<at::Tensor>&,
                                                   const decltype(ModuleParityCase::reference)&)> plant) {
  c.reference = [plant, inner = c.reference](const ReferenceWeights& w, const std::vector<at::Tensor>& in) {
    return plant(w, in, inner);
  };
  return c;
}

TEST(ModuleParityTest, ShippedCasesCompareOutputInputAndParameterGradients) {
  auto run = [](const std::string& spec_name, const std::string& case_name) {
    const ModuleParityResult r = spec::run_module_parity(shipped_case(spec_name, case_name));
    EXPECT_TRUE(r.passed()) << r.failure();
    return names_of(r);
  };
  EXPECT_THAT(run("llama", "fused_swiglu_vs_unfused"),
              ElementsAre("output", "input_grad[0]", "grad:gate_up_proj.weight", "grad:down_proj.weight"));
  EXPECT_THAT(run("llama", "cp_attention_vs_plain_attention"),
              ElementsAre("output", "input_grad[0]", "input_grad[1]", "input_grad[2]"));
  EXPECT_THAT(run("moe", "moe_mlp_vs_per_token_loop"),
              ElementsAre("output", "aux_loss", "input_grad[0]", "grad:router", "grad:experts.gate_up_proj",
                          "grad:experts.down_proj"));
  EXPECT_THAT(run("vlm", "patch_embedding_vs_conv2d"),
              ElementsAre("output", "input_grad[0]", "grad:class_embedding", "grad:patch_embedding.weight",
                          "grad:position_embedding.weight"));
}

TEST(ModuleParityTest, AnUnmappedParameterFailsNamingIt) {
  ModuleParityCase c = shipped_case("llama", "fused_swiglu_vs_unfused");
  c.weights.pop_back();  // {"down_proj.weight", "down"}
  const ModuleParityResult r = spec::run_module_parity(c);
  EXPECT_FALSE(r.passed());
  EXPECT_THAT(r.trainable, ElementsAre("gate_up_proj.weight", "down_proj.weight"));
  EXPECT_THAT(r.unmapped, ElementsAre("down_proj.weight"));
  EXPECT_THAT(r.observations, IsEmpty());  // nothing runs on a partial adapter
  EXPECT_THAT(r.failure(), HasSubstr("module parity case 'fused_swiglu_vs_unfused': the weight adapter maps no "
                                     "reference weight from the candidate's trainable parameter 'down_proj.weight'"));
  const nlohmann::json j = r.to_json();
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_EQ(j["unmapped"], nlohmann::json::array({"down_proj.weight"}));
  EXPECT_THAT(j["failure"].get<std::string>(), HasSubstr("'down_proj.weight'"));
}

TEST(ModuleParityTest, AnAdapterOrReferenceNamingAWeightThatIsNotThereIsAnError) {
  ModuleParityCase c = shipped_case("llama", "fused_swiglu_vs_unfused");
  c.weights.emplace_back("gate_proj.weight", "gate_only");
  ModuleParityResult r = spec::run_module_parity(c);
  EXPECT_FALSE(r.passed());
  EXPECT_THAT(r.error, HasSubstr("weight adapter entry 'gate_proj.weight' -> 'gate_only': the candidate has no "
                                 "parameter or buffer 'gate_proj.weight'; it has 'gate_up_proj.weight', 'down_proj.weight'"));
  c = with_reference(shipped_case("llama", "fused_swiglu_vs_unfused"),
                     [](const ReferenceWeights& w, const std::vector<at::Tensor>& in, const auto&) -> ParityOutput {
                       return at::linear(in[0], w.at("gate_proj"));
                     });
  r = spec::run_module_parity(c);
  EXPECT_THAT(r.error, HasSubstr("reference weight 'gate_proj': the weight adapter produces no such name; it produces "
                                 "'down', 'gate', 'up'"));
  EXPECT_THAT(r.failure(), HasSubstr("module parity case 'fused_swiglu_vs_unfused' raised:"));
}

TEST(ModuleParityTest, AMalformedCaseIsRejectedNamingTheField) {
  ModuleParityCase c = shipped_case("llama", "fused_swiglu_vs_unfused");
  c.reference = nullptr;
  EXPECT_THAT([&] { c.validate(); }, ::testing::ThrowsMessage<Error>(HasSubstr("'fused_swiglu_vs_unfused': reference is empty")));
  c = shipped_case("llama", "fused_swiglu_vs_unfused");
  c.weights.emplace_back("down_proj.weight", "gate");
  EXPECT_THAT([&] { c.validate(); },
              ::testing::ThrowsMessage<Error>(HasSubstr("the weight adapter produces reference weight 'gate' twice")));
  spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  s.parity_cases.front().input_shapes.clear();
  EXPECT_THAT([&] { s.validate(); }, ::testing::ThrowsMessage<Error>(HasSubstr("input_shapes is empty")));
}

TEST(ModuleParityTest, ADetachedReferenceWeightFailsOnItsGradientAlone) {
  const ModuleParityCase c = with_reference(
      shipped_case("llama", "fused_swiglu_vs_unfused"),
      [](const ReferenceWeights& w, const std::vector<at::Tensor>& in, const auto&) -> ParityOutput {
        const at::Tensor gate = at::linear(in[0], w.at("gate")), up = at::linear(in[0], w.at("up"));
        return at::linear(gate * at::sigmoid(gate) * up, w.at("down").detach());  // the planted bug
      });
  const ModuleParityResult r = spec::run_module_parity(c);
  EXPECT_THAT(failed(r), ElementsAre("grad:down_proj.weight"));
  EXPECT_EQ(r.observations.front().name, "output");
  EXPECT_TRUE(r.observations.front().passed);
  EXPECT_THAT(r.failure(), HasSubstr("observation 'grad:down_proj.weight' relative error 1 > tolerance 1e-12"));
  EXPECT_THAT(r.failure(), HasSubstr("the reference's gradient is undefined"));
}

TEST(ModuleParityTest, AWrongGradientWithTheRightValueFailsOnTheInputAndParameterItReaches) {
  // gate' = gate in value, 2 * gate in gradient: the forward is right, the backward is not.
  const ModuleParityCase c = with_reference(
      shipped_case("llama", "fused_swiglu_vs_unfused"),
      [](const ReferenceWeights& w, const std::vector<at::Tensor>& in, const auto&) -> ParityOutput {
        at::Tensor gate = at::linear(in[0], w.at("gate"));
        gate = gate.detach() + 2 * (gate - gate.detach());
        const at::Tensor up = at::linear(in[0], w.at("up"));
        return at::linear(gate * at::sigmoid(gate) * up, w.at("down"));
      });
  const ModuleParityResult r = spec::run_module_parity(c);
  EXPECT_THAT(failed(r), ElementsAre("input_grad[0]", "grad:gate_up_proj.weight"));
  EXPECT_THAT(r.failure(), HasSubstr("observation 'input_grad[0]'"));
}

TEST(ModuleParityTest, AnInputTheReferenceDetachesFailsOnThatInputsGradient) {
  // The function case (no parameters): k detached in the reference.
  const ModuleParityCase c = with_reference(
      shipped_case("llama", "cp_attention_vs_plain_attention"),
      [](const ReferenceWeights& w, const std::vector<at::Tensor>& in, const auto& inner) {
        return inner(w, {in[0], in[1].detach(), in[2]});
      });
  const ModuleParityResult r = spec::run_module_parity(c);
  EXPECT_THAT(failed(r), ElementsAre("input_grad[1]"));
}

TEST(ModuleParityTest, AReferenceWithoutTheAuxLossGradientFailsOnTheRouterAndTheInput) {
  // The load-balancing loss reaches the gradients through the router probabilities only:
  // dropping it from the reference's backward (its value still compared) leaves the output,
  // the aux loss value and the experts' gradients right.
  const ModuleParityCase c = with_reference(
      shipped_case("moe", "moe_mlp_vs_per_token_loop"),
      [](const ReferenceWeights& w, const std::vector<at::Tensor>& in, const auto& inner) {
        const ParityOutput out = inner(w, in);
        return ParityOutput(out.output, out.aux_loss.detach());
      });
  const ModuleParityResult r = spec::run_module_parity(c);
  EXPECT_THAT(failed(r), ElementsAre("input_grad[0]", "grad:router"));
}

TEST(ModuleParityTest, AForwardBugFailsOnTheOutput) {
  const ModuleParityCase c = with_reference(
      shipped_case("vlm", "patch_embedding_vs_conv2d"),
      [](const ReferenceWeights& w, const std::vector<at::Tensor>& in, const auto& inner) {
        return ParityOutput(inner(w, in).output * (1 + 1e-9));
      });
  const ModuleParityResult r = spec::run_module_parity(c);
  ASSERT_FALSE(r.observations.empty());
  EXPECT_EQ(r.observations.front().name, "output");
  EXPECT_FALSE(r.observations.front().passed);
  EXPECT_THAT(r.failure(), HasSubstr("observation 'output'"));
}

TEST(ModuleParityTest, EvidenceListsEachObservationsErrorAndTolerance) {
  ModuleParityCase c = shipped_case("llama", "fused_swiglu_vs_unfused");
  c.grad_tolerance = 1e-9;
  const at::NoGradGuard no_grad;  // a caller in a no-grad region still gets the gradients compared
  const nlohmann::json j = spec::run_module_parity(c).to_json();
  EXPECT_TRUE(j["passed"].get<bool>());
  EXPECT_FALSE(j.contains("failure"));
  ASSERT_EQ(j["observations"].size(), 4u);
  for (const auto& o : j["observations"]) {
    for (const char* key : {"name", "shape", "max_abs_error", "relative_error", "tolerance", "passed"}) {
      EXPECT_TRUE(o.contains(key)) << key << " missing in " << o.dump();
    }
    EXPECT_LE(o["relative_error"].get<double>(), o["tolerance"].get<double>()) << o.dump();
    EXPECT_EQ(o["tolerance"].get<double>(), o["name"] == "output" ? 1e-12 : 1e-9) << o.dump();
  }
  EXPECT_EQ(j["observations"][2]["name"], "grad:gate_up_proj.weight");
  EXPECT_EQ(j["observations"][2]["shape"], nlohmann::json::array({48, 16}));
  // The declaration in the spec's evidence: the adapter's entries and both tolerances.
  const nlohmann::json d = c.to_json();
  EXPECT_EQ(d["weights"][0], nlohmann::json({{"candidate", "gate_up_proj.weight"}, {"reference", "gate"}, {"transform", true}}));
  EXPECT_EQ(d["grad_tolerance"].get<double>(), 1e-9);
}

}  // namespace
}  // namespace mih
