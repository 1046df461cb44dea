// The benchmarks' model: GPT-like layers split on rows over the ranks, and
// the layouts it is saved and loaded under.
#pragma once

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/distckpt.h"

namespace bench {

using namespace distckpt;

struct Model {
  std::vector<std::pair<std::string, at::Tensor>> local;  // key -> this rank's rows
  uint64_t local_bytes = 0;
};

// GPT-like layers (qkv, proj, fc1, fc2) of width `hidden`, every tensor split
// on rows over the ranks, until the global state reaches `total_mb`.
inline Model make_model(int64_t total_mb, int64_t hidden, int world) {
  Model m;
  const std::vector<std::pair<std::string, int64_t>> per_layer{{"self_attention.linear_qkv.weight", 3 * hidden},
                                                               {"self_attention.linear_proj.weight", hidden},
                                                               {"mlp.linear_fc1.weight", 4 * hidden},
                                                               {"mlp.linear_fc2.weight", hidden}};
  const uint64_t target = static_cast<uint64_t>(total_mb) << 20;
  uint64_t global_bytes = 0;
  for (int layer = 0; global_bytes < target; ++layer) {
    for (const auto& [name, rows] : per_layer) {
      const int64_t cols = name == "mlp.linear_fc2.weight" ? 4 * hidden : hidden;
      at::Tensor t = at::rand({rows / world, cols});
      m.local.emplace_back(fmt::format("decoder.layers.{}.{}", layer, name), t);
      m.local_bytes += t.nbytes();
      global_bytes += static_cast<uint64_t>(rows * cols) * 4;
    }
  }
  return m;
}

// The saving layout (rows), with the model's tensors.
inline StateDict saved_layout(const Model& m, int rank, int world) {
  StateDict sd = Value::dict();
  for (const auto& [key, t] : m.local) sd[key] = ShardedTensor::from_rank_offsets(key, t, {{0, rank, world}});
  return sd;
}

// Destinations a resumed trainer already has (allocated and touched once):
// the same rows, or a column split into max(world, 2) parts.
inline StateDict load_layout(const Model& m, int rank, int world, bool columns) {
  StateDict sd = Value::dict();
  for (const auto& [key, t] : m.local) {
    if (!columns) {
      sd[key] = ShardedTensor::from_rank_offsets(key, at::zeros_like(t), {{0, rank, world}});
      continue;
    }
    const int64_t rows = t.size(0) * world, cols = t.size(1);
    const int64_t parts = std::max(world, 2);
    List pieces;
    for (int64_t p = rank; p < parts; p += world) {
      pieces.push_back(ShardedTensor::from_rank_offsets(key, at::zeros({rows, cols / parts}), {{1, p, parts}}));
    }
    sd[key] = Value(std::move(pieces));
  }
  return sd;
}

}  // namespace bench
