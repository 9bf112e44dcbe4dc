// vlm (see vlm.h).
#include "reference_models/vlm.h"

#include <cmath>

#include <ATen/ATen.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"

namespace mih::models {
namespace {

// A parameter replicated over tp whose gradient is partial over tp under sequence parallelism
// (the vision side feeds only this tp rank's tokens then).
at::Tensor replicated(ParallelContext& ctx, std::vector<int64_t> shape, double std) {
  ParamSpec s;
  s.shape = std::move(shape);
  s.init = init::normal(std);
  s.tp_partial_grad = ctx.sequence_parallel();
  return ctx.make_parameter(s);
}

at::Tensor linear(ParallelContext& ctx, const at::Tensor& x, const at::Tensor& w) { return at::matmul(x, ctx.use(w).t()); }

// The vision activations [B, P, H]: every cp rank runs the whole tower on its rows
// (pixel_values is cp-replicated) and every tp rank too; each consumes the features of its own
// tokens only, so under cp (and tp with sequence parallelism) the gradient of each one is a
// partial sum until the parameters' gradients are reduced.
ActivationLayout tower_layout(const ParallelContext& ctx) {
  ActivationLayout tower = ActivationLayout::replicated(/*sequence_over_cp=*/false);
  tower.grad_partial_over_tp = ctx.sequence_parallel();
  tower.grad_partial_over_cp = true;
  return tower;
}

}  // namespace

void VlmOptions::validate(const ParallelContext& ctx) const {
  text().validate(ctx);
  MIH_CHECK(image_size() % patch_size() == 0, "vlm: image_size(", image_size(), ") must divide by patch_size(",
            patch_size(), ")");
  MIH_CHECK(vision_hidden_size() % vision_heads() == 0, "vlm: vision_hidden_size(", vision_hidden_size(),
            ") must divide by vision_heads(", vision_heads(), ")");
  MIH_CHECK(image_token_id() >= 0 && image_token_id() < text().vocab_size(), "vlm: image_token_id(", image_token_id(),
            ") must be a token of the language model's vocabulary [0, ", text().vocab_size(), ")");
}

VisionBlockImpl::VisionBlockImpl(ParallelContext& ctx, const VlmOptions& o) : ctx_(&ctx), o_(o) {
  const int64_t h = o.vision_hidden_size();
  const double std = o.text().init_std();
  layer_norm1 = register_module("layer_norm1", LayerNorm(ctx, h));
  qkv = register_parameter("qkv", replicated(ctx, {3 * h, h}, std));
  out = register_parameter("out_proj", replicated(ctx, {h, h}, std));
  layer_norm2 = register_module("layer_norm2", LayerNorm(ctx, h));
  fc1 = register_parameter("fc1", replicated(ctx, {4 * h, h}, std));
  fc2 = register_parameter("fc2", replicated(ctx, {h, 4 * h}, std));
}

at::Tensor VisionBlockImpl::forward(const at::Tensor& x) {
  const int64_t n = x.size(0), p = x.size(1), heads = o_.vision_heads(), d = o_.vision_hidden_size() / heads;
  auto parts = linear(*ctx_, layer_norm1(x), qkv).chunk(3, -1);
  auto split = [&](const at::Tensor& t) { return t.reshape({n, p, heads, d}).transpose(1, 2); };  // [N, heads, P, d]
  at::Tensor scores = at::matmul(split(parts[0]), split(parts[1]).transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  at::Tensor context = at::matmul(at::softmax(scores, -1), split(parts[2])).transpose(1, 2).reshape({n, p, heads * d});
  at::Tensor h = x + linear(*ctx_, context, out);
  return h + linear(*ctx_, at::gelu(linear(*ctx_, layer_norm2(h), fc1)), fc2);
}

VisionTowerImpl::VisionTowerImpl(ParallelContext& ctx, const VlmOptions& o) : ctx_(&ctx), o_(o) {
  const int64_t h = o.vision_hidden_size(), patch = o.channels() * o.patch_size() * o.patch_size();
  patch_embedding = register_parameter("patch_embedding", replicated(ctx, {h, patch}, o.text().init_std()));
  position_embedding = register_parameter("position_embedding", replicated(ctx, {o.num_patches(), h}, o.text().init_std()));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.vision_layers(); ++i) layers->push_back(VisionBlock(ctx, o));
  post_layernorm = register_module("post_layernorm", LayerNorm(ctx, h));
}

at::Tensor VisionTowerImpl::forward(const at::Tensor& pixel_values) {
  const int64_t n = pixel_values.size(0), c = o_.channels(), s = o_.patch_size(), g = o_.image_size() / s;
  // [N, C, g*s, g*s] -> [N, g, g, C, s, s] -> [N, P, C*s*s], patches in row-major order.
  at::Tensor patches = pixel_values.reshape({n, c, g, s, g, s}).permute({0, 2, 4, 1, 3, 5}).reshape({n, g * g, c * s * s});
  at::Tensor x = linear(*ctx_, patches.to(patch_embedding.scalar_type()), patch_embedding) + ctx_->use(position_embedding);
  const ActivationLayout tower = tower_layout(*ctx_);
  for (const auto& layer : *layers) x = ctx_->observe(*layer, layer->as<VisionBlock>()->forward(x), tower);
  return post_layernorm(x);
}

VlmForConditionalGeneration::VlmForConditionalGeneration(ParallelContext& ctx, const VlmOptions& o) : ctx_(&ctx), o_(o) {
  o.validate(ctx);
  MIH_CHECK(!ctx.config().pipelined(), "vlm: the model does not split into pipeline stages (config '",
            ctx.config().name(), "'); run it without pp and vpp");
  vision_tower = register_module("vision_tower", VisionTower(ctx, o));
  const int64_t h = o.text().hidden_size();
  projector_ = register_module("multi_modal_projector", std::make_shared<torch::nn::Module>());
  auto& projector = projector_;
  projector_1 = projector->register_parameter("linear_1", replicated(ctx, {h, o.vision_hidden_size()}, o.text().init_std()));
  projector_2 = projector->register_parameter("linear_2", replicated(ctx, {h, h}, o.text().init_std()));
  language_model = register_module("language_model", std::make_shared<LlamaForCausalLM>(ctx, o.text()));
}

at::Tensor VlmForConditionalGeneration::token_losses(const Batch& batch) {
  return language_model->losses(logits(batch), batch);
}

at::Tensor VlmForConditionalGeneration::logits(const Batch& batch) {
  auto field = [&](const char* name) {
    auto it = batch.fields.find(name);
    MIH_CHECK(it != batch.fields.end(), "vlm: the batch has no field '", name,
              "' (the vlm needs pixel_values and image_token_index; see vlm_batches)");
    return it->second;
  };
  // As Hugging Face's vision-language models do, a batch without pixel_values runs text-only:
  // the placeholder tokens keep their token embeddings (which is why a dropped image field
  // trains on silently, and the harness checks the forward fields).
  if (!batch.fields.count("pixel_values")) return language_model->decode(language_model->embed(batch), batch);
  const at::Tensor pixels = field("pixel_values"), index = field("image_token_index");
  MIH_CHECK(pixels.dim() == 4 && pixels.size(0) == batch.input_ids.size(0) && pixels.size(1) == o_.channels() &&
                pixels.size(2) == o_.image_size() && pixels.size(3) == o_.image_size(),
            "vlm: pixel_values ", pixels.sizes(), " must be [B=", batch.input_ids.size(0), ", C=", o_.channels(),
            ", H=", o_.image_size(), ", W=", o_.image_size(), "]");
  MIH_CHECK(index.sizes() == batch.input_ids.sizes(), "vlm: image_token_index ", index.sizes(), " must match input_ids ",
            batch.input_ids.sizes());
  // Vision features: [B, P, Hv] -> projected [B, P, H].
  const ActivationLayout tower = tower_layout(*ctx_);
  ctx_->shared_state().publish("vision.features", ctx_->fsdp_forward("vision_tower", [&] {
    return ctx_->observe(*vision_tower, vision_tower(pixels), tower);
  }), "vision_tower");
  at::Tensor features = ctx_->shared_state().consume("vision.features", "multi_modal_projector");
  // F19 (docs/fault-catalog.md): the features detached before the projector: the vision tower gets no gradient.
  if (fault::active(fault::Fault::kF19)) features = features.detach();
  features = ctx_->observe(*projector_, linear(*ctx_, at::gelu(linear(*ctx_, features, projector_1)), projector_2), tower);
  at::Tensor x = language_model->embed(batch);  // [B, S, H] (sequence parallel: [B, S/TP, H])
  // Each placeholder token takes its patch's feature; under sequence parallelism this tp rank
  // holds a contiguous S/TP chunk of the sequence, and of the index with it.
  const at::Tensor local_index = ctx_->sequence_parallel_chunk(index, 1);
  at::Tensor is_image = local_index.ge(0).unsqueeze(-1);  // [B, S, 1]
  at::Tensor gathered = features.gather(1, local_index.clamp_min(0).unsqueeze(-1).expand({-1, -1, x.size(-1)}));
  x = at::where(is_image, gathered, x);
  return language_model->decode(x, batch);
}

void VlmForConditionalGeneration::apply_fsdp(ParallelContext& ctx) {
  ctx.fully_shard(*vision_tower, "vision_tower");
  for (auto& [i, layer] : language_model->decoder_layers) ctx.fully_shard(*layer, "layers." + std::to_string(i));
  ctx.fully_shard(*this, "root");
}

ModelFactory make_vlm(VlmOptions o) {
  return [o](ParallelContext& ctx) { return std::make_shared<VlmForConditionalGeneration>(ctx, o); };
}

BatchSource vlm_batches(const VlmOptions& o, data::TextPipeline text, data::ImagePipeline images) {
  return [o, text = std::move(text), images = std::move(images)](int64_t step) {
    Batch b = text.batch(step);
    const int64_t p = o.num_patches(), rows = b.input_ids.size(0), seq = b.input_ids.size(1);
    MIH_CHECK(seq > p, "vlm_batches: seq_len ", seq, " leaves no text after the ", p, " image placeholder tokens");
    b.input_ids = b.input_ids.clone();
    b.labels = b.labels.clone();
    b.input_ids.narrow(1, 0, p).fill_(o.image_token_id());
    b.labels.narrow(1, 0, p).fill_(-100);  // no loss on predicting placeholders or from them
    if (b.fields.count("loss_mask")) {
      b.fields["loss_mask"] = b.fields["loss_mask"].clone();
      b.fields["loss_mask"].narrow(1, 0, p).fill_(0);
    }
    at::Tensor index = at::full({rows, seq}, -1, at::kLong);
    index.narrow(1, 0, p).copy_(at::arange(p, at::kLong).unsqueeze(0).expand({rows, p}));
    b.fields["image_token_index"] = index;
    // Positions count from the row's start through the placeholders: a document start they
    // cover is no boundary any more (the text after them continues the image's sample).
    if (b.position_ids.defined()) {
      b.position_ids = b.position_ids.clone().contiguous();
      const at::Tensor ids = b.input_ids.contiguous();
      int64_t* pos = b.position_ids.data_ptr<int64_t>();
      const int64_t* in = ids.data_ptr<int64_t>();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t t = 0; t < seq; ++t) {
          const int64_t i = r * seq + t;
          pos[i] = t < p ? t : in[i] == data::ByteTokenizer::kBos ? 0 : pos[i - 1] + 1;
        }
      }
    }
    // What the check of the pipeline's outputs recomputes the placeholders from.
    if (b.provenance) {
      auto provenance = std::make_shared<BatchProvenance>(*b.provenance);
      provenance->prefix_tokens = p;
      provenance->prefix_token = o.image_token_id();
      provenance->prefix_index_field = "image_token_index";
      b.provenance = std::move(provenance);
    }
    at::Tensor pixels = images.images(step);
    MIH_CHECK(pixels.size(0) == rows && pixels.size(2) == o.image_size() && pixels.size(3) == o.image_size(),
              "vlm_batches: images ", pixels.sizes(), " do not fit ", rows, " rows of ", o.image_size(), "-pixel images");
    // F18 (docs/fault-catalog.md): the collate drops the images before the forward call.
    if (!fault::active(fault::Fault::kF18)) b.fields["pixel_values"] = pixels;
    return b;
  };
}

}  // namespace mih::models
