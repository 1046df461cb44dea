// Name mappings: expansion into one external tensor per index combination
// (stacked axes, keys per element, fused parts, padded dims), the errors of
// an inconsistent mapping, and their round trips through the metadata and
// through JSON files (a mapping given to a checkpoint that records none).
#include "distckpt/format/name_mapping.h"

#include <gtest/gtest.h>

#include "distckpt/core/errors.h"
#include "format/metadata.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

TEST(NameMapping, ExpandsStackedFusedAndKeyedEntries) {
  NameMapping m("llama");
  m.map("layers.qkv", "l.{layer}.k", {12, 4}).over("layer", 2).part(0, 6, 3);
  m.map("blocks.{b}.experts.w", "b.{b}.e.{e}.w", {5, 4}).over_keys("b", 2).over("e", 3);
  m.map("emb", "embed", {10, 4}).with_pad(0);
  const std::vector<MappedName> names = m.expand();
  ASSERT_EQ(names.size(), 2 + 6 + 1U);

  EXPECT_EQ(names[1].external, "l.1.k");
  EXPECT_EQ(names[1].key, "layers.qkv");
  EXPECT_EQ(names[1].key_shape, (Shape{2, 12, 4}));
  EXPECT_EQ(names[1].region.offset, (Shape{1, 6, 0}));
  EXPECT_EQ(names[1].region.length, (Shape{1, 3, 4}));
  EXPECT_EQ(names[1].external_shape(), (Shape{3, 4}));

  // Keys per element of the outer stack, a leading axis for the inner one (last index fastest).
  EXPECT_EQ(names[2 + 4].external, "b.1.e.1.w");
  EXPECT_EQ(names[2 + 4].key, "blocks.1.experts.w");
  EXPECT_EQ(names[2 + 4].key_shape, (Shape{3, 5, 4}));
  EXPECT_EQ(names[2 + 4].region.offset, (Shape{1, 0, 0}));

  EXPECT_EQ(names[8].key_pad_dim, 0);
  EXPECT_EQ(names[8].leading_axes, 0);
}

TEST(NameMapping, InconsistentMappingsAreErrorsNamingIt) {
  NameMapping twice("m");
  twice.map("a", "same", {2});
  twice.map("b", "same", {2});
  EXPECT_THROW(
      {
        try {
          twice.expand();
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(), "name mapping 'm' names the external tensor 'same' twice: for 'a' and for 'b'");
          throw;
        }
      },
      Error);
  NameMapping outside("m");
  outside.map("a", "x", {4, 2}).part(0, 3, 2);
  EXPECT_THROW(outside.expand(), Error);
  NameMapping unknown("m");
  unknown.map("a", "x.{layer}", {4});
  EXPECT_THROW(unknown.expand(), Error);
  EXPECT_THROW(find_mapping({twice}, "llama", "checkpoint 'c'"), Error);
  // A mapping read from a checkpoint may claim any count: the expansion is bounded before it allocates
  // (2^20 x 2^20 x 2^20 would also overflow int64).
  NameMapping huge("m");
  huge.map("w", "w.{a}.{b}.{c}", {1}).over("a", int64_t{1} << 20).over("b", int64_t{1} << 20).over("c", 1 << 20);
  EXPECT_TRUE(throws_with<CheckpointError>([&] { huge.expand(); },
                                           "name mapping 'm': 'w.{a}.{b}.{c}' expands to more than 16777216 external "
                                           "names"));
}

TEST(NameMapping, RoundTripsThroughTheMetadata) {
  CheckpointMetadata m;
  NameMapping& mapping = m.name_mappings.emplace_back("mixtral");
  mapping.map("decoder.layers.mlp.experts.linear_fc1.weight", "model.layers.{l}.experts.{e}.w1.weight", {8, 4})
      .over("l", 2)
      .over_keys("e", 3)
      .part(0, 0, 4)
      .with_pad(1);
  const CheckpointMetadata back = decode_metadata(encode_metadata(m), "metadata.fb");
  ASSERT_EQ(back.name_mappings.size(), 1U);
  const MappedTensor& t = back.name_mappings[0].tensors().at(0);
  EXPECT_EQ(back.name_mappings[0].name(), "mixtral");
  EXPECT_EQ(t.key, "decoder.layers.mlp.experts.linear_fc1.weight");
  EXPECT_EQ(t.external, "model.layers.{l}.experts.{e}.w1.weight");
  EXPECT_EQ(t.shape, (Shape{8, 4}));
  ASSERT_EQ(t.indices.size(), 2U);
  EXPECT_EQ(t.indices[1].name, "e");
  EXPECT_EQ(t.indices[1].count, 3);
  EXPECT_FALSE(t.indices[1].leading_axis);
  EXPECT_EQ(t.part_dim, 0);
  EXPECT_EQ(t.part_extent, 4);
  EXPECT_EQ(t.pad_dim, 1);
  // A checkpoint without mappings records none.
  EXPECT_TRUE(decode_metadata(encode_metadata(CheckpointMetadata{}), "m").name_mappings.empty());
}

// Every field through to_json and back: the expansions are equal.
// A checkpoint whose metadata is mostly a large mapping of short names (few
// tensors, many entries, several indices each) decodes: what decoding
// charges against the buffer's size is what the buffer holds of each entry.
TEST(NameMapping, AMappingOfManyShortEntriesDecodes) {
  CheckpointMetadata m;
  NameMapping& mapping = m.name_mappings.emplace_back("m");
  for (int i = 0; i < 2000; ++i) {
    mapping.map(std::to_string(i), "e" + std::to_string(i) + ".{a}.{b}", {2, 2}).over("a", 2).over("b", 2);
  }
  const std::string bytes = encode_metadata(m);
  const CheckpointMetadata back = decode_metadata(bytes, "metadata.fb");
  ASSERT_EQ(back.name_mappings.at(0).tensors().size(), 2000U);
  EXPECT_EQ(back.name_mappings[0].tensors().at(1999).indices.size(), 2U);
  EXPECT_EQ(LazyMetadata(bytes, "metadata.fb").header().name_mappings.at(0).tensors().size(), 2000U);
}

TEST(NameMapping, JsonRoundTripKeepsEveryExpansion) {
  NameMapping m("llama");
  m.map("layers.qkv", "l.{layer}.k", {12, 4}).over("layer", 2).part(0, 6, 3);
  m.map("blocks.{b}.experts.w", "b.{b}.e.{e}.w", {5, 4}).over_keys("b", 2).over("e", 3);
  m.map("emb", "embed", {10, 4}).with_pad(0);
  const NameMapping back = NameMapping::from_json(m.to_json(), "m.json");
  EXPECT_EQ(back.name(), "llama");
  const std::vector<MappedName> want = m.expand(), got = back.expand();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].external, want[i].external);
    EXPECT_EQ(got[i].key, want[i].key);
    EXPECT_EQ(got[i].key_shape, want[i].key_shape);
    EXPECT_EQ(got[i].region.offset, want[i].region.offset);
    EXPECT_EQ(got[i].region.length, want[i].region.length);
    EXPECT_EQ(got[i].key_pad_dim, want[i].key_pad_dim);
  }
  EXPECT_EQ(back.to_json(), m.to_json());
}

// A mapping file is the user's input: what is wrong is named with the file and the entry.
TEST(NameMapping, AMappingFileThatIsNotOneIsRefusedNamingTheFileAndTheEntry) {
  const auto refused = [](const std::string& text, const std::string& part) {
    return throws_with<UsageError>([&] { NameMapping::from_json(text, "m.json"); }, part);
  };
  EXPECT_TRUE(refused("{not json", "m.json: not a name mapping (a JSON object"));
  EXPECT_TRUE(refused("[1, 2]", "m.json: not a name mapping"));
  EXPECT_TRUE(refused(R"({"tensors": []})", "m.json: 'name' is missing or not a string"));
  EXPECT_TRUE(refused(R"({"name": "x", "tensors": [{"key": "a", "shape": [2]}]})",
                      "m.json: tensors[0]: 'external' is missing or not a string"));
  EXPECT_TRUE(refused(R"({"name": "x", "tensors": [{"key": "a", "external": "b", "shape": [2.5]}]})",
                      "m.json: tensors[0]: 'shape' holds a non-integer"));
  EXPECT_TRUE(refused(R"({"name": "x", "tensors": [{"key": "a", "external": "b", "shape": [2],
                          "indices": [{"name": "l", "count": "4"}]}]})",
                      "m.json: tensors[0]: 'count' is missing or not an integer"));
  EXPECT_TRUE(refused(R"({"name": "x", "tensors": [{"key": "a", "external": "b", "shape": [4],
                          "part": {"dim": 0, "offset": 3, "extent": 2}}]})",
                      "m.json: name mapping 'x': part [3, +2) along dim 0 is not inside 'a'"));
  EXPECT_TRUE(refused(R"({"name": "x", "tensors": [{"key": "a", "external": "b.{layer}", "shape": [4]}]})",
                      "'{layer}' in 'b.{layer}' is not one of its indices"));
  EXPECT_TRUE(refused(R"({"name": "x", "tensors": [{"key": "a", "external": "b", "shape": [4], "pad_dim": 99}]})",
                      "m.json: tensors[0]: 'pad_dim' is 99, not a dim"));
}

}  // namespace
}  // namespace distckpt
