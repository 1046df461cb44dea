// The sharding rules of distckpt::layout::Builder that generated code relies
// on: splits over a product of axes, uneven stage placement, replica ids,
// stored keys and shape checks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "distckpt/core/errors.h"
#include "distckpt/layout/builder.h"

namespace distckpt::layout {
namespace {

// Mesh (tp, ep, etp, dp) with this rank at tp 1/2, ep 1/2, etp 1/2, dp 0/3.
MeshCoords mesh() { return MeshCoords{{"tp", "ep", "etp", "dp"}, {{1, 2}, {1, 2}, {1, 2}, {0, 3}}}; }

TEST(LayoutBuilder, SplitOverAProductOfAxesIsMajorFirst) {
  Builder b("t", mesh());
  const size_t slot = b.add_tensor(TensorSpec("experts.w", {8, 4}).with_split(0, {1, 2}), Position{}, "experts.w");
  EXPECT_EQ(b.local_shape(slot), (Shape{2, 4}));
  b.set_tensor(slot, at::zeros({2, 4}));
  const ShardedTensor t = b.state_dict().at("experts.w").as_sharded_tensor();
  EXPECT_EQ(t.global_offset, (Shape{6, 0}));   // (ep 1 * etp size 2 + etp 1) * 2 rows
  EXPECT_EQ(t.replica_id, (ReplicaId{1, 0}));  // replicated over tp and dp, in mesh order
}

TEST(LayoutBuilder, UnevenPlacementPutsFirstAndLastCountsOnTheEnds) {
  const Placement p{10, 2, 4};
  EXPECT_EQ(p.range(0, 4, "layers"), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(p.range(1, 4, "layers"), (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_EQ(p.range(2, 4, "layers"), (std::pair<int64_t, int64_t>{4, 6}));
  EXPECT_EQ(p.range(3, 4, "layers"), (std::pair<int64_t, int64_t>{6, 10}));
  EXPECT_EQ((Placement{8, -1, -1}.range(1, 4, "layers")), (std::pair<int64_t, int64_t>{2, 4}));
  EXPECT_THROW((Placement{9, -1, -1}.range(0, 4, "layers")), Error);
  EXPECT_THROW((Placement{10, 6, 6}.range(0, 4, "layers")), Error);
}

TEST(LayoutBuilder, StackedElementsGetPrependedAxesAndStoredKeys) {
  Builder b("t", mesh());
  const Position layer = Position{}.within(5, 8, /*axis=*/3, "layers", /*stacked_axis=*/true);
  const size_t stacked = b.add_tensor(TensorSpec("layers.norm", {4}), layer, "layers.0.norm");
  const Position keyed = Position{}.within(5, 8, 3, "blocks", /*stacked_axis=*/false);
  const size_t per_key =
      b.add_tensor(TensorSpec("blocks.norm", {4}).stored_as("blocks.5.norm"), keyed, "blocks.0.norm");
  b.set_tensor(stacked, at::zeros({4}));
  b.set_tensor(per_key, at::zeros({4}));
  const StateDict sd = b.state_dict();
  const ShardedTensor& s = sd.at("layers.0.norm").as_sharded_tensor();
  EXPECT_EQ(s.key, "layers.norm");
  EXPECT_EQ(s.global_shape, (Shape{8, 4}));
  EXPECT_EQ(s.global_offset, (Shape{5, 0}));
  EXPECT_EQ(s.replica_id, (ReplicaId{1, 1, 1}));  // tp, ep, etp; not dp, which places the layers
  EXPECT_EQ(sd.at("blocks.0.norm").as_sharded_tensor().key, "blocks.5.norm");
  EXPECT_EQ(sd.at("blocks.0.norm").as_sharded_tensor().global_shape, (Shape{4}));
}

TEST(LayoutBuilder, ShapeAndDtypeMismatchesNameTheKey) {
  Builder b("t", mesh());
  const size_t slot = b.add_tensor(TensorSpec("w", {8, 4}).with_split(1, {0}).with_dtype("bfloat16"), Position{}, "w");
  try {
    b.set_tensor(slot, at::zeros({8, 4}, at::kBFloat16));
    ADD_FAILURE();
  } catch (const ShardingError& e) {
    EXPECT_NE(std::string(e.what()).find("'w' expects a local tensor of shape [8, 2]"), std::string::npos) << e.what();
  }
  try {
    b.set_tensor(slot, at::zeros({8, 2}));
    ADD_FAILURE();
  } catch (const ShardingError& e) {
    EXPECT_NE(std::string(e.what()).find("'w' is declared bfloat16 but the tensor is float32"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(b.add_tensor(TensorSpec("odd", {7}).with_split(0, {0}), Position{}, "odd"), Error);
}

}  // namespace
}  // namespace distckpt::layout
