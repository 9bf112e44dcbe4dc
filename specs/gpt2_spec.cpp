// The validation spec of the gpt2 reference port (reference_models/gpt2.h), declared as
// GPT2LMHeadModel: the fault catalog's port with a GELU (F32, the exact GELU where GPT-2 has
// the tanh approximation), caught only by its golden of the original (MatchesOriginal).
#include "reference_models/gpt2.h"
#include "specs/spec_support.h"
#include "suites/conformance.h"

namespace mih::specs {
namespace {

// GPT2Config's fields, every one that changes the original's numbers declared (inspect warns
// for one left out): the tanh GELU, no dropout, an untied head, no inner-layer scaling.
spec::HfConfig hf_gpt2_config(const models::Gpt2Options& o) {
  return {"gpt2",
          {"GPT2LMHeadModel"},
          {{"vocab_size", o.vocab_size()},
           {"n_positions", o.n_positions()},
           {"n_embd", o.n_embd()},
           {"n_layer", o.n_layer()},
           {"n_head", o.n_head()},
           {"n_inner", o.n_inner()},
           {"activation_function", "gelu_new"},
           {"layer_norm_epsilon", o.layer_norm_epsilon()},
           {"initializer_range", o.initializer_range()},
           {"resid_pdrop", 0.0},
           {"embd_pdrop", 0.0},
           {"attn_pdrop", 0.0},
           {"scale_attn_weights", true},
           {"scale_attn_by_inverse_layer_idx", false},
           {"reorder_and_upcast_attn", false},
           {"tie_word_embeddings", false}}};
}

spec::ModelSpec gpt2_spec() {
  const models::Gpt2Options o;
  spec::ModelSpec s = language_model_spec("gpt2", models::LlamaOptions());
  s.tp_divides = {o.n_head(), o.n_inner()};
  s.num_key_value_heads = o.n_head();  // multi-head attention: a key/value head per query head
  s.checkpoint.hf = hf_gpt2_config(o);
  // A real GPT-2 checkpoint's causal-mask buffers, which the port does not load.
  s.checkpoint.inference_only = {"transformer.h.*.attn.bias", "transformer.h.*.attn.masked_bias"};
  s.shared_state = {};  // no rotary table
  // GPT-2 names its norms ln_*: no weight decay on them or on the biases.
  s.trainer.no_weight_decay({"*bias", "*ln_*"});
  s.golden.dir = reference_golden("gpt2");
  s.golden.layers = {{"h.0", 1}, {"h.1", 2}, {"ln_f", 3}};
  s.golden.logits = "lm_head";
  return s;
}

MIH_REGISTER_SPEC(gpt2_spec);

}  // namespace
}  // namespace mih::specs

// On the variants' lane (dp_shard, tp, tp with sequence parallelism).
MIH_CONFORMANCE_SUITES(Gpt2, "gpt2", "cpu-smoke-variants");
