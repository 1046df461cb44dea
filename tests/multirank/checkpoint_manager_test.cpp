// CheckpointManager (Megatron's iter_* directories and tracker file) and the
// commands around it: ls, rm-tensors, diff, extract.
#include "distckpt/api/checkpoint_manager.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "distckpt/distckpt.h"
#include "distckpt/version.h"
#include "io/file.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/process.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

namespace fs = std::filesystem;

StateDict state(int rank, double value) {
  StateDict sd;
  sd["w"] = ShardedTensor::from_rank_offsets("w", at::full({2, 3}, value + rank), {{0, rank, 2}});
  sd["iteration"] = static_cast<int64_t>(value);
  return sd;
}

std::vector<int64_t> iterations(const CheckpointManager& m) {
  std::vector<int64_t> out;
  for (const CheckpointEntry& e : m.list()) out.push_back(e.iteration);
  return out;
}

TEST(CheckpointManager, TrackerFollowsCommitsAndKeepsTheLastN) {
  TempDir tmp("manager");
  const std::string root = tmp.path() + "/run";
  run_ranks(2, [&](Communicator& comm) {
    CheckpointManager manager(root, /*keep_last=*/2);
    for (int64_t it : {10, 20, 30}) manager.save(state(comm.rank(), it), it, comm);
    save(state(comm.rank(), 1), tmp.path() + "/outside", comm);
  });
  CheckpointManager manager(root, 2);
  EXPECT_EQ(manager.path_for(30), root + "/iter_0000030");
  EXPECT_EQ(io::read_file(root + "/latest_checkpointed_iteration.txt", 64), "30\n");
  EXPECT_EQ(manager.latest_iteration(), 30);
  EXPECT_EQ(iterations(manager), (std::vector<int64_t>{20, 30}));
  EXPECT_TRUE(manager.list().back().latest);
  EXPECT_FALSE(manager.list().front().latest);

  // A failed save (overlapping main replicas) moves nothing and removes nothing.
  run_ranks(2, [&](Communicator& comm) {
    CheckpointManager m(root, 2);
    EXPECT_ANY_THROW(m.save(state(0, 40), 40, comm));
  });
  EXPECT_EQ(manager.latest_iteration(), 30);
  EXPECT_EQ(iterations(manager), (std::vector<int64_t>{20, 30}));

  // An incomplete directory is listed, never pruned; a symlink is not followed.
  io::make_dirs(root + "/iter_0000025");
  fs::create_directory_symlink(tmp.path() + "/outside", root + "/iter_0000001");
  run_ranks(2, [&](Communicator& comm) {
    CheckpointManager m(root, 2);
    m.save(state(comm.rank(), 50), 50, comm);
    const LoadResult r = m.load_latest(state(comm.rank(), 0), comm);
    EXPECT_EQ(r.state_dict.at("iteration").as_int(), 50);
    EXPECT_TRUE(at::equal(r.state_dict.at("w").as_tensor(), at::full({2, 3}, 50.0 + comm.rank())));
  });
  const std::vector<CheckpointEntry> entries = manager.list();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].iteration, 25);
  EXPECT_FALSE(entries[0].committed);
  EXPECT_EQ(entries[1].iteration, 30);
  EXPECT_EQ(entries[2].iteration, 50);
  EXPECT_TRUE(entries[2].committed && entries[2].latest);
  EXPECT_FALSE(fs::exists(root + "/iter_0000020"));
  EXPECT_TRUE(is_distributed_checkpoint(tmp.path() + "/outside"));  // not pruned through the link
  // ls shows the same.
  const CommandResult ls = run_command(std::string(DISTCKPT_BIN_DIR) + "/distckpt ls " + root);
  EXPECT_EQ(ls.exit_code, 0) << ls.output;
  EXPECT_NE(ls.output.find("25  incomplete  " + root + "/iter_0000025\n"), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find("50  committed   " + root + "/iter_0000050  (latest)\n"), std::string::npos) << ls.output;
}

// After a rollback (resumed from 20, saving 25 while 30 exists) the tracker
// names 25, as Megatron's would, and only older checkpoints are pruned.
TEST(CheckpointManager, PruningNeverRemovesNewerIterations) {
  TempDir tmp("manager-rollback");
  const std::string root = tmp.path() + "/run";
  run_ranks(2, [&](Communicator& comm) {
    CheckpointManager manager(root, /*keep_last=*/2);
    for (int64_t it : {10, 20, 30, 25, 27}) manager.save(state(comm.rank(), it), it, comm);
    const LoadResult r = manager.load_latest(state(comm.rank(), 0), comm);
    EXPECT_EQ(r.state_dict.at("iteration").as_int(), 27);
  });
  const CheckpointManager manager(root, 2);
  EXPECT_EQ(manager.latest_iteration(), 27);
  EXPECT_EQ(iterations(manager), (std::vector<int64_t>{25, 27, 30}));
}

TEST(CheckpointManager, DamagedTrackerAndUncommittedIterationsAreErrors) {
  TempDir tmp("manager-errors");
  const std::string root = tmp.path() + "/run";
  CheckpointManager manager(root);
  EXPECT_FALSE(manager.latest_iteration().has_value());
  EXPECT_TRUE(manager.list().empty());
  EXPECT_TRUE(throws_with<CheckpointError>([&] { manager.mark_committed(5); },
                                           "'" + root + "/iter_0000005' is not a committed checkpoint"));
  run_ranks(1, [&](Communicator& comm) {
    EXPECT_TRUE(throws_with<CheckpointError>([&] { manager.load_latest(state(0, 0), comm); },
                                             "has no latest_checkpointed_iteration.txt"));
  });
  io::make_dirs(root);
  io::write_file_atomic(root + "/latest_checkpointed_iteration.txt", "release\n");
  EXPECT_TRUE(throws_with<CheckpointError>([&] { manager.latest_iteration(); }, "holds 'release', not an iteration"));
  io::write_file_atomic(root + "/latest_checkpointed_iteration.txt", "7\n");
  EXPECT_TRUE(throws_with<CheckpointError>([&] { manager.latest_iteration(); },
                                           "names iteration 7, but '" + root + "/iter_0000007' is not a committed"));
  EXPECT_TRUE(throws_with<UsageError>([&] { manager.path_for(-1); }, "iteration -1 is negative"));
}

// Falling back to the newest intact checkpoint: three iterations saved by 2
// ranks; damage is a flipped data byte that only rank 1 reads (its own rows
// of "w"), so only rank 1 finds it, yet every rank moves on together.
class FallbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    run_ranks(2, [&](Communicator& comm) {
      CheckpointManager manager(root_);
      for (int64_t it : {100, 200, 300}) manager.save(state(comm.rank(), static_cast<double>(it)), it, comm);
    });
    for (int64_t it : {100, 200, 300}) digests_[it] = digest_lines(manager_.path_for(it));
  }

  static std::string digest_lines(const std::string& dir) {
    std::string out;
    for (const TensorDigest& d : digest_checkpoint(dir)) out += d.line() + "\n";
    return out;
  }

  // Flips one byte of rank 1's rows of "w" in iteration `it` (rank 1 wrote them to its own file).
  void damage(int64_t it) {
    const std::string file = manager_.path_for(it) + "/data/rank_00001.bin";
    std::string bytes = io::read_file(file, 1 << 20);
    ASSERT_FALSE(bytes.empty());
    bytes[0] = static_cast<char>(bytes[0] ^ 0x10);
    io::write_file_atomic(file, bytes);
  }

  // Loads the latest on 2 ranks (each its own rows), resaves what it got,
  // and returns the iteration each rank loaded, with the resave's digest.
  std::vector<int64_t> load_latest_everywhere(std::string& resaved_digest,
                                              std::vector<std::vector<SkippedCheckpoint>>& skipped) {
    std::vector<int64_t> loaded(2, -1);
    skipped.assign(2, {});
    const std::string resaved = tmp_.path() + "/resaved";
    run_ranks(2, [&](Communicator& comm) {
      const CheckpointManager manager(root_);
      LatestLoadResult r = manager.load_latest(state(comm.rank(), 0), comm);
      loaded[static_cast<size_t>(comm.rank())] = r.iteration;
      skipped[static_cast<size_t>(comm.rank())] = r.skipped;
      StateDict again = state(comm.rank(), 0);
      again["w"].as_sharded_tensor().data = r.state_dict.at("w").as_tensor();
      again["iteration"] = r.state_dict.at("iteration");
      SaveOptions options;
      options.overwrite = true;
      save(again, resaved, comm, options);
    });
    resaved_digest = digest_lines(resaved);
    return loaded;
  }

  TempDir tmp_{"fallback"};
  const std::string root_ = tmp_.path() + "/run";
  const CheckpointManager manager_{root_};
  std::map<int64_t, std::string> digests_;
};

TEST_F(FallbackTest, ADamagedNewestCheckpointFallsBackToTheNextOnEveryRank) {
  damage(300);
  std::vector<std::string> warnings;
  const LogSink previous = set_log_sink([&](LogLevel, const std::string& m) { warnings.push_back(m); });
  std::string digest;
  std::vector<std::vector<SkippedCheckpoint>> skipped;
  const std::vector<int64_t> loaded = load_latest_everywhere(digest, skipped);
  set_log_sink(previous);
  EXPECT_EQ(loaded, (std::vector<int64_t>{200, 200}));
  EXPECT_EQ(digest, digests_[200]);
  for (const auto& s : skipped) {
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].iteration, 300);
    EXPECT_EQ(s[0].error_class, "CorruptionError");
    EXPECT_THAT(s[0].reason, ::testing::HasSubstr("rank 1 (CorruptionError)"));
    EXPECT_THAT(s[0].reason, ::testing::HasSubstr("(file 'data/rank_00001.bin'"));
    EXPECT_THAT(s[0].reason, ::testing::HasSubstr("distckpt verify " + manager_.path_for(300)));
  }
  // One warning (rank 0's), naming the iteration and the cause.
  ASSERT_EQ(warnings.size(), 1u) << ::testing::PrintToString(warnings);
  EXPECT_THAT(warnings[0], ::testing::HasSubstr("iteration 300 under '" + root_ + "' does not load (CorruptionError)"));
  EXPECT_THAT(warnings[0], ::testing::HasSubstr("falling back to the next older checkpoint"));
}

TEST_F(FallbackTest, TwoDamagedCheckpointsFallBackToTheThird) {
  damage(300);
  damage(200);
  std::string digest;
  std::vector<std::vector<SkippedCheckpoint>> skipped;
  EXPECT_EQ(load_latest_everywhere(digest, skipped), (std::vector<int64_t>{100, 100}));
  EXPECT_EQ(digest, digests_[100]);
  EXPECT_EQ(skipped[0].size(), 2u);
  EXPECT_EQ(skipped[1].size(), 2u);
}

TEST_F(FallbackTest, NoIntactCheckpointIsOneErrorOnEveryRank) {
  for (int64_t it : {100, 200, 300}) damage(it);
  std::vector<std::string> messages(2);
  run_ranks(2, [&](Communicator& comm) {
    const CheckpointManager manager(root_);
    try {
      manager.load_latest(state(comm.rank(), 0), comm);
      ADD_FAILURE() << "rank " << comm.rank() << " loaded a damaged checkpoint";
    } catch (const CorruptionError& e) {
      messages[static_cast<size_t>(comm.rank())] = e.what();
    }
  });
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_THAT(messages[0], ::testing::HasSubstr("no committed checkpoint under '" + root_ +
                                                "' loads; tried 3 iteration(s), newest first:\n  iteration 300 "
                                                "(CorruptionError): "));
  EXPECT_THAT(messages[0], ::testing::HasSubstr("\n  iteration 100 (CorruptionError): "));
}

TEST_F(FallbackTest, WithoutFallbackTheDamageIsTheError) {
  damage(300);
  run_ranks(2, [&](Communicator& comm) {
    const CheckpointManager manager(root_, CheckpointManagerOptions{0, /*fall_back=*/false});
    EXPECT_TRUE(throws_with<CorruptionError>([&] { manager.load_latest(state(comm.rank(), 0), comm); },
                                             "rank 1 (CorruptionError)"));
  });
}

TEST_F(FallbackTest, LsVerifyShowsWhichCheckpointsAreIntact) {
  damage(200);
  const CommandResult ls = run_command(std::string(DISTCKPT_BIN_DIR) + "/distckpt ls --verify " + root_);
  EXPECT_EQ(ls.exit_code, 0) << ls.output;
  EXPECT_NE(ls.output.find(root_ + "/iter_0000100  intact\n"), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find(root_ + "/iter_0000200  corrupt: "), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find(root_ + "/iter_0000300  (latest)  intact\n"), std::string::npos) << ls.output;
}

TEST(CheckpointCommands, DiffRemoveAndExtract) {
  TempDir tmp("commands");
  const std::string a = tmp.path() + "/a";
  const std::string b = tmp.path() + "/b";
  const at::Tensor w = at::arange(12, at::kFloat).reshape({4, 3});
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sd;
    sd["w"] = ShardedTensor::from_rank_offsets("w", w.chunk(2, 0)[r].contiguous(), {{0, r, 2}});
    sd["layers.0.bias"] = ShardedTensor::from_rank_offsets("layers.0.bias", at::ones({3}), {}, {r});
    sd["step"] = 3;
    sd["rng"] = ShardedObject{"rng", "state a", {}, {}, {r}};
    save(sd, a, comm);
    // b: saved along the other axis (same values of w), a changed bias, a new tensor.
    StateDict other;
    other["w"] =
        ShardedTensor::from_global_offset("w", w.narrow(1, r * 2, r == 0 ? 2 : 1).contiguous(), {4, 3}, {0, r * 2});
    at::Tensor bias = at::ones({3});
    bias[2] = 5;
    other["layers.0.bias"] = ShardedTensor::from_rank_offsets("layers.0.bias", bias, {}, {r});
    other["layers.1.bias"] = ShardedTensor::from_rank_offsets("layers.1.bias", at::ones({3}), {}, {r});
    other["step"] = 4;
    other["rng"] = ShardedObject{"rng", "state b", {}, {}, {r}};
    save(other, b, comm);
  });
  const CheckpointDiff d = diff_checkpoints(a, b);
  ASSERT_EQ(d.tensors.size(), 3u);
  EXPECT_EQ(d.tensors[0].key, "layers.0.bias");
  EXPECT_EQ(d.tensors[0].status, TensorDifference::Status::kValues);
  EXPECT_EQ(d.tensors[0].detail, "1 of 3 elements differ, first at [2] (1 vs 5), max |difference| 4");
  EXPECT_EQ(d.tensors[1].status, TensorDifference::Status::kOnlyRight);
  EXPECT_EQ(d.tensors[2].status, TensorDifference::Status::kEqual);  // w: same values, another layout
  EXPECT_EQ(d.common_differ, (std::vector<std::string>{"step"}));
  EXPECT_EQ(d.objects_differ, (std::vector<std::string>{"rng/shard__"}));
  EXPECT_FALSE(d.content_metadata_differs);
  EXPECT_FALSE(d.equal());
  EXPECT_TRUE(diff_checkpoints(a, a).equal());

  const std::string bin = std::string(DISTCKPT_BIN_DIR) + "/distckpt ";
  const CommandResult diff = run_command(bin + "diff " + a + " " + b);
  EXPECT_EQ(diff.exit_code, 1);
  EXPECT_EQ(diff.output,
            "! layers.0.bias: values 1 of 3 elements differ, first at [2] (1 vs 5), max |difference| 4\n"
            "+ layers.1.bias (only in " +
                b + ")\n= w\n! common step: 3 vs 4\n! object rng/shard__\ndifferent\n");
  EXPECT_EQ(run_command(bin + "diff " + a + " " + a).exit_code, 0);

  // extract: both file kinds, read back by the real readers.
  const CommandResult st = run_command(bin + "extract " + b + " w --to " + tmp.path() + "/w.safetensors");
  EXPECT_EQ(st.exit_code, 0) << st.output;
  EXPECT_TRUE(at::equal(load_plain_tensor(tmp.path() + "/w.safetensors", "w"), w));
  extract_tensor(a, "w", tmp.path() + "/w.pt");
  const CommandResult py = run_command("/usr/bin/python3 -c \"import torch; t = torch.load('" + tmp.path() +
                                       "/w.pt')['w']; print(t.shape, float(t.sum()))\"");
  EXPECT_EQ(py.output, "torch.Size([4, 3]) 66.0\n");
  EXPECT_TRUE(
      throws_with<UsageError>([&] { extract_tensor(a, "w", tmp.path() + "/w.pt"); }, "exists; name a new file"));
  EXPECT_TRUE(throws_with<UsageError>([&] { extract_tensor(a, "w", tmp.path() + "/w.npy"); },
                                      "must end in .safetensors or .pt"));
  const CommandResult missing = run_command(bin + "extract " + a + " nope --to " + tmp.path() + "/n.pt");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("holds no tensor 'nope'"), std::string::npos) << missing.output;

  EXPECT_TRUE(throws_with<Error>([&] { remove_sharded_tensors(b, ""); }, "an empty prefix would remove every tensor"));
  const CommandResult rm = run_command(bin + "rm-tensors " + b + " layers.");
  EXPECT_EQ(rm.exit_code, 0) << rm.output;
  EXPECT_EQ(rm.output, b + ": removed 2 key(s) starting with 'layers.'\n");
  const CommandResult after = run_command(bin + "diff --json " + a + " " + b);
  EXPECT_EQ(after.exit_code, 1);
  EXPECT_NE(after.output.find("\"status\": \"only_left\""), std::string::npos) << after.output;
  // A prefix that matches nothing (a typo, say) is not a success.
  const CommandResult none = run_command(bin + "rm-tensors " + b + " layers.");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_EQ(none.output,
            "distckpt rm-tensors: no tensor or object of " + b + " starts with 'layers.'; nothing was changed\n");

  // A NaN on one side makes the largest difference NaN, not 0.
  const std::string n1 = tmp.path() + "/n1", n2 = tmp.path() + "/n2";
  run_ranks(1, [&](Communicator& comm) {
    StateDict x;
    x["v"] = ShardedTensor::from_rank_offsets("v", at::tensor({1.0f, 2.0f, 3.0f}), {});
    save(x, n1, comm);
    StateDict y;
    y["v"] = ShardedTensor::from_rank_offsets("v", at::tensor({1.0f, NAN, 3.5f}), {});
    save(y, n2, comm);
  });
  EXPECT_EQ(diff_checkpoints(n1, n2).tensors.at(0).detail,
            "2 of 3 elements differ, first at [1] (2 vs nan), max |difference| nan (NaN on one side)");

  // Keys are untrusted bytes: diff and digest print control bytes escaped, never raw to the terminal.
  const std::string e1 = tmp.path() + "/e1", e2 = tmp.path() + "/e2";
  const std::string key = "a\x1b[2Jb";
  run_ranks(1, [&](Communicator& comm) {
    StateDict x;
    x[key] = ShardedTensor::from_rank_offsets(key, at::ones({2}), {});
    save(x, e1, comm);
    StateDict y;
    y[key] = ShardedTensor::from_rank_offsets(key, at::zeros({2}), {});
    save(y, e2, comm);
  });
  const CommandResult escaped = run_command(bin + "diff " + e1 + " " + e2);
  EXPECT_EQ(escaped.output.find('\x1b'), std::string::npos) << escaped.output;
  EXPECT_NE(escaped.output.find("! a\\x1b[2Jb: values"), std::string::npos) << escaped.output;
  const CommandResult digest = run_command(bin + "digest " + e1);
  EXPECT_EQ(digest.output.find('\x1b'), std::string::npos) << digest.output;
  EXPECT_NE(digest.output.find("a\\x1b[2Jb float32 [2]"), std::string::npos) << digest.output;
}

// What a user gets wrong first: a command by another tool's name, a root
// that is not there.
TEST(CheckpointCommands, UnknownCommandsAndMissingRootsAreClearErrors) {
  const std::string bin = std::string(DISTCKPT_BIN_DIR) + "/distckpt";
  const CommandResult compare = run_command(bin + " compare a b");
  EXPECT_EQ(compare.exit_code, 2);
  EXPECT_EQ(compare.output,
            "distckpt: unknown command 'compare' (did you mean diff?); the commands are inspect, verify, digest, "
            "convert, ls, rm-tensors, diff, extract (distckpt --help)\n");
  const CommandResult version = run_command(bin + " --version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(version.output, std::string(DISTCKPT_VERSION_STRING) + "\n");
  TempDir tmp("commands-missing");
  const CommandResult ls = run_command(bin + " ls " + tmp.path() + "/nope");
  EXPECT_EQ(ls.exit_code, 2);
  EXPECT_EQ(ls.output, "distckpt ls: '" + tmp.path() + "/nope' does not exist\n");
  const CommandResult inspect = run_command(bin + " inspect " + tmp.path() + "/nope");
  EXPECT_EQ(inspect.exit_code, 2);
  EXPECT_EQ(inspect.output, "distckpt: CheckpointError: '" + tmp.path() + "/nope' does not exist\n");
  // A root of iter_* checkpoints given where one checkpoint is expected.
  io::make_dirs(tmp.path() + "/iter_0000010");
  io::write_file_atomic(tmp.path() + "/iter_0000010/metadata.json", "{}");  // what a save leaves
  const CommandResult root = run_command(bin + " inspect " + tmp.path());
  EXPECT_EQ(root.exit_code, 2);
  EXPECT_NE(
      root.output.find("it holds iter_* checkpoints: pass one of them (`distckpt ls " + tmp.path() + "` lists them)"),
      std::string::npos)
      << root.output;
}

}  // namespace
}  // namespace distckpt
