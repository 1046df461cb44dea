// plan/balance.h: largest first, to the least-loaded candidate, ties to the
// lowest rank, equal sizes in their original order.
#include "plan/balance.h"

#include <gtest/gtest.h>

#include <vector>

#include "distckpt/core/errors.h"

namespace distckpt::plan {
namespace {

TEST(Balance, LargestFirstToTheLeastLoadedCandidate) {
  // 30 goes first (to rank 0, a tie of zero loads), then 20 to rank 1, then
  // 10 to rank 1 (20 < 30).
  const Balance b = balance_least_loaded({{10, {0, 1}}, {30, {0, 1}}, {20, {0, 1}}}, {0, 0});
  EXPECT_EQ(b.choice, (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(b.load, (std::vector<uint64_t>{30, 30}));
}

TEST(Balance, TiesGoToTheLowestRankWhateverTheCandidateOrder) {
  const Balance b = balance_least_loaded({{5, {2, 1, 3}}}, {0, 0, 0, 0});
  EXPECT_EQ(b.choice, (std::vector<int>{1}));
}

TEST(Balance, EqualSizesKeepTheirOrder) {
  const Balance b = balance_least_loaded({{4, {0, 1}}, {4, {0, 1}}, {4, {0, 1}}}, {0, 0});
  EXPECT_EQ(b.choice, (std::vector<int>{0, 1, 0}));
  EXPECT_EQ(b.load, (std::vector<uint64_t>{8, 4}));
}

TEST(Balance, InitialLoadsCountAndOnlyCandidatesTakeItems) {
  const Balance b = balance_least_loaded({{7, {0, 2}}, {3, {1}}}, {100, 0, 50});
  EXPECT_EQ(b.choice, (std::vector<int>{2, 1}));
  EXPECT_EQ(b.load, (std::vector<uint64_t>{100, 3, 57}));
}

TEST(Balance, NoItems) {
  const Balance b = balance_least_loaded({}, {1, 2});
  EXPECT_TRUE(b.choice.empty());
  EXPECT_EQ(b.load, (std::vector<uint64_t>{1, 2}));
}

TEST(Balance, AnItemWithoutCandidatesIsRejected) {
  EXPECT_THROW(balance_least_loaded({{1, {}}}, {0}), Error);
  EXPECT_THROW(balance_least_loaded({{1, {3}}}, {0}), Error);
}

}  // namespace
}  // namespace distckpt::plan
