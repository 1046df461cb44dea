// Box geometry: numel, intersect, contains, strides and the flat-range split.
#include "distckpt/core/box.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <random>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

using ::testing::HasSubstr;

TEST(BoxTest, NumelIsTheProductAndOneForRankZero) {
  EXPECT_EQ(numel(Shape{}), 1);
  EXPECT_EQ(numel(Shape{5}), 5);
  EXPECT_EQ(numel(Shape{2, 3, 4}), 24);
  EXPECT_EQ(numel(Shape{2, 0, 4}), 0);
  // A zero after extents whose product overflows (found by fuzz_local_file).
  EXPECT_EQ(numel(Shape{8192, 7020949529436356615, 0}), 0);
  EXPECT_EQ((Box{{1, 1}, {3, 2}}).numel(), 6);
  EXPECT_TRUE((Box{{0, 0}, {3, 0}}).empty());
  EXPECT_FALSE((Box{{}, {}}).empty());
}

TEST(BoxTest, IntersectOverlappingBoxes) {
  const auto r = intersect(Box{{0, 4}, {4, 4}}, Box{{2, 2}, {4, 4}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, (Box{{2, 4}, {2, 2}}));
}

TEST(BoxTest, IntersectTouchingOrDisjointIsEmpty) {
  EXPECT_FALSE(intersect(Box{{0, 0}, {2, 2}}, Box{{2, 0}, {2, 2}}).has_value());
  EXPECT_FALSE(intersect(Box{{0, 0}, {2, 2}}, Box{{5, 5}, {1, 1}}).has_value());
  EXPECT_FALSE(intersect(Box{{0}, {0}}, Box{{0}, {4}}).has_value());
}

TEST(BoxTest, IntersectOfRankZeroBoxesIsTheScalar) {
  const auto r = intersect(Box{}, Box{});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->numel(), 1);
}

TEST(BoxTest, RankMismatchThrows) {
  try {
    intersect(Box{{0}, {2}}, Box{{0, 0}, {2, 2}});
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("different rank (1 vs 2)"));
  }
  EXPECT_THROW(contains(Box{{0}, {2}}, Box{{0, 0}, {2, 2}}), Error);
}

TEST(BoxTest, Contains) {
  const Box outer{{2, 0}, {4, 6}};
  EXPECT_TRUE(contains(outer, outer));
  EXPECT_TRUE(contains(outer, Box{{3, 1}, {2, 5}}));
  EXPECT_FALSE(contains(outer, Box{{1, 1}, {2, 2}}));
  EXPECT_FALSE(contains(outer, Box{{3, 1}, {2, 6}}));
}

// A peer's box may hold anything: an end past int64 or a negative length is not inside.
TEST(BoxTest, ContainsRefusesOverflowingAndNegativeBoxes) {
  const Box outer{{0}, {8}};
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(contains(outer, Box{{4}, {kMax}}));
  EXPECT_FALSE(contains(outer, Box{{kMax}, {kMax}}));
  EXPECT_FALSE(contains(outer, Box{{4}, {-2}}));
  EXPECT_TRUE(contains(outer, Box{{8}, {0}}));
}

TEST(BoxTest, ContiguousStrides) {
  EXPECT_EQ(contiguous_strides(Shape{2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(contiguous_strides(Shape{7}), (Shape{1}));
  EXPECT_EQ(contiguous_strides(Shape{}), (Shape{}));
  EXPECT_EQ(contiguous_strides(Shape{2, 0, 3}), (Shape{3, 3, 1}));  // as LibTorch does
}

TEST(BoxTest, ToString) {
  EXPECT_EQ(to_string(Shape{2, 3}), "[2, 3]");
  EXPECT_EQ(to_string(Shape{}), "[]");
  EXPECT_EQ(to_string(Box{{0, 4}, {2, 4}}), "offset [0, 4] length [2, 4]");
}

TEST(BoxTest, DecomposeAlignedRangeIsOneBox) {
  const Box parent{{10, 0, 0}, {4, 3, 2}};
  const auto pieces = decompose_flat_range(parent, {6, 18});
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].box, (Box{{11, 0, 0}, {2, 3, 2}}));
  EXPECT_EQ(pieces[0].flat_start, 6);
}

TEST(BoxTest, DecomposeHeadMiddleTail) {
  // Parent [3, 4] at offset [1, 2]; flat [3, 10) = (0,3) | row 1 | (2,0..1).
  const auto pieces = decompose_flat_range(Box{{1, 2}, {3, 4}}, {3, 10});
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].box, (Box{{1, 5}, {1, 1}}));
  EXPECT_EQ(pieces[0].flat_start, 3);
  EXPECT_EQ(pieces[1].box, (Box{{2, 2}, {1, 4}}));
  EXPECT_EQ(pieces[1].flat_start, 4);
  EXPECT_EQ(pieces[2].box, (Box{{3, 2}, {1, 2}}));
  EXPECT_EQ(pieces[2].flat_start, 8);
}

TEST(BoxTest, DecomposeEmptyAndRankZero) {
  EXPECT_TRUE(decompose_flat_range(Box{{0, 0}, {3, 4}}, {5, 5}).empty());
  const auto scalar = decompose_flat_range(Box{}, {0, 1});
  ASSERT_EQ(scalar.size(), 1u);
  EXPECT_EQ(scalar[0].box, Box{});
  EXPECT_EQ(scalar[0].flat_start, 0);
  EXPECT_TRUE(decompose_flat_range(Box{}, {1, 1}).empty());
  EXPECT_TRUE(decompose_flat_range(Box{{0, 0}, {3, 0}}, {0, 0}).empty());  // no elements at all
}

TEST(BoxTest, DecomposeRangeOutsideThrows) {
  try {
    decompose_flat_range(Box{{0, 0}, {3, 4}}, {2, 13});
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[2, 13) is not inside [0, 12]"));
    EXPECT_THAT(e.what(), HasSubstr("offset [0, 0] length [3, 4]"));
  }
  EXPECT_THROW(decompose_flat_range(Box{{0}, {4}}, {-1, 2}), Error);
  EXPECT_THROW(decompose_flat_range(Box{{0}, {4}}, {3, 2}), Error);
  EXPECT_THROW(decompose_flat_range(Box{}, {0, 2}), Error);
}

// Flat index of absolute coordinate `coord` in the row-major order of `parent`.
int64_t flat_index_in(const Box& parent, const Shape& coord) {
  const Shape strides = contiguous_strides(parent.length);
  int64_t flat = 0;
  for (size_t a = 0; a < coord.size(); ++a) flat += (coord[a] - parent.offset[a]) * strides[a];
  return flat;
}

// Appends the parent-flat index of every element of `box`, in row-major order.
void enumerate_box(const Box& parent, const Box& box, std::vector<int64_t>& out) {
  const int64_t n = box.numel();
  const Shape strides = contiguous_strides(box.length);
  Shape coord(box.ndim());
  for (int64_t i = 0; i < n; ++i) {
    for (size_t a = 0; a < box.ndim(); ++a) coord[a] = box.offset[a] + (i / strides[a]) % box.length[a];
    out.push_back(flat_index_in(parent, coord));
  }
}

TEST(BoxTest, DecomposeRandomRangesEnumerateExactlyTheRange) {
  std::mt19937_64 rng(20240521);
  std::uniform_int_distribution<int> ndim_dist(1, 4);
  std::uniform_int_distribution<int64_t> extent_dist(1, 5);
  std::uniform_int_distribution<int64_t> offset_dist(0, 7);
  for (int trial = 0; trial < 2000; ++trial) {
    Box parent;
    const int ndim = ndim_dist(rng);
    for (int a = 0; a < ndim; ++a) {
      parent.offset.push_back(offset_dist(rng));
      parent.length.push_back(extent_dist(rng));
    }
    const int64_t total = parent.numel();
    std::uniform_int_distribution<int64_t> pos(0, total);
    int64_t start = pos(rng);
    int64_t stop = pos(rng);
    if (start > stop) std::swap(start, stop);

    const auto pieces = decompose_flat_range(parent, {start, stop});
    SCOPED_TRACE(fmt::format("parent {} range [{}, {})", to_string(parent), start, stop));
    EXPECT_LE(pieces.size(), static_cast<size_t>(2 * ndim - 1));
    std::vector<int64_t> seen;
    for (const FlatPiece& piece : pieces) {
      ASSERT_FALSE(piece.box.empty());
      ASSERT_TRUE(contains(parent, piece.box));
      EXPECT_EQ(piece.flat_start, static_cast<int64_t>(start + seen.size()));
      enumerate_box(parent, piece.box, seen);
    }
    std::vector<int64_t> expected(static_cast<size_t>(stop - start));
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = start + static_cast<int64_t>(i);
    ASSERT_EQ(seen, expected);
  }
}

TEST(BoxTest, DecomposeWorstCaseUsesTwoNdimMinusOneBoxes) {
  // Starts one past a corner, ends one before the opposite corner: the
  // worst case, every axis needs a head and a tail piece.
  const Box parent{{0, 0, 0, 0}, {3, 3, 3, 3}};
  const auto pieces = decompose_flat_range(parent, {1, 80});
  EXPECT_EQ(pieces.size(), 7u);
}

}  // namespace
}  // namespace distckpt
