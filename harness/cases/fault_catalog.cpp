// The fault catalog's rows (see faults.h): each fault, the case where it manifests, the tests
// that must catch it and the patterns their message must match.
#include "harness/cases/faults.h"

#include <nlohmann/json.hpp>

namespace mih::cases {
using nlohmann::json;

const std::vector<FaultEntry>& fault_catalog() {
  const json dp_shard2 = {{"dp_shard", 2}}, tp2 = {{"tp", 2}}, tp2_sp = {{"tp", 2}, {"sequence_parallel", true}};
  const json cp2zz = {{"cp", 2}, {"cp_layout", "zigzag"}}, cp2 = {{"cp", 2}};
  const json resume = {{"kind", "resume"}, {"config", dp_shard2}, {"resume_at", 2}};
  const json cross = {{"kind", "cross_resume"}, {"save", dp_shard2}, {"load", tp2}, {"resume_at", 2}};
  const json ep2 = {{"dp_shard", 2}, {"ep", 2}};
  const json dp_replicate2 = {{"dp_replicate", 2}}, reference = "Reference";
  const json pp2_mb4 = {{"pp", 2}, {"micro_batches", 4}}, pp2_mb2 = {{"pp", 2}, {"micro_batches", 2}};
  const json dp_shard2_mb2 = {{"dp_shard", 2}, {"micro_batches", 2}};
  const json tp4 = {{"tp", 4}}, pp2 = {{"pp", 2}};
  const json sgd_cosine = {{"optimizer", "sgd"}, {"warmup_steps", 2}, {"decay_steps", 3}, {"max_grad_norm", 0}};
  const json resume_sgd = {{"kind", "resume"}, {"config", dp_shard2}, {"resume_at", 2}, {"trainer", sgd_cosine}};
  const json dp_shard2_sgd = {{"dp_shard", 2}, {"trainer", sgd_cosine}};
  const json resume_epoch1 = {{"kind", "resume"}, {"config", dp_replicate2}, {"resume_at", 2}};
  // Cause patterns name the parameter, field, key or invariant at fault. A quoted FQN
  // ('norm.weight') is that parameter exactly, not layers.0.input_layernorm.weight. The last
  // field is the place the harness should blame first (verdicts::blame).
  static const std::vector<FaultEntry> catalog = {
      {"F01", "replicated-param grad",
       "under sequence parallelism the final norm's weight gradient is a partial sum per TP rank and is never all-reduced",
       "reference_models/llama.cpp", "Llama", "llama", tp2_sp, {"NumericParity", "ReplicaConsistency"},
       {R"((^|[^._\w])'?norm\.weight)"}, "", "norm",
       {tp2}, "sp"},
      {"F02", "replicated-param grad",
       "MoE router weight is replicated over TP but its input gradient is partial and never reduced",
       "reference_models/llama.cpp", "Moe", "moe", tp2_sp, {"NumericParity"}, {R"(mlp\.router)"}, "", "layers.1.mlp",
       {tp2}, "sp"},
      {"F03", "grad-norm scope", "global grad norm computed from local shards only",
       "harness/parallel/parallel_context_grads.cpp", "Llama", "llama", dp_shard2, {"NumericParity.GradNormsMatchReference"},
       {"grad_norm"}, "", "grad_norm",
       {dp_replicate2}, "world_size>1"},
      {"F04", "grad-norm scope", "replicated (unsharded) grads counted once per rank in the norm",
       "harness/parallel/parallel_context_grads.cpp", "Llama", "llama", tp2, {"NumericParity.GradNormsMatchReference"},
       {"grad_norm"}, "", "grad_norm",
       {dp_shard2}, "tp>1"},
      {"F05", "loss normalization",
       "loss divided by the rank's own valid-token count, then averaged over DP (uneven valid tokens across ranks)",
       "harness/training/trainer.cpp", "Llama", "llama", dp_shard2, {"NumericParity.LossMatchesReference"}, {"loss"}, "", "loss",
       {tp2}, "dp_shard>1"},
      {"F06", "data contract", "labels shifted by the pipeline and again by the model", "reference_models/llama.cpp",
       "Llama", "llama", dp_shard2, {"DataContract.LossFollowsTheLabels"}, {"labels"}, "", "data",
       {reference}, "every_case"},
      {"F07", "sequence layout", "position ids restart at 0 on every CP rank", "harness/training/trainer.cpp", "Llama",
       "llama", cp2zz, {"InputIdentity.SameGlobalBatchAsReference"}, {"position_ids"}, "", "data",
       {dp_shard2}, "cp>1"},
      {"F08", "TP layout", "row-parallel bias added on every TP rank before the all-reduce", "harness/parallel/layers.cpp",
       "LlamaBias", "llama_bias", tp2, {"NumericParity.LossMatchesReference"}, {"loss"}, "", "layers.0.self_attn",
       {dp_shard2}, "tp>1"},
      {"F09", "TP layout", "fused gate/up projection split contiguously so one rank gets all of gate",
       "reference_models/llama.cpp", "Llama", "llama", tp2, {"NumericParity.LossMatchesReference"}, {"loss"}, "", "layers.0.mlp",
       {dp_shard2}, "tp>1"},
      {"F10", "checkpoint", "one parameter missing from the checkpoint key map", "reference_models/registry.cpp",
       "Llama", "llama", resume, {"CheckpointCoverage.EveryTargetKeyLoadedOrTrainingOnly"},
       {R"((^|[^._\w])norm\.weight)"}, "", "checkpoint",
       {reference}, "every_case"},
      {"F11", "checkpoint", "rotary inv_freq buffer left uninitialized / not rebuilt after load",
       "harness/checkpoint/distributed_checkpoint.cpp", "Llama", "llama", resume, {"StateInvariants.AllHold"},
       {"inv_freq"}, "", "checkpoint",
       {dp_shard2}, "resume"},
      {"F12", "checkpoint", "optimizer state not resharded when loading under another topology",
       "harness/checkpoint/distributed_checkpoint.cpp", "Llama", "llama", cross,
       {"CheckpointRoundTrip.LoadedTensorsBitExact", "Resume.StepsAfterLoadMatchUninterruptedRun"},
       {"exp_avg"}, "", "checkpoint",
       {resume, dp_shard2}, "resume"},
      {"F13", "activation checkpointing",
       "a shared-state producer (routing stats) republishes during recompute", "reference_models/llama.cpp", "Moe", "moe",
       {{"dp_shard", 2}, {"activation_checkpointing", true}},
       {"SharedState.PublishedOncePerForward"},
       {"expert_counts"}, "", "layers.1.mlp",
       {dp_shard2}, "ac"},
      {"F14", "activation checkpointing", "RNG state not restored for recompute, with dropout > 0",
       "harness/parallel/activation_checkpoint.cpp", "LlamaDropout", "llama_dropout",
       {{"activation_checkpointing", true}}, {"ActivationCheckpointEquivalence.MatchesTheRunWithoutCheckpointing"},
       {"grad_before_clip", R"(localized to 'layers\.[0-9]+')"}, "", "layers.1",
       {}, "ac"},
      {"F15", "optimizer layout", "optimizer built over the unsharded parameters (before sharding)",
       "harness/training/trainer.cpp", "Llama", "llama", dp_shard2, {"OptimizerLayout.HoldsTheLiveShards"},
       {"not a live sharded parameter"}, "", "optimizer",
       {reference}, "every_case"},
      {"F16", "tied weights", "embedding and output head tied on one device but untied after sharding",
       "reference_models/llama.cpp", "LlamaTied", "llama_tied", dp_shard2,
       {"StateInvariants.AllHold", "TiedParameters.DeclaredTiesAreOneParameter"}, {"tied", "lm_head"}, "", "lm_head",
       {reference}, "every_case"},
      {"F17", "data parallel", "every DP rank reads the same micro-batch", "harness/training/trainer.cpp", "Llama", "llama",
       dp_shard2, {"InputIdentity.SameGlobalBatchAsReference"}, {"input_ids"}, "", "data",
       {tp2}, "dp_shard>1"},
      {"F18", "multimodal", "pixel_values dropped before the forward call", "reference_models/vlm.cpp", "Vlm", "vlm",
       dp_shard2, {"DataContract.ForwardFieldsReachTheModel"}, {"pixel_values"}, "", "data",
       {reference}, "every_case"},
      {"F19", "multimodal", "vision features detached before the projector, vision tower gets no gradient",
       "reference_models/vlm.cpp", "Vlm", "vlm", dp_shard2, {"ModalityGradients"}, {"vision_tower\\."}, "", "vision_tower",
       {reference}, "every_case"},
      {"F20", "MoE", "load-balancing aux loss summed instead of averaged over DP ranks", "reference_models/llama.cpp",
       "Moe", "moe", dp_shard2, {"NumericParity.WatchedTensorsMatchReferenceAtEveryStage"},
       {R"(mlp\.router|localized to 'layers\.[0-9]+\.mlp')"}, "", "layers.1.mlp",
       {tp2}, "dp_shard>1"},
      {"F21", "sequence layout", "causal mask built in local instead of global coordinates under CP",
       "harness/parallel/context_parallel.cpp", "Llama", "llama", cp2zz, {"NumericParity.LossMatchesReference"},
       {"loss"}, "", "layers.0.self_attn",
       {dp_shard2}, "cp>1"},
      {"F22", "loss normalization (micro-batches)",
       "each micro-batch's loss divided by its own valid-token count, then averaged over the micro-batches",
       "harness/training/trainer.cpp", "Llama", "llama", {{"dp_shard", 2}, {"micro_batches", 2}},
       {"NumericParity.LossMatchesReference"}, {"loss"},
       "huggingface/blog#2414 (transformers' gradient accumulation fix, Oct 2024), meta-pytorch/torchtune#1875, "
       "karpathy/nanochat#59", "loss",
       {dp_shard2}, "micro_batches>1"},
      {"F23", "expert parallelism",
       "expert gradients reduced over the dense gradient domain (dp_shard x cp), so summed over the ep ranks that hold "
       "other experts, instead of over edp",
       "harness/parallel/parallel_context_grads.cpp", "Moe", "moe", ep2, {"NumericParity", "GradientSync"},
       {R"(mlp\.experts)"},
       "pytorch/pytorch#160285 (expert gradients doubled at EP=2), NVIDIA/Megatron-LM#5956 (expert gradients ep_size "
       "times too large after a reduce-scatter over the wrong group)", "layers.1.mlp.experts",
       {dp_shard2}, "ep>1"},
      {"F24", "expert parallelism",
       "the router's gates detached in the expert-parallel combine: the router's gradient loses the path through the "
       "experts' outputs while the loss is unchanged",
       "reference_models/llama.cpp", "Moe", "moe", ep2, {"NumericParity"},
       {R"(mlp\.router|localized to 'layers\.1\.mlp')"},
       "huggingface/transformers#48687, NVIDIA-NeMo/Automodel#2995 (a non-differentiable gather detached the router)",
       "layers.1.mlp",
       {dp_shard2}, "ep>1"},
      {"F25", "expert parallelism",
       "load-balancing statistics from each ep rank's own token counts, never reduced over the ep group",
       "reference_models/llama.cpp", "Moe", "moe", ep2, {"StateInvariants.AllHold", "NumericParity"},
       {"expert_counts", R"(mlp\.router|localized to 'layers\.1\.mlp')"},
       "NVIDIA/Megatron-LM's MoE aux-loss statistics reduced over the tensor-and-context-parallel group "
       "(moe_utils.py, reduce_aux_losses_tracker_across_ranks)", "layers.1.mlp",
       {dp_shard2}, "ep>1"},
      {"F26", "dropout layout (TP)",
       "the same dropout mask on every TP shard of a sharded activation (the attention context split by heads), as when "
       "the model-parallel RNG state is not forked per TP rank",
       "harness/parallel/parallel_context.cpp", "LlamaDropout", "llama_dropout", tp2, {"NumericParity"},
       {R"(layers\.[0-9]+\.self_attn)"},
       "NVIDIA/Megatron-LM's model-parallel RNG tracker (tensor_parallel/random.py: get_cuda_rng_tracker().fork() around "
       "attention dropout)", "layers.0.self_attn",
       {dp_shard2}, "tp>1"},
      {"F27", "data pipeline (shared)",
       "packed rows' position ids counted 0..S-1 through the row, never restarted at a document start; the Reference "
       "is fed by the same pipeline, so every case agrees with it and only the recomputation from the documents differs",
       "harness/data/text_pipeline.cpp", "Llama", "llama", dp_shard2, {"PipelineOutputs"}, {"position_ids"},
       "huggingface/nanoVLM#201 (packed samples numbered contiguously), allenai/OLMo-core#591 (RoPE positions not "
       "reset at document boundaries with doc_lens)", "data",
       {reference}, "every_case"},
      // The original model (config-invariant): the same bug in every configuration, the
      // reference included, so only the golden of the original catches it (MatchesOriginal,
      // docs/golden.md). Each runs in the reference and in a tp x sp case, which must pass.
      {"F28", "original model (config-invariant)",
       "rotary embeddings built with the default theta 1e4 instead of the config's rope_theta 1e6",
       "reference_models/llama.cpp", "MoeQwen", "moe_qwen", tp2_sp, {"MatchesOriginal"},
       {R"(localized to 'layers\.0')"},
       "mih issue 35 (a Qwen2-MoE-style port that passed all 626 parallel tests)", "layers.0",
       {}, "original_model", true},
      {"F29", "original model (config-invariant)",
       "attention scores scaled by 1/d instead of 1/sqrt(d): the queries scaled before an attention that scales again",
       "reference_models/llama.cpp", "Llama", "llama", tp2_sp, {"MatchesOriginal"}, {R"(localized to 'layers\.0')"},
       "mih issue 35 (a Qwen2-MoE-style port that passed all 626 parallel tests)", "layers.0",
       {}, "original_model", true},
      {"F30", "original model (config-invariant)",
       "RMSNorm computed as (1 + w) * x / rms (Gemma's) where Llama has w * x / rms",
       "harness/parallel/layers.cpp", "Llama", "llama", tp2_sp, {"MatchesOriginal"}, {R"(localized to 'layers\.0')"},
       "huggingface/transformers' GemmaRMSNorm (1 + weight) beside LlamaRMSNorm (weight)", "layers.0",
       {}, "original_model", true},
      {"F31", "original model (config-invariant)",
       "MoE top-k probabilities renormalized although the original does not (norm_topk_prob false)",
       "reference_models/llama.cpp", "MoeQwen", "moe_qwen", tp2_sp, {"MatchesOriginal"},
       {R"(localized to 'layers\.1')"},
       "mih issue 35 (a Qwen2-MoE-style port that passed all 626 parallel tests)", "layers.1",
       {}, "original_model", true},
      {"F32", "original model (config-invariant)",
       "the exact (erf) GELU where GPT-2 has the tanh approximation (gelu_new)", "reference_models/gpt2.cpp", "Gpt2",
       "gpt2", tp2_sp, {"MatchesOriginal"}, {R"(localized to 'h\.0')"},
       "huggingface/transformers' ACT2FN gelu vs gelu_new", "h.0",
       {}, "original_model", true},
      // Pipeline parallelism: each in a pp case, its control a data-parallel case with the same
      // micro-batching (so only pp tells them apart).
      {"F33", "pipeline parallelism (loss normalization)",
       "each micro-batch's loss averaged over its own valid tokens and backpropagated so on the last stage, never "
       "divided by the step's valid-token count (the micro-batches' means summed)",
       "harness/parallel/pipeline.cpp", "Llama", "llama", pp2_mb4, {"NumericParity.LossMatchesReference"}, {"loss"},
       "pytorch/torchtitan#2972 (PP gradients scaled by the token count: the loss backpropagated un-normalized), "
       "deepspeedai/DeepSpeed#7773 (gradient accumulation summed instead of averaged)", "loss",
       {dp_shard2_mb2}, "pp>1"},
      {"F34", "pipeline parallelism (tied weights)",
       "the gradients of a parameter tied across the first and the last stage (the embedding and the head) never "
       "summed over pp: each stage updates its copy with its own part and the tie comes apart",
       "harness/parallel/parallel_context_grads.cpp", "LlamaTied", "llama_tied", pp2_mb2,
       {"ReplicaConsistency", "GradientSync", "NumericParity"}, {R"(embed_tokens\.weight)"},
       "NVIDIA/Megatron-LM#844 and #4641 (the embedding group's all-reduce of the tied word embeddings missing or "
       "in the wrong order)", "embed_tokens",
       {dp_shard2_mb2}, "pp>1"},
      {"F35", "pipeline parallelism (grad-norm scope)",
       "the global grad norm summed over the stage's own ranks only, never over pp: each stage clips by the norm of "
       "its own parameters",
       "harness/parallel/parallel_context_grads.cpp", "Llama", "llama", pp2_mb4, {"NumericParity.GradNormsMatchReference"},
       {"grad_norm"}, "pytorch/torchtitan#596 (the grad norm clipped per pipeline stage)", "grad_norm",
       {dp_shard2_mb2}, "pp>1"},
      // tp above the KV heads, each replicated over tp / num_kv_heads ranks: only a case with
      // tp > num_key_value_heads reaches it; its control tp 2 splits the heads as usual.
      {"F36", "TP layout (replicated KV heads)",
       "with tp above the key/value heads (each replicated over tp / num_kv_heads ranks) tp rank t attends with KV "
       "head t % num_kv_heads instead of t / (tp / num_kv_heads): the query heads of two ranks use the other group's "
       "keys and values",
       "harness/parallel/layers.cpp", "Llama", "llama", tp4, {"NumericParity"},
       {R"(layers\.[0-9]+\.self_attn)"},
       "vLLM's num_kv_head_replicas (QKVParallelLinear: the KV head of tp rank t is t / (tp / num_kv_heads)); mih "
       "issue 52 (a wrong KV head per rank at tp 4 was green on cpu-smoke)", "layers.0.self_attn",
       {tp2}, "tp>num_key_value_heads"},
      // Packed documents masked by document_ids (llama_docs): only a case that splits the
      // sequence over cp reaches these faults' code; the sp case of the same spec is the control.
      {"F37", "sequence layout (packed documents)",
       "the document mask under cp looked up at a rank's local token indices (0..S/CP-1) for its queries and at "
       "global ids for the gathered keys: every cp rank but the first takes the documents of the row's first tokens, "
       "so its queries attend into other documents and a document straddling a chunk boundary is cut",
       "harness/parallel/context_parallel.cpp", "LlamaDocs", "llama_docs", cp2, {"NumericParity"},
       {R"(layers\.[0-9]+\.self_attn)"},
       "huggingface/trl#6843 (packing with context parallelism: the document mask replaced by plain causal "
       "attention, each packed document attends to the ones before it); NVIDIA/Megatron-LM#4495 (packed sequences "
       "under cp: local chunk boundaries from the wrong cu_seqlens, tokens leaked across sequence boundaries)",
       "layers.0.self_attn", {tp2_sp}, "cp>1"},
      {"F38", "sequence layout (packed documents)",
       "rotary positions under cp counted on from the position of a rank's first token through its shard (its offset "
       "in the row) instead of read from position_ids: a document that starts inside the shard does not restart at 0",
       "reference_models/llama.cpp", "LlamaDocs", "llama_docs", cp2zz, {"NumericParity"},
       {R"(layers\.[0-9]+\.self_attn)"},
       "NVIDIA/Megatron-LM#5243 (packed THD RoPE under cp: a cp rank's later packed sequences took the positions of "
       "the first one); NVIDIA/Megatron-LM#453 (RoPE ignores the reset position ids of packed documents)",
       "layers.0.self_attn", {tp2_sp}, "cp>1"},
      // A sliding window of 8 over packed documents (llama_swa): the keys of another cp rank.
      {"F39", "sequence layout (sliding window)",
       "the sliding window one key wider for the keys gathered from another cp rank (q - k <= W instead of < W): at a "
       "cp chunk boundary a query attends to W + 1 keys",
       "harness/parallel/context_parallel.cpp", "LlamaSwa", "llama_swa", cp2zz, {"NumericParity"},
       {R"(layers\.[0-9]+\.self_attn)"},
       "open-lm-engine/lm-engine#447 (sliding-window attention under ring context parallelism: the window offset per "
       "cp step); huggingface/transformers#39408 (a sliding window off by one: flash attention's inclusive window); "
       "PrimeIntellect-ai/prime-rl#2828 (the cp ring attention ignoring the sliding window)",
       "layers.0.self_attn", {tp2_sp}, "cp>1"},
      // SGD with momentum at a warmup-then-cosine schedule, no clipping (cpu-smoke's
      // ResumeDpShard2SgdCosine): the schedule and the momentum buffer cross the resume; the
      // uninterrupted twin of the same trainer is the control.
      {"F40", "learning-rate schedule across a resume",
       "the learning-rate schedule's step not restored from the checkpoint: after a load it counts from the resumed "
       "step as from 0, so the warmup starts again",
       "harness/training/trainer.cpp", "Llama", "llama", resume_sgd, {"Resume.LearningRateAfterLoadMatchesUninterruptedRun"},
       {"metric 'lr'"},
       "verl-project/verl#7954 (Megatron checkpoints: the LR scheduler state saved and not loaded by default, the "
       "schedule restarts at step 0 on resume); PrimeIntellect-ai/prime-rl#1095 (LR scheduler across checkpoint "
       "resume); lightly-ai/lightly-train#301 (warmup restarting on resume)",
       "optimizer", {dp_shard2_sgd}, "resume"},
      {"F41", "optimizer state in the checkpoint (non-AdamW)",
       "the checkpoint writes and reads the Adam moments (exp_avg, exp_avg_sq) only: SGD's momentum buffer is "
       "neither saved nor restored, so momentum restarts from the first step after a load (invisible under AdamW)",
       "harness/checkpoint/distributed_checkpoint.cpp", "Llama", "llama", resume_sgd,
       {"CheckpointRoundTrip.LoadedTensorsBitExact", "Resume.StepsAfterLoadMatchUninterruptedRun"},
       {"momentum_buffer"},
       "TrenTorch/TrenTorch#187 (checkpoints saved the state of one optimizer kind only: the others' moments and step "
       "silently dropped); harvard-edge/cs249r_book#2087 (the momentum branch of the checkpoint never exercised: every "
       "test used momentum 0)",
       "checkpoint", {dp_shard2_sgd}, "resume"},
      // One micro-batch (Pp2: a moe's pp case its numbers are held to), four layers: stage 0
      // holds MoE layer 1, stage 1 MoE layer 3.
      {"F42", "pipeline parallelism (moe balancing loss)",
       "the load-balancing loss added to the loss at the model's end: under pp only the last stage computes the "
       "loss, so the routers of the earlier stages never get the balancing loss's gradient",
       "reference_models/llama.cpp", "MoeDeep", "moe_deep", pp2, {"NumericParity"}, {R"(layers\.1\.mlp)"},
       "databricks/megablocks#64 (the balancing loss under pipeline parallelism: its backward reaches an earlier "
       "stage only through the output gradient the next stage sends back); pytorch/torchtitan#2061 (the aux loss "
       "broken under interleaved pipeline schedules)", "layers.1.mlp",
       {dp_shard2}, "pp>1"},
      // A loader with epochs (llama_epochs: 12 samples an epoch, 8 a step), resumed after
      // step 1 straddled the first epoch boundary: saved at epoch 1, position 4.
      {"F43", "data loader state across a resume",
       "the sampler's epoch not restored from the checkpoint (set_epoch(0) on the resumed loader): the position is "
       "kept but in epoch 0's shuffle order, so the resumed run serves samples it already trained on",
       "harness/data/data_loader.cpp", "LlamaEpochs", "llama_epochs", resume_epoch1,
       {"DataLoaderState.EverySampleOncePerEpochAcrossTheResume"}, {"served twice"},
       "huggingface/accelerate#4195 (a stateful dataloader resumes the cursor, not the shuffle order: epoch 0's "
       "permutation at the restored position); huggingface/accelerate#4012 (the DataLoaderShard epoch counter not "
       "persisted: a resumed run replays the epoch-0 order); modelscope/ms-swift#10050 (resume_from_checkpoint "
       "loses the epoch seed: already-trained samples trained again)",
       "data", {dp_replicate2}, "resume"},
      {"F44", "data loader state across a resume",
       "the data loader left out of the checkpoint (the model and optimizer restored, the loader never given its "
       "state): the resumed run draws from the first batch again",
       "harness/training/trainer.cpp", "LlamaEpochs", "llama_epochs", resume_epoch1,
       {"DataLoaderState.SampleLedgerAfterLoadMatchesUninterruptedRun", "DataLoaderState"}, {"served|did not continue"},
       "KempnerInstitute/KempnerForge#51 (the dataloader never passed to the checkpoint manager: every resume "
       "replays the first epoch from scratch, StatefulDataLoader's batches_yielded reset to zero)",
       "data", {dp_replicate2}, "resume"},
  };
  return catalog;
}

}  // namespace mih::cases
