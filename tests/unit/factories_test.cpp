// apply_factories / apply_factory_merges (Megatron-Core semantics): a fused
// tensor stored as two parts and merged back, and every path error named.
#include "distckpt/core/factories.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "distckpt/core/errors.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

// A [4, 2] tensor stored as its two row halves {"w": ..., "v": ...}.
ShardedTensorFactory swiglu(const std::string& key, at::Tensor data) {
  ShardedTensorFactory f;
  f.key = key;
  f.data = std::move(data);
  f.build = [](const std::string& k, const at::Tensor& t, const ReplicaId& replica, const std::optional<FlatRange>&) {
    Value parts = Value::dict();
    const auto halves = t.chunk(2, 0);
    parts["w"] = ShardedTensor::from_rank_offsets(k + ".w", halves[0], {}, replica);
    parts["v"] = ShardedTensor::from_rank_offsets(k + ".v", halves[1], {}, replica);
    return parts;
  };
  f.merge = [](const Value& loaded) { return at::cat({loaded.at("w").as_tensor(), loaded.at("v").as_tensor()}); };
  return f;
}

StateDict request_with_factories(const at::Tensor& fused) {
  StateDict sd;
  sd["mlp"]["fc1"] = swiglu("mlp.fc1", fused);
  sd["layers"] = List{Value(1), Value(swiglu("layers.0", fused.clone()))};
  sd["step"] = 3;
  return sd;
}

// What a load returns for that request: the parts as plain tensors.
StateDict loaded_parts(const at::Tensor& values) {
  StateDict parts;
  parts["w"] = values.chunk(2, 0)[0].clone();
  parts["v"] = values.chunk(2, 0)[1].clone();
  StateDict loaded;
  loaded["mlp"]["fc1"] = parts;
  loaded["layers"] = List{Value(1), parts};
  loaded["step"] = 3;
  return loaded;
}

TEST(FactoriesTest, ApplyThenMergeRoundTrips) {
  const at::Tensor fused = at::zeros({4, 2});
  const StateDict request = request_with_factories(fused);
  const StateDict applied = apply_factories(request);
  EXPECT_EQ(applied.at("mlp").at("fc1").at("w").as_sharded_tensor().key, "mlp.fc1.w");
  EXPECT_EQ(applied.at("layers")[1].at("v").as_sharded_tensor().key, "layers.0.v");
  EXPECT_EQ(applied.at("step").as_int(), 3);

  const at::Tensor values = at::arange(8, at::kFloat).reshape({4, 2});
  StateDict loaded = loaded_parts(values);
  apply_factory_merges(loaded, request);
  EXPECT_TRUE(at::equal(loaded.at("mlp").at("fc1").as_tensor(), values));
  EXPECT_TRUE(at::equal(loaded.at("layers")[1].as_tensor(), values));
  // Merged into the factory's own tensor.
  EXPECT_TRUE(at::equal(fused, values));
  EXPECT_EQ(loaded.at("mlp").at("fc1").as_tensor().data_ptr(), fused.data_ptr());
}

TEST(FactoriesTest, MergeErrorsNameThePath) {
  const StateDict request = request_with_factories(at::zeros({4, 2}));
  const at::Tensor values = at::ones({4, 2});

  StateDict missing = loaded_parts(values);
  missing.at("mlp").as_dict().erase("fc1");
  EXPECT_TRUE(
      throws_with<UsageError>([&] { apply_factory_merges(missing, request); },
                              "the loaded state dict has nothing at 'mlp/fc1', where the request has a factory"));
  // A lenient load that skipped the whole factory leaves it out.
  apply_factory_merges(missing, request, /*skip_absent=*/true);
  EXPECT_FALSE(missing.at("mlp").contains("fc1"));
  EXPECT_TRUE(at::equal(missing.at("layers")[1].as_tensor(), values));

  StateDict shorter = loaded_parts(values);
  shorter.at("layers").as_list().pop_back();
  EXPECT_TRUE(throws_with<UsageError>([&] { apply_factory_merges(shorter, request); },
                                      "lists at 'layers' have different lengths (1 loaded, 2 requested)"));
  // A lenient load that skipped elements compacted the list: left as loaded.
  apply_factory_merges(shorter, request, /*skip_absent=*/true);
  EXPECT_EQ(shorter.at("layers").size(), 1u);
  EXPECT_TRUE(at::equal(shorter.at("mlp").at("fc1").as_tensor(), values));

  StateDict leaf = loaded_parts(values);
  leaf["mlp"] = 5;
  EXPECT_TRUE(throws_with<UsageError>([&] { apply_factory_merges(leaf, request); },
                                      "at 'mlp' the loaded state dict holds a int where the request holds a dict"));

  // Paths without factories are not walked: a missing 'step' is fine.
  StateDict no_step = loaded_parts(values);
  no_step.as_dict().erase("step");
  apply_factory_merges(no_step, request);
  EXPECT_TRUE(at::equal(no_step.at("mlp").at("fc1").as_tensor(), values));
}

TEST(FactoriesTest, FactoriesSplitWithListsAsDictsMergeIntoLists) {
  const StateDict request = request_with_factories(at::zeros({4, 2}));
  StateDict factories = Value::dict();
  factories["layers"]["1"] = request.at("layers")[1];
  StateDict loaded = loaded_parts(at::ones({4, 2}));
  apply_factory_merges(loaded, factories);
  EXPECT_EQ(loaded.at("layers")[1].kind(), Kind::kTensor);
  // The mlp factory is not in `factories`: its parts stay as loaded.
  EXPECT_TRUE(loaded.at("mlp").at("fc1").is_dict());

  factories["layers"]["7"] = request.at("layers")[1];
  EXPECT_TRUE(throws_with<UsageError>([&] { apply_factory_merges(loaded, factories); },
                                      "'layers/7' is not an index of the loaded list of 2 elements"));
}

}  // namespace
}  // namespace distckpt
