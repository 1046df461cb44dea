// Peak memory of loading Adam state through the generated GPT layout.
//   optimizer_memory_bench --save DIR   one rank: parameters + Adam state after one step
//   optimizer_memory_bench --load DIR   a fresh process: parameters allocated, optimizer
//                                       without state; loads both; reports the peak
// The bound to meet: peak growth during the load <= local optimizer state +
// the largest single tensor (loading reads straight into the destination
// tensors, merges fused tensors one at a time, and uses bounded scratch).
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/optim/adam.h>

#include <CLI/CLI.hpp>
#include <fstream>

#include "distckpt/distckpt.h"
#include "gpt.shard.h"

namespace {

using namespace distckpt;

// Resident set and its high-water mark (bytes) from /proc/self/status.
std::pair<int64_t, int64_t> rss_and_peak() {
  std::ifstream status("/proc/self/status");
  std::string line;
  int64_t rss = 0, peak = 0;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stoll(line.substr(6)) * 1024;
    if (line.rfind("VmHWM:", 0) == 0) peak = std::stoll(line.substr(6)) * 1024;
  }
  return {rss, peak};
}

void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"peak memory of loading optimizer state"};
  std::string save_dir, load_dir;
  int64_t hidden = 1024, layers = 8, vocab = 32000;
  app.add_option("--save", save_dir);
  app.add_option("--load", load_dir);
  app.add_option("--hidden", hidden);
  app.add_option("--layers", layers);
  app.add_option("--vocab", vocab);
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  auto comm = make_single_process_communicator();

  gpt::Config config;
  config.hidden = hidden;
  config.ffn = 4 * hidden;
  config.vocab = vocab;
  config.layers = layers;
  config.heads = 16;
  config.kv_groups = 4;
  gpt::Model model(config, {{0, 1}, {0, 1}, {0, 1}, {0, 1}});
  std::vector<std::pair<std::string, at::Tensor>> params;
  int64_t param_bytes = 0, largest = 0;
  // Parameters of this rank's local shapes, read off the layout (a fused tensor's parts stack on dim 0).
  const StateDict meta = model.metadata_state_dict();
  for (const auto& [name, entry] : meta.as_dict()) {
    if (entry.kind() == Kind::kShardedObject) continue;
    Shape shape;
    if (entry.kind() == Kind::kShardedTensor) {
      shape = entry.as_sharded_tensor().local_shape;
    } else {
      const Value parts = entry.as_factory().build_subtree();
      for (const auto& [part, piece] : parts.as_dict()) {
        const Shape s = piece.as_sharded_tensor().local_shape;
        if (shape.empty())
          shape = s;
        else
          shape[0] += s[0];
      }
    }
    at::Tensor p = at::randn(shape).requires_grad_(true);
    param_bytes += static_cast<int64_t>(p.nbytes());
    largest = std::max<int64_t>(largest, static_cast<int64_t>(p.nbytes()));
    params.emplace_back(name, p);
  }
  model.bind(params);
  for (int64_t l = 0; l < model.decoder_layers_local_count(); ++l) {
    model.decoder_layers(l).self_attention_core_attention__extra_state("x");
  }
  model.iteration(1).consumed_samples(0);
  std::vector<at::Tensor> tensors;
  for (auto& [name, p] : params) tensors.push_back(p);
  torch::optim::Adam optimizer(tensors, torch::optim::AdamOptions(1e-3));
  const gpt::Adam layout_optimizer(model);

  if (!save_dir.empty()) {
    for (auto& t : tensors) t.mutable_grad() = t.detach().clone();
    optimizer.step();
    StateDict sd = model.state_dict();
    merge(sd, layout_optimizer.state_dict(optimizer));
    save(sd, save_dir, *comm, model.save_options());
    fmt::print("saved {}: parameters {:.1f} MB, Adam state {:.1f} MB\n", save_dir, param_bytes / 1e6,
               2 * param_bytes / 1e6);
    return 0;
  }
  const auto [rss_before, peak_unused] = rss_and_peak();
  (void)peak_unused;
  reset_peak();
  {
    StateDict request = model.state_dict();
    merge(request, layout_optimizer.load_request(optimizer));
    LoadResult result = load(request, load_dir, *comm);
    layout_optimizer.load_state_dict(optimizer, result.state_dict);
  }
  const auto [rss_after, peak] = rss_and_peak();
  const int64_t state_bytes = 2 * param_bytes;  // exp_avg + exp_avg_sq, now held by the optimizer
  const int64_t growth = peak - rss_before;
  fmt::print(
      "| parameters | Adam state (local) | largest tensor | RSS before load | peak during load | growth | "
      "bound (state + largest) | growth / bound |\n|---|---|---|---|---|---|---|---|\n");
  fmt::print("| {:.1f} MB | {:.1f} MB | {:.1f} MB | {:.1f} MB | {:.1f} MB | {:.1f} MB | {:.1f} MB | {:.2f} |\n",
             param_bytes / 1e6, state_bytes / 1e6, largest / 1e6, rss_before / 1e6, peak / 1e6, growth / 1e6,
             (state_bytes + largest) / 1e6, static_cast<double>(growth) / static_cast<double>(state_bytes + largest));
  fmt::print("RSS after load {:.1f} MB (the optimizer now holds its state)\n", rss_after / 1e6);
  return growth <= state_bytes + largest ? 0 : 1;
}
