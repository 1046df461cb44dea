// plan/chunk_index: a query returns exactly the stored pieces that overlap
// the region, whichever axis the chunks were split along, and the index is
// kept on the axis that tells the pieces apart.
#include "plan/chunk_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace distckpt::plan {
namespace {

// A [rows, cols] float tensor stored as a grid of row_parts x col_parts
// boxes, one file per chunk.
TensorRecord grid(int64_t rows, int64_t cols, int64_t row_parts, int64_t col_parts) {
  TensorRecord t;
  t.key = "w";
  t.global_shape = {rows, cols};
  for (int64_t r = 0; r < row_parts; ++r) {
    for (int64_t c = 0; c < col_parts; ++c) {
      ChunkRecord chunk;
      chunk.box =
          Box{{r * rows / row_parts, c * cols / col_parts},
              {(r + 1) * rows / row_parts - r * rows / row_parts, (c + 1) * cols / col_parts - c * cols / col_parts}};
      t.chunks.push_back(chunk);
    }
  }
  return t;
}

// The same tensor written as flat ranges (ZeRO) of the whole tensor.
TensorRecord flat_ranges(int64_t rows, int64_t cols, int64_t parts) {
  TensorRecord t;
  t.key = "w";
  t.global_shape = {rows, cols};
  const int64_t n = rows * cols;
  for (int64_t p = 0; p < parts; ++p) {
    ChunkRecord chunk;
    chunk.box = Box{{0, 0}, {rows, cols}};
    chunk.flat = FlatRange{p * n / parts, (p + 1) * n / parts};
    t.chunks.push_back(chunk);
  }
  return t;
}

// Every file written by rank 0.
ChunkIndex::WriterOf files_for(const TensorRecord& /*t*/) {
  return [](uint32_t) { return 0; };
}

std::set<const StoredPiece*> brute_force(const ChunkIndex& index, const Box& region) {
  std::set<const StoredPiece*> hits;
  for (const StoredPiece& p : index.pieces()) {
    if (intersect(p.box, region)) hits.insert(&p);
  }
  return hits;
}

void expect_queries_match(const TensorRecord& t, uint32_t seed) {
  const ChunkIndex index(t, files_for(t));
  std::mt19937 rng(seed);
  for (int q = 0; q < 300; ++q) {
    Box region{{0, 0}, {0, 0}};
    for (size_t d = 0; d < 2; ++d) {
      std::uniform_int_distribution<int64_t> start(0, t.global_shape[d] - 1);
      region.offset[d] = start(rng);
      std::uniform_int_distribution<int64_t> length(1, t.global_shape[d] - region.offset[d]);
      region.length[d] = length(rng);
    }
    std::vector<const StoredPiece*> found;
    index.query(region, found);
    const std::set<const StoredPiece*> unique(found.begin(), found.end());
    EXPECT_EQ(unique.size(), found.size()) << "a piece returned twice for " << to_string(region);
    EXPECT_EQ(unique, brute_force(index, region)) << to_string(region);
  }
}

TEST(ChunkIndex, RowSplitIsIndexedAlongRows) {
  const TensorRecord t = grid(64, 16, 8, 1);
  EXPECT_EQ(ChunkIndex(t, files_for(t)).axis(), 0u);
  expect_queries_match(t, 1);
}

TEST(ChunkIndex, ColumnSplitIsIndexedAlongColumns) {
  // Tensor parallel's row-parallel linear: every chunk starts at row 0, so
  // an index on rows would make every query visit every chunk.
  const TensorRecord t = grid(16, 64, 1, 8);
  const ChunkIndex index(t, files_for(t));
  EXPECT_EQ(index.axis(), 1u);
  std::vector<const StoredPiece*> found;
  index.query(Box{{0, 24}, {16, 8}}, found);  // columns 24-31: chunk 3 only
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0]->chunk, 3u);
  expect_queries_match(t, 2);
}

TEST(ChunkIndex, GridsAndFlatRangesMatchBruteForce) {
  expect_queries_match(grid(30, 50, 3, 7), 3);
  expect_queries_match(grid(50, 30, 7, 3), 4);
  expect_queries_match(flat_ranges(13, 17, 9), 5);  // ranges cut mid-row: up to three boxes each
}

TEST(ChunkIndex, ScalarsAndEmptyRegions) {
  TensorRecord scalar;
  scalar.key = "s";
  scalar.chunks.push_back(ChunkRecord{});
  const ChunkIndex index(scalar, files_for(scalar));
  std::vector<const StoredPiece*> found;
  index.query(Box{}, found);
  EXPECT_EQ(found.size(), 1u);

  const TensorRecord t = grid(8, 8, 2, 2);
  const ChunkIndex tiles(t, files_for(t));
  found.clear();
  tiles.query(Box{{2, 2}, {0, 4}}, found);
  EXPECT_TRUE(found.empty());
}

}  // namespace
}  // namespace distckpt::plan
