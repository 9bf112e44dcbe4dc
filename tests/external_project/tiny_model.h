// The model of the outside port (tests/external_project): a one-block MLP language model
// written against harness/parallel layers, so it trains under tp, sp and dp_shard unchanged:
// vocab-parallel embedding, RMSNorm, a ColumnParallel -> GELU -> RowParallel residual block,
// and a vocab-parallel head with its cross entropy. Plain single-device code at degree 1.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include <ATen/ATen.h>

#include "harness/parallel/layers.h"
#include "harness/training/trainer.h"

namespace my_port {

struct TinyMlpOptions {
  int64_t vocab = 37;  // not divisible by 2: the head and embedding pad it under tp=2
  int64_t hidden = 16;
  int64_t ffn = 32;  // sharded over tp (ColumnParallel outputs, RowParallel inputs)
};

class TinyMlpLM : public mih::ParallelModel {
 public:
  TinyMlpLM(mih::ParallelContext& ctx, const TinyMlpOptions& o) : ctx_(&ctx), o_(o) {
    embed = register_module("embed", mih::VocabParallelEmbedding(ctx, o.vocab, o.hidden));
    norm = register_module("norm", mih::RMSNorm(ctx, o.hidden));
    up = register_module("up", mih::ColumnParallelLinear(ctx, mih::ColumnParallelLinearOptions(o.hidden, o.ffn)));
    down = register_module("down", mih::RowParallelLinear(ctx, mih::RowParallelLinearOptions(o.ffn, o.hidden)));
    head = register_module(
        "head", mih::ColumnParallelLinear(
                    ctx, mih::ColumnParallelLinearOptions(o.hidden, o.vocab).bias(false).pad_to_tp(true)));
  }

  /// Shape: batch [B, S] -> per-token losses [B, S], replicated over tp.
  /// Each module's output is declared to the activation probes (ParallelContext::observe)
  /// with its layout, so a failure names the first module whose output diverges.
  /// TINY_PORT_BUG=up (the test my_port_localizes_a_forward_bug) plants a forward bug in the
  /// up projection: tp rank 1 scales its shard of the output.
  at::Tensor token_losses(const mih::Batch& batch) override {
    const mih::ActivationLayout residual = mih::ActivationLayout::residual(*ctx_);
    at::Tensor x = ctx_->observe(*embed, embed(batch.input_ids), residual);  // [B, S, H] (SP: [B, S/TP, H])
    at::Tensor h = ctx_->observe(*norm, norm(x), residual);
    at::Tensor u = up(h);  // [B, S, F/TP]
    static const bool bug = [] {
      const char* v = std::getenv("TINY_PORT_BUG");
      return v != nullptr && std::string(v) == "up";
    }();
    if (bug && ctx_->tp_rank() == 1) u = u * 1.001;
    u = ctx_->observe(*up, u, mih::ActivationLayout::column_parallel(o_.ffn));
    x = x + ctx_->observe(*down, down(at::gelu(u)), residual);  // down sums over tp
    at::Tensor logits = ctx_->observe(*head, head(x), mih::ActivationLayout::column_parallel(o_.vocab));  // [B, S, V/TP]
    at::Tensor losses = mih::vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                          batch.labels.reshape(-1), ctx_->tp_group(), o_.vocab);
    return losses.view_as(batch.labels);
  }

  mih::VocabParallelEmbedding embed{nullptr};
  mih::RMSNorm norm{nullptr};
  mih::ColumnParallelLinear up{nullptr}, head{nullptr};
  mih::RowParallelLinear down{nullptr};

 private:
  mih::ParallelContext* ctx_;
  TinyMlpOptions o_;
};

inline mih::ModelFactory tiny_mlp_factory(TinyMlpOptions o = {}) {
  return [o](mih::ParallelContext& ctx) { return std::make_shared<TinyMlpLM>(ctx, o); };
}

}  // namespace my_port
