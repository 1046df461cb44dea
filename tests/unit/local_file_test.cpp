// One rank's local checkpoint on disk: the hollow state codec and the file
// (header, tensor bytes, metadata), with corruption of each part detected.
#include "local/local_file.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>

#include "distckpt/core/errors.h"
#include "distckpt/local/tensor_aware_state_dict.h"
#include "format/local_state_codec.h"
#include "io/file.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

// Rank 1 of 2: a row-split weight, a flattened slice, an object, common values.
TensorAwareStateDict sample() {
  StateDict sd = Value::dict();
  sd["w"] = ShardedTensor::from_rank_offsets("w", at::arange(24, at::kFloat).reshape({4, 6}), {{0, 1, 2}});
  sd["flat"] =
      ShardedTensor::from_rank_offsets_flat("flat", at::arange(5, at::kDouble), {3, 4}, {{0, 1, 2}}, FlatRange{2, 7});
  sd["rng"] = ShardedObject{"rng", std::string("\0bytes", 6), {2}, {1}};
  sd["iteration"] = 7;
  sd["lr"] = 0.5;
  auto comm = make_single_process_communicator();
  TensorAwareStateDict tasd = TensorAwareStateDict::from_state_dict(sd, *comm);
  tasd.state().owner_rank = 1;
  tasd.state().world_size = 2;
  return tasd;
}

TEST(LocalState, HollowFormRoundTripsEveryField) {
  TensorAwareStateDict tasd = sample();
  const std::vector<at::Tensor> popped = tasd.pop_tensors();
  ASSERT_EQ(popped.size(), 2u);
  EXPECT_TRUE(tasd.is_hollow());
  const TensorAwareStateDict back = TensorAwareStateDict::deserialize_hollow(tasd.serialize_hollow(), "test");
  EXPECT_TRUE(back.is_hollow());
  const LocalState& s = back.state();
  EXPECT_EQ(s.owner_rank, 1);
  EXPECT_EQ(s.world_size, 2);
  ASSERT_EQ(s.tensors.size(), 2u);
  // sharded_leaves order is key order: "flat" before "w".
  EXPECT_EQ(s.tensors[0].meta.key, "flat");
  EXPECT_EQ(s.tensors[0].meta.dtype, at::kDouble);
  EXPECT_EQ(s.tensors[0].meta.local_shape, (Shape{3, 4}));
  EXPECT_EQ(s.tensors[0].meta.global_offset, (Shape{3, 0}));
  ASSERT_TRUE(s.tensors[0].meta.flattened_range.has_value());
  EXPECT_EQ(s.tensors[0].meta.flattened_range->start, 2);
  EXPECT_EQ(s.tensors[1].meta.global_shape, (Shape{8, 6}));
  EXPECT_EQ(s.tensors[1].device, "cpu");
  ASSERT_EQ(s.objects.size(), 1u);
  EXPECT_EQ(s.objects[0].data, std::string("\0bytes", 6));
  EXPECT_EQ(s.common.at("iteration").as_int(), 7);
  EXPECT_EQ(s.common.at("lr").as_float(), 0.5);
}

TEST(LocalState, InsertChecksShapesAndCounts) {
  TensorAwareStateDict tasd = sample();
  std::vector<at::Tensor> popped = tasd.pop_tensors();
  EXPECT_TRUE(throws_with<UsageError>([&] { tasd.insert_tensors({popped[0]}); }, "1 tensors given"));
  EXPECT_TRUE(throws_with<UsageError>([&] { tasd.insert_tensors({popped[1], popped[0]}); }, "does not match 'flat'"));
  tasd.insert_tensors(popped);
  EXPECT_FALSE(tasd.is_hollow());
  EXPECT_TRUE(at::equal(tasd.tensors()[1], at::arange(24, at::kFloat).reshape({4, 6})));
  tasd.pop_tensors();
  tasd.init_tensors();
  EXPECT_EQ(tasd.tensors()[0].sizes(), (c10::IntArrayRef{5}));
  EXPECT_EQ(tasd.tensors()[0].scalar_type(), at::kDouble);
}

TEST(LocalState, CpuCopiesRecordTheDeviceAndRefuseAHollowDict) {
  TensorAwareStateDict tasd = sample();
  const at::Tensor before = tasd.tensors()[1];
  tasd.copy_tensors_to_cpu();
  EXPECT_EQ(tasd.state().tensors[1].device, "cpu");
  EXPECT_TRUE(at::equal(tasd.tensors()[1], before));
  tasd.restore_tensor_device();
  EXPECT_TRUE(tasd.tensors()[1].device().is_cpu());
  tasd.pop_tensors();
  EXPECT_TRUE(throws_with<UsageError>([&] { tasd.copy_tensors_to_cpu(); }, "the dict is hollow"));
}

TEST(LocalState, CorruptBufferIsRejected) {
  std::string bytes = sample().serialize_hollow();
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  bytes.resize(bytes.size() - 3);
  EXPECT_THROW(decode_local_state(bytes, "crafted"), CorruptionError);
  EXPECT_THROW(decode_local_state("", "empty"), CorruptionError);
}

TEST(LocalFile, RoundTripsBitwiseAndNeverOverwrites) {
  TempDir tmp("local-file");
  const std::string path = tmp.file("iter_3_owner_1.dcl");
  const TensorAwareStateDict tasd = sample();
  const uint64_t size = local::write_local_file(tasd, 3, path);
  EXPECT_EQ(io::file_size(path), size);
  EXPECT_FALSE(io::exists(path + ".tmp"));
  const auto header = local::probe_local_file(path);
  ASSERT_TRUE(header.has_value());
  EXPECT_EQ(header->iteration, 3);
  EXPECT_EQ(header->owner_rank, 1);
  const TensorAwareStateDict back = local::read_local_file(path);
  EXPECT_EQ(back.state().iteration, 3);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(at::equal(back.tensors()[i], tasd.tensors()[i]));
  EXPECT_TRUE(throws_with<CheckpointError>([&] { local::write_local_file(tasd, 3, path); }, "never overwritten"));
}

TEST(LocalFile, EveryCorruptionIsDetected) {
  TempDir tmp("local-corrupt");
  const TensorAwareStateDict tasd = sample();
  // A flipped byte in the tensor bytes: the checksum names the tensor.
  const std::string data = tmp.file("data.dcl");
  local::write_local_file(tasd, 1, data);
  flip_byte(data, 4096 + 5);
  EXPECT_TRUE(local::probe_local_file(data).has_value());  // the cheap check cannot see it...
  EXPECT_TRUE(
      throws_with<CorruptionError>([&] { local::read_local_file(data); }, "tensor 'flat'"));  // ...the read does
  // In the metadata.
  const std::string meta = tmp.file("meta.dcl");
  const uint64_t size = local::write_local_file(tasd, 1, meta);
  flip_byte(meta, size - 20);
  EXPECT_TRUE(throws_with<CorruptionError>([&] { local::read_local_file(meta); }, "metadata's checksum"));
  // In the header; and a truncated file.
  const std::string head = tmp.file("head.dcl");
  local::write_local_file(tasd, 1, head);
  flip_byte(head, 30);
  EXPECT_FALSE(local::probe_local_file(head).has_value());
  EXPECT_TRUE(throws_with<CorruptionError>([&] { local::read_local_file(head); }, "header's checksum"));
  const std::string cut = tmp.file("cut.dcl");
  local::write_local_file(tasd, 1, cut);
  ASSERT_EQ(truncate(cut.c_str(), static_cast<off_t>(size - 1)), 0);
  EXPECT_FALSE(local::probe_local_file(cut).has_value());
  EXPECT_TRUE(throws_with<CorruptionError>([&] { local::read_local_file(cut); }, "the file has"));
}

// What a read gave, comparable: the hollow state (offsets and checksums
// included) and every tensor's bytes.
std::pair<std::string, std::vector<at::Tensor>> contents(TensorAwareStateDict tasd) {
  std::vector<at::Tensor> tensors = tasd.pop_tensors();
  return {tasd.serialize_hollow(), std::move(tensors)};
}

// Every byte of a local file, flipped in turn (one bit): the read rejects
// the file, or the byte was alignment padding and the read gives exactly
// what it gave before, never different contents; and the rejected bytes are
// exactly those the file's layout says are read.
TEST(LocalFile, EveryFlippedByteIsRejectedOrHarmless) {
  TempDir tmp("local-flips");
  const std::string path = tmp.file("flips.dcl");
  local::write_local_file(sample(), 1, path);
  const std::string pristine = io::read_file(path, uint64_t{1} << 20);
  const auto [hollow, tensors] = contents(local::read_local_file(path));
  size_t rejected = 0, harmless = 0;
  std::vector<size_t> silent;
  const auto put = [&](size_t at, char byte) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(byte);
  };
  for (size_t i = 0; i < pristine.size(); ++i) {
    put(i, static_cast<char>(pristine[i] ^ (1 << (i % 8))));
    try {
      const auto [h, t] = contents(local::read_local_file(path));
      bool same = h == hollow && t.size() == tensors.size();
      for (size_t k = 0; same && k < t.size(); ++k) same = at::equal(t[k], tensors[k]);
      if (same) {
        ++harmless;
      } else {
        silent.push_back(i);
      }
    } catch (const CheckpointError&) {
      ++rejected;  // CorruptionError included
    }
    put(i, pristine[i]);
  }
  EXPECT_EQ(silent, std::vector<size_t>{}) << "offsets whose flip changed what was read";
  EXPECT_EQ(rejected + harmless, pristine.size());
  // Every byte a read uses is covered: the 64-byte header, the tensor bytes
  // and the metadata; the rest is padding up to 4 KiB boundaries.
  const auto header = local::probe_local_file(path);
  ASSERT_TRUE(header.has_value());
  uint64_t tensor_bytes = 0;
  for (const at::Tensor& t : tensors) tensor_bytes += t.nbytes();
  EXPECT_EQ(rejected, 64 + tensor_bytes + header->meta_size);
  std::cout << pristine.size() << " bytes flipped: " << rejected << " rejected, " << harmless << " harmless\n";
}

}  // namespace
}  // namespace distckpt
