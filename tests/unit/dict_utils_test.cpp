// dict_utils: diff, extract_matching, merge, maps, nested walks, key prefixes.
#include "distckpt/core/dict_utils.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "distckpt/core/errors.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> paths(const std::vector<Path>& ps) {
  std::vector<std::string> out;
  for (const Path& p : ps) out.push_back(to_string(p));
  return out;
}

ShardedTensor shard(const std::string& key) { return ShardedTensor::from_rank_offsets(key, at::zeros({2}), {}); }

// {model: {w: ShardedTensor 'model.w', b: tensor}, step: 3, rng: [obj, 1]}
StateDict sample() {
  StateDict sd;
  sd["model"]["w"] = shard("model.w");
  sd["model"]["b"] = at::ones({2});
  sd["step"] = 3;
  sd["rng"] = List{Value(ShardedObject{"rng", "x", {1}, {0}, {0}}), Value(1)};
  return sd;
}

bool is_sharded(const Value& v) { return v.is_sharded(); }

TEST(DictUtilsTest, PathToString) {
  EXPECT_EQ(to_string(Path{"a", "b", "0", "c"}), "a/b/0/c");
  EXPECT_EQ(to_string(Path{}), "");
}

TEST(DictUtilsTest, DiffOfEqualTreesIsEmpty) {
  const DiffResult d = diff(sample(), sample());
  EXPECT_TRUE(d.only_left.empty());
  EXPECT_TRUE(d.only_right.empty());
  EXPECT_TRUE(d.mismatch.empty());
}

TEST(DictUtilsTest, DiffReportsOnlyLeftOnlyRightAndMismatch) {
  StateDict left = sample();
  StateDict right = sample();
  left["only_l"] = 1;
  right["model"]["only_r"] = 2;
  right["step"] = 4;                    // value differs
  right["model"]["b"] = Value::dict();  // kind differs: not recursed
  right["rng"].push_back(5);            // longer list
  left["nested"]["x"] = List{Value(1), Value(2)};
  right["nested"]["x"] = List{Value(1)};

  const DiffResult d = diff(left, right);
  EXPECT_THAT(paths(d.only_left), ElementsAre("nested/x/1", "only_l"));
  EXPECT_THAT(paths(d.only_right), ElementsAre("model/only_r", "rng/2"));
  EXPECT_THAT(paths(d.mismatch_paths()), ElementsAre("model/b", "step"));
}

TEST(DictUtilsTest, DiffComparesTensorValues) {
  StateDict left = sample();
  StateDict right = sample();
  right["model"]["b"] = at::zeros({2});
  EXPECT_THAT(paths(diff(left, right).mismatch_paths()), ElementsAre("model/b"));
}

TEST(DictUtilsTest, ExtractMatchingKeepsTreeShapeAndCompactsLists) {
  const auto [match, rest] = extract_matching(sample(), is_sharded);
  StateDict expected_match;
  expected_match["model"]["w"] = shard("model.w");
  expected_match["rng"] = List{Value(ShardedObject{"rng", "x", {1}, {0}, {0}})};
  EXPECT_TRUE(match.equals(expected_match));

  StateDict expected_rest;
  expected_rest["model"]["b"] = at::ones({2});
  expected_rest["step"] = 3;
  expected_rest["rng"] = List{Value(1)};
  EXPECT_TRUE(rest.equals(expected_rest));
}

TEST(DictUtilsTest, ExtractMatchingListsAsDictsKeepsPositions) {
  StateDict sd;
  sd["l"] = List{Value(1), Value(shard("a")), Value(2), Value(shard("b"))};
  const auto [match, rest] = extract_matching(sd, is_sharded, /*lists_as_dicts=*/true);
  EXPECT_EQ(match.at("l").kind(), Kind::kDict);
  EXPECT_EQ(match.at("l").at("1").as_sharded_tensor().key, "a");
  EXPECT_EQ(match.at("l").at("3").as_sharded_tensor().key, "b");
  EXPECT_EQ(match.at("l").size(), 2u);
  EXPECT_EQ(rest.at("l").at("0").as_int(), 1);
  EXPECT_EQ(rest.at("l").at("2").as_int(), 2);
}

TEST(DictUtilsTest, ExtractMatchingDropsEmptiedContainers) {
  StateDict sd;
  sd["only_plain"]["x"] = 1;
  sd["empty"] = Value::dict();
  const auto [match, rest] = extract_matching(sd, is_sharded);
  EXPECT_TRUE(match.equals(Value::dict()));  // empty root keeps its kind
  // An originally empty container stays on the non-matching side.
  EXPECT_TRUE(rest.equals(sd));

  const auto [all, none] = extract_matching(Value(List{Value(shard("a"))}), is_sharded);
  EXPECT_EQ(all.size(), 1u);
  EXPECT_TRUE(none.equals(Value::list()));
  const auto [none_as_dict, unused] = extract_matching(Value(List{Value(1)}), is_sharded, /*lists_as_dicts=*/true);
  EXPECT_TRUE(none_as_dict.equals(Value::dict()));
}

TEST(DictUtilsTest, MergeCombinesDisjointTrees) {
  StateDict a;
  a["model"]["w"] = shard("model.w");
  a["opt"] = Value();  // None is replaced
  StateDict b;
  b["model"]["b"] = at::ones({2});
  b["opt"]["lr"] = 0.1;
  b["step"] = 3;
  merge(a, b);
  StateDict expected;
  expected["model"]["w"] = shard("model.w");
  expected["model"]["b"] = at::ones({2});
  expected["opt"]["lr"] = 0.1;
  expected["step"] = 3;
  EXPECT_TRUE(a.equals(expected));

  // Lists merge element by element; None on either side never conflicts.
  Value l1 = List{Value(), Value(2)};
  merge(l1, Value(List{Value(1), Value()}));
  EXPECT_EQ(l1[0].as_int(), 1);
  EXPECT_EQ(l1[1].as_int(), 2);
}

TEST(DictUtilsTest, MergeErrorsNameThePath) {
  StateDict a;
  a["x"]["y"] = 1;
  StateDict b;
  b["x"]["y"] = 2;
  try {
    merge(a, b);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("both trees hold a value at 'x/y' (int and int)"));
  }

  StateDict la;
  la["l"] = List{Value(), Value()};
  StateDict lb;
  lb["l"] = List{Value(1)};
  try {
    merge(la, lb);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("lists at 'l' have different lengths (2 and 1)"));
  }

  StateDict kinds;
  kinds["k"] = Value::list();
  StateDict dict_side;
  dict_side["k"]["z"] = 1;
  try {
    merge(kinds, dict_side);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("at 'k' (list and dict)"));
  }
}

TEST(DictUtilsTest, MapInplaceVisitsLeavesOnly) {
  StateDict sd;
  sd["a"] = 1;
  sd["b"]["c"] = 2;
  sd["l"] = List{Value(3), Value(List{Value(4)})};
  int visits = 0;
  map_inplace(sd, [&](Value& v) {
    ++visits;
    v = v.as_int() * 10;
  });
  EXPECT_EQ(visits, 4);
  EXPECT_EQ(sd.at("b").at("c").as_int(), 20);
  EXPECT_EQ(sd.at("l")[1][0].as_int(), 40);
}

TEST(DictUtilsTest, MapOutplaceLeavesInputUntouched) {
  StateDict sd = sample();
  const Value out = map_outplace(sd, [](const Value& v) -> Value {
    if (v.kind() == Kind::kShardedTensor) return Value(v.as_sharded_tensor().without_data());
    return v;
  });
  EXPECT_FALSE(out.at("model").at("w").as_sharded_tensor().data.defined());
  EXPECT_TRUE(sd.at("model").at("w").as_sharded_tensor().data.defined());
  EXPECT_TRUE(out.at("rng").equals(sd.at("rng")));
}

TEST(DictUtilsTest, NestedValuesAndItemsAreDepthFirstInKeyOrder) {
  StateDict sd;
  sd["z"] = 1;
  sd["a"]["y"] = 2;
  sd["a"]["b"] = List{Value(3), Value(4)};
  sd["m"] = Value::dict();  // no leaves
  std::vector<int64_t> values;
  for (const Value* v : nested_values(static_cast<const Value&>(sd))) values.push_back(v->as_int());
  EXPECT_THAT(values, ElementsAre(3, 4, 2, 1));

  std::vector<std::string> item_paths;
  for (const auto& [path, v] : nested_items(sd)) item_paths.push_back(to_string(path));
  EXPECT_THAT(item_paths, ElementsAre("a/b/0", "a/b/1", "a/y", "z"));

  for (Value* v : nested_values(sd)) *v = 0;
  EXPECT_EQ(sd.at("a").at("b")[1].as_int(), 0);
}

TEST(DictUtilsTest, AddPrefixRewritesShardingKeysOnly) {
  StateDict sd = sample();
  ShardedTensorFactory f;
  f.key = "fac";
  sd["f"] = f;
  add_prefix_for_sharding(sd, "module.");
  EXPECT_EQ(sd.at("model").at("w").as_sharded_tensor().key, "module.model.w");
  EXPECT_EQ(sd.at("rng")[0].as_sharded_object().key, "module.rng");
  EXPECT_EQ(sd.at("f").as_factory().key, "module.fac");
  EXPECT_TRUE(sd.contains("model"));  // dict keys unchanged
}

TEST(DictUtilsTest, ReplacePrefixRewritesEveryShardingKey) {
  StateDict sd = sample();
  replace_prefix_for_sharding(sd, "", "x.");
  replace_prefix_for_sharding(sd, "x.", "y.");
  EXPECT_EQ(sd.at("model").at("w").as_sharded_tensor().key, "y.model.w");
  EXPECT_EQ(sd.at("rng")[0].as_sharded_object().key, "y.rng");
}

TEST(DictUtilsTest, ReplacePrefixFailureLeavesKeysUntouched) {
  StateDict sd = sample();  // keys "model.w" and "rng"
  try {
    replace_prefix_for_sharding(sd, "model.", "m.");
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("key 'rng' does not start with the expected prefix 'model.'"));
  }
  EXPECT_EQ(sd.at("model").at("w").as_sharded_tensor().key, "model.w");
  EXPECT_EQ(sd.at("rng")[0].as_sharded_object().key, "rng");
}

TEST(DictUtilsTest, ApplyPrefixMappingFirstMatchWins) {
  StateDict sd;
  sd["a"] = shard("decoder.layers.0.w");
  sd["b"] = shard("decoder.final.w");
  sd["c"] = shard("embedding.w");
  apply_prefix_mapping(sd, {{"decoder.layers.", "blocks."}, {"decoder.", "dec."}});
  EXPECT_EQ(sd.at("a").as_sharded_tensor().key, "blocks.0.w");
  EXPECT_EQ(sd.at("b").as_sharded_tensor().key, "dec.final.w");
  EXPECT_EQ(sd.at("c").as_sharded_tensor().key, "embedding.w");
}

TEST(DictUtilsTest, DiffReportsTheTwoKindsOfAMismatch) {
  StateDict left = sample();
  StateDict right = sample();
  right["step"] = "three";
  right["model"]["b"] = at::zeros({2});
  const DiffResult d = diff(left, right);
  ASSERT_EQ(d.mismatch.size(), 2u);
  EXPECT_EQ(to_string(d.mismatch[0].path), "model/b");
  EXPECT_EQ(d.mismatch[0].left, Kind::kTensor);
  EXPECT_EQ(d.mismatch[0].right, Kind::kTensor);
  EXPECT_EQ(to_string(d.mismatch[1].path), "step");
  EXPECT_EQ(d.mismatch[1].left, Kind::kInt);
  EXPECT_EQ(d.mismatch[1].right, Kind::kString);
}

TEST(DictUtilsTest, InspectTypes) {
  EXPECT_EQ(inspect_types(sample()),
            "model:\n"
            "  b: tensor\n"
            "  w: ShardedTensor\n"
            "rng:\n"
            "  0: ShardedObject\n"
            "  1: int\n"
            "step: int\n");
  EXPECT_EQ(inspect_types(Value(2.5)), "float\n");
}

TEST(DictUtilsTest, DictMapTreatsListsAsLeaves) {
  StateDict sd = sample();
  std::vector<std::string> seen;
  dict_map(sd, [&](const Value& v) {
    seen.push_back(kind_name(v.kind()));
    return Value(static_cast<int64_t>(seen.size()));
  });
  // Key order: model/b, model/w, rng (the whole list), step.
  EXPECT_THAT(seen, ElementsAre("tensor", "ShardedTensor", "list", "int"));
  EXPECT_EQ(sd.at("model").at("b").as_int(), 1);
  EXPECT_EQ(sd.at("rng").as_int(), 3);
  EXPECT_EQ(sd.at("step").as_int(), 4);

  StateDict keyed = sample();
  dict_map_with_key(keyed, [](const std::string& key, const Value&) { return Value(key); });
  EXPECT_EQ(keyed.at("model").at("w").as_string(), "w");
  EXPECT_EQ(keyed.at("rng").as_string(), "rng");
  Value list = Value::list();
  EXPECT_TRUE(throws_with<UsageError>([&] { dict_map(list, [](const Value& v) { return v; }); },
                                      "the root is a list, not a dict"));
}

TEST(DictUtilsTest, MapReduceGroupsInOrder) {
  const std::vector<std::string> words{"apple", "bee", "avocado", "bear", "cat"};
  const auto first_letters = map_reduce(
      words, [](const std::string& w) { return w.front(); }, [](const std::string& w) { return w.size(); },
      [](std::vector<size_t> sizes) { return sizes; });
  ASSERT_EQ(first_letters.size(), 3u);
  EXPECT_THAT(first_letters.at('a'), ElementsAre(5u, 7u));
  EXPECT_THAT(first_letters.at('b'), ElementsAre(3u, 4u));
  const auto total = map_reduce(
      words, [](const std::string& w) { return w.size() > 3; }, [](const std::string& w) { return w.size(); },
      [](const std::vector<size_t>& sizes) {
        size_t sum = 0;
        for (size_t s : sizes) sum += s;
        return sum;
      });
  EXPECT_EQ(total.at(true), 16u);
  EXPECT_EQ(total.at(false), 6u);
}

TEST(DictUtilsTest, ForEachNestedItemGivesContainerAndKey) {
  StateDict sd = sample();
  std::vector<std::string> keys;
  for_each_nested_item(sd, [&](Value& container, const std::string& key, Value& value) {
    keys.push_back(fmt::format("{}:{}", container.is_list() ? "list" : "dict", key));
    if (value.kind() == Kind::kInt) value = Value(value.as_int() * 10);
  });
  EXPECT_THAT(keys, ElementsAre("dict:b", "dict:w", "list:0", "list:1", "dict:step"));
  EXPECT_EQ(sd.at("step").as_int(), 30);
  EXPECT_EQ(sd.at("rng")[1].as_int(), 10);
}

TEST(DictUtilsTest, NamedExtractsSplitByLeafKind) {
  StateDict sd = sample();
  sd["extra"] = LocalNonPersistentObject(Value(5));
  sd["fused"] = ShardedTensorFactory{"fused", at::zeros({2}), {}, {}, {0}, std::nullopt};
  auto keys_of = [](const Value& tree) {
    std::vector<std::string> out;
    for (const auto& [path, leaf] : nested_items(tree)) out.push_back(to_string(path));
    return out;
  };
  EXPECT_THAT(keys_of(extract_sharded_tensors(sd).first), ElementsAre("model/w"));
  EXPECT_THAT(keys_of(extract_sharded_tensors(sd).second),
              ElementsAre("extra", "fused", "model/b", "rng/0", "rng/1", "step"));
  EXPECT_THAT(keys_of(extract_sharded_tensors_and_factories(sd).first), ElementsAre("fused", "model/w"));
  EXPECT_THAT(keys_of(extract_sharded_tensors_or_nonpersistent(sd).first), ElementsAre("extra", "fused", "model/w"));
  EXPECT_THAT(keys_of(extract_nonpersistent(sd).first), ElementsAre("extra"));
  EXPECT_THAT(keys_of(extract_sharded_base(sd).first), ElementsAre("fused", "model/w", "rng/0"));
}

}  // namespace
}  // namespace distckpt
