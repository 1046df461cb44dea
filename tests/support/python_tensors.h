// The tensors tests/interop/write_safetensors.py writes (and
// write_torch_save.py's state.pt holds): their names, shapes and dtypes in
// its order, and the values it gives the k-th of them.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "distckpt/core/box.h"

namespace distckpt {

struct PythonTensor {
  const char* name;
  Shape shape;
  at::ScalarType dtype;
};
const std::vector<PythonTensor>& python_tensors();

// write_safetensors.value(k, shape, dtype).
at::Tensor python_value(int64_t k, const Shape& shape, at::ScalarType dtype);
inline at::Tensor python_value(size_t k) {
  const PythonTensor& t = python_tensors().at(k);
  return python_value(static_cast<int64_t>(k), t.shape, t.dtype);
}

// Two ranks load the first two tensors from `path` (any format load()
// reads), the first split by rows and the second by columns, and each gets
// its half of the values.
void expect_two_ranks_load_python_shards(const std::string& path);

}  // namespace distckpt
