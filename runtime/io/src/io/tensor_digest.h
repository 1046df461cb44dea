// The layout-independent digest of a tensor: the sum, modulo 2^64, of one
// 64-bit hash per element, of its row-major index in the global tensor and
// its bytes. A sum does not depend on the order its terms arrive in, so the
// digest of a tensor is the sum of the digests of any disjoint parts that
// cover it: the ranks of any mesh (or the windows of a stream) each digest
// what they hold and the sums meet, without the tensor ever being whole in
// one place. `distckpt digest` prints it; a transfer compares it between
// sources and destinations.
//
// The terms are as strong as splitmix64's finalizer: a changed element or
// two swapped ones change the digest except with probability ~2^-64; it is
// a check against accidents (a byte flipped in flight, a part that never
// arrived), not a cryptographic hash.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>

#include "distckpt/core/box.h"

namespace distckpt::io {

// The digest of `count` consecutive elements of `element_size` bytes at
// `data`, the first of which has row-major index `first_index`
// in its tensor.
uint64_t digest_run(const void* data, uint64_t count, size_t element_size, uint64_t first_index);

// The digest of `values` (a CPU tensor of sizes region.length, any strides),
// the elements of `region` of a tensor of `global_shape`.
uint64_t digest_region(const at::Tensor& values, const Box& region, const Shape& global_shape);

// Which elements a set of parts covers, as sums over their row-major
// indices i of i and of i * i (mod 2^64): parts that cover a tensor once
// sum to the whole tensor's, while a part missing or held twice changes
// them (short of a contrived coincidence). Computed per row in closed form.
struct PlaceSums {
  uint64_t elements = 0, indices = 0, squares = 0;
  PlaceSums& operator+=(const PlaceSums& o);
  bool operator==(const PlaceSums& o) const;
};
PlaceSums place_sums(const Box& region, const Shape& global_shape);

}  // namespace distckpt::io
