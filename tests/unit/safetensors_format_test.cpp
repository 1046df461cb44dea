// format layer: the safetensors header and index, parsed as untrusted input
// (every rejection names the file and the tensor) and written.
#include <gtest/gtest.h>

#include <string>

#include "distckpt/core/errors.h"
#include "format/dtype.h"
#include "format/safetensors.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

const std::string kOrigin = "hf/model.safetensors";

// Parses `json` as the header of a file with `data_bytes` bytes after it.
safetensors::Header parse(const std::string& json, uint64_t data_bytes) {
  return safetensors::parse_header(json, safetensors::kPrefixBytes + json.size() + data_bytes, kOrigin);
}

TEST(SafetensorsHeader, ParsesTensorsAndMetadataWithAbsoluteOffsets) {
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[16,28]},)"
      R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"s":{"dtype":"I64","shape":[],"data_offsets":[28,36]},)"
      R"("e":{"dtype":"U8","shape":[0,5],"data_offsets":[36,36]}}  )";
  const safetensors::Header h = parse(json, 36);
  EXPECT_EQ(h.data_start, 8 + json.size());
  ASSERT_EQ(h.tensors.size(), 4u);
  EXPECT_EQ(h.tensors[0].name, "a");  // sorted by name
  EXPECT_EQ(h.tensors[0].dtype, at::kFloat);
  EXPECT_EQ(h.tensors[0].begin, h.data_start);
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].dtype, at::kBFloat16);
  EXPECT_EQ(h.tensors[1].shape, (Shape{2, 3}));
  EXPECT_EQ(h.tensors[1].end, h.data_start + 28);
  EXPECT_EQ(h.tensors[2].shape, (Shape{0, 5}));
  EXPECT_EQ(h.tensors[3].shape, Shape{});
  EXPECT_EQ(h.metadata.at("format"), "pt");
}

TEST(SafetensorsHeader, EncodedHeadersParseBackAligned) {
  std::vector<safetensors::Entry> tensors = {{"w", at::kHalf, {3, 5}, 0, 0}, {"b", at::kDouble, {7}, 0, 0}};
  const std::string prefix_and_json = safetensors::encode_header(tensors, {{"format", "pt"}});
  EXPECT_EQ(prefix_and_json.size() % 8, 0u);
  const uint64_t data = 3 * 5 * 2 + 7 * 8;
  const uint64_t n = safetensors::header_length(reinterpret_cast<const uint8_t*>(prefix_and_json.data()),
                                                prefix_and_json.size() + data, kOrigin);
  EXPECT_EQ(n + 8, prefix_and_json.size());
  const safetensors::Header h =
      safetensors::parse_header(prefix_and_json.substr(8), prefix_and_json.size() + data, kOrigin);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[1].name, "w");
  EXPECT_EQ(h.tensors[1].begin, tensors[0].begin);  // written in the given order: w first
  EXPECT_EQ(h.tensors[0].begin, tensors[0].end);
  EXPECT_EQ(h.metadata.at("format"), "pt");
}

TEST(SafetensorsHeader, RejectsHeaderLengthsTheFileCannotHold) {
  const uint8_t huge[8] = {0, 0, 0, 0, 0, 0, 0, 0x10};
  EXPECT_TRUE(throws_with<CorruptionError>([&] { safetensors::header_length(huge, 1 << 20, kOrigin); },
                                           "hf/model.safetensors: the header length is 1152921504606846976 bytes"));
  const uint8_t big[8] = {0x00, 0x10, 0, 0, 0, 0, 0, 0};  // 4096
  EXPECT_TRUE(throws_with<CorruptionError>([&] { safetensors::header_length(big, 100, kOrigin); },
                                           "the header length is 4096 bytes but the file has only 100; it is "
                                           "truncated"));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { safetensors::header_length(big, 5, kOrigin); }, "5 bytes, too short"));
}

TEST(SafetensorsHeader, RejectsDamagedHeadersNamingTheTensor) {
  const auto rejects = [](const std::string& json, uint64_t data, const std::string& part) {
    return throws_with<CorruptionError>([&] { parse(json, data); }, part);
  };
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8, "not valid JSON"));
  EXPECT_TRUE(rejects(R"([1,2])", 0, "the safetensors header is not a JSON object"));
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      8, "names 'a' twice"));
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4,
                      "tensor 'a' has the unknown dtype 'F33'"));
  EXPECT_TRUE(rejects(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4, "tensor 'a' has no 'dtype'"));
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
                      "tensor 'a': shape holds -1, not a non-negative integer"));
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
                      "tensor 'a': shape [3] of F32 needs 12 bytes but data_offsets span 8"));
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8,
                      "tensor 'a': data_offsets [0, 16] are outside the 8 data bytes"));
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "outside"));
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      12, "tensors 'a' and 'b' overlap (bytes 0..8 and 4..12)"));
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
                      "data bytes 0..4 belong to no tensor (before 'a')"));
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, "it was appended to"));
  EXPECT_TRUE(rejects(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,0]}})", 0,
                      "is too large"));
  EXPECT_TRUE(rejects(R"({"__metadata__":{"k":1}})", 0, "__metadata__ maps 'k' to 1, not a string"));
  EXPECT_TRUE(rejects(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, "a tensor has an empty name"));
  // Keys are unique per object (the same name in two objects is fine); nesting is bounded.
  EXPECT_TRUE(
      rejects(R"({"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, "names 'dtype' twice"));
  EXPECT_TRUE(
      rejects(R"({"x":)" + std::string(100, '[') + std::string(100, ']') + "}", 0, "nests more than 64 levels deep"));
}

// FP8 checkpoints (DeepSeek-V3 style): listed by name whatever the LibTorch,
// loadable where it has the type; packed sub-byte dtypes are refused.
TEST(SafetensorsHeader, Float8AndUnsignedDtypesAreKnownByNameAndSize) {
  const safetensors::Header h = parse(
      R"({"a":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"U16","shape":[2],"data_offsets":[3,7]},)"
      R"("c":{"dtype":"C64","shape":[1],"data_offsets":[7,15]}})",
      15);
  ASSERT_EQ(h.tensors.size(), 3u);
  const std::pair<const char*, uint32_t> expected[] = {{"float8_e4m3fn", 1}, {"uint16", 2}};
  for (size_t i = 0; i < 2; ++i) {
    const safetensors::Entry& e = h.tensors[i];
    if (e.unrepresentable) {
      EXPECT_EQ(e.unrepresentable->name, expected[i].first);
      EXPECT_EQ(e.unrepresentable->element_size, expected[i].second);
    } else {
      EXPECT_EQ(dtype_name(e.dtype), expected[i].first);
    }
  }
  EXPECT_EQ(h.tensors[2].dtype, at::kComplexFloat);
  EXPECT_STREQ(safetensors::dtype_name(at::kComplexFloat), "C64");
  EXPECT_TRUE(throws_with<CheckpointError>([] { parse(R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1); },
                                           "tensor 'a' has dtype F4, whose packed elements distckpt cannot address"));
  EXPECT_TRUE(throws_with<CheckpointError>([] { safetensors::dtype_name(at::kComplexDouble); },
                                           "safetensors has no dtype for"));
}

TEST(SafetensorsIndex, ParsesTheWeightMapAndRefusesPathsOutOfTheDirectory) {
  const safetensors::Index index = safetensors::parse_index(
      R"({"metadata":{"total_size":24},"weight_map":{"a":"m-1.safetensors","b":"m-2.safetensors"}})", "idx.json");
  EXPECT_EQ(index.weight_map.at("b"), "m-2.safetensors");
  EXPECT_EQ(index.metadata.at("total_size"), "24");
  EXPECT_EQ(safetensors::parse_index(safetensors::encode_index(index), "again").weight_map, index.weight_map);
  EXPECT_TRUE(throws_with<CorruptionError>(
      [] { safetensors::parse_index(R"({"weight_map":{"a":"../x.safetensors"}})", "idx.json"); },
      "idx.json: weight_map puts 'a' in '../x.safetensors', which is not a file name in the index's directory"));
  EXPECT_TRUE(throws_with<CorruptionError>([] { safetensors::parse_index(R"({"metadata":{}})", "idx.json"); },
                                           "idx.json: the index has no weight_map"));
  EXPECT_TRUE(throws_with<CorruptionError>(
      [] { safetensors::parse_index(R"({"weight_map":{"a":"x","a":"y"}})", "idx.json"); }, "names 'a' twice"));
}

}  // namespace
}  // namespace distckpt
