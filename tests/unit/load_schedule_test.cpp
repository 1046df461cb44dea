// plan/load_schedule: which rank reads each stored piece, what every other
// rank receives, and that pieces several ranks need are read once.
#include "plan/load_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "distckpt/core/errors.h"
#include "support/throws_with.h"

namespace distckpt::plan {
namespace {

// Four pieces of a [16, 8] float tensor: rows 0-3, 4-7, 8-11, 12-15.
PieceGeometry piece(uint32_t /*tensor*/, uint32_t p) {
  return PieceGeometry{Box{{4 * static_cast<int64_t>(p), 0}, {4, 8}}, 4, {}};
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

// A live transfer's pieces: only their holders can read them.
TEST(LoadSchedule, PiecesOnlyTheirHoldersCanReadAreSentByAHolder) {
  // Piece p is held by ranks {p, p + 4} (a tp shard and its dp copy); ranks 2 and 3 need pieces.
  const PieceLookup held = [](uint32_t t, uint32_t p) {
    PieceGeometry g = piece(t, p);
    g.holders = {static_cast<int>(p), static_cast<int>(p) + 4};
    return g;
  };
  std::vector<std::vector<PieceNeed>> needs(8);
  needs[2] = {whole(0), whole(1), whole(2)};
  needs[3] = {whole(0), whole(1), whole(3)};
  const LoadSchedule s = make_load_schedule(needs, held, 1 << 20, true);
  // Piece 2 is needed by its holder alone: read there. Piece 3 needed by its holder and nobody else: the same.
  EXPECT_EQ(s.shared_slot[2][2], -1);
  EXPECT_EQ(s.shared_slot[3][2], -1);
  ASSERT_EQ(s.shared.size(), 2u);  // pieces 0 and 1: needed by ranks that do not hold them
  for (const SharedPiece& p : s.shared) {
    EXPECT_TRUE(p.reader == static_cast<int>(p.piece) || p.reader == static_cast<int>(p.piece) + 4) << p.piece;
    // The sender joins the needers without needs of its own.
    ASSERT_EQ(p.needers.size(), 3u);
    const auto sender = std::find_if(p.needers.begin(), p.needers.end(),
                                     [&](const SharedPiece::Needer& n) { return n.rank == p.reader; });
    ASSERT_NE(sender, p.needers.end());
    EXPECT_TRUE(sender->needs.empty());
  }
  // Spread over the holders: ranks 0 and 1 hold one piece each to send, their copies another.
  EXPECT_NE(s.shared[0].reader, s.shared[1].reader);
  // A needer that holds a piece takes it from its own copy; the others get it from a holder that reads the least.
  needs[4] = {whole(0)};
  const LoadSchedule t = make_load_schedule(needs, held, 1 << 20, true);
  EXPECT_EQ(t.shared_slot[4][0], -1);
  EXPECT_EQ(t.read_bytes[4], 128u);
  ASSERT_EQ(t.shared.size(), 2u);
  EXPECT_EQ(t.shared[0].reader, 0);           // rank 4 already reads piece 0 for itself
  EXPECT_EQ(t.shared[0].needers.size(), 3u);  // ranks 2 and 3, and the sender
  // A holder outside the ranks is refused.
  const PieceLookup outside = [](uint32_t t, uint32_t p) {
    PieceGeometry g = piece(t, p);
    g.holders = {9};
    return g;
  };
  EXPECT_THROW(make_load_schedule(needs, outside, 1 << 20, true), UsageError);
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
