// torch.save files written by the real PyTorch (tests/interop/
// write_torch_save.py) as checkpoints: load() reshards them directly over
// ranks, reading only the bytes each shard needs; a read of a whole record
// is checked against its CRC-32; strided views and a module's state_dict()
// (an OrderedDict with `_metadata`) read; files that stand for far more than their size,
// or name one thing twice, are refused with what to do.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "distckpt/distckpt.h"
#include "support/process.h"
#include "support/python_tensors.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kSource = DISTCKPT_SOURCE_DIR;

class TorchFile : public ::testing::Test {
 protected:
  void SetUp() override {
    const CommandResult py = run_command(
        fmt::format("cd {}/tests/interop && /usr/bin/python3 write_torch_save.py {}", kSource, tmp_.path()));
    ASSERT_EQ(py.exit_code, 0) << py.output;
  }
  std::string file(const std::string& name) const { return tmp_.path() + "/" + name; }
  TempDir tmp_{"torch-file"};
};

TEST_F(TorchFile, TwoRanksLoadTheirShardsStraightFromTheFile) {
  expect_two_ranks_load_python_shards(file("state.pt"));
  const StateDict common = load_common_state_dict(file("state.pt"));
  EXPECT_EQ(common.at("iteration").as_int(), 7);
  EXPECT_EQ(common.at("optimizer").at("param_groups").as_list()[0].at("lr").as_float(), 0.5);
}

// torch.save(model.state_dict()): the OrderedDict's `_metadata` attribute
// (module versions) is no item and is dropped.
TEST_F(TorchFile, AModuleStateDictLoadsAndItsDigestMatchesItsExport) {
  const StateDict plain = load_plain_tensors(file("module.pt"));
  EXPECT_TRUE(at::equal(plain.at("weight").as_tensor(), at::arange(12, at::kFloat).reshape({3, 4})));
  EXPECT_TRUE(at::equal(plain.at("bias").as_tensor(), -at::arange(3, at::kFloat)));
  EXPECT_FALSE(load_common_state_dict(file("module.pt")).contains("_metadata"));
  const auto cli = [](const std::string& args) { return run_command(kBin + "/distckpt " + args); };
  const CommandResult inspect = cli("inspect " + file("module.pt"));
  EXPECT_NE(inspect.output.find("torch, 1 file, 2 tensors (60 bytes)"), std::string::npos) << inspect.output;
  ASSERT_EQ(cli("convert " + file("module.pt") + " " + file("module-st") + " --to safetensors --quiet").exit_code, 0);
  EXPECT_EQ(cli("digest " + file("module.pt")).output, cli("digest " + file("module-st")).output);
}

// A file of torch.save's legacy format (no zip) is named as such, with what to do.
TEST_F(TorchFile, TheLegacyFormatIsNamedWithWhatToDo) {
  const CommandResult py = run_command("/usr/bin/python3 -c \"import torch; torch.save({'w': torch.ones(2)}, '" +
                                       file("legacy.pt") + "', _use_new_zipfile_serialization=False)\"");
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const CommandResult inspect = run_command(kBin + "/distckpt inspect " + file("legacy.pt"));
  EXPECT_EQ(inspect.exit_code, 2);
  EXPECT_NE(inspect.output.find("is a torch.save file in the legacy format (PyTorch before 1.6, or "
                                "_use_new_zipfile_serialization=False), which distckpt does not read: load it with "
                                "torch.load and save it again with torch.save"),
            std::string::npos)
      << inspect.output;
}

// A tensor named "" (torch.save takes any key) cannot be a distckpt key: said plainly.
TEST_F(TorchFile, ATensorWithAnEmptyNameIsRefusedByTheConversionToDistckpt) {
  const CommandResult py = run_command(
      "/usr/bin/python3 -c \"import torch; torch.save({'': torch.ones(2), 'b': "
      "torch.zeros(1)}, '" +
      file("empty-key.pt") + "')\"");
  ASSERT_EQ(py.exit_code, 0) << py.output;
  const CommandResult converted =
      run_command(kBin + "/distckpt convert " + file("empty-key.pt") + " " + file("empty-key") + " --to distckpt");
  EXPECT_EQ(converted.exit_code, 2);
  EXPECT_NE(converted.output.find("holds a tensor with an empty name, which a distckpt checkpoint cannot store"),
            std::string::npos)
      << converted.output;
  EXPECT_FALSE(std::filesystem::exists(file("empty-key")));
}

// A load that reads a tensor's whole record checks its CRC-32.
TEST_F(TorchFile, AWholeRecordReadIsCheckedAgainstItsCrc) {
  StateDict sd = Value::dict();
  sd["model.embed_tokens.weight"] =
      ShardedTensor::from_rank_offsets("model.embed_tokens.weight", at::empty({40, 16}), {});
  const auto one = make_single_process_communicator();
  EXPECT_TRUE(throws_with<CorruptionError>([&] { load(sd, file("damaged.pt"), *one); },
                                           "record 'state/data/0' fails its CRC-32"));
  EXPECT_NO_THROW(load(sd, file("state.pt"), *one));
}

TEST_F(TorchFile, FilesStandingForMoreThanTheyHoldOrNamingOneThingTwiceAreRefused) {
  const auto refused = [&](const std::string& name, const std::string& part) {
    return throws_with<CheckpointError>([&] { load_plain_tensors(file(name)); }, part);
  };
  EXPECT_TRUE(refused("fanout.pt", "its pickle expands to more than 64 times its size"));
  EXPECT_TRUE(refused("globals.pt", "global names adding up to more than 8 times the pickle's size"));
  EXPECT_TRUE(refused("nones.pt", "more than 1048576 values waiting on the stack"));
  EXPECT_TRUE(refused("aliases.pt", "its tensors add up to 104857600 bytes, more than 4 times the file's"));
  EXPECT_TRUE(refused("twice.pt", "'a.b' names two tensors"));
  EXPECT_TRUE(refused("intkey.pt", "the top-level dict holds the key '0' twice (as an int and as a string)"));
  StateDict sd = Value::dict();
  sd["w"] = ShardedTensor::from_rank_offsets("w", at::empty({2}), {});
  const auto one = make_single_process_communicator();
  SaveOptions as_torch;
  as_torch.format = StorageFormat::torch();
  EXPECT_TRUE(throws_with<UsageError>([&] { save(sd, file("saved"), *one, as_torch); },
                                      "write a torch.save file from a checkpoint with convert_to_torch"));
}

// Strided views (a transposed weight, a column slice), as converted
// checkpoints hold them, load like any tensor: sharded over two ranks, whole,
// through the tools, with a digest equal to their export's.
TEST_F(TorchFile, StridedViewsLoadShardedAndWhole) {
  const at::Tensor wide = at::arange(48, at::kFloat).reshape({6, 8});
  const at::Tensor wt = wide.t();  // [8, 6]
  const at::Tensor mask = at::remainder(at::arange(12).reshape({3, 4}), 3).eq(0).t();
  const at::Tensor half = at::arange(30, at::kHalf).reshape({5, 6}).slice(1, 2, 5);
  const std::string path = file("transposed.pt");
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sd = Value::dict();
    sd["wt"] = ShardedTensor::from_rank_offsets("wt", at::empty({4, 6}), {{0, r, 2}});  // rows of the view
    sd["half"] = ShardedTensor::from_rank_offsets("half", at::empty({5, 1}, at::kHalf), {{1, r, 3}});
    sd["row"] = ShardedTensor::from_rank_offsets("row", at::empty({4}), {{0, r, 2}});
    const LoadResult out = load(sd, path, comm);
    EXPECT_TRUE(at::equal(out.state_dict.at("wt").as_tensor(), wt.narrow(0, 4 * r, 4)));
    EXPECT_TRUE(at::equal(out.state_dict.at("half").as_tensor(), half.narrow(1, r, 1)));
    EXPECT_TRUE(at::equal(out.state_dict.at("row").as_tensor(), wide[4].narrow(0, 4 * r, 4)));
  });
  const StateDict plain = load_plain_tensors(path);
  EXPECT_TRUE(at::equal(plain.at("wt").as_tensor(), wt));
  EXPECT_TRUE(at::equal(plain.at("mask").as_tensor(), mask));
  EXPECT_TRUE(at::equal(plain.at("half").as_tensor(), half));
  EXPECT_TRUE(at::equal(load_plain_tensors(file("views.pt")).at("cols").as_tensor(),
                        at::arange(12, at::kFloat).reshape({3, 4}).slice(1, 1, 3)));
  const auto cli = [](const std::string& args) { return run_command(kBin + "/distckpt " + args); };
  ASSERT_EQ(cli("convert " + path + " " + file("transposed-st") + " --to safetensors --quiet").exit_code, 0);
  const CommandResult digest = cli("digest " + path);
  EXPECT_EQ(digest.exit_code, 0) << digest.output;
  EXPECT_EQ(digest.output, cli("digest " + file("transposed-st")).output);
  EXPECT_EQ(cli("verify " + path).exit_code, 0);
}

// Small tensors share the exports' windows (a hand-over each cost more than
// writing the tensor): with 4 KiB windows, 300 of them of five dtypes (empty
// ones among them) around one larger than a window arrive intact in every
// format.
TEST_F(TorchFile, ManySmallTensorsShareWindowsAndArriveIntact) {
  ConvertOptions options;
  options.window_bytes = 4096;
  const StateDict source = load_plain_tensors(file("many.pt"));
  ASSERT_EQ(source.size(), 301u);
  EXPECT_EQ(convert_to_safetensors(file("many.pt"), file("many-st"), options).tensors, 301u);
  EXPECT_EQ(convert_to_torch(file("many.pt"), file("many-again.pt"), options).tensors, 301u);
  EXPECT_EQ(convert_to_distckpt(file("many.pt"), file("many-ckpt"), options).tensors, 301u);
  for (const char* out : {"many-st", "many-again.pt", "many-ckpt"}) {
    const StateDict got = load_plain_tensors(file(out));
    ASSERT_EQ(got.size(), source.size()) << out;
    for (const auto& [key, value] : source.as_dict()) {
      EXPECT_TRUE(at::equal(got.at(key).as_tensor(), value.as_tensor())) << out << " " << key;
    }
  }
  EXPECT_EQ(run_command(kBin + "/distckpt verify " + file("many-ckpt")).exit_code, 0);
}

// One writer per target across processes: while another process holds a
// target's lock (flock(1) here, as a running save or export does), every
// conversion to it is refused at once and the staging area in use is left
// alone; afterwards the same command succeeds and leaves no lock file.
TEST_F(TorchFile, AConversionIntoATargetAnotherProcessWritesIsRefused) {
  for (const char* to : {"distckpt", "safetensors", "torch"}) {
    const std::string dst = file(fmt::format("out-{}", to)), lock = file(fmt::format(".out-{}.distckpt-lock", to));
    const std::string staging = file(fmt::format(".out-{}.distckpt-staging", to));
    ASSERT_EQ(run_command("mkdir " + staging + " && echo theirs > " + staging + "/in-progress").exit_code, 0);
    const std::string convert =
        fmt::format("{}/distckpt convert {} {} --to {} --quiet", kBin, file("state.pt"), dst, to);
    const CommandResult refused = run_command(fmt::format("flock {} {}", lock, convert));
    EXPECT_EQ(refused.exit_code, 2) << to;
    EXPECT_NE(refused.output.find(fmt::format("another save or export is writing '{}' (it holds '{}')", dst, lock)),
              std::string::npos)
        << refused.output;
    EXPECT_EQ(run_command("cat " + staging + "/in-progress").output, "theirs\n") << to;
    EXPECT_FALSE(std::filesystem::exists(dst)) << to;

    const CommandResult done = run_command(convert);
    EXPECT_EQ(done.exit_code, 0) << done.output;
    EXPECT_FALSE(std::filesystem::exists(lock)) << to;
    EXPECT_FALSE(std::filesystem::exists(staging)) << to;
  }
  const auto a = digest_checkpoint(file("out-distckpt")), b = digest_checkpoint(file("out-torch"));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].line(), b[i].line());
}

}  // namespace
}  // namespace distckpt
