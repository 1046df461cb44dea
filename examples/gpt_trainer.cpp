// Trains a small GPT (or MoE GPT) for a few steps under any (tp, pp, dp, ep)
// mesh, saving and loading through the API generated from
// schema/models/{gpt,moe}.shard. No sharding code here: the modules hold local
// shards, the generated Model binds them by name and knows every offset.
//
//   distckpt-launch -n 8 -- distckpt-gpt-trainer --tp 2 --pp 4 --steps 3 --save A
//   distckpt-launch -n 8 -- distckpt-gpt-trainer --tp 4 --pp 2 --load A --save B
//   distckpt digest A; distckpt digest B      # equal: same logical state
//   ... --load A --save HF --save-mapping llama  # Hugging Face files, from every rank
//
// Every parameter starts as its slice of a deterministic global tensor, and
// the loss is elementwise (0.5 * |p - target|^2 with a global target), so
// training gives the same logical model whatever the layout.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "distckpt/distckpt.h"
#include "distckpt/layout/from_global.h"
#include "gpt.shard.h"
#include "gpt_modules.h"
#include "moe.shard.h"

namespace {

using namespace distckpt;

struct Args {
  std::string model = "gpt";
  int64_t tp = 1, pp = 1, dp = 1, ep = 1;
  int64_t layers = 4, hidden = 64, heads = 4, kv_groups = 0, ffn = 128, vocab = 256, experts = 4;
  int64_t tie_embeddings = 0, steps = 0;
  std::string optimizer = "sgd";      // sgd (stateless), adam or adamw
  int64_t distributed_optimizer = 1;  // ZeRO-1 layout of the optimizer state over dp
  std::string save_dir, load_dir;
  std::string load_mapping;  // --load reads another naming through this mapping of the schema
  std::string save_mapping;  // --save writes safetensors under this mapping of the schema
  bool overwrite = false;
};

struct Coords {
  int64_t tp, pp, dp, ep;
};

// Rank order: tp fastest, then ep, dp, pp.
Coords coords_of(int rank, const Args& a) {
  int64_t r = rank;
  Coords c{};
  c.tp = r % a.tp;
  r /= a.tp;
  c.ep = r % a.ep;
  r /= a.ep;
  c.dp = r % a.dp;
  c.pp = r / a.dp;
  return c;
}

// The global tensors every layout slices: a fixed function of key and shape.
at::Tensor global_value(const std::string& key, const Shape& shape, double salt) {
  const double k = static_cast<double>(std::hash<std::string>{}(key) % 1013) + salt;
  return at::arange(numel(shape), at::kFloat).mul(0.0137).add(k).sin().reshape(shape);
}

// This rank's part of a layout entry's global value.
at::Tensor local_value(const Value& entry, double salt) {
  return layout::local_from_global(
      entry, [salt](const std::string& key, const Shape& shape) { return global_value(key, shape, salt); });
}

template <typename Model>
void set_objects_and_common(Model& model, const Coords& c, int64_t iteration) {
  if constexpr (std::is_same_v<Model, gpt::Model>) {
    for (int64_t l = 0; l < model.decoder_layers_local_count(); ++l) {
      auto& layer = model.decoder_layers(l);
      layer.self_attention_core_attention__extra_state(
          fmt::format("extra-state layer {} tp {}", layer.global_index(), c.tp));
    }
    model.consumed_samples(iteration * 32);
  }
  model.iteration(iteration);
}

// The tensors of a request (what another framework's files can hold).
StateDict weights_only(const StateDict& request) {
  StateDict out = StateDict::dict();
  for (const auto& [key, value] : request.as_dict()) {
    if (value.kind() == Kind::kShardedTensor || value.kind() == Kind::kFactory) out[key] = value;
  }
  return out;
}

// Runs `steps` of the elementwise loss, 0.5 * |p - target|^2.
template <typename Optimizer>
void train(Optimizer& optimizer, const std::vector<std::pair<std::string, at::Tensor>>& params,
           const std::vector<at::Tensor>& targets, int64_t steps) {
  for (int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    at::Tensor loss = torch::zeros({});
    for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i].second - targets[i]).pow(2).sum() * 0.5;
    loss.backward();
    optimizer.step();
  }
}

// Save and load of the model plus, for Adam/AdamW, the optimizer state laid
// out by the schema's optimizer block.
template <typename Model, typename LayoutOptimizer, typename TorchOptimizer>
int64_t checkpoint_and_train(Model& layout, const LayoutOptimizer& layout_optimizer, TorchOptimizer& optimizer,
                             const std::vector<std::pair<std::string, at::Tensor>>& params,
                             const std::vector<at::Tensor>& targets, const Args& a, const Coords& c,
                             Communicator& comm) {
  constexpr bool kStateful = !std::is_same_v<TorchOptimizer, torch::optim::SGD>;
  int64_t iteration = 0;
  if (!a.load_dir.empty()) {
    set_objects_and_common(layout, c, 0);
    StateDict request = layout.state_dict();
    LoadOptions options{StrictHandling::kReturnUnexpected};
    if (!a.load_mapping.empty()) {
      // Weights only (a Hugging Face directory has no optimizer state, objects or common values).
      options.mapping = find_mapping(layout.save_options().name_mappings, a.load_mapping, "the layout schema");
      request = weights_only(request);
    } else if constexpr (kStateful) {
      merge(request, layout_optimizer.load_request(optimizer));
    }
    // Per-tp objects (extra_state) exist only for the saving tp; every tensor must be found.
    LoadResult result = load(request, a.load_dir, comm, options);
    if (!a.load_mapping.empty()) {
      uint64_t shard_bytes = 0;
      for (const auto& [name, tensor] : params) shard_bytes += tensor.nbytes();
      fmt::print("rank {} read {} bytes for {} bytes of shards\n", comm.rank(), result.bytes_read, shard_bytes);
    }
    for (const std::string& key : result.unexpected_keys) {
      if (key.find("._extra_state/") == std::string::npos) {
        throw Error(fmt::format("'{}' is not in the checkpoint {}", key, a.load_dir));
      }
    }
    if (!result.unexpected_keys.empty() && comm.rank() == 0) {
      fmt::print("per-tp extra_state objects not carried over: saved under another tp\n");
    }
    {
      torch::NoGradGuard no_grad;
      for (auto& [name, tensor] : params) tensor.copy_(result.state_dict.at(name).as_tensor());  // fused: merged
    }
    if (a.load_mapping.empty()) {
      if constexpr (kStateful) layout_optimizer.load_state_dict(optimizer, result.state_dict);
      iteration = result.state_dict.at("iteration").as_int();
    }
  }
  train(optimizer, params, targets, a.steps);
  iteration += a.steps;
  if (!a.save_dir.empty()) {
    set_objects_and_common(layout, c, iteration);
    StateDict sd = layout.state_dict();
    if constexpr (kStateful) merge(sd, layout_optimizer.state_dict(optimizer));
    SaveOptions options = layout.save_options();
    options.overwrite = a.overwrite;
    if (!a.save_mapping.empty()) {
      options.format = StorageFormat::kSafetensors;
      options.safetensors.mapping = find_mapping(options.name_mappings, a.save_mapping, "the layout schema");
    }
    save(sd, a.save_dir, comm, options);
  }
  return iteration;
}

template <typename Model, typename LayoutOptimizer>
int run(Model& layout, const Args& a, const Coords& c, Communicator& comm) {
  const int64_t local_layers = layout.decoder_layers_local_count();
  int64_t local_experts = -1;
  if constexpr (std::is_same_v<Model, moe::Model>) {
    local_experts = local_layers > 0 ? layout.decoder_layers(0).mlp_experts_local_count() : 0;
  }
  const auto& cfg = layout.config();
  const example::Dims dims{cfg.hidden, cfg.ffn, cfg.vocab, cfg.heads, cfg.kv_groups, cfg.head_dim, a.experts, a.tp};
  example::Gpt module(dims, local_layers, local_experts, c.pp == 0, c.pp == a.pp - 1);

  // Initial values and training targets from the global model.
  const StateDict meta = layout.metadata_state_dict();
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<at::Tensor> targets;
  {
    torch::NoGradGuard no_grad;
    for (auto& p : module->named_parameters()) {
      p.value().copy_(local_value(meta.at(p.key()), 0.0));
      targets.push_back(local_value(meta.at(p.key()), 0.5));
      params.emplace_back(p.key(), p.value());
    }
  }
  layout.bind(params);

  const LayoutOptimizer layout_optimizer(layout, a.distributed_optimizer != 0);
  int64_t iteration = 0;
  if (a.optimizer == "adam") {
    torch::optim::Adam optimizer(module->parameters(), torch::optim::AdamOptions(0.01));
    iteration = checkpoint_and_train(layout, layout_optimizer, optimizer, params, targets, a, c, comm);
  } else if (a.optimizer == "adamw") {
    torch::optim::AdamW optimizer(module->parameters(), torch::optim::AdamWOptions(0.01));
    iteration = checkpoint_and_train(layout, layout_optimizer, optimizer, params, targets, a, c, comm);
  } else {
    torch::optim::SGD optimizer(module->parameters(), torch::optim::SGDOptions(0.1));
    iteration = checkpoint_and_train(layout, layout_optimizer, optimizer, params, targets, a, c, comm);
  }
  comm.barrier();
  if (comm.rank() == 0) {
    fmt::print("{}: tp={} pp={} dp={} ep={} ({} ranks), {} local layers on rank 0, iteration {}{}{}\n", a.model, a.tp,
               a.pp, a.dp, a.ep, comm.size(), local_layers, iteration,
               a.load_dir.empty() ? "" : ", loaded " + a.load_dir, a.save_dir.empty() ? "" : ", saved " + a.save_dir);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a small GPT trained under any (tp, pp, dp, ep) mesh, checkpointed through the generated layout API"};
  Args a;
  app.add_option("--model", a.model, "gpt or moe")->check(CLI::IsMember({"gpt", "moe"}));
  app.add_option("--tp", a.tp, "tensor-parallel size");
  app.add_option("--pp", a.pp, "pipeline-parallel size");
  app.add_option("--dp", a.dp, "data-parallel size");
  app.add_option("--ep", a.ep, "expert-parallel size (moe)");
  app.add_option("--layers", a.layers, "decoder layers");
  app.add_option("--hidden", a.hidden, "hidden size");
  app.add_option("--heads", a.heads, "attention heads");
  app.add_option("--kv-groups", a.kv_groups, "key/value groups (0: = heads)");
  app.add_option("--ffn", a.ffn, "MLP (expert) hidden size");
  app.add_option("--vocab", a.vocab, "padded vocabulary size");
  app.add_option("--experts", a.experts, "experts per layer (moe)");
  app.add_option("--tie-embeddings", a.tie_embeddings, "1: the output layer reuses the embedding (gpt)");
  app.add_option("--steps", a.steps, "training steps (after --load, before --save)");
  app.add_option("--optimizer", a.optimizer, "sgd, adam or adamw")->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("--distributed-optimizer", a.distributed_optimizer,
                 "1: each dp rank saves its ZeRO-1 flat range of the optimizer state; 0: full state");
  app.add_option("--save", a.save_dir, "save a checkpoint here at the end");
  app.add_option("--load", a.load_dir, "load this checkpoint first");
  app.add_option("--load-mapping", a.load_mapping,
                 "--load is in another naming (a Hugging Face directory): read it through this mapping of the "
                 "schema (llama for gpt, mixtral for moe); weights only");
  app.add_option("--save-mapping", a.save_mapping,
                 "--save writes Hugging Face safetensors under this mapping of the schema, from every rank; "
                 "weights only");
  app.add_flag("--overwrite", a.overwrite, "replace a checkpoint already in --save (after the new one is committed)");
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(1);
    auto comm = communicator_from_env();
    const int64_t world = a.tp * a.pp * a.dp * a.ep;
    if (world != comm->size()) {
      throw Error(fmt::format("tp*pp*dp*ep = {} but {} ranks were started", world, comm->size()));
    }
    if (a.model == "gpt" && a.ep != 1) throw Error("--ep needs --model moe");
    const Coords c = coords_of(comm->rank(), a);
    const std::optional<int64_t> kv = a.kv_groups > 0 ? std::optional<int64_t>(a.kv_groups) : std::nullopt;
    if (a.model == "gpt") {
      gpt::Model layout({a.hidden, a.ffn, a.vocab, a.layers, a.heads, kv, std::nullopt, a.tie_embeddings},
                        {{c.tp, a.tp}, {c.pp, a.pp}, {c.dp, a.dp}});
      return run<gpt::Model, gpt::Adam>(layout, a, c, *comm);
    }
    moe::Model layout({a.hidden, a.ffn, a.vocab, a.layers, a.heads, kv, std::nullopt, a.experts},
                      {{c.tp, a.tp}, {c.pp, a.pp}, {c.ep, a.ep}, {c.dp, a.dp}});
    return run<moe::Model, moe::Adam>(layout, a, c, *comm);
  } catch (const std::exception& e) {
    std::cerr << "distckpt-gpt-trainer: " << e.what() << '\n';
    return 1;
  }
}
