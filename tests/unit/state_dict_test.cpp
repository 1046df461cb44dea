// Value: construction of every kind, typed access and its errors, equality.
#include "distckpt/core/state_dict.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected distckpt::Error";
  return "";
}

ShardedTensor shard(const std::string& key, const at::Tensor& data) {
  return ShardedTensor::from_rank_offsets(key, data, {{0, 0, 2}});
}

TEST(StateDictTest, EveryKindConstructs) {
  EXPECT_EQ(Value().kind(), Kind::kNone);
  EXPECT_EQ(Value(true).kind(), Kind::kBool);
  EXPECT_EQ(Value(7).kind(), Kind::kInt);
  EXPECT_EQ(Value(uint8_t{7}).kind(), Kind::kInt);
  EXPECT_EQ(Value(int64_t{-3}).as_int(), -3);
  EXPECT_EQ(Value(1.5).kind(), Kind::kFloat);
  EXPECT_EQ(Value(1.5f).as_float(), 1.5);
  EXPECT_EQ(Value("x").kind(), Kind::kString);
  EXPECT_EQ(Value(std::string("y")).as_string(), "y");
  EXPECT_EQ(Value(at::ones({2})).kind(), Kind::kTensor);
  EXPECT_EQ(Value(shard("w", at::ones({2}))).kind(), Kind::kShardedTensor);
  EXPECT_EQ(Value(ShardedObject{"o", "", {1}, {0}, {0}}).kind(), Kind::kShardedObject);
  EXPECT_EQ(Value(ShardedTensorFactory{}).kind(), Kind::kFactory);
  EXPECT_EQ(Value(LocalNonPersistentObject(Value(1))).kind(), Kind::kNonPersistent);
  EXPECT_EQ(Value::dict().kind(), Kind::kDict);
  EXPECT_EQ(Value::list().kind(), Kind::kList);
}

TEST(StateDictTest, KindNames) {
  const std::vector<std::pair<Kind, std::string>> names = {
      {Kind::kNone, "None"},
      {Kind::kBool, "bool"},
      {Kind::kInt, "int"},
      {Kind::kFloat, "float"},
      {Kind::kString, "string"},
      {Kind::kTensor, "tensor"},
      {Kind::kShardedTensor, "ShardedTensor"},
      {Kind::kShardedObject, "ShardedObject"},
      {Kind::kFactory, "ShardedTensorFactory"},
      {Kind::kNonPersistent, "LocalNonPersistentObject"},
      {Kind::kDict, "dict"},
      {Kind::kList, "list"},
  };
  for (const auto& [kind, name] : names) EXPECT_EQ(kind_name(kind), name);
}

TEST(StateDictTest, IsShardedAndContainerPredicates) {
  EXPECT_TRUE(Value(shard("w", at::ones({2}))).is_sharded());
  EXPECT_TRUE(Value(ShardedObject{"o", "", {1}, {0}, {0}}).is_sharded());
  EXPECT_TRUE(Value(ShardedTensorFactory{}).is_sharded());
  EXPECT_TRUE(Value(LocalNonPersistentObject(Value())).is_sharded());
  EXPECT_FALSE(Value(at::ones({2})).is_sharded());
  EXPECT_FALSE(Value::dict().is_sharded());
  EXPECT_TRUE(Value::dict().is_container());
  EXPECT_TRUE(Value::list().is_container());
  EXPECT_FALSE(Value(1).is_container());
  EXPECT_TRUE(Value().is_none());
}

TEST(StateDictTest, AccessorsThrowNamingBothKinds) {
  EXPECT_EQ(error_of([] { Value(1).as_string(); }), "expected string but the value is int");
  EXPECT_EQ(error_of([] { Value("s").as_int(); }), "expected int but the value is string");
  EXPECT_EQ(error_of([] { Value().as_dict(); }), "expected dict but the value is None");
  EXPECT_EQ(error_of([] { Value::dict().as_list(); }), "expected list but the value is dict");
  EXPECT_EQ(error_of([] { Value(true).as_tensor(); }), "expected tensor but the value is bool");
  EXPECT_EQ(error_of([] { Value(1.0).as_sharded_tensor(); }), "expected ShardedTensor but the value is float");
  EXPECT_EQ(error_of([] { Value(1).as_bool(); }), "expected bool but the value is int");
  EXPECT_EQ(error_of([] { Value("1").as_float(); }), "expected float but the value is string");
  EXPECT_EQ(error_of([] { Value(1).as_factory(); }), "expected ShardedTensorFactory but the value is int");
  EXPECT_EQ(error_of([] { Value(1).as_non_persistent(); }), "expected LocalNonPersistentObject but the value is int");
  EXPECT_EQ(error_of([] { Value(1).as_sharded_object(); }), "expected ShardedObject but the value is int");
}

TEST(StateDictTest, IntsReadAsFloats) { EXPECT_EQ(Value(3).as_float(), 3.0); }

TEST(StateDictTest, MutableAccessorsWriteThrough) {
  Value v(shard("w", at::ones({2})));
  v.as_sharded_tensor().key = "renamed";
  EXPECT_EQ(v.as_sharded_tensor().key, "renamed");
  Value t(at::zeros({2}));
  t.as_tensor().fill_(5);
  EXPECT_EQ(t.as_tensor()[1].item<float>(), 5.0f);
}

TEST(StateDictTest, BracketTurnsNoneIntoNestedDicts) {
  StateDict sd;
  sd["model"]["layer"]["w"] = at::ones({2});
  sd["iteration"] = 100;
  EXPECT_TRUE(sd.is_dict());
  EXPECT_EQ(sd.size(), 2u);
  EXPECT_TRUE(sd.at("model").at("layer").contains("w"));
  EXPECT_EQ(sd.at("iteration").as_int(), 100);
  EXPECT_FALSE(sd.contains("optimizer"));
  EXPECT_FALSE(Value().contains("x"));
  EXPECT_EQ(error_of([] {
              Value v(1);
              v["x"];
            }),
            "expected dict but the value is int");
}

TEST(StateDictTest, AtNamesTheMissingKeyAndSomeAvailableKeys) {
  StateDict sd;
  sd["alpha"] = 1;
  sd["beta"] = 2;
  EXPECT_EQ(error_of([&] { sd.at("gamma"); }), "key 'gamma' not found; the dict has 2 keys: [alpha, beta]");

  StateDict big;
  for (int i = 0; i < 12; ++i) big[fmt::format("k{:02d}", i)] = i;
  const std::string message = error_of([&] { big.at("zz"); });
  EXPECT_THAT(message, HasSubstr("the dict has 12 keys: [k00, k01, k02, k03, k04, k05, k06, k07, "
                                 "k08, k09, ... (2 more)]"));
}

TEST(StateDictTest, ListAccess) {
  Value list;
  list.push_back(1);
  list.push_back("two");
  EXPECT_TRUE(list.is_list());
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(list[1].as_string(), "two");
  list[0] = 10;
  EXPECT_EQ(static_cast<const Value&>(list)[0].as_int(), 10);
  EXPECT_EQ(error_of([&] { list[2]; }), "list index 2 is out of range for a list of 2 elements");
  EXPECT_EQ(error_of([] { Value(1).size(); }), "size() needs a dict or a list, but the value is int");
  EXPECT_EQ(error_of([] { Value::dict().push_back(1); }), "expected list but the value is dict");
}

TEST(StateDictTest, EqualsComparesStructureAndValues) {
  auto make = [] {
    StateDict sd;
    sd["a"]["t"] = at::arange(4);
    sd["a"]["f"] = 0.5;
    sd["l"] = List{Value(1), Value("x"), Value()};
    return sd;
  };
  EXPECT_TRUE(make().equals(make()));

  StateDict other = make();
  other["l"].as_list()[1] = "y";
  EXPECT_FALSE(make().equals(other));
  other = make();
  other["a"]["extra"] = 1;
  EXPECT_FALSE(make().equals(other));
  other = make();
  other["l"].push_back(2);
  EXPECT_FALSE(make().equals(other));
  EXPECT_FALSE(Value(1).equals(Value(1.0)));
  EXPECT_FALSE(Value(1).equals(Value(true)));
  EXPECT_TRUE(Value().equals(Value()));
}

TEST(StateDictTest, TensorsEqualByDtypeShapeAndValues) {
  EXPECT_TRUE(Value(at::arange(6).reshape({2, 3})).equals(Value(at::arange(6).reshape({2, 3}))));
  EXPECT_FALSE(Value(at::arange(6).reshape({2, 3})).equals(Value(at::arange(6).reshape({3, 2}))));
  EXPECT_FALSE(Value(at::arange(6)).equals(Value(at::arange(6, at::kFloat))));
  EXPECT_FALSE(Value(at::arange(6)).equals(Value(at::arange(1, 7))));
  // A non-contiguous view equals its contiguous copy.
  const at::Tensor t = at::arange(6).reshape({2, 3}).t();
  EXPECT_TRUE(Value(t).equals(Value(t.contiguous())));
  EXPECT_TRUE(Value(at::Tensor()).equals(Value(at::Tensor())));
  EXPECT_FALSE(Value(at::Tensor()).equals(Value(at::zeros({1}))));
}

TEST(StateDictTest, ShardedLeavesEquality) {
  const ShardedTensor a = shard("w", at::arange(4, at::kFloat));
  EXPECT_TRUE(Value(a).equals(Value(shard("w", at::arange(4, at::kFloat)))));
  EXPECT_FALSE(Value(a).equals(Value(shard("w", at::zeros({4})))));
  EXPECT_FALSE(Value(a).equals(Value(shard("v", at::arange(4, at::kFloat)))));
  EXPECT_TRUE(Value(a.without_data()).equals(Value(a.without_data())));
  EXPECT_FALSE(Value(a).equals(Value(a.without_data())));
  ShardedTensor moved = a;
  moved.global_offset = {4};
  EXPECT_FALSE(Value(a).equals(Value(moved)));

  const ShardedObject o{"o", "abc", {2}, {1}, {0}};
  ShardedObject o2 = o;
  EXPECT_TRUE(Value(o).equals(Value(o2)));
  o2.data = "abd";
  EXPECT_FALSE(Value(o).equals(Value(o2)));

  ShardedTensorFactory f;
  f.key = "fac";
  f.data = at::ones({2});
  ShardedTensorFactory g = f;
  g.build = [](const std::string&, const at::Tensor&, const ReplicaId&, const std::optional<FlatRange>&) {
    return Value();
  };
  EXPECT_TRUE(Value(f).equals(Value(g)));  // functions are not compared
  g.flattened_range = FlatRange{0, 1};
  EXPECT_FALSE(Value(f).equals(Value(g)));

  EXPECT_TRUE(Value(LocalNonPersistentObject(Value(3))).equals(Value(LocalNonPersistentObject(Value(3)))));
  EXPECT_FALSE(Value(LocalNonPersistentObject(Value(3))).equals(Value(LocalNonPersistentObject(Value(4)))));
}

}  // namespace
}  // namespace distckpt

namespace distckpt {
namespace {

TEST(StateDictTemporaries, IteratingATemporarysDictDoesNotDangle) {
  auto make = [] {
    Value v = Value::dict();
    v["a"] = 1;
    v["b"] = List{Value(2), Value(3)};
    return v;
  };
  int64_t sum = 0;
  for (const auto& [key, value] : make().as_dict()) sum += value.is_list() ? value.size() : value.as_int();
  EXPECT_EQ(sum, 1 + 2);
  const List items = make().at("b").as_list();  // at() returns a reference: copy before the temporary dies
  EXPECT_EQ(items.size(), 2u);
}

}  // namespace
}  // namespace distckpt
