// PyTorch DCP's `.metadata`, stage by stage: what the encoder writes the
// parser reads back (both module namings), and what no real file holds is
// refused with the reason: globals off the allow-list wherever they are
// named, persistent ids, a pickle nested a million levels deep, chunks
// outside their tensor, items without storage, negative sizes.
#include "format/dcp_metadata.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "distckpt/core/errors.h"
#include "format/pickle_writer.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

dcp::Metadata sample() {
  dcp::Metadata m;
  m.tensors.push_back(
      {"a.weight",
       at::kBFloat16,
       std::nullopt,
       {4, 6},
       {{{0, 0}, {2, 6}, {"__0_0.distcp", 0, 900, {}}}, {{2, 0}, {2, 6}, {"__1_0.distcp", 64, 900, {}}}}});
  m.tensors.push_back({"step_scalar", at::kLong, std::nullopt, {}, {{{}, {}, {"__0_0.distcp", 960, 700, {}}}}});
  m.bytes.push_back({"config", {"__0_0.distcp", 1664, 500, {}}});
  m.bytes.push_back({"rng/shard_0_2", {"__0_0.distcp", 2176, 400, {}}});
  return m;
}

void expect_equal(const dcp::Metadata& got, const dcp::Metadata& want) {
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (size_t t = 0; t < want.tensors.size(); ++t) {
    EXPECT_EQ(got.tensors[t].key, want.tensors[t].key);
    EXPECT_EQ(got.tensors[t].dtype, want.tensors[t].dtype);
    EXPECT_EQ(got.tensors[t].size, want.tensors[t].size);
    ASSERT_EQ(got.tensors[t].chunks.size(), want.tensors[t].chunks.size());
    for (size_t c = 0; c < want.tensors[t].chunks.size(); ++c) {
      const dcp::Chunk &g = got.tensors[t].chunks[c], &w = want.tensors[t].chunks[c];
      EXPECT_EQ(g.offsets, w.offsets);
      EXPECT_EQ(g.sizes, w.sizes);
      EXPECT_EQ(g.storage.relative_path, w.storage.relative_path);
      EXPECT_EQ(g.storage.offset, w.storage.offset);
      EXPECT_EQ(g.storage.length, w.storage.length);
    }
  }
  ASSERT_EQ(got.bytes.size(), want.bytes.size());
  for (size_t b = 0; b < want.bytes.size(); ++b) {
    EXPECT_EQ(got.bytes[b].key, want.bytes[b].key);
    EXPECT_EQ(got.bytes[b].storage.offset, want.bytes[b].storage.offset);
  }
}

TEST(DcpMetadata, WhatTheEncoderWritesTheParserReadsUnderBothNamings) {
  const dcp::Metadata m = sample();
  const std::string v2 = dcp::encode_metadata(m, dcp::ModuleNaming::kTorch2);
  const std::string v113 = dcp::encode_metadata(m, dcp::ModuleNaming::kTorch113);
  EXPECT_NE(v2.find("torch.distributed.checkpoint.metadata"), std::string::npos);
  EXPECT_NE(v113.find("torch.distributed._shard.checkpoint.metadata"), std::string::npos);
  EXPECT_NE(v113.find("torch.distributed._shard.sharded_tensor.metadata\nMEM_FORMAT_ENCODING"), std::string::npos);
  const dcp::Metadata a = dcp::parse_metadata(v2, "v2/.metadata"), b = dcp::parse_metadata(v113, "v113/.metadata");
  EXPECT_EQ(a.naming, "torch 2");
  EXPECT_EQ(b.naming, "torch 1.13");
  expect_equal(a, m);
  expect_equal(b, m);
}

// PROTO 2, then `body`, then STOP.
std::string pickle(const std::function<void(torch_pickle::PickleWriter&)>& body) {
  torch_pickle::PickleWriter p;
  p.proto();
  body(p);
  p.stop();
  return std::move(p).take();
}

TEST(DcpMetadata, AGlobalOffTheListIsRefusedWhereItIsNamed) {
  const std::string code = pickle([](torch_pickle::PickleWriter& p) {
    p.global("os", "system");
    p.string("touch /tmp/pwned");
    p.tuple(1);
    p.op('R');
  });
  EXPECT_TRUE(throws_with<CorruptionError>([&] { dcp::parse_metadata(code, "ck/.metadata"); },
                                           "'ck/.metadata' at byte 2: global 'os.system', which this pickle may not "
                                           "name (nothing is imported)"));
  const std::string eval = pickle([](torch_pickle::PickleWriter& p) { p.global("builtins", "eval"); });
  EXPECT_TRUE(throws_with<CorruptionError>([&] { dcp::parse_metadata(eval, "ck/.metadata"); }, "'builtins.eval'"));
  // Allowed classes, but not what a .metadata holds (a torch.Size is read as its tuple).
  const std::string size = pickle([](torch_pickle::PickleWriter& p) {
    p.global("torch", "Size");
    p.tuple(0);
    p.tuple(1);
    p.op('R');
  });
  EXPECT_TRUE(throws_with<CorruptionError>([&] { dcp::parse_metadata(size, "ck/.metadata"); },
                                           "the pickled value is not an object"));
  const std::string layout = pickle([](torch_pickle::PickleWriter& p) {
    p.global("torch.serialization", "_get_layout");
    p.string("torch.strided");
    p.tuple(1);
    p.op('R');
  });
  EXPECT_TRUE(throws_with<CorruptionError>([&] { dcp::parse_metadata(layout, "ck/.metadata"); },
                                           "it holds a torch.serialization._get_layout, not a DCP Metadata"));
}

TEST(DcpMetadata, PersistentIdsAndDeepNestingAreRefused) {
  const std::string persistent = pickle([](torch_pickle::PickleWriter& p) {
    p.string("storage");
    p.tuple(1);
    p.op('Q');
  });
  EXPECT_TRUE(throws_with<CorruptionError>([&] { dcp::parse_metadata(persistent, "ck/.metadata"); },
                                           "a persistent id, which this pickle may not hold"));
  // A million lists, each inside the last: read and freed without recursion.
  const std::string deep = pickle([](torch_pickle::PickleWriter& p) {
    for (int i = 0; i < 1000000; ++i) p.op(']');
    for (int i = 0; i < 999999; ++i) p.op('a');
  });
  EXPECT_TRUE(throws_with<CorruptionError>([&] { dcp::parse_metadata(deep, "ck/.metadata"); },
                                           "the pickled value is not an object"));
}

TEST(DcpMetadata, WhatTheFileSaysIsChecked) {
  dcp::Metadata outside = sample();
  outside.tensors[0].chunks[1].offsets = {3, 0};  // rows 3 and 4 of 4
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] { dcp::parse_metadata(dcp::encode_metadata(outside, dcp::ModuleNaming::kTorch2), "ck/.metadata"); },
      "a chunk of 'a.weight' reaches past the tensor's size in dimension 0"));

  dcp::Metadata flat = sample();
  flat.tensors[0].chunks[1].sizes = {12};
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] { dcp::parse_metadata(dcp::encode_metadata(flat, dcp::ModuleNaming::kTorch2), "ck/.metadata"); },
      "a chunk of 'a.weight' has 1 dimensions, its tensor 2"));

  // Two chunks at one offset: the second has no storage entry of its own.
  dcp::Metadata twice = sample();
  twice.tensors[0].chunks[1].offsets = {0, 0};
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] { dcp::parse_metadata(dcp::encode_metadata(twice, dcp::ModuleNaming::kTorch2), "ck/.metadata"); },
      "storage_data names an item of 'a.weight' twice"));

  dcp::Metadata negative = sample();
  negative.tensors[0].size = {-4, 6};
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] { dcp::parse_metadata(dcp::encode_metadata(negative, dcp::ModuleNaming::kTorch2), "ck/.metadata"); },
      "'a.weight''s size holds a negative extent"));
}

}  // namespace
}  // namespace distckpt
