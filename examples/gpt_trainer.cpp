// Trains a small GPT (or MoE GPT) for a few steps under any Megatron-style
// layout: (tp, cp, dp, pp) with virtual pipeline stages (vp, or an explicit
// layers-per-virtual-stage layout) and, for MoE, experts folded over
// (etp, ep, edp, pp) of the same ranks; saving and loading through the API
// generated from schema/models/{gpt,moe}.shard. No sharding code here: the
// modules hold local shards, one module per model chunk, and the generated
// Model binds them by name and knows every offset.
//
//   distckpt-launch -n 8 -- distckpt-gpt-trainer --tp 2 --pp 4 --steps 3 --save A
//   distckpt-launch -n 8 -- distckpt-gpt-trainer --tp 4 --pp 2 --vp 2 --load A --save B
//   distckpt digest A; distckpt digest B      # equal: same logical state
//   ... --model moe --tp 2 --dp 4 --etp 1 --ep 4  # 8 ranks: experts over ep 4 x edp 2
//   ... --load A --save HF --save-mapping llama  # Hugging Face files, from every rank
//   ... --load A --save D --save-format dcp      # PyTorch DCP, which torch.distributed.checkpoint loads
//   distckpt-gpt-trainer --write-mapping llama m.json  # the schema's mapping for this config, as JSON:
//   distckpt convert TORCH_DIST HF --to safetensors --map m.json  # what DCP does not record
//   ... --steps 100 --async-save-every 10 --async-save-root R  # asynchronous saves while training
//   distckpt-launch -n 6 -- distckpt-gpt-trainer --tp 2 --pp 2 --steps 6 --send-every 2 --inference-ranks 2
//       # 4 trainer ranks send their weights every 2 steps to 2 "inference" ranks of the same job
//       # (tp 2, Llama names), which check them: transfer(), no storage
//
// Every parameter starts as its slice of a deterministic global tensor, and
// the loss is elementwise (0.5 * |p - target|^2 with a global target), so
// training gives the same logical model whatever the layout.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>

#include "distckpt/distckpt.h"
#include "distckpt/layout/from_global.h"
#include "gpt.shard.h"
#include "gpt_modules.h"
#include "moe.shard.h"

namespace {

using namespace distckpt;

struct Args {
  std::string model = "gpt";
  int64_t tp = 1, cp = 1, dp = 1, pp = 1, vp = 1;
  int64_t ep = 1, etp = 0;  // etp 0: = tp (Megatron's default)
  std::vector<int64_t> pipeline_layout;
  int64_t layers = 4, hidden = 64, heads = 4, kv_groups = 0, ffn = 128, vocab = 256, experts = 4, mtp_layers = 0;
  int64_t tie_embeddings = 0, steps = 0;
  std::string optimizer = "sgd";      // sgd (stateless), adam or adamw
  int64_t distributed_optimizer = 1;  // ZeRO-1 layout of the optimizer state over dp * cp (edp for experts)
  int64_t optimizer_instances = 1;
  std::string save_dir, load_dir;
  int64_t async_save_every = 0;  // asynchronous saves during training, every N steps, under async_save_root
  std::string async_save_root;
  std::string load_mapping;                // --load reads another naming through this mapping of the schema
  std::string load_exchange = "auto";      // how a piece several ranks need reaches them (LoadExchange)
  std::string save_mapping;                // --save writes safetensors under this mapping of the schema
  std::string save_format = "distckpt";    // or dcp, dcp-1.13, torch_dist
  std::vector<std::string> write_mapping;  // NAME FILE: write the schema's mapping NAME for this config, and stop
  bool overwrite = false;
  std::string device = "cpu";   // cuda: parameters and optimizer state live on this rank's GPU
  int64_t inference_ranks = 0;  // more ranks after the trainer's, receiving its weights every send_every steps
  int64_t send_every = 0;
};

struct Coords {
  int64_t tp, cp, dp, pp;  // dense mesh
  int64_t etp, ep, edp;    // expert mesh (shares pp)
};

// Megatron's rank order: dense tp fastest, then cp, dp, pp; on the expert
// mesh of the same ranks etp fastest, then ep, edp, pp.
Coords coords_of(int rank, const Args& a) {
  Coords c{};
  int64_t r = rank;
  c.tp = r % a.tp;
  r /= a.tp;
  c.cp = r % a.cp;
  r /= a.cp;
  c.dp = r % a.dp;
  c.pp = r / a.dp;
  r = rank % (a.tp * a.cp * a.dp);  // the rank within its pipeline stage
  c.etp = r % a.etp;
  r /= a.etp;
  c.ep = r % a.ep;
  c.edp = r / a.ep;
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

// Weights sent to inference ranks: the schema's mapping of the model
// (Llama names for gpt, Mixtral's for moe), each external tensor split on
// rows over the inference ranks where they divide it, else replicated.
const char* inference_mapping(const Args& a) { return a.model == "gpt" ? "llama" : "mixtral"; }

TransferOptions send_options(const NameMapping& mapping) {
  static const std::shared_ptr<TransferPlanCache> cache = TransferPlanCache::create();  // planned at the first send
  TransferOptions options;
  options.mapping = mapping;
  options.plan_cache = cache;
  options.exchange = LoadExchange::kAuto;  // within a host, ranks read the weights out of one another's memory
  return options;
}

// An inference rank: receives the weights after every send_every steps and
// checks them. With SGD on the elementwise loss a weight after s steps is
// target + (initial - target) * 0.9^s, which the rank computes for its own
// part; the transfer itself compares every tensor's digest with the trainer's.
int run_inference(const NameMapping& mapping, const Args& a, Communicator& comm) {
  const int64_t me = comm.rank() - (comm.size() - a.inference_ranks);
  StateDict requests = Value::dict();
  std::vector<std::pair<std::string, MappedName>> mine;
  for (const MappedName& name : mapping.expand()) {
    const Shape shape = name.external_shape();
    const bool split = !shape.empty() && shape[0] % a.inference_ranks == 0;
    const int64_t parts = split ? a.inference_ranks : 1;
    Shape local = shape;
    if (!local.empty()) local[0] /= parts;
    requests[name.external] = ShardedTensor::from_rank_offsets(
        name.external, at::zeros(local),
        shape.empty() ? std::vector<RankOffset>{} : std::vector<RankOffset>{{0, split ? me : 0, parts}},
        {split ? 0 : me});
    mine.emplace_back(name.external, name);
  }
  for (int64_t step = a.send_every; step <= a.steps; step += a.send_every) {
    const TransferResult r = transfer(StateDict::dict(), requests, comm, send_options(mapping));
    double worst = 0;
    for (const auto& [external, name] : mine) {
      if (a.optimizer != "sgd") break;
      const auto region_of = [&](double salt) {
        at::Tensor t = global_value(name.key, name.key_shape, salt);
        for (size_t d = 0; d < name.region.ndim(); ++d) {
          t = t.narrow(static_cast<int64_t>(d), name.region.offset[d], name.region.length[d]);
        }
        return t.reshape(name.external_shape());
      };
      const at::Tensor target = region_of(0.5);
      const at::Tensor expected = target + (region_of(0.0) - target) * std::pow(0.9, static_cast<double>(step));
      const ShardedTensor& request = requests.at(external).as_sharded_tensor();
      at::Tensor want = expected;
      if (want.dim() > 0) want = want.narrow(0, request.global_offset[0], request.local_shape[0]);
      worst = std::max(worst, (r.state_dict.at(external).as_tensor() - want).abs().max().item<double>());
    }
    if (a.optimizer == "sgd" && worst > 1e-4) {
      throw Error(
          fmt::format("inference rank {}: weights after step {} differ from the trainer's by {}", me, step, worst));
    }
    fmt::print("inference rank {} received step {}: {} tensors{}, digests compared{}\n", me, step, mine.size(),
               a.optimizer == "sgd" ? fmt::format(", values within {:.1e} of the closed form", worst) : "",
               r.plan_reused ? " (plan reused)" : "");
  }
  comm.barrier();  // the trainer's closing one
  return 0;
}

// Runs `steps` of the elementwise loss, 0.5 * |p - target|^2.
// `before_update` runs between backward and the optimizer step (which
// changes the parameters), `after_step` once a step is complete.
template <typename Optimizer>
void train(Optimizer& optimizer, const std::vector<std::pair<std::string, at::Tensor>>& params,
           const std::vector<at::Tensor>& targets, int64_t steps, const std::function<void()>& before_update,
           const std::function<void(int64_t done)>& after_step) {
  for (int64_t step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    at::Tensor loss = torch::zeros({});
    for (size_t i = 0; i < params.size(); ++i) loss = loss + (params[i].second - targets[i]).pow(2).sum() * 0.5;
    loss.backward();
    before_update();
    optimizer.step();
    after_step(step + 1);
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
    options.exchange = parse_load_exchange(a.load_exchange);
    // Safetensors and torch.save files hold weights only (no optimizer state,
    // objects or common values, even where a conversion carried optimizer
    // tensors along): training starts over from them at iteration 0. A
    // PyTorch DCP checkpoint holds everything distckpt's does.
    const StorageFormat source = detect_storage_format(a.load_dir);
    const bool weights_source =
        !a.load_mapping.empty() || (source != StorageFormat::distckpt() && source != StorageFormat("dcp"));
    if (!a.load_mapping.empty()) {
      options.mapping = find_mapping(layout.save_options().name_mappings, a.load_mapping, "the layout schema");
    }
    if (weights_source) {
      request = weights_only(request);
      if (comm.rank() == 0) {
        fmt::print("{} holds weights only ({}): starting at iteration 0 with fresh optimizer state\n", a.load_dir,
                   source.name());
      }
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
      const std::string extra_state = "._extra_state";
      const bool is_extra_state = key.size() > extra_state.size() &&
                                  key.compare(key.size() - extra_state.size(), extra_state.size(), extra_state) == 0;
      if (!is_extra_state) {
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
    if (!weights_source) {
      if (!result.state_dict.contains("iteration")) {
        const std::string common_file = a.load_dir + "/common.fb";
        throw CheckpointError(fmt::format("the checkpoint '{}' has no common value 'iteration' (not in '{}'): it was "
                                          "not saved by this trainer. To start from its weights, convert it "
                                          "(distckpt convert {} DIR --to safetensors) and --load DIR",
                                          a.load_dir, common_file, a.load_dir),
                              common_file);
      }
      if constexpr (kStateful) layout_optimizer.load_state_dict(optimizer, result.state_dict);
      iteration = result.state_dict.at("iteration").as_int();
    }
  }
  const auto state_at = [&](int64_t at_iteration) {
    set_objects_and_common(layout, c, at_iteration);
    StateDict sd = layout.state_dict();
    if constexpr (kStateful) merge(sd, layout_optimizer.state_dict(optimizer));
    return sd;
  };
  // --async-save-every: the copy of each save overlaps the next forward and
  // backward; the wait before the optimizer step keeps the snapshot exact.
  std::optional<AsyncCallsQueue> queue;
  if (a.async_save_every > 0) {
    AsyncQueueOptions queue_options;
    queue_options.staging = AsyncStaging::kInBackground;
    queue.emplace(comm, queue_options);
  }
  const int64_t start = iteration;
  train(
      optimizer, params, targets, a.steps,
      [&] {
        if (queue) queue->wait_staged();
      },
      [&](int64_t done) {
        if (a.inference_ranks > 0 && done % a.send_every == 0) {
          const NameMapping mapping =  // a copy: save_options() is a temporary
              find_mapping(layout.save_options().name_mappings, inference_mapping(a), "the layout schema");
          set_objects_and_common(layout, c, start + done);  // the state dict wants them; only weights go
          transfer(weights_only(layout.state_dict()), StateDict::dict(), comm, send_options(mapping));
        }
        if (!queue || done % a.async_save_every != 0) return;
        const int64_t at_iteration = start + done;
        queue->save(state_at(at_iteration), fmt::format("{}/iter_{:07d}", a.async_save_root, at_iteration),
                    layout.save_options());
        queue->maybe_finalize();
      });
  if (queue) queue->close();
  iteration += a.steps;
  if (!a.save_dir.empty()) {
    StateDict sd = state_at(iteration);
    SaveOptions options = layout.save_options();
    options.overwrite = a.overwrite;
    if (!a.save_mapping.empty()) {
      SafetensorsWriteOptions knobs;
      knobs.mapping = find_mapping(options.name_mappings, a.save_mapping, "the layout schema");
      options.format = safetensors_format(std::move(knobs));
    } else if (a.save_format != "distckpt") {
      DcpWriteOptions knobs;
      knobs.naming =
          a.save_format == "dcp-1.13" ? DcpWriteOptions::Naming::kTorch113 : DcpWriteOptions::Naming::kTorch2;
      knobs.torch_dist = a.save_format == "torch_dist";
      options.format = dcp_format(knobs);
    }
    save(sd, a.save_dir, comm, options);
  }
  return iteration;
}

int64_t local_rank() {
  const char* value = std::getenv("LOCAL_RANK");
  return value != nullptr && *value != '\0' ? std::atoll(value) : 0;
}

// The config parameters both schemas share.
template <typename Config>
Config common_config(const Args& a) {
  Config config;
  config.hidden = a.hidden;
  config.ffn = a.ffn;
  config.vocab = a.vocab;
  config.layers = a.layers;
  config.heads = a.heads;
  if (a.kv_groups > 0) config.kv_groups = a.kv_groups;
  config.vp = a.vp;
  config.pipeline_layout = a.pipeline_layout;
  config.optimizer_instances = a.optimizer_instances;
  return config;
}

template <typename Model, typename LayoutOptimizer>
int run(Model& layout, const Args& a, const Coords& c, Communicator& comm) {
  if (comm.rank() >= comm.size() - a.inference_ranks) {
    return run_inference(find_mapping(layout.save_options().name_mappings, inference_mapping(a), "the layout schema"),
                         a, comm);
  }
  if (!a.write_mapping.empty()) {
    const SaveOptions options = layout.save_options();
    const NameMapping& mapping = find_mapping(options.name_mappings, a.write_mapping[0], "the layout schema");
    if (comm.rank() == 0) {
      std::ofstream out(a.write_mapping[1], std::ios::binary | std::ios::trunc);
      out << mapping.to_json();
      if (!out.flush()) throw Error(fmt::format("--write-mapping: cannot write '{}'", a.write_mapping[1]));
    }
    return 0;
  }
  int64_t local_experts = -1;
  if constexpr (std::is_same_v<Model, moe::Model>) {
    local_experts = layout.decoder_layers_local_count() > 0 ? layout.decoder_layers(0).mlp_experts_local_count() : 0;
  }
  const auto& cfg = layout.config();
  const example::Dims dims{cfg.hidden,   cfg.ffn,   cfg.vocab, cfg.heads, cfg.kv_groups,
                           cfg.head_dim, a.experts, a.tp,      a.etp};
  // Ranks share the visible GPUs round-robin (LOCAL_RANK as torchrun sets it).
  const at::Device device =
      a.device == "cuda"
          ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank() % torch::cuda::device_count()))
          : at::Device(at::kCPU);
  // One module per model chunk (virtual pipeline stage), as an interleaved schedule runs them.
  std::vector<example::Gpt> chunks;
  const int64_t last_chunk = layout.chunk_count() - 1;
  for (int64_t k = 0; k <= last_chunk; ++k) {
    const bool first = c.pp == 0 && k == 0, last = c.pp == a.pp - 1 && k == last_chunk;
    chunks.emplace_back(dims, layout.decoder_layers_chunk(k).second, local_experts, first, last, a.mtp_layers);
    chunks.back()->to(device);  // before binding: the schema's builders keep these tensors
    layout.bind_chunk(k, chunks.back()->named_parameters());
  }

  // Initial values and training targets from the global model; names with the chunk prefix.
  const StateDict meta = layout.metadata_state_dict();
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<at::Tensor> targets;
  {
    torch::NoGradGuard no_grad;
    for (int64_t k = 0; k <= last_chunk; ++k) {
      for (auto& p : chunks[k]->named_parameters()) {
        const std::string name = distckpt::layout::chunk_prefix(k) + p.key();
        p.value().copy_(local_value(meta.at(name), 0.0));
        targets.push_back(local_value(meta.at(name), 0.5).to(device));
        params.emplace_back(name, p.value());
      }
    }
  }
  std::vector<at::Tensor> parameters;
  for (const auto& [name, tensor] : params) parameters.push_back(tensor);

  const LayoutOptimizer layout_optimizer(layout, a.distributed_optimizer != 0);
  int64_t iteration = 0;
  if (a.optimizer == "adam") {
    torch::optim::Adam optimizer(parameters, torch::optim::AdamOptions(0.01));
    iteration = checkpoint_and_train(layout, layout_optimizer, optimizer, params, targets, a, c, comm);
  } else if (a.optimizer == "adamw") {
    torch::optim::AdamW optimizer(parameters, torch::optim::AdamWOptions(0.01));
    iteration = checkpoint_and_train(layout, layout_optimizer, optimizer, params, targets, a, c, comm);
  } else {
    torch::optim::SGD optimizer(parameters, torch::optim::SGDOptions(0.1));
    iteration = checkpoint_and_train(layout, layout_optimizer, optimizer, params, targets, a, c, comm);
  }
  comm.barrier();
  if (comm.rank() == 0) {
    fmt::print("{}: tp={} cp={} dp={} pp={} vp={}{} ({} ranks), {} local layers on rank 0, iteration {}{}{}\n", a.model,
               a.tp, a.cp, a.dp, a.pp, layout.chunk_count(),
               a.model == "moe" ? fmt::format(", experts etp={} ep={}", a.etp, a.ep) : "", comm.size(),
               layout.decoder_layers_local_count(), iteration, a.load_dir.empty() ? "" : ", loaded " + a.load_dir,
               a.save_dir.empty() ? "" : ", saved " + a.save_dir);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "a small GPT trained under any Megatron-style layout (tp, cp, dp, pp, vp; MoE experts folded over etp, ep, "
      "edp), checkpointed through the generated layout API"};
  Args a;
  app.add_option("--model", a.model, "gpt or moe")->check(CLI::IsMember({"gpt", "moe"}));
  app.add_option("--tp", a.tp, "tensor-parallel size");
  app.add_option("--cp", a.cp, "context-parallel size (parameters replicated over it)");
  app.add_option("--dp", a.dp, "data-parallel size");
  app.add_option("--pp", a.pp, "pipeline-parallel size");
  app.add_option("--vp", a.vp, "virtual pipeline stages per stage (interleaved schedule)");
  app.add_option("--pipeline-layout", a.pipeline_layout,
                 "layers per virtual stage, in virtual-stage order (pp * vp counts; e.g. 1,3,3,1)")
      ->delimiter(',');
  app.add_option("--ep", a.ep, "expert-parallel size (moe), carved out of tp * cp * dp");
  app.add_option("--etp", a.etp, "expert tensor-parallel size (moe; default: --tp)");
  app.add_option("--mtp-layers", a.mtp_layers, "multi-token-prediction depth (moe)");
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
                 "1: each dp x cp rank (edp rank for experts) saves its ZeRO-1 flat range of the optimizer state; "
                 "0: full state");
  app.add_option("--optimizer-instances", a.optimizer_instances,
                 "distributed optimizer instances: each shards the state, which is replicated across them");
  app.add_option("--save", a.save_dir, "save a checkpoint here at the end");
  app.add_option("--async-save-every", a.async_save_every,
                 "also save asynchronously every N steps, into --async-save-root/iter_NNNNNNN (the copy runs "
                 "during the next forward and backward)");
  app.add_option("--async-save-root", a.async_save_root, "where --async-save-every saves");
  app.add_option("--load", a.load_dir, "load this checkpoint first");
  app.add_option("--load-exchange", a.load_exchange,
                 "how a stored piece several ranks need reaches them: auto (read once per host), none (each rank "
                 "reads it), broadcast, all_gather");
  app.add_option("--load-mapping", a.load_mapping,
                 "--load is in another naming (a Hugging Face directory): read it through this mapping of the "
                 "schema (llama for gpt, mixtral for moe); weights only");
  app.add_option("--save-mapping", a.save_mapping,
                 "--save writes Hugging Face safetensors under this mapping of the schema, from every rank; "
                 "weights only");
  app.add_option("--write-mapping", a.write_mapping,
                 "NAME FILE: write the schema's mapping NAME (llama, mixtral) for this model's config as JSON "
                 "(what `distckpt convert --map FILE` reads for a checkpoint that records no mappings), then stop")
      ->expected(2);
  app.add_option("--save-format", a.save_format,
                 "distckpt, dcp (PyTorch's distributed checkpoint, 2.x module names), dcp-1.13 (torch 1.13's) or "
                 "torch_dist (Megatron-Core's)")
      ->check(CLI::IsMember({"distckpt", "dcp", "dcp-1.13", "torch_dist"}));
  app.add_option("--device", a.device, "where parameters and optimizer state live: cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--overwrite", a.overwrite, "replace a checkpoint already in --save (after the new one is committed)");
  app.add_option("--inference-ranks", a.inference_ranks,
                 "ranks after the trainer's that receive its weights every --send-every steps (transfer, no "
                 "storage) in Hugging Face names (llama for gpt, mixtral for moe), split over them, and check them");
  app.add_option("--send-every", a.send_every, "send the weights to the inference ranks every N steps");
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(1);
    auto comm = communicator_from_env();
    if (a.etp == 0) a.etp = a.tp;
    const int64_t world = a.tp * a.cp * a.dp * a.pp;
    if (world + a.inference_ranks != comm->size()) {
      throw Error(fmt::format("tp*cp*dp*pp = {} and {} inference ranks, but {} ranks were started", world,
                              a.inference_ranks, comm->size()));
    }
    if ((a.inference_ranks > 0) != (a.send_every > 0)) throw Error("--inference-ranks and --send-every go together");
    if (a.inference_ranks > 0 && (!a.save_dir.empty() || !a.load_dir.empty() || a.async_save_every > 0)) {
      throw Error("--inference-ranks: the job's ranks are not all trainers, so it neither saves nor loads");
    }
    if (a.model == "gpt" && (a.ep != 1 || a.mtp_layers != 0)) throw Error("--ep and --mtp-layers need --model moe");
    if (a.async_save_every > 0 && a.async_save_root.empty()) throw Error("--async-save-every needs --async-save-root");
    if (a.device == "cuda" && !torch::cuda::is_available()) {
      throw Error("--device cuda: no GPU is visible, or LibTorch was built without CUDA");
    }
    // Parallel folding: the expert mesh (etp, ep, edp) decomposes the same tp * cp * dp ranks of a stage.
    const int64_t stage_ranks = a.tp * a.cp * a.dp;
    if (stage_ranks % (a.etp * a.ep) != 0) {
      throw Error(
          fmt::format("etp*ep = {} does not divide tp*cp*dp = {}: the experts must fold into the ranks of a "
                      "pipeline stage",
                      a.etp * a.ep, stage_ranks));
    }
    const int64_t edp = stage_ranks / (a.etp * a.ep);
    const Coords c = coords_of(static_cast<int>(std::min<int64_t>(comm->rank(), world - 1)), a);  // inference: any
    if (a.model == "gpt") {
      gpt::Config config = common_config<gpt::Config>(a);
      config.tie_embeddings = a.tie_embeddings;
      gpt::Model layout(config, {{c.tp, a.tp}, {c.cp, a.cp}, {c.dp, a.dp}, {c.pp, a.pp}});
      return run<gpt::Model, gpt::Adam>(layout, a, c, *comm);
    }
    moe::Config config = common_config<moe::Config>(a);
    config.experts = a.experts;
    config.mtp_layers = a.mtp_layers;
    moe::Model layout(
        config, {{c.tp, a.tp}, {c.cp, a.cp}, {c.dp, a.dp}, {c.pp, a.pp}, {c.etp, a.etp}, {c.ep, a.ep}, {c.edp, edp}});
    return run<moe::Model, moe::Adam>(layout, a, c, *comm);
  } catch (const std::exception& e) {
    std::cerr << "distckpt-gpt-trainer: " << e.what() << '\n';
    return 1;
  }
}
