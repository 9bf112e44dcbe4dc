// The validation spec of the outside port (tiny_model.h): what a model team writes to run
// mih's conformance suites on its model. Registered by name ("tiny_port"); its suites run over
// tiny_matrix.json (the reference, dp_shard=2, tp=2; float64, 3 steps).
#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "harness/spec/model_spec.h"
#include "suites/conformance.h"
#include "tiny_model.h"

namespace my_port {
namespace {

// Global batches of 8 x 16 tokens from a generator seeded by the step: labels are the next
// token, a row-dependent number of leading positions ignored (-100), so data-parallel ranks
// hold different numbers of valid targets. The same for step k whatever the parallel config.
mih::BatchSource synthetic_batches(int64_t vocab) {
  constexpr int64_t kRows = 8, kSeq = 16;
  return [vocab](int64_t step) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1234 + static_cast<uint64_t>(step));
    at::Tensor tokens = at::randint(vocab, {kRows, kSeq + 1}, gen, at::kLong);
    mih::Batch b;
    b.input_ids = tokens.narrow(1, 0, kSeq).contiguous();
    b.labels = tokens.narrow(1, 1, kSeq).contiguous();
    for (int64_t r = 0; r < kRows; ++r) {
      const int64_t masked = (r * 3 + step) % (kSeq / 2);
      if (masked > 0) b.labels[r].narrow(0, 0, masked).fill_(-100);
    }
    return b;
  };
}

// The head has a weight of its own (the port does not tie it to the embedding).
mih::spec::StateInvariant head_not_tied() {
  return {"head_not_tied_to_embedding", mih::spec::Phase::kStructure,
          [](const mih::TrainingState& t) -> mih::spec::CheckResult {
            bool tied = false;
            for (const auto& p : t.context->parameters()) {
              tied = tied || std::find(p->aliases.begin(), p->aliases.end(), "head.weight") != p->aliases.end();
            }
            return {!tied, {{"head", "head.weight"}, {"tied", tied}}};
          }};
}

mih::spec::ModelSpec tiny_port_spec() {
  const TinyMlpOptions o;
  mih::spec::ModelSpec s;
  s.name = "tiny_port";
  s.description = "one-block MLP language model of the outside port (tests/external_project)";
  s.factory = tiny_mlp_factory(o);
  s.tp_divides = {o.ffn};
  s.seq_len = 16;
  s.data.pipeline = "synthetic tokens from a generator seeded by the step, labels shifted in the pipeline";
  s.data.make_batches = [vocab = o.vocab] { return synthetic_batches(vocab); };
  s.data.labels_are_shifted = true;
  // The external checkpoint keeps its MLP in GPT-2's Conv1D layout ([in, out], the transpose
  // of a Linear's weight) under GPT-2's names; every other parameter under "model.<fqn>".
  s.checkpoint.key_map = {{R"(up\.weight)", {"transformer.h.0.mlp.c_fc.weight"}, 0, /*transpose=*/true},
                          {R"(up\.bias)", {"transformer.h.0.mlp.c_fc.bias"}},
                          {R"(down\.weight)", {"transformer.h.0.mlp.c_proj.weight"}, 0, /*transpose=*/true},
                          {R"(down\.bias)", {"transformer.h.0.mlp.c_proj.bias"}},
                          {R"((.+))", {"model.$1"}}};
  // What `my_port_conformance export` writes as config.json and `inspect` compares.
  s.checkpoint.hf = {"tiny_mlp", {"TinyMlpForCausalLM"},
                     {{"vocab_size", o.vocab}, {"hidden_size", o.hidden}, {"intermediate_size", o.ffn}}};
  s.invariants = {head_not_tied()};
  return s;
}

MIH_REGISTER_SPEC(tiny_port_spec);

}  // namespace
}  // namespace my_port

// Every conformance suite for this spec over tiny_matrix.json (`--matrix` overrides it; the
// ctest tests pass the PRESET of CMakeLists.txt).
MIH_CONFORMANCE_SUITES(TinyPort, "tiny_port", TINY_PORT_MATRIX);
