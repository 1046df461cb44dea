// The state distckpt_fault_probe saves and loads, shared with the tests that
// prepare a checkpoint in-process instead of launching a job for it.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

#include "distckpt/distckpt.h"

// Each rank holds its rows of "w" (about `mb` MiB in all) and every rank a
// replica of "bias"; the values depend only on the seed and the rank.
inline distckpt::StateDict fault_state(int rank, int world, int64_t seed, int64_t mb, bool with_data) {
  using distckpt::ShardedTensor;
  constexpr int64_t kColumns = 256;
  const auto values = [](int64_t s, at::IntArrayRef shape) {
    at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(s));
    return at::rand(shape, gen);
  };
  const int64_t rows = std::max<int64_t>(1, mb * (int64_t{1} << 20) / (kColumns * 4) / world);
  at::Tensor w = values(1000 * seed + rank, {rows, kColumns});
  at::Tensor bias = values(seed, {kColumns});
  distckpt::StateDict sd = distckpt::Value::dict();
  sd["w"] = ShardedTensor::from_rank_offsets("w", with_data ? w : at::zeros_like(w), {{0, rank, world}});
  sd["bias"] = ShardedTensor::from_rank_offsets("bias", with_data ? bias : at::zeros_like(bias), {}, {rank});
  sd["seed"] = seed;
  return sd;
}
