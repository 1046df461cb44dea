// io/tensor_digest: a sum over elements, so any parts of a tensor, in any
// order and layout, digest to the whole tensor's digest.
#include "io/tensor_digest.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <random>
#include <vector>

#include "io/digest_kernels.h"

namespace distckpt::io {
namespace {

uint64_t whole(const at::Tensor& t) {
  return digest_region(t, Box{Shape(static_cast<size_t>(t.dim()), 0), Shape(t.sizes().begin(), t.sizes().end())},
                       Shape(t.sizes().begin(), t.sizes().end()));
}

TEST(TensorDigest, PartsOfAnyLayoutSumToTheWhole) {
  const at::Tensor t = at::randn({6, 10});
  const Shape shape{6, 10};
  // Columns split in two (strided views), rows in three.
  uint64_t by_columns = 0, by_rows = 0;
  for (int64_t c = 0; c < 10; c += 5) by_columns += digest_region(t.narrow(1, c, 5), Box{{0, c}, {6, 5}}, shape);
  for (int64_t r = 0; r < 6; r += 2) by_rows += digest_region(t.narrow(0, r, 2), Box{{r, 0}, {2, 10}}, shape);
  EXPECT_EQ(by_columns, whole(t));
  EXPECT_EQ(by_rows, whole(t));
  // Runs of the flattening (what digest_checkpoint streams).
  const at::Tensor flat = t.reshape({-1});
  EXPECT_EQ(digest_run(flat.data_ptr(), 25, 4, 0) + digest_run(flat[25].data_ptr(), 35, 4, 25), whole(t));
}

TEST(TensorDigest, AChangedOrMovedElementChangesIt) {
  const at::Tensor t = at::arange(24, at::kFloat).reshape({4, 6});
  at::Tensor changed = t.clone();
  changed[2][3] = 1e-7;
  EXPECT_NE(whole(changed), whole(t));
  at::Tensor swapped = t.clone();
  swapped[0][0] = t[0][1];
  swapped[0][1] = t[0][0];
  EXPECT_NE(whole(swapped), whole(t));
  // The same bytes as another dtype at the same places: the same terms.
  EXPECT_EQ(whole(t.view(at::kInt)), whole(t));
  EXPECT_NE(whole(t.to(at::kBFloat16)), whole(t));
  // 0-d, empty and wide elements.
  const at::Tensor scalar = at::scalar_tensor(2.0, at::kDouble);
  EXPECT_EQ(whole(scalar), digest_run(scalar.data_ptr(), 1, 8, 0));
  EXPECT_EQ(whole(at::zeros({0, 3})), 0u);
  const at::Tensor c = at::randn({3, 2}, at::kComplexDouble);
  EXPECT_EQ(digest_region(c.narrow(0, 0, 1), Box{{0, 0}, {1, 2}}, {3, 2}) +
                digest_region(c.narrow(0, 1, 2), Box{{1, 0}, {2, 2}}, {3, 2}),
            whole(c));
}

TEST(TensorDigest, PlaceSumsTellWhetherPartsCoverATensorOnce) {
  const Shape shape{6, 10};
  const PlaceSums whole = place_sums(Box{{0, 0}, {6, 10}}, shape);
  PlaceSums halves = place_sums(Box{{0, 0}, {6, 5}}, shape);
  halves += place_sums(Box{{0, 5}, {6, 5}}, shape);
  EXPECT_EQ(halves, whole);
  EXPECT_EQ(whole.elements, 60u);
  EXPECT_EQ(whole.indices, 59u * 60u / 2u);
  // One part twice and another not at all: as many elements, other places.
  PlaceSums twice = place_sums(Box{{0, 0}, {3, 10}}, shape);
  twice += place_sums(Box{{0, 0}, {3, 10}}, shape);
  EXPECT_EQ(twice.elements, whole.elements);
  EXPECT_FALSE(twice == whole);
  // Rows that swap places: Σi agrees, Σi² does not.
  PlaceSums swapped = place_sums(Box{{1, 0}, {1, 10}}, shape);
  swapped += place_sums(Box{{1, 0}, {1, 10}}, shape);
  PlaceSums apart = place_sums(Box{{0, 0}, {1, 10}}, shape);
  apart += place_sums(Box{{2, 0}, {1, 10}}, shape);
  EXPECT_EQ(swapped.indices, apart.indices);
  EXPECT_NE(swapped.squares, apart.squares);
}

TEST(TensorDigest, EveryKernelThisCpuRunsGivesThePortableSums) {
  const std::vector<digest_kernels::Kernel>& kernels = digest_kernels::available();
  ASSERT_FALSE(kernels.empty());
  EXPECT_STREQ(kernels.front().name, "portable");
  std::mt19937_64 random(7);
  std::vector<uint8_t> bytes(8 * 300 + 8);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(random());
  // Every element size, counts around the vector widths, misaligned data, indices near 2^64.
  for (const size_t element : {1, 2, 4, 8}) {
    for (const uint64_t count : {0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 255, 300}) {
      for (const size_t misalign : {0, 1, 3}) {
        for (const uint64_t first : {uint64_t{0}, uint64_t{12345}, ~uint64_t{0} - 400}) {
          const uint64_t want = kernels.front().sum(bytes.data() + misalign, count, element, first);
          for (const digest_kernels::Kernel& k : kernels) {
            EXPECT_EQ(k.sum(bytes.data() + misalign, count, element, first), want)
                << k.name << ": " << count << " elements of " << element << " bytes from " << first;
          }
        }
      }
    }
  }
  // What digest_run uses is the last one; on this machine's CPU:
  std::cout << "digest kernels here:";
  for (const digest_kernels::Kernel& k : kernels) std::cout << " " << k.name;
  std::cout << "\n";
}

}  // namespace
}  // namespace distckpt::io
