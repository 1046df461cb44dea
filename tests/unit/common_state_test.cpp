// format layer: the common state codec (round trip of every kind, rejection
// of sharded leaves, corrupt buffers).
#include "format/common_state.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "distckpt/core/errors.h"
#include "distckpt/fb/checkpoint_generated.h"
#include "format/metadata.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

// Every kind the common state holds, nested.
Value sample_common_state() {
  Value root = Value::dict();
  root["none"] = Value();
  root["flag"] = true;
  root["off"] = false;
  root["iteration"] = int64_t{1000};
  root["min"] = std::numeric_limits<int64_t>::min();
  root["lr"] = 1.5e-4;
  root["name"] = "gpt";
  root[""] = "";
  root["weights"] = at::arange(6, at::kFloat).reshape({2, 3});
  root["bf16"] = at::tensor({1.5f, -2.0f, 3.25f}).to(at::kBFloat16);
  root["scalar"] = at::scalar_tensor(7, at::kLong);
  root["empty_tensor"] = at::zeros({0, 3}, at::kHalf);
  root["mask"] = at::arange(5).remainder(2).eq(0);
  root["transposed"] = at::arange(6, at::kInt).reshape({2, 3}).t();
  root["nested"]["list"] = List{1, "two", List{3.0, Value()}, Value::dict()};
  root["nested"]["empty_list"] = Value::list();
  root["nested"]["deeper"]["complex"] = at::complex(at::tensor({1.f, 2.f}), at::tensor({3.f, -4.f}));
  return root;
}

TEST(FormatCommonStateTest, RoundTripOfEveryKind) {
  const Value state = sample_common_state();
  std::string bytes = encode_common_state(state);
  EXPECT_EQ(bytes.substr(4, 4), "DCKC");
  EXPECT_EQ(encode_common_state(state), bytes);  // deterministic
  const Value decoded = decode_common_state(bytes, "common.fb");
  bytes.assign(bytes.size(), '\0');  // decoded tensors must own their memory
  EXPECT_TRUE(decoded.equals(state));
  EXPECT_EQ(decoded.size(), state.size());
  EXPECT_TRUE(decoded.at("none").is_none());
  EXPECT_EQ(decoded.at("min").as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(decoded.at("lr").as_float(), 1.5e-4);
  EXPECT_EQ(decoded.at("").as_string(), "");
  const at::Tensor& bf16 = decoded.at("bf16").as_tensor();
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
  EXPECT_EQ(bf16[2].item<float>(), 3.25f);
  const at::Tensor& scalar = decoded.at("scalar").as_tensor();
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.item<int64_t>(), 7);
  EXPECT_EQ(decoded.at("empty_tensor").as_tensor().sizes(), at::IntArrayRef({0, 3}));
  const at::Tensor& transposed = decoded.at("transposed").as_tensor();
  EXPECT_TRUE(transposed.is_contiguous());
  EXPECT_EQ(transposed.sizes(), at::IntArrayRef({3, 2}));
  EXPECT_EQ(transposed[0][1].item<int>(), 3);
  const Value& list = decoded.at("nested").at("list");
  ASSERT_EQ(list.size(), 4u);
  EXPECT_EQ(list[1].as_string(), "two");
  EXPECT_EQ(list[2][0].as_float(), 3.0);
  EXPECT_TRUE(list[3].is_dict());
  EXPECT_TRUE(decoded.at("nested").at("empty_list").is_list());
}

// -0.0 equals the field's default (0.0), which FlatBuffers leaves out: it
// came back as +0.0.
TEST(FormatCommonStateTest, NegativeZeroInfinitiesAndNanKeepTheirValues) {
  Value state = Value::dict();
  state["neg_zero"] = Value(-0.0);
  state["zero"] = Value(0.0);
  state["inf"] = Value(-std::numeric_limits<double>::infinity());
  state["nan"] = Value(std::numeric_limits<double>::quiet_NaN());
  state["list"] = List{-0.0, 1.0};
  const Value decoded = decode_common_state(encode_common_state(state), "common.fb");
  EXPECT_EQ(decoded.at("neg_zero").as_float(), 0.0);
  EXPECT_TRUE(std::signbit(decoded.at("neg_zero").as_float()));
  EXPECT_FALSE(std::signbit(decoded.at("zero").as_float()));
  EXPECT_TRUE(std::signbit(decoded.at("list")[0].as_float()));
  EXPECT_EQ(decoded.at("inf").as_float(), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(decoded.at("nan").as_float()));
}

TEST(FormatCommonStateTest, ContentMetadataTravelsBesideTheRootAndMustBeADict) {
  StateDict common;
  common["iteration"] = 3;
  StateDict content;
  content["type"] = "fully_sharded";
  const std::string both = encode_common_state(common, content);
  EXPECT_TRUE(decode_common_state(both, "c").equals(common));
  const std::optional<Value> read = decode_content_metadata(both, "c");
  ASSERT_TRUE(read.has_value());
  EXPECT_TRUE(read->equals(content));
  EXPECT_FALSE(decode_content_metadata(encode_common_state(common), "c").has_value());
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_content_metadata(encode_common_state(common, Value(3)), "c"); },
                                           "the content metadata is a int, not a dict"));
}

TEST(FormatCommonStateTest, ConjugateViewsAreStoredResolved) {
  const at::Tensor z = at::complex(at::tensor({1.f, 2.f}), at::tensor({3.f, -4.f}));
  const Value decoded = decode_common_state(encode_common_state(Value(z.conj())), "common.fb");
  EXPECT_FALSE(decoded.as_tensor().is_conj());
  EXPECT_TRUE(at::equal(decoded.as_tensor(), z.conj().resolve_conj()));
}

TEST(FormatCommonStateTest, RejectsShardedLeavesAndTooDeepNesting) {
  Value state = Value::dict();
  state["a"]["b"] = ShardedTensor{};
  EXPECT_TRUE(throws_with<UsageError>([&] { encode_common_state(state); },
                                      "common state cannot hold a ShardedTensor at 'a/b'"));
  Value objects = Value::dict();
  objects["rng"] = List{1, ShardedObject{}};
  EXPECT_TRUE(throws_with<UsageError>([&] { encode_common_state(objects); }, "a ShardedObject at 'rng/1'"));

  const auto nest = [](int levels) {
    Value v = 1;
    for (int i = 0; i < levels; ++i) v = List{v};
    return v;
  };
  EXPECT_TRUE(decode_common_state(encode_common_state(nest(48)), "c").equals(nest(48)));
  EXPECT_TRUE(throws_with<UsageError>([&] { encode_common_state(nest(49)); }, "nested deeper than 48 levels"));
}

// A common-state buffer holding one dict entry built by `make_child`.
std::string raw_common_state(
    uint32_t version, const std::function<flatbuffers::Offset<fb::Node>(flatbuffers::FlatBufferBuilder&)>& make_child) {
  flatbuffers::FlatBufferBuilder fbb;
  const std::vector<flatbuffers::Offset<fb::Node>> children = {make_child(fbb)};
  const auto root = fb::CreateNodeDirect(fbb, fb::NodeKind::Dict, nullptr, false, 0, 0, nullptr, nullptr, nullptr,
                                         nullptr, &children);
  fbb.Finish(fb::CreateCommonState(fbb, version, root), "DCKC");
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

TEST(FormatCommonStateTest, RejectsCorruptBuffers) {
  const auto tensor = [](const char* dtype, std::vector<uint8_t> data) {
    return [=](flatbuffers::FlatBufferBuilder& fbb) {
      const std::vector<int64_t> shape = {2};
      return fb::CreateNodeDirect(fbb, fb::NodeKind::Tensor, "w", false, 0, 0, nullptr, dtype, &shape, &data);
    };
  };
  EXPECT_TRUE(decode_common_state(raw_common_state(1, tensor("int16", {1, 0, 2, 0})), "c")
                  .at("w")
                  .as_tensor()
                  .equal(at::tensor({1, 2}, at::kShort)));
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] {
        decode_common_state(raw_common_state(1, tensor("float32", {1, 2, 3})), "c");
      },
      "c: common state at 'w': tensor of float32 and shape [2] has 3 data bytes"));
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] {
        decode_common_state(raw_common_state(1, tensor("float8", {1, 2})), "c");
      },
      "unknown dtype 'float8'"));
  EXPECT_TRUE(throws_with<CheckpointError>(
      [&] {
        decode_common_state(raw_common_state(4, tensor("int8", {1, 2})), "c");
      },
      "written by a newer distckpt (version 4)"));
  const auto odd_kind = [](flatbuffers::FlatBufferBuilder& fbb) {
    return fb::CreateNodeDirect(fbb, static_cast<fb::NodeKind>(42), "k");
  };
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_common_state(raw_common_state(1, odd_kind), "c"); },
                                           "unknown node kind 42"));
  const auto keyless = [](flatbuffers::FlatBufferBuilder& fbb) { return fb::CreateNodeDirect(fbb, fb::NodeKind::Int); };
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_common_state(raw_common_state(1, keyless), "c"); },
                                           "dict entry 0 has no key"));
  const std::string message = "c: not a valid distckpt common state buffer (failed FlatBuffers verification)";
  const std::string valid = encode_common_state(sample_common_state());
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_common_state(valid.substr(0, 100), "c"); }, message));
  EXPECT_TRUE(
      throws_with<CorruptionError>([&] { decode_common_state(encode_metadata(CheckpointMetadata{}), "c"); }, message));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_common_state("not flatbuffers", "c"); }, message));
}

TEST(FormatCommonStateTest, RejectsUnsortedDictKeys) {
  flatbuffers::FlatBufferBuilder fbb;
  const std::vector<flatbuffers::Offset<fb::Node>> children = {fb::CreateNodeDirect(fbb, fb::NodeKind::None, "b"),
                                                               fb::CreateNodeDirect(fbb, fb::NodeKind::None, "a")};
  const auto root = fb::CreateNodeDirect(fbb, fb::NodeKind::Dict, nullptr, false, 0, 0, nullptr, nullptr, nullptr,
                                         nullptr, &children);
  fbb.Finish(fb::CreateCommonState(fbb, 1, root), "DCKC");
  const std::string bytes(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
  EXPECT_TRUE(throws_with<CorruptionError>([&] { decode_common_state(bytes, "c"); },
                                           "dict keys are not sorted and unique: 'a' follows 'b'"));
}

}  // namespace
}  // namespace distckpt
