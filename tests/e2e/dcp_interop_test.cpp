// PyTorch DCP checkpoints written by the real PyTorch (Debian's torch 1.13,
// tests/interop/dcp_native_save.py: 1 and 2 processes over Gloo, one file
// per item and one file per rank), a .metadata with torch 2.x's class names
// (dcp_metadata_2x.py) and a Megatron torch_dist directory
// (megatron_torch_dist.py) are opened by distckpt directly: loads reshard
// them reading only the bytes a rank needs, digests equal those of a
// torch.save of the same whole tensors, the bytes values are common state,
// Megatron's sharded objects are objects. Hostile copies (dcp_hostile.py)
// are refused naming the file and the reason, nothing in them executed.
// The other way: a GPT saved by distckpt in DCP (and a conversion to DCP and
// to torch_dist) loads in PyTorch's own FileSystemReader into whole,
// row-sharded and column-sharded tensors (dcp_native_check.py), and back
// into the trainer under another mesh with its digest unchanged.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "distckpt/distckpt.h"
#include "support/process.h"
#include "support/ranks.h"
#include "support/s3_server.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kInterop = std::string(DISTCKPT_SOURCE_DIR) + "/tests/interop";

// The fixtures, written once for every test of the suite.
class Dcp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("dcp");
    const auto python = [](int ranks, const std::string& script_and_args) {
      const std::string launch = ranks > 1 ? fmt::format("{}/distckpt-launch -n {} -- ", kBin, ranks) : "";
      const CommandResult r = run_command(
          fmt::format("cd {} && OMP_NUM_THREADS=1 {}/usr/bin/python3 {} 2>&1", kInterop, launch, script_and_args));
      ASSERT_EQ(r.exit_code, 0) << script_and_args << "\n" << r.output;
    };
    python(1, fmt::format("dcp_native_save.py {0} {0}.pt", at("n1")));
    python(2, fmt::format("dcp_native_save.py {0} {0}.pt", at("n2")));
    python(2, fmt::format("dcp_native_save.py {0} {0}.pt --single-file-per-rank", at("s2")));
    python(1, fmt::format("dcp_metadata_2x.py {0} {0}.pt", at("v2")));
    python(1, fmt::format("dcp_metadata_2x.py {0} {0}.pt --zstd", at("v2z")));
    python(1, fmt::format("megatron_torch_dist.py {0} {0}.pt", at("mc")));
    std::filesystem::create_directories(at("hostile"));
    python(1, fmt::format("dcp_hostile.py {} {}", at("n1"), at("hostile")));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string at(const std::string& name) { return dir_->file(name); }

  static TempDir* dir_;
};
TempDir* Dcp::dir_ = nullptr;

std::string digest(const std::string& path) {
  const CommandResult r = run_command(kBin + "/distckpt digest " + path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

// dcp_native_check.py: PyTorch's own reader against a torch.save reference.
CommandResult pytorch_check(int ranks, const std::string& ckpt, const std::string& reference, const std::string& keys) {
  const std::string launch = ranks > 1 ? fmt::format("{}/distckpt-launch -n {} -- ", kBin, ranks) : "";
  return run_command(
      fmt::format("cd {} && OMP_NUM_THREADS=1 {}/usr/bin/python3 dcp_native_check.py {} {} --keys {} 2>&1", kInterop,
                  launch, ckpt, reference, keys));
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

at::Tensor reference(const std::string& file, const std::string& key) {
  return load_plain_tensors(file).at(key).as_tensor();
}

// Each of 2 ranks asks for its half of every tensor along a dimension
// the checkpoint did not split (or for the whole, replicated).
TEST_F(Dcp, PyTorchSavesLoadUnderAnotherShardingOnTwoRanks) {
  for (const char* name : {"n1", "n2", "s2"}) {
    SCOPED_TRACE(name);
    const std::string ckpt = at(name);
    const StateDict want = load_plain_tensors(ckpt + ".pt");
    const auto half = [&](const std::string& key, int64_t dim, int rank) {
      return want.at(key).as_tensor().chunk(2, dim)[rank];
    };
    run_ranks(2, [&](Communicator& comm) {
      const int rank = comm.rank();
      StateDict sd = Value::dict();
      sd["rows"] = ShardedTensor::from_rank_offsets("rows", at::zeros({10, 2}), {{1, rank, 2}});
      sd["cols"] = ShardedTensor::from_rank_offsets("cols", at::zeros({3, 9}, at::kBFloat16), {{0, rank, 2}});
      sd["ints"] = ShardedTensor::from_rank_offsets("ints", at::zeros({4, 2}, at::kLong), {{1, rank, 2}});
      sd["uneven"] = ShardedTensor::from_rank_offsets("uneven", at::zeros({7, 5}), {}, ReplicaId{rank});
      sd["plain.weight"] = ShardedTensor::from_rank_offsets("plain.weight", at::zeros({5, 3}), {}, ReplicaId{rank});
      sd["plain.bias"] =
          ShardedTensor::from_rank_offsets("plain.bias", at::zeros({7}, at::kBFloat16), {}, ReplicaId{rank});
      const LoadResult loaded = load(sd, ckpt, comm);
      const Dict& got = loaded.state_dict.as_dict();
      EXPECT_TRUE(at::equal(got.at("rows").as_tensor(), half("rows", 1, rank)));
      EXPECT_TRUE(at::equal(got.at("cols").as_tensor(), half("cols", 0, rank)));
      EXPECT_TRUE(at::equal(got.at("ints").as_tensor(), half("ints", 1, rank)));
      EXPECT_TRUE(at::equal(got.at("uneven").as_tensor(), want.at("uneven").as_tensor()));
      EXPECT_TRUE(at::equal(got.at("plain.weight").as_tensor(), want.at("plain.weight").as_tensor()));
      EXPECT_TRUE(at::equal(got.at("plain.bias").as_tensor(), want.at("plain.bias").as_tensor()));
      EXPECT_EQ(got.at("step").as_int(), 7);
    });
  }
}

// A tensor item is a torch.save archive; rows are a byte range of its
// stored record, and only that range is read (once per host: ranks on one
// host share what one of them read).
TEST_F(Dcp, OnlyTheBytesOfTheRowsAskedForAreRead) {
  const at::Tensor rows = reference(at("n1") + ".pt", "rows");
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["rows"] = ShardedTensor::from_rank_offsets("rows", at::zeros({5, 4}), {{0, 1, 2}});
    const LoadResult loaded = load(sd, at("n1"), comm);
    EXPECT_EQ(loaded.bytes_read, 5u * 4 * sizeof(float));
    EXPECT_TRUE(at::equal(loaded.state_dict.at("rows").as_tensor(), rows.chunk(2, 0)[1]));
  });
  std::atomic<uint64_t> read{0};
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["rows"] = ShardedTensor::from_rank_offsets("rows", at::zeros({5, 4}), {{0, comm.rank(), 2}});
    const LoadResult loaded = load(sd, at("n1"), comm);
    read += loaded.bytes_read;
    EXPECT_TRUE(at::equal(loaded.state_dict.at("rows").as_tensor(), rows.chunk(2, 0)[comm.rank()]));
  });
  EXPECT_EQ(read.load(), 10u * 4 * sizeof(float));
}

TEST_F(Dcp, DigestsEqualThoseOfATorchSaveOfTheWholeTensors) {
  for (const char* name : {"n1", "n2", "s2"}) {
    // The reference also holds nested.inner.t, which 1.13 keeps inside the bytes value "nested".
    const std::vector<std::string> got = lines(digest(at(name))), want = lines(digest(at(name) + ".pt"));
    EXPECT_EQ(got.size(), 6u) << name;
    for (const std::string& line : got) {
      EXPECT_NE(std::find(want.begin(), want.end(), line), want.end()) << name << ": " << line;
    }
  }
  EXPECT_EQ(digest(at("v2")), digest(at("v2") + ".pt"));
  EXPECT_EQ(digest(at("mc")), digest(at("mc") + ".pt"));
}

// Every non-tensor value is a bytes item holding torch.save(value): plain
// values decoded, a nested dict with its tensor.
TEST_F(Dcp, BytesValuesAreTheCommonState) {
  const StateDict common = load_common_state_dict(at("n2"));
  EXPECT_EQ(common.at("step").as_int(), 7);
  EXPECT_EQ(common.at("lr").as_float(), 0.5);
  EXPECT_EQ(common.at("name").as_string(), "tiny");
  EXPECT_EQ(common.at("blob").as_string(), std::string("\x00\x01"
                                                       "abc",
                                                       5));
  EXPECT_EQ(common.at("config").at("hidden").as_int(), 8);
  EXPECT_EQ(common.at("config").at("betas").as_list().at(1).as_float(), 0.95);
  EXPECT_TRUE(common.at("config").at("flag").as_bool());
  EXPECT_EQ(common.at("config").at("none").kind(), Kind::kNone);
  EXPECT_TRUE(
      at::equal(common.at("nested").at("inner").at("t").as_tensor(), reference(at("n2") + ".pt", "nested.inner.t")));
}

// The 2.x fixtures' tensors loaded on 2 ranks under columns, across
// both stored row chunks, and their bytes value as common state.
void load_the_torch2_fixture(const std::string& ckpt) {
  EXPECT_EQ(detect_storage_format(ckpt).name(), "dcp");
  const StateDict want = load_plain_tensors(ckpt + ".pt");
  run_ranks(2, [&](Communicator& comm) {
    const int rank = comm.rank();
    StateDict sd = Value::dict();
    // Columns across both stored row chunks.
    sd["a"] = ShardedTensor::from_rank_offsets("a", at::zeros({4, 3}), {{1, rank, 2}});
    sd["b"] = ShardedTensor::from_rank_offsets("b", at::zeros({5}, at::kInt), {}, ReplicaId{rank});
    sd["opt.state.0.exp_avg"] =
        ShardedTensor::from_rank_offsets("opt.state.0.exp_avg", at::zeros({3}), {}, ReplicaId{rank});
    const StateDict got = load(sd, ckpt, comm).state_dict;
    EXPECT_TRUE(at::equal(got.at("a").as_tensor(), want.at("a").as_tensor().chunk(2, 1)[rank]));
    EXPECT_TRUE(at::equal(got.at("b").as_tensor(), want.at("b").as_tensor()));
    EXPECT_TRUE(at::equal(got.at("opt.state.0.exp_avg").as_tensor(), want.at("opt.state.0.exp_avg").as_tensor()));
    EXPECT_EQ(got.at("meta").at("epoch").as_int(), 3);
  });
}

// No torch 2.x here: the fixture pickles the 2.x class names (metadata
// moved out of _shard, TensorProperties and StorageMeta with it, a
// pathlib checkpoint_id, the enum member through builtins.getattr).
// v2z: the same items compressed by 2.x's zstd stream transform.
TEST_F(Dcp, AMetadataWithTorch2ClassNamesLoads) {
  for (const char* name : {"v2", "v2z"}) {
    SCOPED_TRACE(name);
    load_the_torch2_fixture(at(name));
  }
  EXPECT_EQ(digest(at("v2z")), digest(at("v2z") + ".pt"));
  const CommandResult verified = run_command(kBin + "/distckpt verify " + at("v2z"));
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
  EXPECT_NE(verified.output.find("intact"), std::string::npos) << verified.output;

  // A byte flipped inside the compressed items: the stream, the archive or
  // a record's CRC-32 gives it away.
  const std::string damaged = at("v2z-damaged");
  std::filesystem::copy(at("v2z"), damaged);
  const std::string file = damaged + "/__0_0.distcp";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  const auto middle = static_cast<std::streamoff>(std::filesystem::file_size(file) / 2);
  char byte = 0;
  f.seekg(middle).read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x10);
  f.seekp(middle).write(&byte, 1);
  f.close();
  const CommandResult bad = run_command(kBin + "/distckpt verify " + damaged + " 2>&1");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("__0_0.distcp"), std::string::npos) << bad.output;
}

// metadata.json (torch_dist), common.pt, Megatron's sharded objects, the
// .metadata pickled as MCoreMetadata.
TEST_F(Dcp, AMegatronTorchDistCheckpointLoads) {
  const std::string ckpt = at("mc");
  EXPECT_EQ(detect_storage_format(ckpt).name(), "dcp");
  EXPECT_EQ(checkpoint_writer(ckpt), "torch_dist");
  const StateDict common = load_common_state_dict(ckpt);
  EXPECT_EQ(common.at("iteration").as_int(), 10);
  EXPECT_EQ(common.at("checkpoint_version").as_float(), 3.0);
  const StateDict want = load_plain_tensors(ckpt + ".pt"), got = load_plain_tensors(ckpt);
  for (const char* key : {"decoder.layers.self_attention.linear_qkv.weight", "embedding.word_embeddings.weight"}) {
    EXPECT_TRUE(at::equal(got.at(key).as_tensor(), want.at(key).as_tensor())) << key;
  }
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["rng"] = ShardedObject{"optimizer.rng_state", "", {2}, {static_cast<int64_t>(comm.rank())}, ReplicaId{0}};
    // Layer r of the stacked weight.
    sd["qkv"] = ShardedTensor::from_rank_offsets("decoder.layers.self_attention.linear_qkv.weight",
                                                 at::zeros({1, 12, 8}), {{0, comm.rank(), 2}});
    const StateDict loaded = load(sd, ckpt, comm).state_dict;
    const std::string& object = loaded.at("rng").as_string();  // torch.save([{"seed": 1234 + rank}])
    EXPECT_EQ(object.substr(0, 2), "PK");
    EXPECT_TRUE(
        at::equal(loaded.at("qkv").as_tensor(),
                  want.at("decoder.layers.self_attention.linear_qkv.weight").as_tensor()[comm.rank()].unsqueeze(0)));
  });
  const CommandResult inspect = run_command(kBin + "/distckpt inspect " + ckpt);
  EXPECT_NE(inspect.output.find("optimizer.rng_state/shard_1_2"), std::string::npos) << inspect.output;
}

TEST_F(Dcp, VerifyConvertAndDiffTakeIt) {
  const std::string ckpt = at("n2"), out = dir_->file("n2-safetensors");
  const CommandResult verify = run_command(kBin + "/distckpt verify " + ckpt);
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_NE(verify.output.find("intact (PyTorch DCP"), std::string::npos) << verify.output;
  const CommandResult convert =
      run_command(kBin + "/distckpt convert " + ckpt + " " + out + " --to safetensors --quiet");
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  EXPECT_EQ(digest(out), digest(ckpt));
  const CommandResult diff = run_command(kBin + "/distckpt diff " + ckpt + " " + out);
  EXPECT_EQ(std::count(diff.output.begin(), diff.output.end(), '='), 6) << diff.output;
}

// A changed byte of a tensor's values: verify names the item, and a read of
// the whole record fails its CRC-32.
TEST_F(Dcp, AFlippedValueByteIsFoundByVerifyAndByAWholeRead) {
  TempDir tmp("dcp-flip");
  const std::string ckpt = tmp.file("ck");
  std::filesystem::copy(at("n1"), ckpt);
  // rows' first values, 4.0f and 4.25f, little-endian.
  const std::string pattern("\x00\x00\x80\x40\x00\x00\x88\x40", 8);
  std::string damaged;
  for (const auto& entry : std::filesystem::directory_iterator(ckpt)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t found = bytes.find(pattern);
    if (found != std::string::npos) {
      flip_byte(entry.path().string(), found + 1);
      damaged = entry.path().filename().string();
    }
  }
  ASSERT_FALSE(damaged.empty());
  const VerifyReport report = verify_checkpoint(ckpt);
  EXPECT_FALSE(report.intact());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find(damaged), std::string::npos) << report.problems[0];
  EXPECT_NE(report.problems[0].find("CRC-32"), std::string::npos) << report.problems[0];
  EXPECT_TRUE(throws_with<CorruptionError>([&] { load_plain_tensors(ckpt); }, "fail their CRC-32"));
  // Without verification (LoadOptions::verify_checksums = false: what
  // PyTorch's reader does) every chunk reads, as stored.
  const std::unique_ptr<StorageReader> unchecked = open_storage(ckpt, StorageOptions{StorageFormat::detected(), false});
  for (const TensorRecord& t : unchecked->index().tensors) {
    for (uint32_t c = 0; c < t.chunks.size(); ++c) {
      std::vector<uint8_t> out(t.chunks[c].byte_length);
      EXPECT_NO_THROW(unchecked->read_chunk(t, c, 0, out.size(), out.data())) << t.key << " chunk " << c;
    }
  }
}

TEST_F(Dcp, HostileCopiesAreRefusedNamingTheFileAndTheReason) {
  const auto refused = [&](const std::string& name, const std::string& why) {
    SCOPED_TRACE(name);
    const std::string ckpt = at("hostile/" + name);
    EXPECT_FALSE(verify_checkpoint(ckpt).intact());
    EXPECT_TRUE(throws_with<CorruptionError>([&] { load_plain_tensors(ckpt); }, why));
  };
  refused("escape", "unsafe path '../outside.distcp'");
  refused("absolute", "absolute paths are not allowed");
  refused("past_end", "which has");
  refused("lying",
          "holds a float32 tensor of shape [5, 3], where .metadata says chunk 0 of 'rows' is float32 of "
          "shape [10, 4]");
  refused("code", "global 'posix.system', which this pickle may not name (nothing is imported)");
  refused("truncated", "truncated pickle");
  EXPECT_FALSE(std::filesystem::exists(at("hostile/code/pwned")));
}

// A GPT (tp2, pp2, Adam) saved straight into DCP with torch 1.13's module
// names: PyTorch loads every tensor whole and split by rows and by columns;
// the trainer loads it under tp4 and resaves the same digest.
TEST_F(Dcp, AGptSavedAsDcpLoadsInPyTorchAndInTheTrainerUnderAnotherMesh) {
  TempDir tmp("dcp-gpt");
  const std::string a = tmp.file("a"), d = tmp.file("d"), c = tmp.file("c"), reference = tmp.file("reference.pt");
  const auto trainer = [&](const std::string& mesh, const std::string& flags) {
    const CommandResult r = run_command(fmt::format(
        "OMP_NUM_THREADS=1 {0}/distckpt-launch -n 4 -- {0}/distckpt-gpt-trainer --model gpt --layers 4 --hidden 32 "
        "--heads 4 --kv-groups 2 --ffn 64 --vocab 64 --optimizer adam {1} {2} 2>&1",
        kBin, mesh, flags));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  trainer("--tp 2 --pp 2", "--steps 2 --save " + a);
  trainer("--tp 2 --pp 2", "--load " + a + " --save " + d + " --save-format dcp-1.13");
  EXPECT_EQ(detect_storage_format(d).name(), "dcp");
  EXPECT_EQ(digest(d), digest(a));
  EXPECT_EQ(run_command(kBin + "/distckpt diff " + a + " " + d).exit_code, 0);  // common state and objects too
  for (int rank = 0; rank < 4; ++rank) EXPECT_TRUE(std::filesystem::exists(fmt::format("{}/__{}_0.distcp", d, rank)));

  ASSERT_EQ(run_command(fmt::format("{}/distckpt convert {} {} --to torch --quiet", kBin, a, reference)).exit_code, 0);
  std::string keys;
  for (const std::string& line : lines(digest(a))) keys += (keys.empty() ? "" : ",") + line.substr(0, line.find(' '));
  const CommandResult pytorch = pytorch_check(2, d, reference, keys);
  EXPECT_EQ(pytorch.exit_code, 0) << pytorch.output;
  EXPECT_NE(pytorch.output.find(fmt::format("tensors equal {}", lines(digest(a)).size())), std::string::npos)
      << pytorch.output;
  EXPECT_NE(pytorch.output.find("rank 1: sharded tensors equal"), std::string::npos) << pytorch.output;

  const std::string resumed = trainer("--tp 4", "--load " + d + " --save " + c);
  EXPECT_NE(resumed.find("iteration 2, loaded"), std::string::npos) << resumed;  // optimizer state and step restored
  EXPECT_EQ(digest(c), digest(a));
}

// convert --to dcp / torch_dist: each tensor in items of whole rows of at
// most a window; PyTorch loads them, distckpt reads them back equal.
TEST_F(Dcp, ConversionsToDcpAndTorchDistLoadInPyTorch) {
  TempDir tmp("dcp-convert");
  const std::string keys = "rows,cols,ints,uneven,plain.weight,plain.bias";
  ConvertOptions small;
  small.window_bytes = 64;  // rows [10, 4] float32: blocks of 4, 4 and 2 rows
  DcpWriteOptions v113;
  v113.naming = DcpWriteOptions::Naming::kTorch113;
  convert_to_dcp(at("n2"), tmp.file("dcp"), v113, small);
  const std::unique_ptr<StorageReader> stored = open_storage(tmp.file("dcp"));
  EXPECT_EQ(stored->index().find_tensor("rows")->chunks.size(), 3u);
  EXPECT_EQ(digest(tmp.file("dcp")), digest(at("n2")));
  EXPECT_EQ(load_common_state_dict(tmp.file("dcp")).at("config").at("hidden").as_int(), 8);
  CommandResult pytorch = pytorch_check(2, tmp.file("dcp"), at("n2") + ".pt", keys);
  EXPECT_EQ(pytorch.exit_code, 0) << pytorch.output;
  EXPECT_NE(pytorch.output.find("tensors equal 6"), std::string::npos) << pytorch.output;

  const CommandResult cli = run_command(fmt::format("{}/distckpt convert {} {} --to torch_dist --torch 1.13 --quiet",
                                                    kBin, at("n2"), tmp.file("megatron")));
  ASSERT_EQ(cli.exit_code, 0) << cli.output;
  EXPECT_EQ(checkpoint_writer(tmp.file("megatron")), "torch_dist");
  EXPECT_TRUE(std::filesystem::exists(tmp.file("megatron/common.pt")));
  EXPECT_EQ(load_common_state_dict(tmp.file("megatron")).at("step").as_int(), 7);
  EXPECT_EQ(digest(tmp.file("megatron")), digest(at("n2")));
  pytorch = pytorch_check(1, tmp.file("megatron"), at("n2") + ".pt", keys);
  EXPECT_EQ(pytorch.exit_code, 0) << pytorch.output;
}

// A DCP save never replaces what is there, and a failed one leaves nothing.
TEST_F(Dcp, ASaveRefusesAnExistingTargetAndAFailedSaveLeavesNothing) {
  TempDir tmp("dcp-refuse");
  const std::string taken = tmp.file("taken"), failed = tmp.file("failed");
  std::filesystem::create_directories(taken);
  std::ofstream(taken + "/keep") << "x";
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets("w", at::ones({2, 4}), {{0, comm.rank(), 2}});
    SaveOptions options;
    options.format = dcp_format();
    EXPECT_TRUE(throws_with<CheckpointError>([&] { save(sd, taken, comm, options); }, "already exists"));
    sd["t"] = ShardedTensor::from_rank_offsets("step", at::ones({2}), {}, ReplicaId{comm.rank()});
    sd["step"] = 1;  // a common value named like that tensor
    EXPECT_TRUE(throws_with<UsageError>([&] { save(sd, failed, comm, options); }, "names both a tensor"));
  });
  EXPECT_TRUE(std::filesystem::exists(taken + "/keep"));
  EXPECT_FALSE(std::filesystem::exists(failed));
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path())) {
    EXPECT_EQ(entry.path().filename().string().find("staging"), std::string::npos) << entry.path();
  }
}

// Format x backend: the same DCP writer and reader on an object store.
TEST_F(Dcp, ASaveAndALoadOnAnObjectStore) {
  DISTCKPT_REQUIRE_MOTO_WITHOUT_SIGNATURE_CHECKS(server);
  server->export_environment();
  const std::string url = fmt::format("s3://{}/{}dcp", MotoServer::kBucket, s3_test_keys("dcp"));
  const at::Tensor w = at::arange(64, at::kFloat).reshape({8, 8});
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets("w", w.chunk(2, 0)[comm.rank()].clone(), {{0, comm.rank(), 2}});
    sd["step"] = 3;
    SaveOptions options;
    options.format = dcp_format();
    save(sd, url, comm, options);
    StateDict request = Value::dict();
    request["w"] = ShardedTensor::from_rank_offsets("w", at::zeros({8, 4}), {{1, comm.rank(), 2}});
    const StateDict loaded = load(request, url, comm).state_dict;
    EXPECT_TRUE(at::equal(loaded.at("w").as_tensor(), w.chunk(2, 1)[comm.rank()]));
    EXPECT_EQ(loaded.at("step").as_int(), 3);
  });
  EXPECT_EQ(detect_storage_format(url).name(), "dcp");
  EXPECT_TRUE(verify_checkpoint(url).intact());
}

}  // namespace
}  // namespace distckpt
