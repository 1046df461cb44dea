// Issue 21 item 11: a checkpoint holding a dtype this build cannot represent
// (float8 under LibTorch 1.x, or a dtype a newer distckpt added) stays
// inspectable, verifiable and comparable, and its other tensors load.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "distckpt/distckpt.h"
#include "format/commit.h"
#include "format/dtype.h"
#include "format/metadata.h"
#include "io/file.h"
#include "multirank/checkpoint_fixtures.h"
#include "storage/distckpt_storage.h"
#include "support/process.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using testing::global_tensor;

// What a newer build writes for `key`: the same bytes under another dtype
// name and its element size (the metadata is re-recorded in the marker).
void rename_dtype(const std::string& dir, const std::string& key, const std::string& name) {
  const storage::DistckptStorage stored(std::shared_ptr<Backend>(open_backend(dir)));
  CheckpointMetadata m = stored.metadata();
  CheckpointConfig config = stored.config();
  for (TensorRecord& t : m.tensors) {
    if (t.key == key) {
      t.unrepresentable = UnrepresentableDtype{name, static_cast<uint32_t>(t.element_size())};
      t.dtype = at::ScalarType::Undefined;
    }
  }
  const std::string encoded = encode_metadata(m);
  config.metadata = record_metadata("metadata-newer.fb", encoded);
  io::write_file_atomic(io::safe_join(dir, "metadata-newer.fb"), encoded);
  write_commit_marker(dir, config);
}

// Two ranks save w (float32, rows split), q (uint8, 1 byte per element like
// float8, rows split) and an object; q is then renamed to `dtype`.
std::string newer_checkpoint(const TempDir& tmp, const std::string& dtype) {
  const std::string dir = tmp.path() + "/" + dtype;
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sd = Value::dict();
    sd["w"] = Value(ShardedTensor::from_rank_offsets("w", global_tensor("w", {4, 3}).narrow(0, 2 * r, 2), {{0, r, 2}}));
    sd["q"] = Value(ShardedTensor::from_rank_offsets(
        "q", global_tensor("q", {4, 2}, at::kByte).narrow(0, 2 * r, 2).clone(), {{0, r, 2}}));
    sd["rng"] = Value(ShardedObject{"rng", "state " + std::to_string(r), {2}, {r}, {0}});
    save(sd, dir, comm);
  });
  const std::string before = digest_checkpoint(dir)[0].line();  // q, as uint8
  rename_dtype(dir, "q", dtype);
  // The digest hashes the same bytes under the new name.
  const std::string after = digest_checkpoint(dir)[0].line();
  EXPECT_EQ(after, "q " + dtype + before.substr(before.find(' ', 2)));
  return dir;
}

void expect_readable_except_q(const std::string& dir, const std::string& dtype, const std::string& reason) {
  EXPECT_TRUE(verify_checkpoint(dir).intact());
  const CommandResult inspect = run_command(std::string(DISTCKPT_BIN_DIR) + "/distckpt inspect " + dir);
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find(dtype), std::string::npos) << inspect.output;

  // The other tensors and the object load on any rank count.
  run_ranks(3, [&](Communicator& comm) {
    StateDict request = Value::dict();
    request["w"] = Value(ShardedTensor::from_rank_offsets("w", at::zeros({4, 1}), {{1, comm.rank(), 3}}));
    request["rng"] = Value(ShardedObject{"rng", "", {2}, {comm.rank() % 2}, {comm.rank() / 2}});
    const LoadResult loaded = load(request, dir, comm);
    EXPECT_TRUE(loaded.state_dict.at("w").as_tensor().equal(global_tensor("w", {4, 3}).narrow(1, comm.rank(), 1)));
    EXPECT_EQ(loaded.state_dict.at("rng").as_string(), "state " + std::to_string(comm.rank() % 2));

    StateDict wants_q = Value::dict();
    wants_q["q"] = Value(ShardedTensor::from_rank_offsets("q", at::zeros({4, 2}, at::kByte), {}, {comm.rank()}));
    EXPECT_TRUE(throws_with<ShardingError>([&] { load(wants_q, dir, comm); },
                                           "'q' in '" + dir + "' cannot be loaded: " + reason +
                                               ". Load it with a build that has the type, or leave it out of the "
                                               "request (the other tensors load)"));
  });

  // Tools without a model: q is listed but left out of what is loaded.
  testing::LogCapture log;
  const StateDict meta = load_tensors_metadata(dir);
  EXPECT_TRUE(meta.contains("w"));
  EXPECT_FALSE(meta.contains("q"));
  EXPECT_NE(log.joined().find("leaves out 'q': their dtypes have no type in this build"), std::string::npos)
      << log.joined();
  EXPECT_TRUE(throws_with<CheckpointError>(
      [&] { load_plain_tensors(dir); },
      "'q' in '" + dir + "' cannot be loaded: " + reason + "; select the other tensors (TensorSelection)"));
  EXPECT_TRUE(
      load_plain_tensors(dir, TensorSelection{{"w"}, {}}).at("w").as_tensor().equal(global_tensor("w", {4, 3})));
  EXPECT_TRUE(diff_checkpoints(dir, dir).equal());

  // Rewriting the metadata (removing w) keeps q's name and size.
  EXPECT_EQ(remove_sharded_tensors(dir, "w"), 1u);
  const storage::DistckptStorage after(std::shared_ptr<Backend>(open_backend(dir)));
  ASSERT_EQ(after.metadata().tensors.size(), 1u);
  EXPECT_EQ(stored_dtype_name(after.metadata().tensors[0]), dtype);
  EXPECT_TRUE(verify_checkpoint(dir).intact());
}

TEST(NewerDtype, ADtypeFromANewerDistckptIsListedVerifiedAndSkipped) {
  TempDir tmp("newer-dtype");
  const std::string dir = newer_checkpoint(tmp, "float4_e2m1fn_x2");
  expect_readable_except_q(dir, "float4_e2m1fn_x2",
                           "float4_e2m1fn_x2 is a dtype this version of distckpt does not know (a newer one wrote it)");
}

TEST(NewerDtype, Float8WithoutLibTorchSupportIsListedVerifiedAndSkipped) {
  if (!resolve_stored_dtype("float8_e4m3fn", 0).unrepresentable) GTEST_SKIP() << "this LibTorch has float8_e4m3fn";
  TempDir tmp("float8");
  const std::string dir = newer_checkpoint(tmp, "float8_e4m3fn");
  expect_readable_except_q(dir, "float8_e4m3fn", "this LibTorch has no float8_e4m3fn type (a newer LibTorch has)");
}

}  // namespace
}  // namespace distckpt
