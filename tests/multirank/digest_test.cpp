// The digest of a checkpoint depends on the logical tensors only, not on
// the layout that saved them.
#include <gtest/gtest.h>

#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using testing::global_tensor;

// [6, 10] split over tp on columns and over pp on rows; bf16 vector replicated.
StateDict mesh_state(int64_t tp, int64_t pp, int rank) {
  const int64_t tp_rank = rank % tp, pp_rank = rank / tp;
  const at::Tensor g = global_tensor("m", {6, 10});
  StateDict sd = Value::dict();
  sd["m"] = ShardedTensor::from_rank_offsets(
      "m", g.narrow(0, pp_rank * (6 / pp), 6 / pp).narrow(1, tp_rank * (10 / tp), 10 / tp).clone(),
      {{0, pp_rank, pp}, {1, tp_rank, tp}});
  sd["v"] = ShardedTensor::from_rank_offsets("v", global_tensor("v", {5}, at::kBFloat16), {}, {rank});
  return sd;
}

TEST(Digest, SameStateUnderTwoMeshesDigestsEqual) {
  TempDir tmp("digest");
  run_ranks(4, [&](Communicator& comm) { save(mesh_state(2, 2, comm.rank()), tmp.path() + "/a", comm); });
  run_ranks(2, [&](Communicator& comm) { save(mesh_state(1, 2, comm.rank()), tmp.path() + "/b", comm); });
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd = mesh_state(1, 1, 0);
    sd["m"].as_sharded_tensor().data.view(-1)[59] = 0.5;  // one element differs
    save(sd, tmp.path() + "/c", comm);
  });
  const auto a = digest_checkpoint(tmp.path() + "/a");
  const auto b = digest_checkpoint(tmp.path() + "/b");
  const auto c = digest_checkpoint(tmp.path() + "/c");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].line(), b[0].line());
  EXPECT_EQ(a[1].line(), b[1].line());
  EXPECT_EQ(a[0].line().substr(0, 17), "m float32 [6,10] ");
  EXPECT_EQ(a[1].line().substr(0, 14), "v bfloat16 [5]");
  EXPECT_NE(a[0].hash, c[0].hash);
  EXPECT_EQ(a[1].hash, c[1].hash);
}

}  // namespace
}  // namespace distckpt
