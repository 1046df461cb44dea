// Saves a checkpoint through the generated tiny::Model on one process, loads
// it back without a model (metadata_state_dict) and checks every value.
// Usage: outside_project CKPT_DIR   (CKPT_DIR must not exist yet)
#include <ATen/ATen.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>  // per-operator header: much faster to compile than ATen.h
#include <distckpt/distckpt.h>

#include <cstdio>
#include <exception>
#include <string>

#include "folded.shard.h"
#include "tiny.shard.h"

namespace {

// The generated API of the large-scale constructs: two model chunks on this
// rank (stage 1 of pp 2, vp 2), experts on the second mesh.
bool check_folded() {
  folded::Config config;
  config.layers = 8;
  config.width = 4;
  config.experts = 2;
  config.vp = 2;
  config.counts = {1, 2, 3, 2};  // virtual stages 0..3: stage 1 holds virtual stages 1 and 3
  // 4 ranks: tp 2 x dp 1 x pp 2 = ep 2 x edp 1 x pp 2; this rank: tp 1, ep 1, pp 1.
  folded::Model model(config, {{1, 2}, {0, 1}, {1, 2}, {1, 2}, {0, 1}});
  const auto second = model.layers_chunk(1);
  return model.chunk_count() == 2 && model.layers_local_count() == 4 && model.layers_chunk(0).second == 2 &&
         second.first == 2 && second.second == 2 && model.layers(0).global_index() == 1 &&
         model.layers(2).global_index() == 6 && model.layers(0).experts_local_count() == 1 &&
         model.head_local_count() == 1 && model.metadata_state_dict().contains("model1.head.0.proj");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CKPT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    if (!check_folded()) {
      std::fprintf(stderr, "outside project: the folded layout's generated API gave unexpected chunks\n");
      return 1;
    }
    auto comm = distckpt::make_single_process_communicator();

    tiny::Config config;
    config.rows = 4;
    config.cols = 3;
    tiny::Mesh mesh;
    mesh.tp = {0, 1};  // rank 0 of tp 1: this process holds the whole tensor
    tiny::Model model(config, mesh);

    const at::Tensor w = at::arange(12, at::kFloat).reshape({4, 3});
    model.w(w).step(42);
    distckpt::save(model.state_dict(), dir, *comm, model.save_options());

    // Load with only the layout's description: tensors are allocated by load().
    const distckpt::LoadResult result = distckpt::load(model.metadata_state_dict(), dir, *comm);
    const at::Tensor loaded = result.state_dict.at("w").as_tensor();
    const int64_t step = result.state_dict.at("step").as_int();
    if (!loaded.equal(w)) {
      std::fprintf(stderr, "outside project: tensor w differs after load\n");
      return 1;
    }
    if (step != 42) {
      std::fprintf(stderr, "outside project: step is %lld after load, expected 42\n", static_cast<long long>(step));
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outside project: %s\n", e.what());
    return 1;
  }
  std::printf("outside project OK\n");
  return 0;
}
