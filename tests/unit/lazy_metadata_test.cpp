// LazyMetadata: metadata.fb's tensor records decoded one at a time, each
// checked as the whole decoder checks it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/core/errors.h"
#include "format/metadata.h"
#include "support/throws_with.h"

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

// A format 3 file opened from its head: reads go through `reads`.
struct Ranged {
  explicit Ranged(std::string file) : bytes(std::move(file)) {}
  LazyMetadata open(const std::string& origin = "ck/metadata.fb") {
    const uint64_t head = metadata_head_bytes(bytes);
    return LazyMetadata(
        bytes.substr(0, head), bytes.size(),
        [this](uint64_t offset, uint64_t length, uint8_t* out) {
          ASSERT_LE(offset + length, bytes.size());
          reads.emplace_back(offset, length);
          std::memcpy(out, bytes.data() + offset, length);
        },
        origin);
  }
  std::string bytes;
  std::vector<std::pair<uint64_t, uint64_t>> reads;
};

// 40 tensors of 3 chunks in 12 files.
CheckpointMetadata many_tensors() {
  CheckpointMetadata m;
  m.world_size = 12;
  for (int f = 0; f < 12; ++f) m.files.push_back({fmt::format("data/rank_{}.bin", f), 40 * 3 * 64, f});
  for (int t = 0; t < 40; ++t) {
    TensorRecord& r = m.tensors.emplace_back();
    r.key = fmt::format("layers.{:02d}.weight", t);
    r.dtype = at::kFloat;
    r.global_shape = {12, 4};
    for (int c = 0; c < 3; ++c) {
      const auto file = static_cast<uint32_t>((t + 5 * c) % 12);
      r.chunks.push_back({{{4 * c, 0}, {4, 4}}, std::nullopt, file, static_cast<uint64_t>(t * 3 + c) * 64, 64, {}});
    }
  }
  m.objects = {{"rng", {2}, {0}, 3, 40 * 3 * 64 - 20, 20, {}}};
  return m;
}

TEST(LazyMetadata, AFormat3FileOpensFromItsHeadAndReadsOnlyTheRecordsAsked) {
  const CheckpointMetadata m = many_tensors();
  Ranged file(encode_metadata(m));
  const uint64_t head = metadata_head_bytes(file.bytes);
  ASSERT_LT(head, file.bytes.size() / 4) << "the head holds no records";
  LazyMetadata lazy = file.open();
  EXPECT_EQ(lazy.tensor_count(), 40u);
  EXPECT_EQ(lazy.file_count(), 12u);
  ASSERT_EQ(lazy.header().objects.size(), 1u);
  EXPECT_EQ(lazy.file(3).path, "data/rank_3.bin");  // the object's file, read at open
  EXPECT_THROW(lazy.file(0), std::out_of_range);    // no record read names it yet
  const uint64_t opened = lazy.bytes_read();
  EXPECT_EQ(lazy.find("layers.17.weight"), 17u);
  EXPECT_EQ(lazy.bytes_read(), opened) << "a key lookup read records";

  const CheckpointMetadata whole = decode_metadata(file.bytes, "m");
  file.reads.clear();
  const TensorRecord t = lazy.tensor(17);
  EXPECT_EQ(t.key, whole.tensors[17].key);
  ASSERT_EQ(t.chunks.size(), 3u);
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(t.chunks[c].box, whole.tensors[17].chunks[c].box);
    EXPECT_EQ(t.chunks[c].file, whole.tensors[17].chunks[c].file);
    EXPECT_EQ(t.chunks[c].byte_offset, whole.tensors[17].chunks[c].byte_offset);
    EXPECT_EQ(lazy.file(t.chunks[c].file).path, whole.files[t.chunks[c].file].path);
    EXPECT_EQ(lazy.file(t.chunks[c].file).writer_rank, whole.files[t.chunks[c].file].writer_rank);
  }
  // One read for the record, one per file record not read before (file 3,
  // the object's, was read at open); all of it past the head, and what was
  // read is what bytes_read() counts.
  std::set<uint32_t> new_files;
  for (const ChunkRecord& c : t.chunks) {
    if (c.file != 3) new_files.insert(c.file);
  }
  EXPECT_EQ(file.reads.size(), 1u + new_files.size());
  uint64_t sum = 0;
  for (const auto& [offset, length] : file.reads) {
    EXPECT_GE(offset, head);
    sum += length;
  }
  EXPECT_EQ(lazy.bytes_read(), opened + sum);
  EXPECT_LT(sum, (file.bytes.size() - head) / 10);
  for (size_t i = 0; i < 40; ++i) {
    if (i != 17) {
      EXPECT_EQ(lazy.tensor(i).chunks.size(), 3u);
    }
  }
  EXPECT_LT(lazy.bytes_read(), file.bytes.size()) << "the file list's vector of offsets is never read";
  EXPECT_THROW(lazy.decode_all(), std::logic_error);
}

TEST(LazyMetadata, AFlippedByteInARecordReadAloneIsCaughtByTheRecordThatReadsIt) {
  const CheckpointMetadata m = many_tensors();
  const std::string genuine = encode_metadata(m);
  // The record of tensor 20 lies before its key's second appearance (the
  // first is the head's index of keys).
  const size_t key = genuine.rfind("layers.20.weight");
  ASSERT_GT(key, metadata_head_bytes(genuine));
  Ranged file(genuine);
  file.bytes[key + 3] ^= 0x01;
  LazyMetadata lazy = file.open();
  EXPECT_EQ(lazy.tensor(19).key, "layers.19.weight");  // a rank that does not read it is not stopped
  try {
    lazy.tensor(20);
    FAIL() << "a flipped record was decoded";
  } catch (const CorruptionError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch in the record of tensor 'layers.20.weight'"),
              std::string::npos)
        << e.what();
  }
  // A flipped file record: caught by whichever record names it first.
  Ranged files(genuine);
  const size_t path = files.bytes.rfind("data/rank_7.bin");
  files.bytes[path + 5] ^= 0x01;
  LazyMetadata other = files.open();
  try {
    for (size_t i = 0; i < 40; ++i) other.tensor(i);
    FAIL() << "a flipped file record was read";
  } catch (const CorruptionError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch in the record of file 7"), std::string::npos) << e.what();
  }
}

TEST(LazyMetadata, TheIndexMustSayWhatTheRecordsSay) {
  // The head's key of record 5 changed (still in order), the rest intact: a
  // reader of records alone and the whole decoder both refuse it.
  std::string bytes = encode_metadata(many_tensors());
  const size_t key = bytes.find("layers.05.weight");
  ASSERT_LT(key, metadata_head_bytes(bytes));
  bytes[key + 15] = 'x';  // "layers.05.weighx"
  Ranged file(bytes);
  LazyMetadata lazy = file.open();
  EXPECT_TRUE(throws_with<CorruptionError>([&] { lazy.tensor(5); },
                                           "the index names tensor record 5 'layers.05.weighx', the record says "
                                           "'layers.05.weight'"));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_metadata(bytes, "m"); }, "the index names tensor record 5"));
  // A head that does not end where the file says: refused at open.
  const uint64_t head = metadata_head_bytes(file.bytes);
  EXPECT_THROW(LazyMetadata(
                   file.bytes.substr(0, head), file.bytes.size() + 8,
                   [](uint64_t, uint64_t, uint8_t*) { FAIL() << "read past the head"; }, "m"),
               CorruptionError);
  // Older formats have no index: they are read whole.
  CheckpointMetadata old = many_tensors();
  old.format_version = 2;
  const std::string v2 = encode_metadata(old);
  EXPECT_EQ(metadata_head_bytes(v2), v2.size());
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] {
        LazyMetadata(
            v2, v2.size() * 2, [](uint64_t, uint64_t, uint8_t*) {}, "m");
      },
      "it says format 2, but the commit marker says format 3 or later"));
  EXPECT_EQ(LazyMetadata(v2, "m").tensor(3).key, "layers.03.weight");
  EXPECT_EQ(decode_metadata(v2, "m").tensors.size(), 40u);
}

}  // namespace
}  // namespace distckpt
