// A small GPT (optionally mixture-of-experts) written with LibTorch modules,
// Megatron style: each rank builds only its own shards (columns/rows split
// over tp, experts' over etp, its pp stage's layers, its ep rank's experts)
// as one module per model chunk. Parameter names follow Megatron-Core, so
// the generated layout binds them by name.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace example {

struct Dims {
  int64_t hidden, ffn, vocab, heads, kv_groups, head_dim, experts;
  int64_t tp;   // tensor-parallel size: every dense split dim is divided by it
  int64_t etp;  // expert tensor-parallel size, for the experts' split dims
};

// A linear layer's weight (no bias), optionally with the layer norm fused in
// front of it (Megatron's TELayerNormColumnParallelLinear).
struct LinearImpl : torch::nn::Module {
  LinearImpl(int64_t out_features, int64_t in_features, int64_t norm_features = 0) {
    weight = register_parameter("weight", torch::empty({out_features, in_features}));
    if (norm_features > 0) layer_norm_weight = register_parameter("layer_norm_weight", torch::ones({norm_features}));
  }
  torch::Tensor weight, layer_norm_weight;
};
TORCH_MODULE(Linear);

// A module holding one "weight": norms, the router, embeddings, the output layer.
struct WeightImpl : torch::nn::Module {
  explicit WeightImpl(std::vector<int64_t> shape) { weight = register_parameter("weight", torch::empty(shape)); }
  torch::Tensor weight;
};
TORCH_MODULE(Weight);

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const Dims& d) {
    // Column-parallel QKV ([q; k; v] rows of this rank's heads) and row-parallel projection.
    linear_qkv =
        register_module("linear_qkv", Linear((d.heads + 2 * d.kv_groups) * d.head_dim / d.tp, d.hidden, d.hidden));
    linear_proj = register_module("linear_proj", Linear(d.hidden, d.heads * d.head_dim / d.tp));
  }
  Linear linear_qkv{nullptr}, linear_proj{nullptr};
};
TORCH_MODULE(Attention);

// SwiGLU MLP: fc1 holds this rank's [W; V] rows, fc2 its columns (split `parts` ways).
struct MlpImpl : torch::nn::Module {
  MlpImpl(const Dims& d, bool fused_norm, int64_t parts) {
    linear_fc1 = register_module("linear_fc1", Linear(2 * d.ffn / parts, d.hidden, fused_norm ? d.hidden : 0));
    linear_fc2 = register_module("linear_fc2", Linear(d.hidden, d.ffn / parts));
  }
  Linear linear_fc1{nullptr}, linear_fc2{nullptr};
};
TORCH_MODULE(Mlp);

// Router plus this rank's experts.
struct MoeImpl : torch::nn::Module {
  MoeImpl(const Dims& d, int64_t local_experts) {
    router = register_module("router", Weight(std::vector<int64_t>{d.experts, d.hidden}));
    experts = register_module("experts", torch::nn::ModuleList());
    for (int64_t e = 0; e < local_experts; ++e) experts->push_back(Mlp(d, false, d.etp));
  }
  Weight router{nullptr};
  torch::nn::ModuleList experts{nullptr};
};
TORCH_MODULE(Moe);

struct LayerImpl : torch::nn::Module {
  LayerImpl(const Dims& d, int64_t local_experts) {
    self_attention = register_module("self_attention", Attention(d));
    if (local_experts < 0) {
      mlp = register_module("mlp", Mlp(d, true, d.tp));
    } else {
      pre_mlp_layernorm = register_module("pre_mlp_layernorm", Weight(std::vector<int64_t>{d.hidden}));
      moe = register_module("mlp", Moe(d, local_experts));
    }
  }
  Attention self_attention{nullptr};
  Mlp mlp{nullptr};
  Weight pre_mlp_layernorm{nullptr};
  Moe moe{nullptr};
};
TORCH_MODULE(Layer);

struct EmbeddingImpl : torch::nn::Module {
  explicit EmbeddingImpl(const Dims& d) {
    word_embeddings = register_module("word_embeddings", Weight(std::vector<int64_t>{d.vocab / d.tp, d.hidden}));
  }
  Weight word_embeddings{nullptr};
};
TORCH_MODULE(Embedding);

struct DecoderImpl : torch::nn::Module {
  DecoderImpl(const Dims& d, int64_t local_layers, int64_t local_experts, bool last_stage) {
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t l = 0; l < local_layers; ++l) layers->push_back(Layer(d, local_experts));
    if (last_stage) final_layernorm = register_module("final_layernorm", Weight(std::vector<int64_t>{d.hidden}));
  }
  torch::nn::ModuleList layers{nullptr};
  Weight final_layernorm{nullptr};
};
TORCH_MODULE(Decoder);

// One multi-token-prediction depth (after the decoder, on the last stage).
struct MtpLayerImpl : torch::nn::Module {
  explicit MtpLayerImpl(const Dims& d) {
    enorm = register_module("enorm", Weight(std::vector<int64_t>{d.hidden}));
    hnorm = register_module("hnorm", Weight(std::vector<int64_t>{d.hidden}));
    eh_proj = register_module("eh_proj", Weight(std::vector<int64_t>{d.hidden / d.tp, 2 * d.hidden}));
    final_layernorm = register_module("final_layernorm", Weight(std::vector<int64_t>{d.hidden}));
  }
  Weight enorm{nullptr}, hnorm{nullptr}, eh_proj{nullptr}, final_layernorm{nullptr};
};
TORCH_MODULE(MtpLayer);

struct MtpImpl : torch::nn::Module {
  MtpImpl(const Dims& d, int64_t depth) {
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < depth; ++i) layers->push_back(MtpLayer(d));
  }
  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(Mtp);

// One model chunk (virtual pipeline stage). local_experts < 0: a dense model.
struct GptImpl : torch::nn::Module {
  GptImpl(const Dims& d, int64_t local_layers, int64_t local_experts, bool first_stage, bool last_stage,
          int64_t mtp_layers = 0) {
    if (first_stage) embedding = register_module("embedding", Embedding(d));
    decoder = register_module("decoder", Decoder(d, local_layers, local_experts, last_stage));
    if (last_stage && mtp_layers > 0) mtp = register_module("mtp", Mtp(d, mtp_layers));
    if (last_stage) {
      output_layer = register_module("output_layer", Weight(std::vector<int64_t>{d.vocab / d.tp, d.hidden}));
    }
  }
  Embedding embedding{nullptr};
  Decoder decoder{nullptr};
  Mtp mtp{nullptr};
  Weight output_layer{nullptr};
};
TORCH_MODULE(Gpt);

}  // namespace example
