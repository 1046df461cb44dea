// plan/load_schedule: which rank reads each stored piece, what every other
// rank receives, and that pieces several ranks need are read once.
#include "plan/load_schedule.h"

#include <gtest/gtest.h>

#include "distckpt/core/errors.h"
#include "support/throws_with.h"

namespace distckpt::plan {
namespace {

// Four pieces of a [16, 8] float tensor: rows 0-3, 4-7, 8-11, 12-15.
PieceGeometry piece(uint32_t /*tensor*/, uint32_t p) {
  return PieceGeometry{Box{{4 * static_cast<int64_t>(p), 0}, {4, 8}}, 4};
}

PieceNeed whole(uint32_t p) { return PieceNeed{0, p, piece(0, p).box}; }

TEST(LoadSchedule, SharedPiecesAreReadOnceByBalancedReaders) {
  // Ranks 0-2 need every piece (replicas); rank 3 needs piece 3 only.
  std::vector<std::vector<PieceNeed>> needs(4);
  for (int r = 0; r < 3; ++r) {
    for (uint32_t p = 0; p < 4; ++p) needs[static_cast<size_t>(r)].push_back(whole(p));
  }
  needs[3].push_back(whole(3));
  const LoadSchedule s = make_load_schedule(needs, piece, 1 << 20, true);
  ASSERT_EQ(s.shared.size(), 4u);
  // Equal sizes, in piece order: 0 -> rank 0, 1 -> rank 1, 2 -> rank 2, 3 -> rank 3 (least loaded).
  for (uint32_t p = 0; p < 4; ++p) EXPECT_EQ(s.shared[p].reader, static_cast<int>(p));
  EXPECT_EQ(s.read_bytes, (std::vector<uint64_t>{128, 128, 128, 128}));
  EXPECT_EQ(s.shared_slot[1][2], 2);
  EXPECT_EQ(s.shared[3].needers.size(), 4u);
  EXPECT_EQ(s.shared[0].message_bytes(needs, s.shared[0].needers[1], 0), 128u);
}

TEST(LoadSchedule, PartsAreCutToSlabsAndOnlyTheirRowsAreRead) {
  std::vector<std::vector<PieceNeed>> needs(2);
  needs[0].push_back(PieceNeed{0, 1, Box{{5, 0}, {2, 4}}});           // rows 5-6, left half
  needs[1].push_back(PieceNeed{0, 1, Box{{5, 4}, {3, 4}}});           // rows 5-7, right half
  const LoadSchedule s = make_load_schedule(needs, piece, 32, true);  // one row (32 bytes) per slab
  ASSERT_EQ(s.shared.size(), 1u);
  const SharedPiece& sp = s.shared[0];
  EXPECT_EQ(sp.slabs.size(), 3u);  // rows 5, 6, 7: row 4 is needed by nobody
  EXPECT_EQ(sp.read_bytes(), 96u);
  const int other = sp.reader == 0 ? 1 : 0;
  const auto& needer = sp.needers[static_cast<size_t>(other)];
  EXPECT_EQ(sp.message_bytes(needs, needer, 2), other == 1 ? 16u : 0u);  // row 7: only rank 1 needs it
}

TEST(LoadSchedule, WithoutSharingEveryRankReadsItsOwnRows) {
  std::vector<std::vector<PieceNeed>> needs(2);
  needs[0].push_back(whole(0));
  needs[1].push_back(PieceNeed{0, 0, Box{{1, 0}, {1, 8}}});
  const LoadSchedule s = make_load_schedule(needs, piece, 1 << 20, false);
  EXPECT_TRUE(s.shared.empty());
  EXPECT_EQ(s.read_bytes, (std::vector<uint64_t>{128, 32}));
  EXPECT_EQ(s.shared_slot[1][0], -1);
}

TEST(LoadSchedule, NeedsRoundTripAndRejectGarbage) {
  const std::vector<PieceNeed> needs{whole(2), PieceNeed{3, 1, Box{{}, {}}}};
  const auto back = decode_needs(encode_needs(1, needs), "rank 1");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].part, needs[0].part);
  EXPECT_EQ(back[1].tensor, 3u);
  EXPECT_TRUE(throws_with<ProtocolError>([] { decode_needs("garbage", "rank 7"); }, "rank 7"));
}

}  // namespace
}  // namespace distckpt::plan
