// The Python package against the C++ runtime, with real PyTorch processes
// (Debian's torch 1.13) and torch.distributed.checkpoint's own planner:
// a GPT saved by C++ under (tp=2, pp=2) loads into a 3-process PyTorch job's
// own sharding; a 2-process PyTorch save through distckpt.FileSystemWriter
// loads into 4 C++ ranks under another layout and holds what PyTorch's own
// writer saved of the same state; damaged bytes are clear Python errors.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>

#include "distckpt/distckpt.h"
#include "support/process.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kInterop = std::string(DISTCKPT_SOURCE_DIR) + "/tests/interop";
const std::string kPython = fmt::format("PYTHONPATH={} OMP_NUM_THREADS=1 /usr/bin/python3", DISTCKPT_PYTHON_DIR);

CommandResult python_job(int ranks, const std::string& script_and_args) {
  return run_command(
      fmt::format("{}/distckpt-launch -n {} -- env PYTHONPATH={} OMP_NUM_THREADS=1 /usr/bin/python3 "
                  "{}/{} 2>&1",
                  kBin, ranks, DISTCKPT_PYTHON_DIR, kInterop, script_and_args));
}

std::string digest(const std::string& dir) {
  const CommandResult r = run_command(kBin + "/distckpt digest " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void flip_byte(const std::string& path, std::streamoff offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(offset);
  f.write(&c, 1);
}

TEST(PythonBridge, PyTorchLoadsACppGptIntoItsOwnShardingOverThreeProcesses) {
  TempDir tmp("py-load");
  const std::string ckpt = tmp.path() + "/gpt", reference = tmp.path() + "/reference.pt";
  CommandResult r = run_command(fmt::format(
      "OMP_NUM_THREADS=1 {0}/distckpt-launch -n 4 -- {0}/distckpt-gpt-trainer --model gpt --layers 4 --hidden 32 "
      "--heads 4 --kv-groups 2 --ffn 64 --vocab 64 --optimizer adam --tp 2 --pp 2 --steps 2 --save {1} 2>&1",
      kBin, ckpt));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The reference is the C++ export: the Python side is checked against C++, not against itself.
  r = run_command(fmt::format("{}/distckpt convert {} {} --to torch --quiet", kBin, ckpt, reference));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  r = python_job(3, fmt::format("dcp_load_distckpt.py {} {} 2", ckpt, reference));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Every tensor (model and Adam state, ZeRO flat chunks included) on every rank.
  const size_t tensors = load_tensors_metadata(ckpt).as_dict().size();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(count(r.output, fmt::format("rank {}: ", rank)), 1u) << r.output;
  }
  EXPECT_EQ(count(r.output, "tensors equal"), 3u) << r.output;
  EXPECT_NE(r.output.find(fmt::format("{} sharded, {} plain", tensors * 2 / 3, tensors - tensors * 2 / 3)),
            std::string::npos)
      << "expected " << tensors << " tensors:\n"
      << r.output;

  // load_plain_tensors equals the C++ side's plain tensors too.
  r = run_command(
      fmt::format("{} -c \"import distckpt, torch; got = distckpt.load_plain_tensors('{}'); want = torch.load('{}'); "
                  "assert sorted(got) == sorted(k for k, v in want.items() if isinstance(v, torch.Tensor)); "
                  "assert all(torch.equal(v, want[k]) for k, v in got.items()); print('plain', len(got))\"",
                  kPython, ckpt, reference));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(fmt::format("plain {}", tensors)), std::string::npos) << r.output;
}

// Element i (row-major) of KEY, as dcp_save_sharded.py writes it.
at::Tensor python_value(const std::string& key, const std::vector<int64_t>& shape, at::ScalarType dtype) {
  int64_t n = 1;
  for (const int64_t extent : shape) n *= extent;
  return (at::arange(n, at::kDouble) * 0.25 + static_cast<double>(key.size())).reshape(shape).to(dtype);
}

TEST(PythonBridge, CppLoadsAPyTorchSaveReshardedOverFourRanks) {
  TempDir tmp("py-save");
  const std::string ours = tmp.path() + "/distckpt", theirs = tmp.path() + "/torch", resaved = tmp.path() + "/plain",
                    reloaded = tmp.path() + "/reloaded";
  CommandResult r = python_job(2, fmt::format("dcp_save_sharded.py {} {}", ours, theirs));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // PyTorch's own checkpoint of the same state, read back by PyTorch, saved again (one process).
  r = run_command(fmt::format("{} {}/dcp_resave_plain.py {} {} 2>&1", kPython, kInterop, theirs, resaved));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string want = digest(resaved);
  EXPECT_EQ(count(want, "\n"), 4u) << want;
  EXPECT_EQ(digest(ours), want);
  EXPECT_TRUE(verify_checkpoint(ours).intact());

  const StateDict common = load_common_state_dict(ours);
  EXPECT_EQ(common.at("step").as_int(), 7);
  EXPECT_EQ(common.at("config").at("name").as_string(), "tiny");
  EXPECT_EQ(common.at("config").at("betas").as_list().at(1).as_float(), 0.95);

  // Rows saved over 2 ranks load as 4 column parts and the other way round.
  const auto layers0 = python_value("layers.0.weight", {8, 6}, at::kFloat);
  const auto layers1 = python_value("layers.1.weight", {6, 8}, at::kBFloat16);
  const auto embedding = python_value("embedding", {12, 4}, at::kFloat);
  const auto bias = python_value("bias", {6}, at::kFloat);
  run_ranks(4, [&](Communicator& comm) {
    const int rank = comm.rank();
    StateDict sd = Value::dict();
    sd["layers.0.weight"] = ShardedTensor::from_rank_offsets("layers.0.weight", at::zeros({2, 6}), {{0, rank, 4}});
    sd["layers.1.weight"] =
        ShardedTensor::from_rank_offsets("layers.1.weight", at::zeros({6, 2}, at::kBFloat16), {{1, rank, 4}});
    sd["embedding"] = ShardedTensor::from_rank_offsets("embedding", at::zeros({12, 1}), {{1, rank, 4}});
    sd["bias"] = ShardedTensor::from_rank_offsets("bias", at::zeros({6}), {}, ReplicaId{rank});
    const LoadResult loaded = load(sd, ours, comm);
    const Dict& got = loaded.state_dict.as_dict();
    EXPECT_TRUE(at::equal(got.at("layers.0.weight").as_tensor(), layers0.chunk(4, 0)[rank]));
    EXPECT_TRUE(at::equal(got.at("layers.1.weight").as_tensor(), layers1.chunk(4, 1)[rank]));
    EXPECT_TRUE(at::equal(got.at("embedding").as_tensor(), embedding.chunk(4, 1)[rank]));
    EXPECT_TRUE(at::equal(got.at("bias").as_tensor(), bias));
    EXPECT_EQ(got.at("step").as_int(), 7);
    save(sd, reloaded, comm);  // filled in place: the 4-rank layout of the same values
  });
  EXPECT_EQ(digest(reloaded), want);
}

TEST(PythonBridge, DamagedBytesAreClearPythonErrors) {
  TempDir tmp("py-damage");
  const std::string ckpt = tmp.path() + "/ckpt";
  const at::Tensor w = at::arange(4096, at::kFloat).reshape({64, 64});
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets("w", w.chunk(2, 0)[comm.rank()].contiguous(), {{0, comm.rank(), 2}});
    sd["iteration"] = Value(int64_t{5});
    save(sd, ckpt, comm);
  });
  const std::string load_w =
      fmt::format("{} -c \"import distckpt; distckpt.load_plain_tensors('{}')\" 2>&1", kPython, ckpt);
  ASSERT_EQ(run_command(load_w).exit_code, 0);

  flip_byte(ckpt + "/data/rank_00001.bin", 100);
  CommandResult r = run_command(load_w);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("CorruptionError: checksum mismatch in " + ckpt + "/data/rank_00001.bin"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("tensor 'w'"), std::string::npos) << r.output;
  flip_byte(ckpt + "/data/rank_00001.bin", 100);  // repaired

  flip_byte(ckpt + "/metadata.fb", 64);
  r = run_command(load_w);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("CorruptionError: checksum mismatch in " + ckpt + "/metadata.fb"), std::string::npos)
      << r.output;
}

// content_metadata written by one side is read by the other.
TEST(PythonBridge, ContentMetadataCrossesBothWays) {
  TempDir tmp("py-content");
  StateDict content;
  content["sharding_type"] = "dp_zero_gather_scatter";
  content["flags"]["chained"] = true;
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd;
    sd["w"] = ShardedTensor::from_rank_offsets("w", at::ones({2}), {});
    SaveOptions options;
    options.content_metadata = content;
    save(sd, tmp.path() + "/cpp", comm, options);
  });
  CommandResult r = run_command(
      fmt::format("{} -c \"import distckpt; print(sorted(distckpt.load_content_metadata('{}').items()))\" 2>&1",
                  kPython, tmp.path() + "/cpp"));
  EXPECT_EQ(r.output, "[('flags', {'chained': True}), ('sharding_type', 'dp_zero_gather_scatter')]\n");

  r = run_command(fmt::format(
      "{} -c \"import torch, distckpt; from distckpt import _dcp; _dcp.save({{'w': torch.ones(2)}}, "
      "storage_writer=distckpt.FileSystemWriter('{}', content_metadata={{'sharding_type': 'dp_zero_gather_scatter', "
      "'flags': {{'chained': True}}}}), no_dist=True)\" 2>&1",
      kPython, tmp.path() + "/py"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::optional<StateDict> read = load_content_metadata(tmp.path() + "/py");
  ASSERT_TRUE(read.has_value());
  EXPECT_TRUE(read->equals(content));
}

}  // namespace
}  // namespace distckpt
