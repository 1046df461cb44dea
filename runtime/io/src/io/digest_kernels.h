// The digest's terms (io/tensor_digest.h) summed over a run of 1-, 2-, 4-
// or 8-byte elements, in every form this CPU runs: the portable one and,
// on x86-64, AVX2 and AVX-512 ones that hash 4 or 8 elements at once. All
// give the same sums, bit for bit (tests compare them); a transfer's check
// hashes every byte twice, so the fastest one decides what it costs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace distckpt::io::digest_kernels {

constexpr uint64_t kStep = 0x9e3779b97f4a7c15ull;  // the place of element i is i * kStep + kOrigin
constexpr uint64_t kOrigin = 0x632be59bd9b4e019ull;
constexpr uint64_t kMix1 = 0xbf58476d1ce4e5b9ull;  // splitmix64's finalizer
constexpr uint64_t kMix2 = 0x94d049bb133111ebull;

// splitmix64's finalizer over an element's bits mixed with its place.
inline uint64_t term(uint64_t bits, uint64_t place) {
  uint64_t x = bits ^ place;
  x = (x ^ (x >> 30)) * kMix1;
  x = (x ^ (x >> 27)) * kMix2;
  return x ^ (x >> 31);
}

// The sum of the terms of `count` elements of `element_size` (1, 2, 4 or
// 8) bytes at `data` (any alignment), the first of index `first_index`.
using SumTerms = uint64_t (*)(const void* data, uint64_t count, size_t element_size, uint64_t first_index);

struct Kernel {
  const char* name;
  SumTerms sum;
};

// The kernels this CPU runs: the portable one first, the fastest last.
const std::vector<Kernel>& available();

}  // namespace distckpt::io::digest_kernels
