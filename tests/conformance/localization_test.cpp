// localize() says what the activation probes could not see: a port that observes no module
// output gets the loss blamed with the reason it can go no further (never "every module's
// forward output matches", which would be vacuous), and one that observes only some modules
// gets the unobserved ones named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/compare/compare.h"

namespace mih {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Divergence diverged(const std::string& kind, const std::string& name, const std::string& stage) {
  Divergence d;
  d.kind = kind;
  d.name = name;
  d.stage = stage;
  d.relative_error = 0.1;
  d.tolerance = 1e-10;
  return d;
}

TEST(LocalizationTest, NoObservedModuleMeansTheBlameStopsAtTheLossAndSaysSo) {
  Comparison c;
  c.divergences = {diverged("metric", "loss", "metrics")};
  c.parameter_modules = 5;
  c.unobserved_modules = {"embed_tokens", "layers.0", "layers.1", "lm_head", "norm"};
  const Localization where = localize(c);
  EXPECT_EQ(where.blamed, "loss");
  EXPECT_THAT(where.reason, HasSubstr("no module outputs were observed (the port never calls "
                                      "ParallelContext::observe): the blame cannot go below 'loss'"));
  EXPECT_THAT(where.reason, HasSubstr("add ctx.observe(module, output, layout)"));
  EXPECT_THAT(where.reason, Not(HasSubstr("forward output matches")));
  // A gradient that diverges while the loss matches: no claim about activations either.
  c.divergences = {diverged("tensor", "layers.0.mlp.down_proj.weight", "grad_before_clip")};
  const Localization grad = localize(c);
  EXPECT_EQ(grad.blamed, "layers.0.mlp.down_proj");
  EXPECT_THAT(grad.reason, HasSubstr("no module outputs were observed"));
  EXPECT_THAT(grad.reason, Not(HasSubstr("the activations and their gradients match")));
}

TEST(LocalizationTest, ModulesNoProbeSeesAreNamedWhereTheBlameReliesOnTheProbes) {
  Comparison c;
  c.divergences = {diverged("metric", "loss", "metrics")};
  c.activation_order = {"layers.0", "layers.1"};
  c.parameter_modules = 5;
  c.unobserved_modules = {"embed_tokens", "lm_head", "norm"};
  const Localization loss = localize(c);
  EXPECT_EQ(loss.blamed, "loss");
  EXPECT_THAT(loss.reason, HasSubstr("every observed module's forward output matches at step 0"));
  EXPECT_THAT(loss.reason, HasSubstr("only some modules were observed: 3 of the 5 modules with parameters are under no "
                                     "observed module ('embed_tokens', 'lm_head', 'norm')"));
  c.divergences = {diverged("activation", "layers.1", "forward_output")};
  const Localization forward = localize(c);
  EXPECT_EQ(forward.blamed, "layers.1");
  EXPECT_THAT(forward.reason, HasSubstr("every observed module before it matches"));
  EXPECT_THAT(forward.reason, HasSubstr("only some modules were observed"));
  // Everything observed: the statements as they were.
  c.unobserved_modules.clear();
  EXPECT_THAT(localize(c).reason, HasSubstr("every module before it matches"));
  c.divergences = {diverged("metric", "loss", "metrics")};
  EXPECT_EQ(localize(c).reason, "every module's forward output matches at step 0 and the loss differs");
}

}  // namespace
}  // namespace mih
