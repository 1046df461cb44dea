// plan/coverage: does a set of boxes tile a global shape exactly once? Pure
// geometry, tested on its own (both the grid check and the sweep).
#include "plan/coverage.h"

#include <gtest/gtest.h>

#include <vector>

#include "distckpt/core/errors.h"
#include "support/throws_with.h"

namespace distckpt::plan {
namespace {

OwnedBox owned(Shape offset, Shape length, int rank) {
  return OwnedBox{Box{std::move(offset), std::move(length)}, rank};
}

// A rows x cols grid of equal blocks, rank = block index.
std::vector<OwnedBox> blocks(int64_t rows, int64_t cols, int64_t block) {
  std::vector<OwnedBox> out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out.push_back(owned({r * block, c * block}, {block, block}, int(r * cols + c)));
  }
  return out;
}

TEST(Coverage, RegularAndUnevenTilingsPass) {
  EXPECT_NO_THROW(check_exact_cover("w", {8, 8}, blocks(2, 2, 4)));
  EXPECT_NO_THROW(check_exact_cover("w", {10, 3}, {owned({0, 0}, {7, 3}, 0), owned({7, 0}, {3, 3}, 1)}));
  // Empty boxes (a rank holding nothing of the tensor) are ignored.
  EXPECT_NO_THROW(check_exact_cover("w", {4}, {owned({0}, {4}, 0), owned({4}, {0}, 1)}));
}

TEST(Coverage, OverlapNamesBothRanksAndBoxes) {
  EXPECT_TRUE(throws_with<ShardingError>(
      [] {
        check_exact_cover("layer.w", {8}, {owned({0}, {5}, 0), owned({4}, {4}, 3)});
      },
      "main replicas overlap: rank 0 holds"));
  EXPECT_TRUE(throws_with<ShardingError>(
      [] {
        check_exact_cover("layer.w", {8}, {owned({0}, {5}, 0), owned({4}, {4}, 3)});
      },
      "rank 3 holds"));
}

TEST(Coverage, GapNamesTheHoleAndTheCount) {
  EXPECT_TRUE(throws_with<ShardingError>(
      [] {
        check_exact_cover("b", {4, 4}, {owned({0, 0}, {4, 2}, 0)});
      },
      "(8 of 16 elements covered)"));
}

TEST(Coverage, BoxesOfTheWrongRankOrOutsideAreRefused) {
  EXPECT_TRUE(throws_with<ShardingError>([] { check_exact_cover("x", {4, 4}, {owned({0}, {4}, 2)}); }, "rank 2 holds"));
  EXPECT_TRUE(throws_with<ShardingError>([] { check_exact_cover("x", {4}, {owned({2}, {4}, 1)}); },
                                         "outside the global shape [4]"));
}

TEST(Coverage, ScalarsNeedExactlyOneHolder) {
  EXPECT_NO_THROW(check_exact_cover("s", {}, {owned({}, {}, 0)}));
  EXPECT_TRUE(throws_with<ShardingError>(
      [] {
        check_exact_cover("s", {}, {owned({}, {}, 0), owned({}, {}, 1)});
      },
      "main replicas overlap"));
  EXPECT_TRUE(throws_with<ShardingError>([] { check_exact_cover("s", {}, {}); }, "no rank holds"));
}

// Boxes whose boundaries form a grid far larger than their count take the
// sweep path; it must reach the same verdicts.
TEST(Coverage, SweepPathFindsOverlapsAndGaps) {
  std::vector<OwnedBox> stairs;
  const int64_t n = 3000;  // n x n grid of cuts: far past the grid budget
  for (int64_t i = 0; i < n; ++i) stairs.push_back(owned({i, 0}, {1, i + 1}, int(i)));
  for (int64_t i = 0; i < n - 1; ++i) stairs.push_back(owned({i, i + 1}, {1, n - i - 1}, int(n + i)));
  EXPECT_NO_THROW(check_exact_cover("t", {n, n}, stairs));

  std::vector<OwnedBox> overlapping = stairs;
  overlapping.push_back(owned({5, 5}, {1, 1}, 9999));
  EXPECT_TRUE(throws_with<ShardingError>([&] { check_exact_cover("t", {n, n}, overlapping); }, "rank 9999"));

  std::vector<OwnedBox> holey = stairs;
  holey.pop_back();
  EXPECT_TRUE(throws_with<ShardingError>([&] { check_exact_cover("t", {n, n}, holey); }, "no rank holds"));
}

// The case that made the sweep quadratic: n column strips, all open for the
// whole sweep, and n single cells each compared with every strip. Now each
// box meets only its axis-1 neighbours; n = 100000 runs in well under a second.
TEST(Coverage, SweepOfColumnStripsAndCellsIsNotQuadratic) {
  const int64_t n = 100000;
  std::vector<OwnedBox> boxes;
  for (int64_t j = 0; j < n; ++j) boxes.push_back(owned({0, j}, {n, 1}, 0));
  for (int64_t i = 0; i < n; ++i) boxes.push_back(owned({i, n}, {1, 1}, 1));
  EXPECT_NO_THROW(check_exact_cover("w", {n, n + 1}, boxes));
  boxes.push_back(owned({7, 5}, {1, 1}, 2));
  EXPECT_TRUE(throws_with<ShardingError>(
      [&] {
        check_exact_cover("w", {n, n + 1}, boxes);
      },
      "rank 0 holds offset [0, 5] length [100000, 1] and rank 2 holds"));
  // An axis every box spans whole (a stacked axis of length 1) changes nothing.
  std::vector<OwnedBox> stacked;
  for (int64_t j = 0; j < n; ++j) stacked.push_back(owned({0, 0, j}, {1, n, 1}, 0));
  for (int64_t i = 0; i < n; ++i) stacked.push_back(owned({0, i, n}, {1, 1, 1}, 1));
  EXPECT_NO_THROW(check_exact_cover("w", {1, n, n + 1}, stacked, CoverSubject::kStoredChunks));
  // Three split axes take the general comparison, still correct.
  std::vector<OwnedBox> cubes;
  for (int64_t j = 0; j < 300; ++j) cubes.push_back(owned({0, j, 0}, {300, 1, 1}, 0));
  for (int64_t i = 0; i < 300; ++i) cubes.push_back(owned({i, 0, 1}, {1, 300, 1}, 1));
  EXPECT_NO_THROW(check_exact_cover("c", {300, 300, 2}, cubes));
  cubes.push_back(owned({3, 4, 1}, {1, 1, 1}, 2));
  EXPECT_TRUE(throws_with<ShardingError>([&] { check_exact_cover("c", {300, 300, 2}, cubes); }, "rank 2 holds"));
}

// Stored chunks of a checkpoint are corrupt, not a bad sharding.
TEST(Coverage, StoredChunksAreCorruption) {
  EXPECT_TRUE(throws_with<CorruptionError>(
      [] {
        check_exact_cover("w", {8}, {owned({0}, {5}, 0), owned({4}, {4}, 1)}, CoverSubject::kStoredChunks);
      },
      "the stored chunks of 'w' (global shape [8]) overlap: offset [0] length [5] (written by rank 0) and offset [4] "
      "length [4] (written by rank 1)"));
  EXPECT_TRUE(throws_with<CorruptionError>(
      [] {
        check_exact_cover("w", {4, 4}, {owned({0, 0}, {4, 2}, 0)}, CoverSubject::kStoredChunks);
      },
      "no stored chunk of 'w' (global shape [4, 4]) holds offset [0, 2] length [4, 2] (8 of 16 elements stored)"));
}

}  // namespace
}  // namespace distckpt::plan
