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

// A plain module under `parent` named `name`: CLIP's grouping modules (encoder, self_attn, mlp,
// patch_embedding, position_embedding) that only give the parameters their checkpoint names.
std::shared_ptr<torch::nn::Module> child(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

// CLIP's activation (CLIPVisionConfig's default hidden_act): x * sigmoid(1.702 x).
at::Tensor quick_gelu(const at::Tensor& x) { return x * at::sigmoid(1.702 * x); }

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
  MIH_CHECK(image_size() > 0 && patch_size() > 0 && channels() > 0 && vision_hidden_size() > 0 && vision_heads() > 0 &&
                vision_intermediate_size() > 0 && vision_layers() >= 0,
            "vlm: image_size(", image_size(), "), patch_size(", patch_size(), "), channels(", channels(),
            "), vision_hidden_size(", vision_hidden_size(), "), vision_heads(", vision_heads(),
            ") and vision_intermediate_size(", vision_intermediate_size(), ") must be positive, vision_layers(",
            vision_layers(), ") not negative");
  MIH_CHECK(image_size() % patch_size() == 0, "vlm: image_size(", image_size(), ") must divide by patch_size(",
            patch_size(), ")");
  MIH_CHECK(vision_hidden_size() % vision_heads() == 0, "vlm: vision_hidden_size(", vision_hidden_size(),
            ") must divide by vision_heads(", vision_heads(), ")");
  MIH_CHECK(image_token_id() >= 0 && image_token_id() < text().vocab_size(), "vlm: image_token_id(", image_token_id(),
            ") must be a token of the language model's vocabulary [0, ", text().vocab_size(), ")");
}

TowerLinearImpl::TowerLinearImpl(ParallelContext& ctx, int64_t in, int64_t out, double init_std) : ctx_(&ctx) {
  weight = register_parameter("weight", replicated(ctx, {out, in}, init_std));
  bias = register_parameter("bias", replicated(ctx, {out}, init_std));
}

at::Tensor TowerLinearImpl::forward(const at::Tensor& x) { return at::linear(x, ctx_->use(weight), ctx_->use(bias)); }

VisionEmbeddingsImpl::VisionEmbeddingsImpl(ParallelContext& ctx, const VlmOptions& o) : ctx_(&ctx), o_(o) {
  const int64_t h = o.vision_hidden_size(), p = o.patch_size();
  const double std = o.text().init_std();
  class_embedding = register_parameter("class_embedding", replicated(ctx, {h}, std));
  patch_weight = child(*this, "patch_embedding")->register_parameter("weight", replicated(ctx, {h, o.channels(), p, p}, std));
  position_weight =
      child(*this, "position_embedding")->register_parameter("weight", replicated(ctx, {o.num_patches() + 1, h}, std));
}

at::Tensor VisionEmbeddingsImpl::forward(const at::Tensor& pixel_values) {
  const int64_t n = pixel_values.size(0), c = o_.channels(), s = o_.patch_size(), g = o_.image_size() / s;
  const int64_t h = o_.vision_hidden_size();
  // The convolution of stride p as unfold + matmul: [N, C, g*s, g*s] -> [N, g, g, C, s, s] ->
  // [N, P, C*s*s], patches in row-major order (the convolution's output flattened).
  const at::Tensor w = ctx_->use(patch_weight);
  at::Tensor patches = pixel_values.reshape({n, c, g, s, g, s}).permute({0, 2, 4, 1, 3, 5}).reshape({n, g * g, c * s * s});
  at::Tensor x = at::matmul(patches.to(w.scalar_type()), w.reshape({h, c * s * s}).t());  // [N, P, Hv]
  at::Tensor cls = ctx_->use(class_embedding).expand({n, 1, h});
  return at::cat({cls, x}, 1) + ctx_->use(position_weight);
}

VisionBlockImpl::VisionBlockImpl(ParallelContext& ctx, const VlmOptions& o) : o_(o) {
  const int64_t h = o.vision_hidden_size(), f = o.vision_intermediate_size();
  const double std = o.text().init_std();
  layer_norm1 = register_module("layer_norm1", LayerNorm(ctx, h));
  auto attn = child(*this, "self_attn");
  q_proj = attn->register_module("q_proj", TowerLinear(ctx, h, h, std));
  k_proj = attn->register_module("k_proj", TowerLinear(ctx, h, h, std));
  v_proj = attn->register_module("v_proj", TowerLinear(ctx, h, h, std));
  out_proj = attn->register_module("out_proj", TowerLinear(ctx, h, h, std));
  layer_norm2 = register_module("layer_norm2", LayerNorm(ctx, h));
  auto mlp = child(*this, "mlp");
  fc1 = mlp->register_module("fc1", TowerLinear(ctx, h, f, std));
  fc2 = mlp->register_module("fc2", TowerLinear(ctx, f, h, std));
}

at::Tensor VisionBlockImpl::attention(const at::Tensor& x) {
  const int64_t n = x.size(0), t = x.size(1), heads = o_.vision_heads(), d = o_.vision_hidden_size() / heads;
  auto split = [&](const at::Tensor& y) { return y.reshape({n, t, heads, d}).transpose(1, 2); };  // [N, heads, T, d]
  at::Tensor scores = at::matmul(split(q_proj(x)), split(k_proj(x)).transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  at::Tensor context = at::matmul(at::softmax(scores, -1), split(v_proj(x))).transpose(1, 2).reshape({n, t, heads * d});
  return out_proj(context);
}

at::Tensor VisionBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = x + attention(layer_norm1(x));
  return h + fc2(quick_gelu(fc1(layer_norm2(h))));
}

VisionTowerImpl::VisionTowerImpl(ParallelContext& ctx, const VlmOptions& o) : ctx_(&ctx) {
  embeddings = register_module("embeddings", VisionEmbeddings(ctx, o));
  pre_layrnorm = register_module("pre_layrnorm", LayerNorm(ctx, o.vision_hidden_size()));
  layers = child(*this, "encoder")->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.vision_layers(); ++i) layers->push_back(VisionBlock(ctx, o));
  post_layernorm = register_module("post_layernorm", LayerNorm(ctx, o.vision_hidden_size()));
}

at::Tensor VisionTowerImpl::forward(const at::Tensor& pixel_values) {
  at::Tensor x = pre_layrnorm(embeddings(pixel_values));  // [N, P + 1, Hv]
  const ActivationLayout tower = tower_layout(*ctx_);
  for (const auto& layer : *layers) x = ctx_->observe(*layer, layer->as<VisionBlock>()->forward(x), tower);
  return x.narrow(1, 1, x.size(1) - 1);  // strategy "default": the class token's feature dropped
}

ProjectorImpl::ProjectorImpl(ParallelContext& ctx, const VlmOptions& o) {
  const int64_t h = o.text().hidden_size();
  linear_1 = register_module("linear_1", TowerLinear(ctx, o.vision_hidden_size(), h, o.text().init_std()));
  linear_2 = register_module("linear_2", TowerLinear(ctx, h, h, o.text().init_std()));
}

at::Tensor ProjectorImpl::forward(const at::Tensor& features) { return linear_2(at::gelu(linear_1(features))); }

VlmForConditionalGeneration::VlmForConditionalGeneration(ParallelContext& ctx, const VlmOptions& o) : ctx_(&ctx), o_(o) {
  o.validate(ctx);
  MIH_CHECK(!ctx.config().pipelined(), "vlm: the model does not split into pipeline stages (config '",
            ctx.config().name(), "'); run it without pp and vpp");
  vision_tower = register_module("vision_tower", VisionTower(ctx, o));
  multi_modal_projector = register_module("multi_modal_projector", Projector(ctx, o));
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
  features = ctx_->observe(*multi_modal_projector, multi_modal_projector(features), tower);
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
