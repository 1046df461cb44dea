#include "support/python_tensors.h"

#include <gtest/gtest.h>

#include "distckpt/distckpt.h"
#include "support/ranks.h"

namespace distckpt {

const std::vector<PythonTensor>& python_tensors() {
  static const std::vector<PythonTensor> tensors = {
      {"model.embed_tokens.weight", {40, 16}, at::kFloat},
      {"model.layers.0.self_attn.q_proj.weight", {16, 16}, at::kBFloat16},
      {"model.layers.0.mlp.up_proj.weight", {24, 16}, at::kHalf},
      {"model.norm.weight", {16}, at::kDouble},
      {"positions", {3, 5}, at::kLong},
      {"counts", {7}, at::kInt},
      {"small", {2, 2}, at::kShort},
      {"signed", {9}, at::kChar},
      {"bytes", {11}, at::kByte},
      {"mask", {4, 3}, at::kBool},
      {"step", {}, at::kLong},
      {"empty", {0, 4}, at::kFloat},
  };
  return tensors;
}

at::Tensor python_value(int64_t k, const Shape& shape, at::ScalarType dtype) {
  return at::arange(numel(shape), at::kDouble).mul(0.25).sub(static_cast<double>(k)).reshape(shape).to(dtype);
}

void expect_two_ranks_load_python_shards(const std::string& path) {
  const char* rows = python_tensors()[0].name;  // [40, 16] float32
  const char* cols = python_tensors()[1].name;  // [16, 16] bfloat16
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sd = Value::dict();
    sd[rows] = ShardedTensor::from_rank_offsets(rows, at::empty({20, 16}), {{0, r, 2}});
    sd[cols] = ShardedTensor::from_rank_offsets(cols, at::empty({16, 8}, at::kBFloat16), {{1, r, 2}});
    const LoadResult out = load(sd, path, comm);
    EXPECT_TRUE(at::equal(out.state_dict.at(rows).as_tensor(), python_value(0).narrow(0, 20 * r, 20))) << path;
    EXPECT_TRUE(at::equal(out.state_dict.at(cols).as_tensor(), python_value(1).narrow(1, 8 * r, 8))) << path;
  });
}

}  // namespace distckpt
