// Saving straight into Hugging Face safetensors from several ranks through
// the StorageWriter interface: row, column, replicated, flat (ZeRO) and
// stacked pieces land where they belong, the files are byte for byte those
// the export writes from a distckpt checkpoint of the same state, a name
// mapping writes external names, and what safetensors cannot hold is refused
// before anything is written.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "distckpt/distckpt.h"
#include "io/buffer_pool.h"
#include "io/file.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// What a refused collective save throws: the reason on the rank that found
// it, a CommError carrying it everywhere else.
// A refused save raises E on every rank (the coordinator found it; all agree).
template <typename E>
::testing::AssertionResult save_refused(const std::function<void()>& save_it, const std::string& message) {
  return throws_with<E>(save_it, message);
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Every file of `a` equals the same file of `b`, and they hold the same names.
void expect_same_files(const std::string& a, const std::string& b) {
  const std::vector<std::string> names = list_dir(a);
  EXPECT_EQ(names, list_dir(b));
  for (const std::string& name : names) {
    EXPECT_EQ(file_bytes(a + "/" + name), file_bytes(b + "/" + name)) << name;
  }
}

const at::Tensor& rows() {
  static const at::Tensor t = testing::global_tensor("rows", {64, 48});
  return t;
}
const at::Tensor& cols() {
  static const at::Tensor t = testing::global_tensor("cols", {40, 64}, at::kBFloat16);
  return t;
}
const at::Tensor& norm() {
  static const at::Tensor t = testing::global_tensor("norm", {48});
  return t;
}
const at::Tensor& flat() {
  static const at::Tensor t = testing::global_tensor("flat", {6, 10});
  return t;
}
const at::Tensor& stack() {
  static const at::Tensor t = testing::global_tensor("stack", {3, 8, 12}, at::kHalf);
  return t;
}

// One rank's pieces of a (tp=4)-like state: rows split on dim 0, columns on
// dim 1, a replicated norm, a flat (ZeRO) slice of each 6x10 half-tensor
// held by ranks (r/2) and a stack of 3 layers split on its last dim.
StateDict sharded_state(int r) {
  StateDict sd = Value::dict();
  sd["rows"] = ShardedTensor::from_rank_offsets("rows", rows().chunk(4, 0)[r].contiguous(), {{0, r, 4}});
  sd["cols"] = ShardedTensor::from_rank_offsets("cols", cols().chunk(4, 1)[r].contiguous(), {{1, r, 4}});
  sd["norm"] = ShardedTensor::from_rank_offsets("norm", norm(), {}, ReplicaId{r});
  // rows [3 * (r / 2), +3) of the 6x10 tensor; each of the two ranks holding
  // them keeps half of their 30 elements.
  const at::Tensor half = flat().chunk(2, 0)[r / 2].contiguous().flatten();
  const FlatRange range{(r % 2) * 15, (r % 2) * 15 + 15};
  sd["flat"] = ShardedTensor::from_rank_offsets_flat("flat", half.slice(0, range.start, range.stop).clone(), {3, 10},
                                                     {{0, r / 2, 2}}, range);
  sd["stack"] = ShardedTensor::from_rank_offsets("stack", stack().chunk(4, 2)[r].contiguous(), {{2, r, 4}});
  sd["note"] = Value("tp4");
  return sd;
}

TEST(SafetensorsSave, FourRanksWriteTheFilesTheExportWrites) {
  TempDir tmp("st-save");
  const std::string ckpt = tmp.path() + "/ckpt", direct = tmp.path() + "/direct", exported = tmp.path() + "/exported";
  std::vector<SaveReport> reports(4);
  run_ranks(4, [&](Communicator& comm) {
    save(sharded_state(comm.rank()), ckpt, comm);
    SaveOptions options;
    SafetensorsWriteOptions knobs;
    knobs.max_shard_bytes = 8000;  // three files
    options.format = safetensors_format(knobs);
    reports[static_cast<size_t>(comm.rank())] = save(sharded_state(comm.rank()), direct, comm, options);
  });
  ConvertOptions convert;
  convert.max_shard_bytes = 8000;
  convert_to_safetensors(ckpt, exported, convert);
  // The export keeps the common value out; a save writes it into __metadata__.
  // "format" describes the files: content metadata, not a value of the state.
  const StateDict common = load_common_state_dict(direct);
  EXPECT_EQ(common.at("note").as_string(), "tp4");
  EXPECT_FALSE(common.contains("format"));
  const std::optional<StateDict> content = load_content_metadata(direct);
  ASSERT_TRUE(content.has_value());
  EXPECT_EQ(content->at("format").as_string(), "pt");

  const StateDict plain = load_plain_tensors(direct);
  EXPECT_TRUE(at::equal(plain.at("rows").as_tensor(), rows()));
  EXPECT_TRUE(at::equal(plain.at("cols").as_tensor(), cols()));
  EXPECT_TRUE(at::equal(plain.at("norm").as_tensor(), norm()));
  EXPECT_TRUE(at::equal(plain.at("flat").as_tensor(), flat()));
  EXPECT_TRUE(at::equal(plain.at("stack").as_tensor(), stack()));
  EXPECT_EQ(list_dir(direct).size(), 4u);  // three shards and the index
  // The norm is written once, by one rank; every byte exactly once overall.
  uint64_t bytes = 0;
  for (const SaveReport& r : reports) bytes += r.bytes_written;
  EXPECT_EQ(bytes, uint64_t{64 * 48 * 4 + 40 * 64 * 2 + 48 * 4 + 60 * 4 + 3 * 8 * 12 * 2});
  const auto a = digest_checkpoint(ckpt), b = digest_checkpoint(direct);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].line(), b[i].line());
}

TEST(SafetensorsSave, ByteIdenticalToTheExportOfTheSameState) {
  TempDir tmp("st-save-bytes");
  const std::string ckpt = tmp.path() + "/ckpt", direct = tmp.path() + "/direct", exported = tmp.path() + "/exported";
  run_ranks(4, [&](Communicator& comm) {
    StateDict sd = sharded_state(comm.rank());
    sd.as_dict().erase("note");  // the export writes no common values
    save(sd, ckpt, comm);
    SaveOptions options;
    SafetensorsWriteOptions knobs;
    knobs.max_shard_bytes = 8000;
    options.format = safetensors_format(knobs);
    save(sd, direct, comm, options);
  });
  ConvertOptions convert;
  convert.max_shard_bytes = 8000;
  convert_to_safetensors(ckpt, exported, convert);
  expect_same_files(direct, exported);
}

// A fused [q; k; v] tensor and a stack of layers, written under external
// names by two ranks holding column halves.
NameMapping test_mapping() {
  NameMapping m("ext");
  m.map("qkv", "attn.q.weight", {16, 8}).part(0, 0, 8);
  m.map("qkv", "attn.k.weight", {16, 8}).part(0, 8, 4);
  m.map("qkv", "attn.v.weight", {16, 8}).part(0, 12, 4);
  m.map("layers", "layers.{layer}.weight", {6, 8}).over("layer", 3);
  return m;
}

TEST(SafetensorsSave, UnderANameMappingWritesTheExternalTensors) {
  TempDir tmp("st-save-mapped");
  const std::string ckpt = tmp.path() + "/ckpt", direct = tmp.path() + "/direct", exported = tmp.path() + "/exported";
  const at::Tensor qkv = testing::global_tensor("qkv", {16, 8});
  const at::Tensor layers = testing::global_tensor("layers", {3, 6, 8});
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sd = Value::dict();
    sd["qkv"] = ShardedTensor::from_rank_offsets("qkv", qkv.chunk(2, 1)[r].contiguous(), {{1, r, 2}});
    sd["layers"] = ShardedTensor::from_rank_offsets("layers", layers.chunk(2, 2)[r].contiguous(), {{2, r, 2}});
    sd["optimizer.step"] = ShardedTensor::from_rank_offsets("optimizer.step", at::ones({1}), {}, ReplicaId{r});
    SaveOptions recorded;
    recorded.name_mappings = {test_mapping()};
    save(sd, ckpt, comm, recorded);
    SaveOptions options;
    SafetensorsWriteOptions knobs;
    knobs.mapping = test_mapping();
    options.format = safetensors_format(knobs);
    save(sd, direct, comm, options);
  });
  ConvertOptions convert;
  convert.mapping = "ext";
  convert_to_safetensors(ckpt, exported, convert);
  expect_same_files(direct, exported);
  const StateDict plain = load_plain_tensors(direct);
  EXPECT_EQ(plain.as_dict().size(), 6u);  // optimizer.step is not mapped: not written
  EXPECT_TRUE(at::equal(plain.at("attn.k.weight").as_tensor(), qkv.slice(0, 8, 12)));
  EXPECT_TRUE(at::equal(plain.at("layers.2.weight").as_tensor(), layers[2]));
}

TEST(SafetensorsSave, ThroughAWriterTheCallerMade) {
  TempDir tmp("st-save-writer");
  const std::string dir = tmp.path() + "/hf";
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["rows"] =
        ShardedTensor::from_rank_offsets("rows", rows().chunk(2, 0)[comm.rank()].contiguous(), {{0, comm.rank(), 2}});
    const std::unique_ptr<StorageWriter> writer = make_safetensors_writer(dir);
    save(sd, *writer, comm);
  });
  EXPECT_TRUE(at::equal(load_plain_tensors(dir).at("rows").as_tensor(), rows()));
}

TEST(SafetensorsSave, WhatSafetensorsCannotHoldIsRefusedAndNothingIsLeft) {
  TempDir tmp("st-save-bad");
  const std::string dir = tmp.path() + "/hf";
  SaveOptions options;
  options.format = StorageFormat::safetensors();
  auto refused = [&](const std::function<void(StateDict&)>& add, const std::string& message) {
    run_ranks(2, [&](Communicator& comm) {
      StateDict sd = Value::dict();
      sd["norm"] = ShardedTensor::from_rank_offsets("norm", norm(), {}, ReplicaId{comm.rank()});
      add(sd);
      EXPECT_TRUE(save_refused<CheckpointError>([&] { save(sd, dir, comm, options); }, message));
    });
    EXPECT_EQ(list_dir(tmp.path()), std::vector<std::string>{"hf"}) << message;  // no staging left behind
  };
  io::make_dirs(dir);  // an existing directory is never replaced
  std::ofstream(dir + "/keep") << "kept";
  refused([](StateDict&) {}, "already exists");
  EXPECT_EQ(file_bytes(dir + "/keep"), "kept");
  io::remove_tree(dir);
  auto only_dir = [&] { return list_dir(tmp.path()).empty(); };
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["norm"] = ShardedTensor::from_rank_offsets("norm", norm(), {}, ReplicaId{comm.rank()});
    sd["step"] = Value(int64_t{7});
    EXPECT_TRUE(save_refused<UsageError>([&] { save(sd, dir, comm, options); }, "common value 'step' (int)"));
    sd.as_dict().erase("step");
    sd["rng"] = ShardedObject{"rng", "state", {2}, {comm.rank()}, ReplicaId{0}};
    EXPECT_TRUE(save_refused<UsageError>([&] { save(sd, dir, comm, options); }, "sharded object 'rng"));
  });
  EXPECT_TRUE(only_dir());
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["norm"] = ShardedTensor::from_rank_offsets("norm", norm(), {});
    EXPECT_TRUE(throws_with<UsageError>(
        [&] {
          async_save(sd, dir, comm, options, io::BufferPool::create({1 << 20, false}));
        },
        "asynchronous saves write the distckpt format"));
  });
  EXPECT_TRUE(only_dir());
}

}  // namespace
}  // namespace distckpt
