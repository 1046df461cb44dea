// The small messages ranks send each other (schema/wire.fbs): each round
// trips, and bytes that are not one raise ProtocolError naming the rank.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "distckpt/core/errors.h"
#include "local/messages.h"
#include "plan/messages.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

const std::string kGarbage = "definitely not a flatbuffer";

TEST(WireMessages, ApiMessagesRoundTrip) {
  const plan::PlanAnnouncement a = plan::decode_plan_announcement(plan::encode_plan_announcement({7, 9}), "rank 1");
  EXPECT_EQ(a.structure_hash, 7u);
  EXPECT_EQ(a.cached_plan, 9u);
  EXPECT_EQ(plan::decode_save_progress(plan::encode_save_progress(3), "rank 2"), 3u);
  const plan::KeyDigests digests = plan::decode_key_digests(plan::encode_key_digests({{1, ~0ull}, {7}}), "rank 3");
  EXPECT_EQ(digests.requested, (std::vector<uint64_t>{1, ~0ull}));
  EXPECT_EQ(digests.stored, (std::vector<uint64_t>{7}));
  const std::vector<std::string> names = {"a", std::string("with\0nul", 8), ""};
  const plan::UnrequestedKeys unrequested =
      plan::decode_unrequested_keys(plan::encode_unrequested_keys({{9}, names}), "rank 3");
  EXPECT_EQ(unrequested.digests, (std::vector<uint64_t>{9}));
  EXPECT_EQ(unrequested.names, names);
  EXPECT_EQ(plan::decode_host_name(plan::encode_host_name("node-7"), "rank 4"), "node-7");
}

TEST(WireMessages, LocalMessagesRoundTrip) {
  const auto s = local::decode_structure_announcement(local::encode_structure_announcement({1, 2}), "rank 0");
  EXPECT_EQ(s.structure_hash, 1u);
  EXPECT_EQ(s.cached_distribution, 2u);
  const auto held = local::decode_inventory(local::encode_inventory({{10, 0}, {20, 3}}), "rank 0");
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[1].iteration, 20);
  EXPECT_EQ(held[1].owner, 3);
  const auto status = local::decode_copy_status(local::encode_copy_status({false, "gone", {1, 2}}), "rank 0");
  EXPECT_FALSE(status.ok);
  EXPECT_EQ(status.problem, "gone");
  EXPECT_EQ(status.held_owners, (std::vector<int>{1, 2}));
  EXPECT_EQ(local::decode_recovery_status(local::encode_recovery_status("why"), "rank 0"), "why");
  const auto needs = local::decode_shard_needs(local::encode_shard_needs({{"x", 8}}), "rank 0");
  ASSERT_EQ(needs.size(), 1u);
  EXPECT_EQ(needs[0].identity, "x");
  EXPECT_EQ(needs[0].bytes, 8u);
  EXPECT_EQ(local::decode_shard_offers(local::encode_shard_offers({"x", "y"}), "rank 0"),
            (std::vector<std::string>{"x", "y"}));
}

TEST(WireMessages, MalformedBytesRaiseProtocolErrorNamingTheRank) {
  EXPECT_TRUE(throws_with<ProtocolError>([] { plan::decode_plan_announcement(kGarbage, "rank 5"); },
                                         "plan announcement from rank 5 is malformed"));
  EXPECT_TRUE(throws_with<ProtocolError>([] { plan::decode_plan_announcement("", "rank 5"); }, "rank 5"));
  EXPECT_TRUE(
      throws_with<ProtocolError>([] { plan::decode_save_progress(kGarbage.substr(0, 3), "rank 1"); }, "rank 1"));
  EXPECT_TRUE(throws_with<ProtocolError>([] { plan::decode_key_digests(kGarbage, "rank 2"); }, "key digests"));
  EXPECT_TRUE(
      throws_with<ProtocolError>([] { plan::decode_unrequested_keys(kGarbage, "rank 2"); }, "unrequested keys"));
  EXPECT_TRUE(throws_with<ProtocolError>([] { local::decode_inventory(kGarbage, "rank 6"); }, "rank 6"));
  EXPECT_TRUE(throws_with<ProtocolError>([] { local::decode_copy_status(kGarbage, "rank 6"); }, "rank 6"));
  EXPECT_TRUE(throws_with<ProtocolError>([] { local::decode_shard_needs(kGarbage, "rank 7"); }, "shard needs"));
}

}  // namespace
}  // namespace distckpt
