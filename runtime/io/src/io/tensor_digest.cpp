#include "io/tensor_digest.h"

#include <cstring>
#include <vector>

#include "io/checksum.h"
#include "io/digest_kernels.h"

namespace distckpt::io {

uint64_t digest_run(const void* data, uint64_t count, size_t element_size, uint64_t first_index) {
  using digest_kernels::kOrigin;
  using digest_kernels::kStep;
  if (element_size == 1 || element_size == 2 || element_size == 4 || element_size == 8) {
    static const digest_kernels::SumTerms fastest = digest_kernels::available().back().sum;
    return fastest(data, count, element_size, first_index);
  }
  // Wider elements (complex128): each one's bytes hashed first.
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t sum = 0;
  for (uint64_t i = 0; i < count; ++i) {
    sum += digest_kernels::term(xxh3(p + i * element_size, element_size), (first_index + i) * kStep + kOrigin);
  }
  return sum;
}

uint64_t digest_region(const at::Tensor& values, const Box& region, const Shape& global_shape) {
  const at::Tensor dense = values.contiguous();  // a view when it already is
  const auto* data = static_cast<const uint8_t*>(dense.data_ptr());
  const auto element = static_cast<size_t>(dense.element_size());
  const size_t nd = region.ndim();
  if (nd == 0) return dense.numel() == 0 ? 0 : digest_run(data, 1, element, 0);
  if (region.empty()) return 0;
  const Shape strides = contiguous_strides(global_shape);
  const auto row = static_cast<uint64_t>(region.length[nd - 1]);
  std::vector<int64_t> at(nd - 1, 0);  // over the axes before the last, last fastest
  uint64_t sum = 0;
  for (uint64_t done = 0, total = static_cast<uint64_t>(region.numel()); done < total; done += row) {
    uint64_t first = static_cast<uint64_t>(region.offset[nd - 1]);
    for (size_t d = 0; d + 1 < nd; ++d) first += static_cast<uint64_t>((region.offset[d] + at[d]) * strides[d]);
    sum += digest_run(data + done * element, row, element, first);
    for (size_t d = nd - 1; d-- > 0;) {
      if (++at[d] < region.length[d]) break;
      at[d] = 0;
    }
  }
  return sum;
}

PlaceSums& PlaceSums::operator+=(const PlaceSums& o) {
  elements += o.elements;
  indices += o.indices;
  squares += o.squares;
  return *this;
}

bool PlaceSums::operator==(const PlaceSums& o) const {
  return elements == o.elements && indices == o.indices && squares == o.squares;
}

PlaceSums place_sums(const Box& region, const Shape& global_shape) {
  using Wide = unsigned __int128;  // the products before their division are exact
  PlaceSums sums;
  const auto add_run = [&](uint64_t first, uint64_t count) {
    const Wide s = first, n = count;
    sums.elements += count;
    sums.indices += static_cast<uint64_t>(n * s + n * (n - 1) / 2);
    sums.squares += static_cast<uint64_t>(n * s * s + s * n * (n - 1) + (n - 1) * n * (2 * n - 1) / 6);
  };
  const size_t nd = region.ndim();
  if (nd == 0) {
    add_run(0, 1);
    return sums;
  }
  if (region.empty()) return sums;
  const Shape strides = contiguous_strides(global_shape);
  const auto row = static_cast<uint64_t>(region.length[nd - 1]);
  std::vector<int64_t> at(nd - 1, 0);
  for (uint64_t done = 0, total = static_cast<uint64_t>(region.numel()); done < total; done += row) {
    uint64_t first = static_cast<uint64_t>(region.offset[nd - 1]);
    for (size_t d = 0; d + 1 < nd; ++d) first += static_cast<uint64_t>((region.offset[d] + at[d]) * strides[d]);
    add_run(first, row);
    for (size_t d = nd - 1; d-- > 0;) {
      if (++at[d] < region.length[d]) break;
      at[d] = 0;
    }
  }
  return sums;
}

}  // namespace distckpt::io
