// format layer: dtype names, metadata.fb (round trip and every semantic
// check of the decoder) and the check of the files it lists.
#include <gtest/gtest.h>
#include <torch/version.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <string>

#include "distckpt/core/errors.h"
#include "distckpt/fb/checkpoint_generated.h"
#include "format/common_state.h"
#include "format/dtype.h"
#include "format/metadata.h"
#include "io/file.h"
#include "storage/distckpt_storage.h"
#include "storage/posix_backend.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

const std::string kOrigin = "ckpt/metadata.fb";

ChunkRecord chunk(Box box, std::optional<FlatRange> flat, uint32_t file, uint64_t offset, uint64_t length,
                  std::vector<uint64_t> sums) {
  return ChunkRecord{std::move(box), flat, file, offset, length, std::move(sums)};
}

// Two files of 4096 bytes, blocks of 64 bytes; tensors with 2-d, flat, 1-d,
// empty and 0-d chunks; two object shards.
CheckpointMetadata sample_metadata() {
  CheckpointMetadata m;
  m.world_size = 2;
  m.checksum_block_size = 64;
  m.files = {{"data/rank_0.bin", 4096, 0}, {"data/rank_1.bin", 4096, 1}};
  m.tensors = {
      {"decoder.weight",
       at::kDouble,
       {4, 6},
       {chunk({{0, 0}, {2, 6}}, std::nullopt, 0, 0, 96, {0xa1, 0xa2}),
        chunk({{2, 0}, {2, 6}}, FlatRange{3, 10}, 1, 512, 56, {0xb1})}},
      {"embedding", at::kBFloat16, {8}, {chunk({{0}, {8}}, std::nullopt, 1, 0, 16, {0xc1})}},
      {"empty", at::kFloat, {0, 5}, {chunk({{0, 0}, {0, 5}}, std::nullopt, 0, 4096, 0, {})}},
      {"step", at::kLong, {}, {chunk({{}, {}}, std::nullopt, 0, 100, 8, {0xd1})}},
  };
  m.objects = {{"rng", {2}, {0}, 0, 200, 10, {0xe1}}, {"rng", {2}, {1}, 1, 300, 10, {0xe2}}};
  m.common_file = "common.fb";
  m.layout_name = "gpt";
  m.layout_fingerprint = "f00d";
  m.layout_schema = "layout gpt;\n";
  m.plan_hashes = {0x1111, 0x2222};
  m.writer_policy = "balanced";
  return m;
}

void expect_same(const CheckpointMetadata& a, const CheckpointMetadata& b) {
  EXPECT_EQ(a.format_version, b.format_version);
  EXPECT_EQ(a.world_size, b.world_size);
  EXPECT_EQ(a.checksum_block_size, b.checksum_block_size);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    EXPECT_EQ(x.key, y.key);
    EXPECT_EQ(x.dtype, y.dtype) << x.key;
    EXPECT_EQ(x.global_shape, y.global_shape) << x.key;
    ASSERT_EQ(x.chunks.size(), y.chunks.size()) << x.key;
    for (size_t j = 0; j < x.chunks.size(); ++j) {
      const auto &c = x.chunks[j], &d = y.chunks[j];
      EXPECT_EQ(c.box, d.box) << x.key << " " << j;
      EXPECT_EQ(c.flat, d.flat) << x.key << " " << j;
      EXPECT_EQ(c.file, d.file);
      EXPECT_EQ(c.byte_offset, d.byte_offset);
      EXPECT_EQ(c.byte_length, d.byte_length);
      EXPECT_EQ(c.block_checksums, d.block_checksums);
    }
  }
  ASSERT_EQ(a.objects.size(), b.objects.size());
  for (size_t i = 0; i < a.objects.size(); ++i) {
    const auto &o = a.objects[i], &p = b.objects[i];
    EXPECT_EQ(o.key, p.key);
    EXPECT_EQ(o.global_shape, p.global_shape);
    EXPECT_EQ(o.global_offset, p.global_offset);
    EXPECT_EQ(o.file, p.file);
    EXPECT_EQ(o.byte_offset, p.byte_offset);
    EXPECT_EQ(o.byte_length, p.byte_length);
    EXPECT_EQ(o.block_checksums, p.block_checksums);
  }
  ASSERT_EQ(a.files.size(), b.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) {
    EXPECT_EQ(a.files[i].path, b.files[i].path);
    EXPECT_EQ(a.files[i].size, b.files[i].size);
    EXPECT_EQ(a.files[i].writer_rank, b.files[i].writer_rank);
  }
  EXPECT_EQ(a.common_file, b.common_file);
  EXPECT_EQ(a.layout_name, b.layout_name);
  EXPECT_EQ(a.layout_fingerprint, b.layout_fingerprint);
  EXPECT_EQ(a.layout_schema, b.layout_schema);
  EXPECT_EQ(a.plan_hashes, b.plan_hashes);
  EXPECT_EQ(a.writer_policy, b.writer_policy);
}

// Encodes the sample after `mutate` and expects decoding to fail with E, a
// message naming the origin and containing `part`.
template <typename E>
testing::AssertionResult rejects(const std::function<void(CheckpointMetadata&)>& mutate, const std::string& part) {
  CheckpointMetadata m = sample_metadata();
  mutate(m);
  const std::string bytes = encode_metadata(m);
  const auto decode = [&] { decode_metadata(bytes, kOrigin); };
  auto result = throws_with<E>(decode, part);
  return result ? throws_with<E>(decode, kOrigin + ": ") : result;
}

TEST(FormatDtypeTest, NamesRoundTripAndSizes) {
  const std::vector<std::pair<std::string, size_t>> names = {
      {"float64", 8}, {"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {"int64", 8},     {"int32", 4},
      {"int16", 2},   {"int8", 1},    {"uint8", 1},   {"bool", 1},     {"complex64", 8}, {"complex128", 16}};
  for (const auto& [name, size] : names) {
    const at::ScalarType t = dtype_from_name(name);
    EXPECT_EQ(dtype_name(t), name);
    EXPECT_EQ(dtype_size(t), size) << name;
  }
  EXPECT_EQ(dtype_from_name("bfloat16"), at::kBFloat16);
  EXPECT_TRUE(throws_with<CorruptionError>([] { dtype_from_name("float8"); }, "unknown dtype 'float8'"));
  EXPECT_TRUE(throws_with<UsageError>([] { dtype_name(at::kQInt8); }, "cannot be stored"));
}

// Issue 21 item 11: newer dtypes by name, where this LibTorch has them, and
// known by name and size where it does not.
TEST(FormatDtypeTest, UnsignedAndFloat8DtypesResolveByNameWhereLibTorchHasThem) {
  const std::vector<std::pair<std::string, uint32_t>> newer = {
      {"uint16", 2},      {"uint32", 4},          {"uint64", 8},          {"float8_e4m3fn", 1},
      {"float8_e5m2", 1}, {"float8_e4m3fnuz", 1}, {"float8_e5m2fnuz", 1}, {"float8_e8m0fnu", 1}};
  for (const auto& [name, size] : newer) {
    const ResolvedDtype r = resolve_stored_dtype(name, 0);
    if (r.unrepresentable) {
      // This LibTorch lacks the type: the record keeps the name and size.
      EXPECT_EQ(r.type, at::ScalarType::Undefined) << name;
      EXPECT_EQ(r.unrepresentable->name, name);
      EXPECT_EQ(r.unrepresentable->element_size, size) << name;
      EXPECT_TRUE(throws_with<CheckpointError>([&] { dtype_from_name(name); },
                                               "this LibTorch has no " + name + " type; a newer LibTorch has"));
    } else {
      EXPECT_EQ(dtype_name(r.type), name);
      EXPECT_EQ(dtype_size(r.type), size) << name;
      EXPECT_TRUE(is_storable_dtype(r.type));
    }
  }
#if TORCH_VERSION_MAJOR < 2
  // LibTorch 1.x has none of them.
  for (const auto& [name, size] : newer) EXPECT_TRUE(resolve_stored_dtype(name, 0).unrepresentable) << name;
#endif
  // A dtype only a newer distckpt knows: its recorded size stands in.
  const ResolvedDtype future = resolve_stored_dtype("float4_e2m1fn_x2", 1);
  ASSERT_TRUE(future.unrepresentable);
  EXPECT_EQ(future.unrepresentable->element_size, 1u);
  EXPECT_TRUE(throws_with<CorruptionError>([] { resolve_stored_dtype("float4_e2m1fn_x2", 0); },
                                           "unknown dtype 'float4_e2m1fn_x2' with no element size recorded"));
  EXPECT_TRUE(throws_with<CorruptionError>([] { resolve_stored_dtype("float4_e2m1fn_x2", 3); },
                                           "unknown dtype 'float4_e2m1fn_x2' with element size 3"));
  EXPECT_TRUE(throws_with<CorruptionError>([] { resolve_stored_dtype("float32", 2); },
                                           "dtype float32 is recorded with element size 2, but its elements take 4"));
  EXPECT_EQ(resolve_stored_dtype("float32", 4).type, at::kFloat);
}

TEST(FormatMetadataTest, UnrepresentableDtypesRoundTripByNameAndSize) {
  CheckpointMetadata m = sample_metadata();
  m.tensors[1].dtype = at::ScalarType::Undefined;  // "embedding": 8 elements, 16 bytes
  m.tensors[1].unrepresentable = UnrepresentableDtype{"float9_future", 2};
  const CheckpointMetadata decoded = decode_metadata(encode_metadata(m), kOrigin);
  ASSERT_TRUE(decoded.tensors[1].unrepresentable);
  EXPECT_EQ(decoded.tensors[1].unrepresentable->name, "float9_future");
  EXPECT_EQ(decoded.tensors[1].element_size(), 2u);
  EXPECT_EQ(stored_dtype_name(decoded.tensors[1]), "float9_future");
  EXPECT_EQ(carrier_dtype(decoded.tensors[1]), at::kShort);
  EXPECT_EQ(unrepresentable_reason(decoded.tensors[1]),
            "float9_future is a dtype this version of distckpt does not know (a newer one wrote it)");
  EXPECT_FALSE(decoded.tensors[0].unrepresentable);
  EXPECT_EQ(decoded.tensors[0].element_size(), 8u);
  // Byte lengths are still checked, with the recorded size.
  m.tensors[1].unrepresentable->element_size = 4;
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_metadata(encode_metadata(m), kOrigin); },
                                           "byte length is 16, but 8 elements of float9_future take 32 bytes"));
}

TEST(FormatMetadataTest, RoundTripKeepsEveryField) {
  const CheckpointMetadata m = sample_metadata();
  const std::string bytes = encode_metadata(m);
  EXPECT_EQ(bytes.substr(4, 4), "DCKP");  // the file identifier
  const CheckpointMetadata decoded = decode_metadata(bytes, kOrigin);
  expect_same(m, decoded);
  EXPECT_EQ(encode_metadata(decoded), bytes);  // deterministic
  // A copy at an odd address decodes too (the decoder realigns it).
  const std::string shifted = "x" + bytes;
  expect_same(m, decode_metadata(std::string_view(shifted).substr(1), kOrigin));
}

TEST(FormatMetadataTest, FindTensorAndObjectUniqueKeys) {
  const CheckpointMetadata m = sample_metadata();
  ASSERT_NE(m.find_tensor("embedding"), nullptr);
  EXPECT_EQ(m.find_tensor("embedding")->global_shape, Shape{8});
  EXPECT_EQ(m.find_tensor("step")->dtype, at::kLong);
  EXPECT_EQ(m.find_tensor("decoder.weight"), &m.tensors[0]);
  EXPECT_EQ(m.find_tensor("embeddin"), nullptr);
  EXPECT_EQ(m.find_tensor("zzz"), nullptr);
  EXPECT_EQ(m.objects[1].unique_key(), "rng/shard_1_2");
  ObjectRecord grid;
  grid.key = "a";
  grid.global_shape = {2, 4};
  grid.global_offset = {1, 3};
  EXPECT_EQ(grid.unique_key(), "a/shard_1.3_2.4");
}

TEST(FormatMetadataTest, RejectsChunkGeometryOutsideTheTensor) {
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.tensors[0].chunks[0].box.length[1] = 7; },
                                       "tensor 'decoder.weight' chunk 0: box"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.tensors[0].chunks[1].box.offset[1] = 1; },
                                       "lies outside the global shape [4, 6] on axis 1"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.tensors[0].chunks[0].box.offset[0] = -1; }, "on axis 0"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.plan_hashes.push_back(3); },
                                       "3 plan hashes recorded for a world of 2 ranks"));
  EXPECT_TRUE(rejects<CorruptionError>(
      [](auto& m) { m.tensors[0].chunks[1].box.offset[0] = std::numeric_limits<int64_t>::max(); },
      "tensor 'decoder.weight' chunk 1: box"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.tensors[0].chunks[0].box.offset.push_back(0); },
                                       "box has offset rank 3 and length rank 2, but the tensor has rank 2"));
  EXPECT_TRUE(rejects<CorruptionError>(
      [](auto& m) {
        m.tensors[0].chunks[1].flat = FlatRange{10, 13};
      },
      "chunk 1: flat range [10, 13) is empty or outside the box's 12 elements"));
  EXPECT_TRUE(rejects<CorruptionError>(
      [](auto& m) {
        m.tensors[0].chunks[1].flat = FlatRange{5, 5};
      },
      "flat range [5, 5)"));
  EXPECT_TRUE(rejects<CorruptionError>(
      [](auto& m) {
        m.tensors[0].chunks[1].flat = FlatRange{-1, 7};
      },
      "flat range [-1, 7)"));
  EXPECT_TRUE(rejects<CorruptionError>(
      [](auto& m) {
        m.tensors[2].global_shape = {-1, 5};
      },
      "tensor 'empty' has global shape [-1, 5]"));
  EXPECT_TRUE(rejects<CorruptionError>(
      [](auto& m) {
        m.tensors[0].global_shape = {std::numeric_limits<int64_t>::max(), 6};
      },
      "element count must fit in int64"));
}

TEST(FormatMetadataTest, RejectsBadByteRangesAndChecksumCounts) {
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.tensors[0].chunks[0].byte_length = 95; },
                                       "chunk 0: byte length is 95, but 12 elements of float64 take 96 bytes"));
  EXPECT_TRUE(
      rejects<CorruptionError>([](auto& m) { m.tensors[0].chunks[0].file = 5; },
                               "tensor 'decoder.weight' chunk 0 refers to file 5, but the checkpoint has 2 files"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.tensors[0].chunks[1].byte_offset = 4041; },
                                       "chunk 1 spans bytes [4041, +56) of 'data/rank_1.bin', which has 4096 bytes"));
  EXPECT_TRUE(rejects<CorruptionError>(
      [](auto& m) { m.tensors[0].chunks[1].byte_offset = std::numeric_limits<uint64_t>::max() - 8; }, "spans bytes"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.tensors[0].chunks[0].block_checksums.pop_back(); },
                                       "chunk 0 has 1 block checksums, expected 2 (96 bytes in blocks of 64)"));
  EXPECT_TRUE(
      rejects<CorruptionError>([](auto& m) { m.checksum_block_size = 0; }, "has 2 block checksums, expected 0"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.objects[0].byte_offset = 4090; },
                                       "object 'rng/shard_0_2' spans bytes [4090, +10)"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.objects[1].block_checksums.clear(); },
                                       "object 'rng/shard_1_2' has 0 block checksums, expected 1"));
  // Two records on the same bytes: a small checkpoint claiming any amount of data.
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.objects[0].byte_offset = m.tensors[0].chunks[0].byte_offset; },
                                       "two records share bytes"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.files[1].path = "metadata.json"; },
                                       "file 'metadata.json' has the name of a file that is not data"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.files[1].path = "common.fb"; },
                                       "file 'common.fb' has the name of a file that is not data"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.common_file = m.files[1].path; },
                                       "file 'data/rank_1.bin' has the name of a file that is not data"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.checksum_block_size = uint64_t{1} << 31; },
                                       "checksum blocks of 2147483648 bytes, more than the 1073741824 a writer uses"));
}

TEST(FormatMetadataTest, RejectsBadKeysFilesAndHeader) {
  EXPECT_TRUE(
      rejects<CorruptionError>([](auto& m) { std::swap(m.tensors[0], m.tensors[1]); },
                               "tensor keys are not sorted and unique: 'embedding' is followed by 'decoder.weight'"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.tensors[2].key = "embedding"; },
                                       "'embedding' is followed by 'embedding'"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.tensors[0].key = ""; }, "a tensor record has an empty key"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { std::swap(m.objects[0], m.objects[1]); },
                                       "object keys are not sorted and unique: 'rng/shard_1_2' is followed by"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.objects[0].global_offset = {2}; },
                                       "object 'rng': shard offset [2] is not inside the shard grid [2]"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.files[1].path = "../escape.bin"; },
                                       "file 1: unsafe path '../escape.bin' in checkpoint metadata"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.files[0].path = "/etc/passwd"; }, "absolute paths"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.files[1].path = "data/rank_0.bin"; },
                                       "file 'data/rank_0.bin' is listed twice"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.common_file = "a/../../common.fb"; },
                                       "the common state file: unsafe path"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.files[1].writer_rank = 2; },
                                       "has writer rank 2, outside the world of 2 ranks"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.world_size = 0; }, "world_size is 0"));
  EXPECT_TRUE(rejects<CheckpointError>([](auto& m) { m.format_version = 4; },
                                       "written by a newer distckpt (version 4); this build reads version 3"));
  EXPECT_TRUE(rejects<CorruptionError>([](auto& m) { m.format_version = 0; }, "format_version 0 is not a valid"));
}

TEST(FormatMetadataTest, RejectsUnknownDtypeAndAliasedBuffers) {
  flatbuffers::FlatBufferBuilder fbb;
  const auto tensor = fb::CreateTensorRecordDirect(fbb, "w", "float8", nullptr, nullptr);
  const std::vector<flatbuffers::Offset<fb::TensorRecord>> tensors = {tensor};
  fb::FinishCheckpointMetadataBuffer(fbb, fb::CreateCheckpointMetadataDirect(fbb, 1, 1, 0, &tensors));
  const std::string unknown(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
  EXPECT_TRUE(
      throws_with<CorruptionError>([&] { decode_metadata(unknown, kOrigin); }, "tensor 'w': unknown dtype 'float8'"));

  // One valid 4 KiB chunk referenced 1000 times: structurally valid, but
  // decoding it would copy 1000x the buffer.
  flatbuffers::FlatBufferBuilder alias;
  const std::vector<int64_t> offset = {0}, shape = {4096};
  const std::vector<uint64_t> sums(4096, 7);
  const auto one = fb::CreateChunkRecordDirect(alias, &offset, &shape, -1, -1, 0, 0, 4096, &sums);
  const std::vector<flatbuffers::Offset<fb::ChunkRecord>> chunks(1000, one);
  const std::vector<flatbuffers::Offset<fb::TensorRecord>> big = {
      fb::CreateTensorRecordDirect(alias, "w", "uint8", &shape, &chunks)};
  const std::vector<flatbuffers::Offset<fb::FileRecord>> files = {
      fb::CreateFileRecordDirect(alias, "d.bin", uint64_t{1} << 40, 0)};
  fb::FinishCheckpointMetadataBuffer(alias, fb::CreateCheckpointMetadataDirect(alias, 1, 1, 1, &big, nullptr, &files));
  const std::string aliased(reinterpret_cast<const char*>(alias.GetBufferPointer()), alias.GetSize());
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_metadata(aliased, kOrigin); }, "aliased FlatBuffers offsets"));
}

TEST(FormatMetadataTest, GarbageAndTruncatedBuffersAreCorruption) {
  const std::string valid = encode_metadata(sample_metadata());
  const std::string message = kOrigin + ": not a valid distckpt metadata buffer (failed FlatBuffers verification)";
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_metadata("", kOrigin); }, message));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_metadata(std::string(64, '\xff'), kOrigin); }, message));
  EXPECT_TRUE(
      throws_with<CorruptionError>([&] { decode_metadata(valid.substr(0, valid.size() / 2), kOrigin); }, message));
  std::string wrong_id = valid;
  wrong_id[4] = 'X';
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_metadata(wrong_id, kOrigin); }, message));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_metadata(encode_common_state(Value(1)), kOrigin); }, message));
}

TEST(FormatMetadataTest, CheckListedFilesComparesSizesAndKinds) {
  TempDir dir("format");
  storage::PosixBackend backend(dir.path());
  const CheckpointMetadata m = sample_metadata();
  io::make_dirs(dir.file("data"));
  const auto write = [&](const std::string& name, size_t n) {
    io::write_file_atomic(dir.file(name), std::string(n, 'x'));
  };
  write("data/rank_0.bin", 4096);
  write("data/rank_1.bin", 4096);
  write("common.fb", 3);
  storage::check_listed_files(m, backend);

  write("data/rank_1.bin", 4000);
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] { storage::check_listed_files(m, backend); },
      "checkpoint file " + dir.file("data/rank_1.bin") + " has 4000 bytes but the metadata records 4096 bytes"));
  write("data/rank_1.bin", 4096);
  ASSERT_EQ(::unlink(dir.file("common.fb").c_str()), 0);
  EXPECT_TRUE(throws_with<CorruptionError>([&] { storage::check_listed_files(m, backend); },
                                           dir.file("common.fb") + " listed"));
  write("common.fb", 3);
  ASSERT_EQ(::unlink(dir.file("data/rank_0.bin").c_str()), 0);
  io::make_dirs(dir.file("data/rank_0.bin"));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { storage::check_listed_files(m, backend); }, "is not a regular file"));
  io::remove_tree(dir.file("data/rank_0.bin"));
  // A data file that is a link out of the checkpoint (here to a file of the
  // right size) is refused; one within it is fine.
  TempDir outside("format-outside");
  io::write_file_atomic(outside.file("x.bin"), std::string(4096, 'x'));
  ASSERT_EQ(::symlink(outside.file("x.bin").c_str(), dir.file("data/rank_0.bin").c_str()), 0);
  EXPECT_TRUE(throws_with<CorruptionError>([&] { storage::check_listed_files(m, backend); },
                                           dir.file("data/rank_0.bin") + " resolves to " +
                                               std::filesystem::canonical(outside.file("x.bin")).string() +
                                               ", outside the checkpoint"));
  ASSERT_EQ(::unlink(dir.file("data/rank_0.bin").c_str()), 0);
  write("data/copy.bin", 4096);
  ASSERT_EQ(::symlink("copy.bin", dir.file("data/rank_0.bin").c_str()), 0);
  storage::check_listed_files(m, backend);
}

}  // namespace
}  // namespace distckpt
