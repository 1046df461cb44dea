// ShardedTensor: factories, integrity errors, narrow, without_data, ShardedObject.
#include "distckpt/core/sharded_tensor.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "distckpt/core/errors.h"
#include "distckpt/core/sharded_object.h"
#include "distckpt/core/state_dict.h"

namespace distckpt {
namespace {

using ::testing::HasSubstr;

at::Tensor iota(const Shape& shape, at::ScalarType dtype = at::kFloat) {
  return at::arange(numel(shape), at::TensorOptions().dtype(dtype)).reshape(shape);
}

// Runs `f`, expects a ShardingError and returns its message.
template <typename F>
std::string sharding_error(F&& f) {
  try {
    f();
  } catch (const ShardingError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ShardingError";
  return "";
}

// A valid 2-D shard to corrupt field by field.
ShardedTensor valid_shard() { return ShardedTensor::from_rank_offsets("w", iota({4, 6}), {{0, 1, 2}}); }

TEST(ShardedTensorTest, FromRankOffsetsComputesGlobalPlacement) {
  const auto st = ShardedTensor::from_rank_offsets("dec.w", iota({4, 6}), {{1, 2, 3}}, {0, 1});
  EXPECT_EQ(st.local_shape, (Shape{4, 6}));
  EXPECT_EQ(st.global_shape, (Shape{4, 18}));
  EXPECT_EQ(st.global_offset, (Shape{0, 12}));
  EXPECT_EQ(st.axis_fragmentations, (Shape{1, 3}));
  EXPECT_EQ(st.dtype, at::kFloat);
  EXPECT_EQ(st.replica_id, (ReplicaId{0, 1}));
  EXPECT_FALSE(st.is_main_replica());
  EXPECT_EQ(st.global_box(), (Box{{0, 12}, {4, 6}}));
  EXPECT_EQ(st.local_chunk_offset_in_global(), (Shape{0, 2}));
  EXPECT_EQ(st.held_numel(), 24);
}

TEST(ShardedTensorTest, FromRankOffsetsWithPrependedAxis) {
  const auto st =
      ShardedTensor::from_rank_offsets("layers.w", iota({4, 6}, at::kBFloat16), {{0, 3, 8}, {1, 1, 2}}, {0}, 1);
  EXPECT_EQ(st.global_shape, (Shape{8, 8, 6}));
  EXPECT_EQ(st.global_offset, (Shape{3, 4, 0}));
  EXPECT_EQ(st.axis_fragmentations, (Shape{8, 2, 1}));
  EXPECT_EQ(st.dtype, at::kBFloat16);
  EXPECT_EQ(st.global_box(), (Box{{3, 4, 0}, {1, 4, 6}}));
  EXPECT_EQ(st.local_chunk_offset_in_global(), (Shape{3, 1, 0}));
  EXPECT_TRUE(st.is_main_replica());
}

TEST(ShardedTensorTest, FromRankOffsetsArgumentErrors) {
  EXPECT_THAT(sharding_error([] {
                ShardedTensor::from_rank_offsets("w", iota({4}), {{1, 0, 2}});
              }),
              HasSubstr("rank offset axis 1 is outside the 1 axes"));
  EXPECT_THAT(sharding_error([] {
                ShardedTensor::from_rank_offsets("w", iota({4, 4}), {{0, 0, 2}, {0, 1, 2}});
              }),
              HasSubstr("axis 0 appears twice"));
  EXPECT_THAT(sharding_error([] {
                ShardedTensor::from_rank_offsets("w", iota({4}), {{0, 2, 2}});
              }),
              HasSubstr("rank offset 2 on axis 0 is outside [0, 2)"));
  EXPECT_THAT(sharding_error([] {
                ShardedTensor::from_rank_offsets("w", iota({4}), {{0, 0, 0}});
              }),
              HasSubstr("axis 0 has 0 fragments"));
  EXPECT_THAT(sharding_error([] { ShardedTensor::from_rank_offsets("w", at::Tensor(), {}); }),
              HasSubstr("needs a defined data tensor"));
}

TEST(ShardedTensorTest, FromRankOffsetsFlat) {
  const auto st =
      ShardedTensor::from_rank_offsets_flat("opt.w", at::zeros({5}, at::kDouble), {4, 6}, {{0, 1, 2}}, {7, 12}, {2});
  EXPECT_EQ(st.local_shape, (Shape{4, 6}));
  EXPECT_EQ(st.global_shape, (Shape{8, 6}));
  EXPECT_EQ(st.global_offset, (Shape{4, 0}));
  ASSERT_TRUE(st.flattened_range.has_value());
  EXPECT_EQ(*st.flattened_range, (FlatRange{7, 12}));
  EXPECT_EQ(st.held_numel(), 5);
  EXPECT_EQ(st.dtype, at::kDouble);

  EXPECT_THAT(sharding_error([] {
                ShardedTensor::from_rank_offsets_flat("opt.w", at::zeros({4}), {4, 6}, {}, {7, 12});
              }),
              HasSubstr("flattened data must be 1-D with 5 elements, got shape [4]"));
  EXPECT_THAT(sharding_error([] {
                ShardedTensor::from_rank_offsets_flat("opt.w", at::zeros({5}), {2, 2}, {}, {0, 5});
              }),
              HasSubstr("flattened_range [0, 5) is not inside [0, 4]"));
}

// Megatron's accessors on a flat shard of chunk (1, 2) of a [3][4, 6] tensor
// (one prepended axis): elements 7..11 of the flattened 2x3 local chunk.
TEST(ShardedTensorTest, CoordinatesOfAFlatShard) {
  const auto st = ShardedTensor::from_rank_offsets_flat("w", at::zeros({4}), {2, 3}, {{0, 1, 3}, {1, 1, 2}, {2, 1, 2}},
                                                        {2, 6}, {0}, /*prepend_axis_num=*/1);
  ASSERT_EQ(st.global_offset, (Shape{1, 2, 3}));
  const std::vector<at::Tensor> local = st.local_coordinates();
  ASSERT_EQ(local.size(), 2u);
  // Flat 2..5 of a 2x3 chunk: (0,2) (1,0) (1,1) (1,2).
  EXPECT_TRUE(at::equal(local[0], at::tensor({0, 1, 1, 1}, at::kLong)));
  EXPECT_TRUE(at::equal(local[1], at::tensor({2, 0, 1, 2}, at::kLong)));
  const std::vector<at::Tensor> global = st.global_coordinates();
  ASSERT_EQ(global.size(), 3u);
  EXPECT_TRUE(at::equal(global[0], at::tensor({1, 1, 1, 1}, at::kLong)));
  EXPECT_TRUE(at::equal(global[1], at::tensor({2, 3, 3, 3}, at::kLong)));
  EXPECT_TRUE(at::equal(global[2], at::tensor({5, 3, 4, 5}, at::kLong)));

  // Reading the global tensor at those coordinates gives the held elements.
  const at::Tensor whole = iota({3, 4, 6});
  const at::Tensor chunk = whole.index(st.global_slice());
  EXPECT_TRUE(at::equal(whole.index({global[0], global[1], global[2]}), chunk.flatten().slice(0, 2, 6)));

  const auto regular = ShardedTensor::from_rank_offsets("w", at::zeros({2, 3}), {{0, 1, 2}, {1, 1, 2}});
  EXPECT_THAT(sharding_error([&] { regular.local_coordinates(); }), HasSubstr("only for a flat shard"));
  EXPECT_THAT(sharding_error([&] { regular.global_coordinates(); }), HasSubstr("only for a flat shard"));
}

TEST(ShardedTensorTest, GlobalSliceIsAnIndexPerPrependedAxisThenSlices) {
  const auto st = ShardedTensor::from_rank_offsets("w", iota({2, 3}), {{0, 2, 4}, {1, 1, 2}, {2, 0, 2}}, {0},
                                                   /*prepend_axis_num=*/1);
  const std::vector<at::indexing::TensorIndex> slice = st.global_slice();
  ASSERT_EQ(slice.size(), 3u);
  EXPECT_TRUE(slice[0].is_integer());
  EXPECT_EQ(slice[0].integer(), 2);
  ASSERT_TRUE(slice[1].is_slice());
  EXPECT_EQ(slice[1].slice().start(), 2);
  EXPECT_EQ(slice[1].slice().stop(), 4);
  EXPECT_EQ(slice[2].slice().start(), 0);
  EXPECT_EQ(slice[2].slice().stop(), 3);
  // Writing the chunk through the slice puts it where the metadata says.
  at::Tensor global = at::zeros({4, 4, 6});
  global.index_put_(st.global_slice(), st.data);
  EXPECT_TRUE(at::equal(global.index({2, at::indexing::Slice(2, 4), at::indexing::Slice(0, 3)}), st.data));
  EXPECT_EQ(global.sum().item<float>(), st.data.sum().item<float>());
}

TEST(ShardedTensorTest, MaxAllowedChunks) {
  const auto st = ShardedTensor::from_rank_offsets("w", at::zeros({2, 3}), {{0, 1, 4}, {1, 0, 2}});
  EXPECT_EQ(st.max_allowed_chunks(), (Shape{2, 3}));
  auto uneven = st;
  uneven.global_shape = {7, 6};
  EXPECT_THAT(sharding_error([&] { uneven.max_allowed_chunks(); }),
              HasSubstr("axis 0 of length 7 does not divide into 4 fragments"));
  uneven.allow_shape_mismatch = true;
  EXPECT_EQ(uneven.max_allowed_chunks(), (Shape{1, 3}));
  const auto irregular = ShardedTensor::from_global_offset("w", at::zeros({3}), {5}, {2});
  EXPECT_THAT(sharding_error([&] { irregular.max_allowed_chunks(); }), HasSubstr("from_global_offset"));
}

TEST(ShardedTensorTest, InitDataAllocatesOnlyWhatIsHeld) {
  auto st = ShardedTensor::from_rank_offsets_flat("w", at::zeros({4}, at::kDouble), {2, 3}, {}, {2, 6}).without_data();
  st.init_data(at::kCPU);
  EXPECT_EQ(st.data.sizes(), (at::IntArrayRef{4}));
  EXPECT_EQ(st.data.scalar_type(), at::kDouble);
  // An init function decides the values; the meta device allocates nothing.
  auto meta = ShardedTensor::from_rank_offsets("w", at::zeros({2, 3}), {}).without_data();
  meta.init_data(at::kMeta,
                 [](at::IntArrayRef shape, const at::TensorOptions& options) { return at::full(shape, 7, options); });
  EXPECT_EQ(meta.data.device().type(), at::kMeta);
  EXPECT_EQ(meta.device.type(), at::kMeta);
  EXPECT_EQ(meta.data.sizes(), (at::IntArrayRef{2, 3}));
  // Data already there is kept.
  auto filled = ShardedTensor::from_rank_offsets("w", at::ones({2}), {});
  filled.init_data(at::kCPU, [](at::IntArrayRef shape, const at::TensorOptions& o) { return at::zeros(shape, o); });
  EXPECT_EQ(filled.data.sum().item<float>(), 2.0F);
}

TEST(ShardedTensorTest, FromGlobalOffsetAllowsIrregularSplits) {
  const auto st = ShardedTensor::from_global_offset("emb", iota({3, 4}), {10, 4}, {7, 0});
  EXPECT_TRUE(st.axis_fragmentations.empty());
  EXPECT_EQ(st.global_box(), (Box{{7, 0}, {3, 4}}));
  EXPECT_THAT(sharding_error([] {
                ShardedTensor::from_global_offset("emb", iota({3, 4}), {10, 4}, {8, 0});
              }),
              HasSubstr("on axis 0 the chunk [8, 11) exceeds the global extent 10"));
}

TEST(ShardedTensorTest, ValidationErrorsNameKeyAndValues) {
  struct Case {
    const char* name;
    std::function<void(ShardedTensor&)> corrupt;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"empty key", [](ShardedTensor& s) { s.key.clear(); }, "the key is empty"},
      {"dtype", [](ShardedTensor& s) { s.dtype = at::kHalf; }, "data has dtype float32 but the metadata says float16"},
      {"data shape",
       [](ShardedTensor& s) {
         s.local_shape = {4, 5};
       },
       "data has shape [4, 6] but local_shape is [4, 5]"},
      {"rank mismatch", [](ShardedTensor& s) { s.global_offset = {4}; },
       "global_shape [8, 6] and global_offset [4] have different ranks"},
      {"prepend", [](ShardedTensor& s) { s.prepend_axis_num = 1; },
       "local_shape [4, 6] with 1 prepended axes does not match the rank of global_shape [8, 6]"},
      {"negative",
       [](ShardedTensor& s) {
         s.global_offset = {-4, 0};
       },
       "axis 0 has a negative extent or offset"},
      {"overflow",
       [](ShardedTensor& s) {
         s.global_shape = {6, 6};
       },
       "on axis 0 the chunk [4, 8) exceeds the global extent 6"},
      {"fragment count", [](ShardedTensor& s) { s.axis_fragmentations = {2}; },
       "axis_fragmentations [2] does not have one entry per global axis"},
      {"off grid",
       [](ShardedTensor& s) {
         s.global_offset = {3, 0};
       },
       "on axis 0 the offset 3 is not a multiple of the local extent 4"},
      {"empty replica", [](ShardedTensor& s) { s.replica_id.clear(); }, "replica_id is empty"},
      {"negative replica",
       [](ShardedTensor& s) {
         s.replica_id = {0, -1};
       },
       "replica_id (0, -1) has a negative entry"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ShardedTensor st = valid_shard();
    c.corrupt(st);
    const std::string message = sharding_error([&] { st.validate_metadata_integrity(); });
    EXPECT_THAT(message, HasSubstr(c.message));
    if (!st.key.empty()) {
      EXPECT_THAT(message, HasSubstr("ShardedTensor 'w'"));
    }
  }
}

TEST(ShardedTensorTest, ValidationOfFlatTensors) {
  auto flat = ShardedTensor::from_rank_offsets_flat("f", at::zeros({3}), {2, 3}, {}, {1, 4});
  flat.allow_shape_mismatch = true;  // a padded vocabulary's ZeRO state (Megatron before 5ab481c)
  flat.validate_metadata_integrity();
  flat.flattened_range = FlatRange{3, 2};
  EXPECT_THAT(sharding_error([&] { flat.validate_metadata_integrity(); }),
              HasSubstr("flattened_range [3, 2) is not inside [0, 6]"));
}

TEST(ShardedTensorTest, PrependedAxisOffsetMustBeInsideGlobalExtent) {
  auto st = ShardedTensor::from_rank_offsets("l", iota({2}), {{0, 1, 4}}, {0}, 1);
  st.global_offset = {4, 0};
  EXPECT_THAT(sharding_error([&] { st.validate_metadata_integrity(); }),
              HasSubstr("on axis 0 the chunk [4, 5) exceeds the global extent 4"));
}

TEST(ShardedTensorTest, WithoutDataKeepsMetadata) {
  const auto st = valid_shard();
  const auto meta = st.without_data();
  EXPECT_FALSE(meta.data.defined());
  EXPECT_EQ(meta.dtype, at::kFloat);
  EXPECT_EQ(meta.global_shape, st.global_shape);
  EXPECT_EQ(meta.global_offset, st.global_offset);
  EXPECT_NO_THROW(meta.validate_metadata_integrity());
  EXPECT_TRUE(st.data.defined());
}

TEST(ShardedTensorTest, NarrowSplitsAFusedTensorIntoShardsOfNarrowerTensors) {
  // SwiGLU: rank 1 of 2 holds [W_1; V_1], 2 rows each; W is rows [0, 2).
  const auto fused = ShardedTensor::from_rank_offsets("fc1", iota({4, 3}), {{0, 1, 2}});
  const auto w = fused.narrow(0, 0, 2);
  const auto v = fused.narrow(0, 2, 2);
  ASSERT_EQ(w.size(), 1u);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(w[0].local_shape, (Shape{2, 3}));
  EXPECT_EQ(w[0].global_shape, (Shape{4, 3}));
  EXPECT_EQ(w[0].global_offset, (Shape{2, 0}));
  EXPECT_TRUE(at::equal(w[0].data, iota({4, 3}).narrow(0, 0, 2)));
  EXPECT_TRUE(at::equal(v[0].data, iota({4, 3}).narrow(0, 2, 2)));
  EXPECT_EQ(v[0].global_offset, (Shape{2, 0}));

  // Metadata-only tensors narrow the same way and stay without data.
  const auto meta = fused.without_data().narrow(0, 2, 2);
  ASSERT_EQ(meta.size(), 1u);
  EXPECT_FALSE(meta[0].data.defined());
  EXPECT_EQ(meta[0].global_box(), v[0].global_box());
}

TEST(ShardedTensorTest, NarrowAlongInnerDimWithPrependedAxis) {
  const auto st = ShardedTensor::from_rank_offsets("qkv", iota({2, 6}), {{0, 5, 8}, {2, 1, 3}}, {0}, 1);
  const auto part = st.narrow(1, 2, 2);
  ASSERT_EQ(part.size(), 1u);
  EXPECT_EQ(part[0].global_shape, (Shape{8, 2, 6}));
  EXPECT_EQ(part[0].global_offset, (Shape{5, 0, 2}));
  EXPECT_EQ(part[0].local_shape, (Shape{2, 2}));
  EXPECT_TRUE(at::equal(part[0].data, iota({2, 6}).narrow(1, 2, 2)));
}

TEST(ShardedTensorTest, NarrowErrors) {
  const auto irregular = ShardedTensor::from_global_offset("e", iota({3, 2}), {10, 2}, {0, 0});
  EXPECT_THAT(sharding_error([&] { irregular.narrow(0, 0, 1); }),
              HasSubstr("global extent 10 and offset 0 are not multiples of the local extent 3"));
  const auto st = valid_shard();
  EXPECT_THAT(sharding_error([&] { st.narrow(2, 0, 1); }), HasSubstr("narrow dim 2 is outside"));
  EXPECT_THAT(sharding_error([&] { st.narrow(0, 3, 2); }), HasSubstr("narrow(0, 3, 2) leaves the local extent 4"));
  const auto flat = ShardedTensor::from_rank_offsets_flat("f", at::zeros({3}), {2, 3}, {}, {1, 4});
  EXPECT_THAT(sharding_error([&] { flat.narrow(1, 0, 1); }), HasSubstr("only be narrowed along dim 0"));
}

TEST(ShardedTensorTest, NarrowFlatKeepsTheHeldPartOfTheRows) {
  // Local chunk [4, 3] (rank 1 of 2 along axis 0); this rank holds flat [4, 10).
  const at::Tensor held = at::arange(4, 10, at::kFloat);
  const auto st = ShardedTensor::from_rank_offsets_flat("f", held, {4, 3}, {{0, 1, 2}}, {4, 10});

  // Rows [2, 4) are flat [6, 12): the held part is [6, 10) -> [0, 4) of the narrowed chunk.
  const auto tail = st.narrow(0, 2, 2);
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0].local_shape, (Shape{2, 3}));
  EXPECT_EQ(tail[0].global_shape, (Shape{4, 3}));
  EXPECT_EQ(tail[0].global_offset, (Shape{2, 0}));
  EXPECT_EQ(*tail[0].flattened_range, (FlatRange{0, 4}));
  EXPECT_TRUE(at::equal(tail[0].data, at::arange(6, 10, at::kFloat)));

  // Rows [1, 2) are flat [3, 6): the held part is [4, 6) -> [1, 3).
  const auto middle = st.narrow(0, 1, 1);
  ASSERT_EQ(middle.size(), 1u);
  EXPECT_EQ(*middle[0].flattened_range, (FlatRange{1, 3}));
  EXPECT_TRUE(at::equal(middle[0].data, at::arange(4, 6, at::kFloat)));

  // Row 0 is flat [0, 3): nothing held.
  EXPECT_TRUE(st.narrow(0, 0, 1).empty());
}

TEST(ShardedTensorTest, DescribeAndReplicaStrings) {
  const auto flat = ShardedTensor::from_rank_offsets_flat("f", at::zeros({3}), {2, 3}, {}, {1, 4}, {0, 2});
  EXPECT_EQ(flat.describe(),
            "ShardedTensor(key='f', dtype=float32, local_shape=[2, 3], global_shape=[2, 3], "
            "global_offset=[0, 0], replica_id=(0, 2), flattened_range=[1, 4))");
  EXPECT_THAT(valid_shard().describe(), HasSubstr("flattened_range=None"));
  EXPECT_EQ(to_string(ReplicaId{0, 1}), "(0, 1)");
  EXPECT_TRUE(is_main_replica({0, 0}));
  EXPECT_FALSE(is_main_replica({0, 3}));
}

TEST(ShardedObjectTest, UniqueKeyAndValidation) {
  ShardedObject obj{"rng", "bytes", {2, 4}, {0, 1}, {0}};
  EXPECT_EQ(obj.unique_key(), "rng/shard_0.1_2.4");
  EXPECT_NO_THROW(obj.validate_metadata_integrity());
  EXPECT_TRUE(obj.is_main_replica());
  EXPECT_EQ(obj.without_data().data, "");
  EXPECT_EQ(obj.without_data().unique_key(), obj.unique_key());

  obj.global_offset = {2, 1};
  EXPECT_THAT(sharding_error([&] { obj.validate_metadata_integrity(); }),
              HasSubstr("on axis 0 the shard index 2 is outside [0, 2)"));
  obj.global_offset = {0};
  EXPECT_THAT(sharding_error([&] { obj.validate_metadata_integrity(); }), HasSubstr("different ranks"));
  obj.global_offset = {0, 0};
  obj.replica_id = {-1};
  EXPECT_THAT(sharding_error([&] { obj.validate_metadata_integrity(); }), HasSubstr("negative entry"));
  obj.replica_id = {0};
  obj.key.clear();
  EXPECT_THAT(sharding_error([&] { obj.validate_metadata_integrity(); }), HasSubstr("the key is empty"));
}

TEST(ShardedObjectTest, FactoryBuildsItsSubtree) {
  ShardedTensorFactory factory;
  factory.key = "fc1";
  factory.data = iota({4, 3});
  factory.replica_id = {1};
  factory.build = [](const std::string& key, const at::Tensor& data, const ReplicaId& replica,
                     const std::optional<FlatRange>&) {
    Value tree = Value::dict();
    tree["w"] = ShardedTensor::from_rank_offsets(key + ".w", data.narrow(0, 0, 2), {}, replica);
    return tree;
  };
  const Value built = factory.build_subtree();
  EXPECT_EQ(built.at("w").as_sharded_tensor().key, "fc1.w");
  EXPECT_EQ(built.at("w").as_sharded_tensor().replica_id, (ReplicaId{1}));

  factory.build = nullptr;
  try {
    factory.build_subtree();
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("ShardedTensorFactory 'fc1' has no build function"));
  }
}

TEST(ShardedObjectTest, NonPersistentWrapsAValue) {
  const LocalNonPersistentObject obj(Value(int64_t{42}));
  EXPECT_EQ(obj.unwrap().as_int(), 42);
}

}  // namespace
}  // namespace distckpt
