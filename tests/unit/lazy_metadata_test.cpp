// LazyMetadata: metadata.fb's tensor records decoded one at a time, each
// checked as the whole decoder checks it.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "distckpt/core/errors.h"
#include "format/metadata.h"

namespace distckpt {
namespace {

CheckpointMetadata three_tensors() {
  CheckpointMetadata m;
  m.world_size = 2;
  m.files = {{"data/rank_0.bin", 1024, 0}, {"data/rank_1.bin", 1024, 1}};
  m.tensors = {
      {"a.weight",
       at::kFloat,
       {4, 4},
       {{{{0, 0}, {2, 4}}, std::nullopt, 0, 0, 32, {}}, {{{2, 0}, {2, 4}}, {}, 1, 0, 32, {}}}},
      {"b.bias", at::kBFloat16, {6}, {{{{0}, {6}}, std::nullopt, 1, 200, 12, {}}}},
      {"c.step", at::kLong, {}, {{{{}, {}}, std::nullopt, 0, 512, 8, {}}}},
  };
  m.objects = {{"rng", {2}, {0}, 0, 600, 20, {}}};
  m.layout_name = "gpt";
  return m;
}

TEST(LazyMetadata, DecodesEachRecordAsTheWholeDecoderDoes) {
  const CheckpointMetadata m = three_tensors();
  LazyMetadata lazy(encode_metadata(m), "ck/metadata.fb");
  EXPECT_TRUE(lazy.header().tensors.empty());
  EXPECT_EQ(lazy.header().files.size(), 2u);
  EXPECT_EQ(lazy.header().objects.size(), 1u);
  EXPECT_EQ(lazy.header().layout_name, "gpt");
  ASSERT_EQ(lazy.tensor_count(), 3u);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    EXPECT_EQ(lazy.key_at(i), m.tensors[i].key);
    EXPECT_EQ(lazy.find(m.tensors[i].key), i);
    const TensorRecord t = lazy.tensor(i);
    EXPECT_EQ(t.key, m.tensors[i].key);
    EXPECT_EQ(t.dtype, m.tensors[i].dtype);
    EXPECT_EQ(t.global_shape, m.tensors[i].global_shape);
    ASSERT_EQ(t.chunks.size(), m.tensors[i].chunks.size());
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      EXPECT_EQ(t.chunks[c].box, m.tensors[i].chunks[c].box);
      EXPECT_EQ(t.chunks[c].byte_offset, m.tensors[i].chunks[c].byte_offset);
    }
  }
  EXPECT_EQ(lazy.find("b"), std::nullopt);
  EXPECT_EQ(lazy.find("zzz"), std::nullopt);
  EXPECT_EQ(lazy.lower_bound("b"), 1u);
  EXPECT_EQ(lazy.lower_bound(""), 0u);
  EXPECT_EQ(lazy.lower_bound("zzz"), 3u);
  EXPECT_EQ(lazy.decode_all().tensors.size(), 3u);
}

TEST(LazyMetadata, ABrokenRecordIsRefusedWhenDecodedAndNamedByEveryLaterDecode) {
  CheckpointMetadata m = three_tensors();
  m.tensors[1].chunks[0].box.length = {7};  // outside the global shape {6}
  m.tensors[1].chunks[0].byte_length = 14;
  const std::string bytes = encode_metadata(m);
  LazyMetadata lazy(bytes, "ck/metadata.fb");
  EXPECT_EQ(lazy.tensor(0).key, "a.weight");
  try {
    lazy.tensor(1);
    FAIL() << "the broken record decoded";
  } catch (const CorruptionError& e) {
    EXPECT_NE(std::string(e.what()).find("ck/metadata.fb: tensor 'b.bias' chunk 0"), std::string::npos) << e.what();
  }
  // The buffer is corrupt: later decodes report the same record, not another.
  try {
    lazy.tensor(2);
    FAIL() << "a record decoded after the buffer was found corrupt";
  } catch (const CorruptionError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'b.bias' chunk 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(lazy.find("c.step"), 2u);  // lookups of keys still work
  EXPECT_THROW(lazy.decode_all(), CorruptionError);
  EXPECT_THROW(decode_metadata(bytes, "ck/metadata.fb"), CorruptionError);
}

TEST(LazyMetadata, KeysOutOfOrderAreCorruptionWhenOpened) {
  CheckpointMetadata m = three_tensors();
  std::swap(m.tensors[0], m.tensors[2]);
  try {
    LazyMetadata lazy(encode_metadata(m), "ck/metadata.fb");
    FAIL() << "keys out of order were accepted";
  } catch (const CorruptionError& e) {
    EXPECT_NE(std::string(e.what()).find("not sorted and unique: 'c.step' is followed by 'b.bias'"), std::string::npos)
        << e.what();
  }
  m = three_tensors();
  m.tensors[1].key = "a.weight";  // twice
  EXPECT_THROW(LazyMetadata(encode_metadata(m), "m"), CorruptionError);
}

TEST(LazyMetadata, RefusesWhatIsNoMetadataBuffer) {
  EXPECT_THROW(LazyMetadata("", "m"), CorruptionError);
  EXPECT_THROW(LazyMetadata(std::string(64, '\xff'), "m"), CorruptionError);
  const std::string bytes = encode_metadata(three_tensors());
  EXPECT_THROW(LazyMetadata(bytes.substr(0, bytes.size() / 2), "m"), CorruptionError);
  CheckpointMetadata newer = three_tensors();
  newer.format_version = kFormatVersion + 1;
  EXPECT_THROW(LazyMetadata(encode_metadata(newer), "m"), CheckpointError);
}

}  // namespace
}  // namespace distckpt
