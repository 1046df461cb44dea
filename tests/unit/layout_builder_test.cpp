// The sharding rules of distckpt::layout::Builder that generated code relies
// on: splits over a product of axes, uneven stage placement, replica ids,
// stored keys and shape checks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "distckpt/core/errors.h"
#include "distckpt/layout/builder.h"
#include "distckpt/layout/optimizer.h"
#include "support/throws_with.h"

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
  // A config value the generator could not check: -4 layers over 2 stages was 0 per stage.
  EXPECT_TRUE(throws_with<UsageError>(
      [] {
        Placement{-4, -1, -1}.range(0, 2, "layers");
      },
      "layers: -4 elements; the count must not be negative (check the config)"));
  Builder b("t", mesh());
  EXPECT_TRUE(throws_with<UsageError>(
      [&] {
        b.add_tensor(TensorSpec("w", {8, -4}), Position{}, "w");
      },
      "layout t: 'w' dim 1 has extent -4; extents must not be negative"));
}

// Megatron's interleaved assignment: virtual stage v = chunk * stages + stage,
// layers handed out to virtual stages in order.
TEST(LayoutBuilder, VirtualStagesInterleaveChunksAndExplicitLayoutsPlaceEachOne) {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  const Placement even{16, -1, -1, /*chunks=*/2};
  EXPECT_EQ(even.chunk_ranges(0, 4, "layers"), (Ranges{{0, 2}, {8, 10}}));
  EXPECT_EQ(even.chunk_ranges(3, 4, "layers"), (Ranges{{6, 8}, {14, 16}}));
  // Asymmetric: 8 layers as 1,3 | 2,2 over pp 2, vp 2 (virtual stages 0..3).
  const Placement explicit_layout{8, -1, -1, 2, {1, 3, 2, 2}};
  EXPECT_EQ(explicit_layout.chunk_ranges(0, 2, "layers"), (Ranges{{0, 1}, {4, 6}}));
  EXPECT_EQ(explicit_layout.chunk_ranges(1, 2, "layers"), (Ranges{{1, 4}, {6, 8}}));
  // first/last apply to the first and last virtual stage.
  EXPECT_EQ((Placement{10, 1, 3, 2}.chunk_ranges(1, 2, "layers")), (Ranges{{1, 4}, {7, 10}}));
  const auto message = [](const Placement& p) {
    try {
      p.chunk_ranges(0, 2, "layers");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(Placement{8, -1, -1, 2, {1, 3, 2}}),
            "layers: the pipeline layout gives 3 counts but there are 2 stages x 2 virtual stages; give one count per "
            "virtual stage, in virtual-stage order");
  EXPECT_EQ(message(Placement{8, -1, -1, 2, {1, 3, 2, 1}}),
            "layers: the pipeline layout places 7 elements but there are 8");
  EXPECT_NE(message(Placement{6, -1, -1, 2}).find("6 elements cannot be spread evenly over 2 stages x 2 virtual"),
            std::string::npos);
  EXPECT_NE(message(Placement{8, -1, -1, 0}).find("0 virtual stages per stage"), std::string::npos);
}

// Parallel folding: dense tensors replicate over their mesh's axes only, the
// experts' over theirs; both meshes must cover the same ranks.
TEST(LayoutBuilder, TensorsReplicateOverTheAxesOfTheirOwnMesh) {
  // 8 ranks: dense (tp 2, dp 4), experts (etp 1, ep 4, edp 2); this rank: tp 1, dp 2 = etp 0, ep 1, edp 1.
  const MeshCoords folded{{"tp", "dp", "etp", "ep", "edp"},
                          {{1, 2}, {2, 4}, {0, 1}, {1, 4}, {1, 2}},
                          {{"default", {0, 1}}, {"experts", {2, 3, 4}}}};
  Builder b("t", folded);
  const size_t dense = b.add_tensor(TensorSpec("w", {8}).with_split(0, {0}), Position{}, "w");
  const Position expert = Position{}.within(1, 4, /*axis=*/3, "experts", /*stacked_axis=*/true);
  const size_t fc = b.add_tensor(TensorSpec("experts.fc", {8}).with_split(0, {2}).on_mesh(1), expert, "experts.0.fc");
  b.set_tensor(dense, at::zeros({4}));
  b.set_tensor(fc, at::zeros({8}));
  const StateDict sd = b.state_dict();
  EXPECT_EQ(sd.at("w").as_sharded_tensor().replica_id, (ReplicaId{2}));             // dp only
  EXPECT_EQ(sd.at("experts.0.fc").as_sharded_tensor().replica_id, (ReplicaId{1}));  // edp only
  MeshCoords uneven = folded;
  uneven.coords[4] = {0, 4};  // edp 4: 16 expert ranks over 8 dense ones
  try {
    Builder bad("t", uneven);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "layout t: its meshes must cover the same ranks, but mesh default: tp 2 x dp 4 = 8, mesh experts: etp 1 "
              "x ep 4 x edp 4 = 16; choose axis sizes whose products agree");
  }
}

// ZeRO-1 over dp x cp within 2 instances: the 4 ranks of an instance own
// quarters; ranks of the other instance hold the same quarters as replicas.
TEST(LayoutBuilder, DistributedRangesOverAProductOfAxesWithinInstances) {
  // tp 1/1, cp 1/2, dp 3/4: group rank dp * 2 + cp = 7 of 8; instances of 4: shard 3, instance 1.
  Builder b("t", MeshCoords{{"tp", "cp", "dp"}, {{0, 1}, {1, 2}, {3, 4}}});
  const size_t slot = b.add_tensor(TensorSpec("w", {1024}), Position{}, "w");
  b.set_tensor(slot, at::zeros({1024}));
  const Distribution zero{0, {2, 1}, 2};
  const auto ranges = b.distributed_ranges(zero);
  ASSERT_TRUE(ranges[0].has_value());
  EXPECT_EQ(ranges[0]->start, 768);
  EXPECT_EQ(ranges[0]->stop, 1024);
  const Value entry = b.derived_entry(slot, "optimizer.state.exp_avg", at::zeros({256}), ranges[0], &zero);
  EXPECT_EQ(entry.as_sharded_tensor().replica_id, (ReplicaId{1, 0}));     // instance 1, then tp
  EXPECT_THROW(b.distributed_ranges(Distribution{0, {2, 1}, 3}), Error);  // 3 instances do not divide 8 ranks
}

// A save holds exactly the states a load asks for: one the schema does not
// declare would be written and never restored, so it is refused at save.
TEST(LayoutBuilder, OptimizerStateTheSchemaDoesNotDeclareIsRefusedAtSave) {
  Builder b("t", mesh());
  const at::Tensor w = at::zeros({4});
  b.set_tensor(b.add_tensor(TensorSpec("w", {4}), Position{}, "w"), w);
  StateDict torch_state = Value::dict();
  torch_state["state"]["0"]["step"] = int64_t{3};
  torch_state["state"]["0"]["exp_avg"] = at::ones({4});
  torch_state["state"]["0"]["exp_avg_sq"] = at::ones({4});
  torch_state["param_groups"] = Value::list();
  Value group = Value::dict();
  group["amsgrad"] = false;
  torch_state["param_groups"].push_back(group);
  const OptimizerSpec both{"adam", {"exp_avg", "exp_avg_sq"}, {"step"}, {}};
  const StateDict saved = sharded_optimizer_state(b, both, torch_state, {w});
  EXPECT_EQ(saved.at("optimizer").at("state").at("w").size(), 2u);
  EXPECT_EQ(saved.at("optimizer").at("step").as_int(), 3);
  const OptimizerSpec one{"adam", {"exp_avg"}, {"step"}, {}};
  EXPECT_TRUE(throws_with<UsageError>([&] { sharded_optimizer_state(b, one, torch_state, {w}); },
                                      "the optimizer has state 'exp_avg_sq' for 'w', which the schema's optimizer adam "
                                      "does not declare, so a load would not restore it; add it to its `state` line"));
}

// PyTorch keeps amsgrad per param group: max_exp_avg_sq is saved, and asked
// for at load, for the parameters of the groups that have it on, whichever
// group comes first.
TEST(LayoutBuilder, AmsgradStateFollowsEachParamGroup) {
  for (const bool first_group_amsgrad : {false, true}) {
    Builder b("t", mesh());
    const at::Tensor w = at::zeros({4}), v = at::zeros({2});
    b.set_tensor(b.add_tensor(TensorSpec("w", {4}), Position{}, "w"), w);
    b.set_tensor(b.add_tensor(TensorSpec("v", {2}), Position{}, "v"), v);
    StateDict torch_state = Value::dict();
    torch_state["param_groups"] = Value::list();
    for (int64_t id = 0; id < 2; ++id) {
      const bool amsgrad = (id == 0) == first_group_amsgrad;
      const at::Tensor& p = id == 0 ? w : v;
      Value& entry = torch_state["state"][std::to_string(id)];
      entry["step"] = int64_t{1};
      entry["exp_avg"] = at::ones_like(p);
      entry["exp_avg_sq"] = at::ones_like(p);
      if (amsgrad) entry["max_exp_avg_sq"] = at::ones_like(p);
      Value group = Value::dict();
      group["amsgrad"] = amsgrad;
      group["params"] = List{Value(id)};
      torch_state["param_groups"].push_back(group);
    }
    const OptimizerSpec adam{"adam", {"exp_avg", "exp_avg_sq"}, {"step"}, {}};
    const std::string amsgrad_param = first_group_amsgrad ? "w" : "v", plain_param = first_group_amsgrad ? "v" : "w";
    const StateDict saved = sharded_optimizer_state(b, adam, torch_state, {w, v});
    const StateDict request = optimizer_load_request(b, adam, torch_state, {w, v});
    for (const StateDict* sd : {&saved, &request}) {
      const Value& state = sd->at("optimizer").at("state");
      EXPECT_TRUE(state.at(amsgrad_param).contains("max_exp_avg_sq")) << first_group_amsgrad;
      EXPECT_EQ(state.at(amsgrad_param).size(), 3u);
      EXPECT_FALSE(state.at(plain_param).contains("max_exp_avg_sq")) << first_group_amsgrad;
      EXPECT_EQ(state.at(plain_param).size(), 2u);
    }
  }
}

// A load asks only for the optimizer's parameters: a frozen one bound to the
// model has no state to restore.
TEST(LayoutBuilder, LoadRequestCoversOnlyTheOptimizersParameters) {
  Builder b("t", mesh());
  const at::Tensor w = at::zeros({4}), frozen = at::zeros({2});
  b.set_tensor(b.add_tensor(TensorSpec("w", {4}), Position{}, "w"), w);
  b.set_tensor(b.add_tensor(TensorSpec("frozen", {2}), Position{}, "frozen"), frozen);
  StateDict torch_state = Value::dict();
  torch_state["state"] = Value::dict();
  Value group = Value::dict();
  group["amsgrad"] = false;
  group["params"] = List{Value(int64_t{0})};
  torch_state["param_groups"] = List{group};
  const OptimizerSpec adam{"adam", {"exp_avg", "exp_avg_sq"}, {"step"}, {}};
  const Value& state = optimizer_load_request(b, adam, torch_state, {w}).at("optimizer").at("state");
  EXPECT_EQ(state.size(), 1u);
  EXPECT_EQ(state.at("w").size(), 2u);
  group["amsgrad"] = true;
  group["params"] = List{Value(int64_t{5})};
  torch_state["param_groups"] = List{group};
  EXPECT_TRUE(throws_with<UsageError>([&] { optimizer_load_request(b, adam, torch_state, {w}); },
                                      "param group 0 lists param id 5, but the optimizer's parameters are ids 0 to 0"));
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
