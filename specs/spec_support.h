// What the reference specs share: the parts of a spec every reference model has, and the
// module parity case and invariants the llama spec lends the moe and vlm specs.
#pragma once

#include <ATen/ATen.h>

#include "harness/spec/model_spec.h"
#include "reference_models/llama.h"
#include "reference_models/registry.h"

namespace mih::specs {

/// A reference model's spec with the parts every language model declares: its factory, the
/// text data contract, the checkpoint map, and the rotary table as shared state.
inline spec::ModelSpec language_model_spec(const std::string& name, const models::LlamaOptions& o) {
  const models::ReferenceModel m = models::reference_model(name);
  spec::ModelSpec s;
  s.name = name;
  s.description = m.description;
  s.tp_divides = {o.num_kv_heads(), o.intermediate_size()};
  s.factory = m.factory;
  s.seq_len = 64;
  s.data.pipeline = "byte-level text over /usr/share/common-licenses, packed, labels shifted in the pipeline";
  s.data.make_batches = [batches = m.batches] {
    return batches(data::TextPipelineOptions().seq_len(64).global_batch(8));
  };
  s.data.labels_are_shifted = true;
  s.data.fields = {{"loss_mask", /*forward=*/false, /*loss=*/true, spec::CpSharding::kSequence},
                   {"attention_mask", false, false, spec::CpSharding::kSequence}};
  s.checkpoint.key_map = m.key_map.rules();
  // Older Hugging Face exports carry the rotary table; it is rebuilt here, never loaded.
  s.checkpoint.inference_only = {"*rotary_emb.inv_freq"};
  s.shared_state = {{"rotary.cos", "*rotary_emb", {"*layers.*"}}, {"rotary.sin", "*rotary_emb", {"*layers.*"}}};
  return s;
}

/// From llama_spec.cpp: the key listing of reference model `name` in Hugging Face layout
/// (specs/sources/<name>/, see its README), or "" when this build's source tree is not there
/// (a relocated install): then the SourceCheckpoint suite is not instantiated.
std::string reference_source_checkpoint(const std::string& name);

/// From llama_spec.cpp: rotary inv_freq against its formula (a non-persistent buffer) after the
/// build and after a checkpoint load, and CP attention against an independent per-head loop
/// (output and the q, k, v gradients).
std::vector<spec::StateInvariant> llama_inv_freq_invariants(const std::string& fqn, double theta);
spec::ModuleParityCase llama_attention_case();

}  // namespace mih::specs
