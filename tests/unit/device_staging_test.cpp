// Reads into device tensors go through two host windows, a round at a time.
// CPU destinations stand in for device ones here (a predicate stages them);
// the GPU tests run the same code with CUDA destinations.
#include "load/device_staging.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

#include "distckpt/core/errors.h"

namespace distckpt::loading {
namespace {

bool floats_only(const at::Tensor& dest) { return dest.scalar_type() == at::kFloat; }

TensorRead read_into(const at::Tensor& dest, const Shape& offset = {}) {
  const Shape length(dest.sizes().begin(), dest.sizes().end());
  return TensorRead{plan::PieceNeed{0, 0, Box{offset.empty() ? Shape(length.size(), 0) : offset, length}}, dest};
}

uint64_t bytes_of(const std::vector<TensorRead>& round) {
  uint64_t bytes = 0;
  for (const TensorRead& r : round) bytes += static_cast<uint64_t>(r.dest.numel() * r.dest.element_size());
  return bytes;
}

TEST(DeviceStaging, StagesNothingForHostDestinations) {
  DeviceStaging staging(1 << 20);
  const at::Tensor a = at::zeros({1000, 1000});  // far more than a window
  std::vector<std::vector<TensorRead>> rounds = staging.plan_rounds({read_into(a)});
  ASSERT_EQ(rounds.size(), 1u);
  staging.stage(rounds[0], 0);
  EXPECT_TRUE(rounds[0][0].dest.is_same(a));
  staging.deliver();
  EXPECT_EQ(staging.peak_bytes(), 0u);
}

TEST(DeviceStaging, PacksStagedReadsIntoWindowsAndLeavesTheRestInTheFirstRound) {
  DeviceStaging staging(2048, floats_only);  // windows of 1024 bytes
  const at::Tensor ids = at::zeros({4096}, at::kLong);
  std::vector<TensorRead> reads{read_into(at::zeros({100})), read_into(at::zeros({100})), read_into(ids),
                                read_into(at::zeros({100})), read_into(at::zeros({256}))};
  const std::vector<std::vector<TensorRead>> rounds = staging.plan_rounds(reads);
  // 400 bytes take 448 aligned: two fit a window, the third starts round 1, 1024 bytes fill round 2.
  ASSERT_EQ(rounds.size(), 3u);
  ASSERT_EQ(rounds[0].size(), 3u);
  EXPECT_TRUE(rounds[0][2].dest.is_same(ids));  // not staged: round 0 whatever its place
  EXPECT_EQ(bytes_of(rounds[1]), 400u);
  EXPECT_EQ(bytes_of(rounds[2]), 1024u);
}

TEST(DeviceStaging, SplitsAReadLargerThanAWindowIntoPartsThatTileIt) {
  DeviceStaging staging(2048, floats_only);
  const at::Tensor rows = at::zeros({10, 64});  // 256-byte rows: four per window
  const at::Tensor wide = at::zeros({2, 600});  // a row of 2400 bytes: split along the row too
  const std::vector<std::vector<TensorRead>> rounds =
      staging.plan_rounds({read_into(rows, {20, 0}), read_into(wide, {0, 100})});
  std::vector<Box> row_parts, wide_parts;
  for (const auto& round : rounds) {
    EXPECT_LE(bytes_of(round), staging.window_bytes());
    for (const TensorRead& r : round) {
      const Shape length(r.dest.sizes().begin(), r.dest.sizes().end());
      EXPECT_EQ(length, r.need.part.length);
      (r.dest.storage().is_alias_of(rows.storage()) ? row_parts : wide_parts).push_back(r.need.part);
    }
  }
  const std::vector<Box> expected_rows{{{20, 0}, {4, 64}}, {{24, 0}, {4, 64}}, {{28, 0}, {2, 64}}};
  EXPECT_EQ(row_parts, expected_rows);
  const std::vector<Box> expected_wide{{{0, 100}, {1, 256}}, {{0, 356}, {1, 256}}, {{0, 612}, {1, 88}},
                                       {{1, 100}, {1, 256}}, {{1, 356}, {1, 256}}, {{1, 612}, {1, 88}}};
  EXPECT_EQ(wide_parts, expected_wide);
  EXPECT_EQ(rounds.size(), 3u + 6u);  // each part a window: 1024 and 1024 bytes leave no room beside them
}

TEST(DeviceStaging, DeliversEveryRoundAndAlternatesTwoWindows) {
  DeviceStaging staging(4096, floats_only);     // windows of 2048 bytes
  const at::Tensor dest = at::zeros({40, 64});  // 10 KiB: five rounds
  std::vector<std::vector<TensorRead>> rounds = staging.plan_rounds({read_into(dest)});
  ASSERT_EQ(rounds.size(), 5u);
  std::vector<const void*> windows;
  for (size_t k = 0; k < rounds.size(); ++k) {
    staging.stage(rounds[k], k);
    for (TensorRead& r : rounds[k]) {
      EXPECT_FALSE(r.dest.storage().is_alias_of(dest.storage()));
      // What a read would write: the element's row index in the whole tensor.
      const int64_t first = r.need.part.offset[0];
      r.dest.copy_(at::arange(first, first + r.need.part.length[0]).to(at::kFloat).unsqueeze(1).expand({-1, 64}));
      windows.push_back(r.dest.storage().data());
    }
    staging.deliver();
  }
  EXPECT_TRUE(at::equal(dest, at::arange(40).to(at::kFloat).unsqueeze(1).expand({40, 64})));
  EXPECT_EQ(std::set<const void*>(windows.begin(), windows.end()).size(), 2u);
  EXPECT_NE(windows[0], windows[1]);
  EXPECT_EQ(windows[0], windows[2]);
  EXPECT_LE(staging.peak_bytes(), 4096u);
}

TEST(DeviceStaging, RefusesABudgetWithoutRoomForTwoWindows) {
  try {
    DeviceStaging staging(100);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LoadOptions::device_staging_bytes is 100"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace distckpt::loading
