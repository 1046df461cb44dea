// Interop with the real PyTorch: safetensors files written by a Python
// process from torch tensors (tests/interop/write_safetensors.py, by the
// published format alone) load in C++ with every value equal, one file or
// sharded with an index, and the CLI inspects, verifies and digests them.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "distckpt/distckpt.h"
#include "support/process.h"
#include "support/python_tensors.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kSource = DISTCKPT_SOURCE_DIR;

class SafetensorsInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    const CommandResult py = run_command(
        fmt::format("/usr/bin/python3 {}/tests/interop/write_safetensors.py {}", kSource, tmp_.path() + "/py"));
    ASSERT_EQ(py.exit_code, 0) << py.output;
  }
  std::string path(const std::string& rel) const { return tmp_.path() + "/py/" + rel; }
  TempDir tmp_{"st-interop"};
};

TEST_F(SafetensorsInterop, EveryTensorPythonWroteLoadsEqual) {
  for (const std::string& where : {path("single"), path("single/model.safetensors"), path("sharded")}) {
    const StateDict plain = load_plain_tensors(where);
    for (size_t k = 0; k < python_tensors().size(); ++k) {
      const PythonTensor& t = python_tensors()[k];
      ASSERT_TRUE(plain.contains(t.name)) << where << ": " << t.name;
      const at::Tensor got = plain.at(t.name).as_tensor();
      EXPECT_EQ(got.scalar_type(), t.dtype) << t.name;
      EXPECT_TRUE(at::equal(got, python_value(k))) << where << ": " << t.name;
    }
    EXPECT_FALSE(load_common_state_dict(where).contains("format"));  // it describes the files
    EXPECT_EQ(load_content_metadata(where)->at("format").as_string(), "pt");
  }
}

TEST_F(SafetensorsInterop, TwoRanksLoadShardsOfPythonsTensors) { expect_two_ranks_load_python_shards(path("sharded")); }

TEST_F(SafetensorsInterop, CliInspectsVerifiesAndDigests) {
  const CommandResult inspect = run_command(kBin + "/distckpt inspect --json " + path("sharded"));
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  const nlohmann::json j = nlohmann::json::parse(inspect.output);
  EXPECT_EQ(j["format"], "safetensors");
  EXPECT_EQ(j["tensors"].size(), python_tensors().size());
  EXPECT_EQ(j["common_keys"], nlohmann::json::array());
  EXPECT_EQ(j["content_metadata"], nlohmann::json({{"format", "pt"}}));

  const CommandResult verify = run_command(kBin + "/distckpt verify " + path("sharded"));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_NE(verify.output.find("intact (safetensors, 3 files"), std::string::npos) << verify.output;

  const CommandResult one = run_command(kBin + "/distckpt digest " + path("single"));
  const CommandResult two = run_command(kBin + "/distckpt digest " + path("sharded"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(one.output, two.output);
  EXPECT_NE(one.output.find("model.layers.0.self_attn.q_proj.weight bfloat16 [16,16] "), std::string::npos)
      << one.output;
}

// Python's files -> distckpt -> safetensors (sharded) -> distckpt ->
// safetensors: digests kept, Python reads every value back from our files,
// and the second export is byte-identical to the first.
TEST_F(SafetensorsInterop, ConvertRoundTripsKeepDigestsAndBytes) {
  const std::string ours = tmp_.path() + "/ours", out = tmp_.path() + "/out", again = tmp_.path() + "/again",
                    out2 = tmp_.path() + "/out2";
  const auto cli = [](const std::string& args) { return run_command(kBin + "/distckpt " + args); };
  const auto digest = [&](const std::string& dir) {
    const CommandResult r = cli("digest " + dir);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  const CommandResult in = cli("convert " + path("single") + " " + ours + " --to distckpt");
  ASSERT_EQ(in.exit_code, 0) << in.output;
  EXPECT_NE(in.output.find("12 tensors"), std::string::npos) << in.output;
  EXPECT_EQ(digest(ours), digest(path("single")));
  EXPECT_FALSE(load_common_state_dict(ours).contains("format"));
  EXPECT_FALSE(load_content_metadata(ours).has_value());  // "format" described the safetensors files only

  const CommandResult exported = cli("convert " + ours + " " + out + " --to safetensors --max-shard-size 2KB --quiet");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_EQ(exported.output, "");
  const CommandResult checked =
      run_command(fmt::format("cd {}/tests/interop && /usr/bin/python3 check_export.py {}", kSource, out));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_NE(checked.output.find("ok 12 tensors in 3 files"), std::string::npos) << checked.output;

  ASSERT_EQ(cli("convert " + out + " " + again + " --to distckpt --quiet").exit_code, 0);
  EXPECT_EQ(digest(again), digest(ours));
  ASSERT_EQ(cli("convert " + again + " " + out2 + " --to safetensors --max-shard-size 2KB --quiet").exit_code, 0);
  const CommandResult same = run_command("diff -r " + out + " " + out2 + " && echo identical");
  EXPECT_NE(same.output.find("identical"), std::string::npos) << same.output;

  // Nothing is written over an existing destination.
  const CommandResult refused = cli("convert " + ours + " " + out + " --to safetensors");
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.output.find("'" + out + "' already exists"), std::string::npos) << refused.output;
  EXPECT_EQ(run_command("ls -A " + tmp_.path() + " | grep -c staging").output, "0\n");
}

TEST_F(SafetensorsInterop, ExportConvertsFloatingPointTensorsToTheAskedDtype) {
  const std::string out = tmp_.path() + "/bf16";
  const CommandResult exported =
      run_command(kBin + "/distckpt convert " + path("sharded") + " " + out + " --to safetensors --dtype bfloat16");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const CommandResult checked =
      run_command(fmt::format("cd {}/tests/interop && /usr/bin/python3 check_export.py {} bfloat16", kSource, out));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  const CommandResult bad =
      run_command(kBin + "/distckpt convert " + path("sharded") + " " + out + "-x --to safetensors --dtype int8");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("must be a floating-point type"), std::string::npos) << bad.output;
}

// --to torch: one .pt that Python's torch.load opens, with every tensor and
// the common values (nested dicts and lists included); from safetensors,
// the tensors alone, so a module's load_state_dict takes it.
TEST_F(SafetensorsInterop, TorchExportLoadsInPythonWithTensorsAndCommonValues) {
  const std::string pt = tmp_.path() + "/model.pt";
  const CommandResult exported = run_command(kBin + "/distckpt convert " + path("sharded") + " " + pt + " --to torch");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const CommandResult checked =
      run_command(fmt::format("cd {}/tests/interop && /usr/bin/python3 check_export.py {}", kSource, pt));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_NE(checked.output.find("ok 12 tensors"), std::string::npos) << checked.output;

  const std::string ckpt = tmp_.path() + "/with-common", pt2 = tmp_.path() + "/with-common.pt";
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets("w", at::arange(6, at::kFloat).reshape({2, 3}).narrow(0, comm.rank(), 1),
                                               {{0, comm.rank(), 2}});
    sd["iteration"] = Value(int64_t{7});
    sd["args"] = Value::dict();
    sd["args"]["lr"] = Value(0.5);
    sd["args"]["name"] = Value("gpt");
    sd["args"]["layers"] = Value(List{Value(int64_t{1}), Value(true)});
    save(sd, ckpt, comm);
  });
  ASSERT_EQ(run_command(kBin + "/distckpt convert " + ckpt + " " + pt2 + " --to torch --quiet").exit_code, 0);
  const CommandResult loaded =
      run_command("/usr/bin/python3 -c \"import torch; d = torch.load('" + pt2 +
                  "'); print(sorted(d)); print(d['w'].tolist(), d['iteration'], sorted(d['args'].items()))\"");
  ASSERT_EQ(loaded.exit_code, 0) << loaded.output;
  EXPECT_EQ(loaded.output,
            "['args', 'iteration', 'w']\n[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] 7 [('layers', [1, True]), ('lr', 0.5), "
            "('name', 'gpt')]\n");
  EXPECT_EQ(run_command(kBin + "/distckpt convert " + ckpt + " " + pt2 + " --to torch").exit_code, 2);
}

// torch.save files written by Python (a state_dict with common values, a
// nested dict, a list) convert to distckpt and to safetensors; every value
// equal, nested tensors named by their dotted path.
TEST_F(SafetensorsInterop, TorchSaveFilesConvertToDistckptAndSafetensors) {
  const std::string py = tmp_.path() + "/pt";
  const CommandResult written =
      run_command(fmt::format("cd {}/tests/interop && /usr/bin/python3 write_torch_save.py {}", kSource, py));
  ASSERT_EQ(written.exit_code, 0) << written.output;
  const auto cli = [](const std::string& args) { return run_command(kBin + "/distckpt " + args); };

  const std::string ours = tmp_.path() + "/from-pt", hf = tmp_.path() + "/from-pt-hf";
  const CommandResult in = cli("convert " + py + "/state.pt " + ours + " --to distckpt");
  ASSERT_EQ(in.exit_code, 0) << in.output;
  EXPECT_NE(in.output.find("12 tensors"), std::string::npos) << in.output;
  const StateDict plain = load_plain_tensors(ours);
  for (size_t k = 0; k < python_tensors().size(); ++k) {
    const char* name = python_tensors()[k].name;
    EXPECT_TRUE(at::equal(plain.at(name).as_tensor(), python_value(k))) << name;
  }
  const StateDict common = load_common_state_dict(ours);
  EXPECT_EQ(common.at("iteration").as_int(), 7);
  EXPECT_EQ(common.at("optimizer").at("state").at("0").at("step").as_int(), 3);
  EXPECT_EQ(common.at("optimizer").at("param_groups").as_list()[0].at("lr").as_float(), 0.5);

  // pytorch_model.bin -> model.safetensors, read back by Python from the published format.
  ASSERT_EQ(cli("convert " + py + "/state.pt " + hf + " --to safetensors --quiet").exit_code, 0);
  const CommandResult checked =
      run_command(fmt::format("cd {}/tests/interop && /usr/bin/python3 check_export.py {}", kSource, hf));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_EQ(cli("digest " + hf).output, cli("digest " + path("single")).output);

  const std::string nested = tmp_.path() + "/nested";
  ASSERT_EQ(cli("convert " + py + "/nested.pt " + nested + " --to distckpt --quiet").exit_code, 0);
  const StateDict n = load_plain_tensors(nested);
  EXPECT_TRUE(at::equal(n.at("model.w").as_tensor(), at::arange(6, at::kFloat).reshape({2, 3})));
  EXPECT_TRUE(at::equal(n.at("model.inner.b").as_tensor(), at::ones({2}, at::kHalf)));
  EXPECT_EQ(n.at("model.inner.c").as_tensor().item<int64_t>(), 4);
  EXPECT_EQ(load_common_state_dict(nested).at("epoch").as_int(), 2);
  EXPECT_FALSE(load_common_state_dict(nested).contains("model"));  // it held only tensors

  const CommandResult list = cli("convert " + py + "/list.pt " + tmp_.path() + "/list --to distckpt");
  EXPECT_EQ(list.exit_code, 2);
  EXPECT_NE(list.output.find("list.pt' holds no dict of tensors"), std::string::npos) << list.output;
  // A dict of one entry (pickle's SETITEM, which LibTorch 1.13's own unpickler lacks).
  ASSERT_EQ(cli("convert " + py + "/one.pt " + tmp_.path() + "/one --to distckpt --quiet").exit_code, 0);
  EXPECT_TRUE(at::equal(load_plain_tensors(tmp_.path() + "/one").at("w").as_tensor(), at::zeros({2})));
  ASSERT_EQ(cli("convert " + py + "/views.pt " + tmp_.path() + "/views --to distckpt --quiet").exit_code, 0);
  const StateDict views = load_plain_tensors(tmp_.path() + "/views");
  const at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  EXPECT_TRUE(at::equal(views.at("p").as_tensor(), at::ones({2, 3})));
  EXPECT_TRUE(at::equal(views.at("cols").as_tensor(), base.slice(1, 1, 3)));
  EXPECT_TRUE(at::equal(views.at("row").as_tensor(), base[2]));
  const CommandResult expanded = cli("convert " + py + "/expanded.pt " + tmp_.path() + "/expanded --to distckpt");
  EXPECT_EQ(expanded.exit_code, 2);
  EXPECT_NE(expanded.output.find("a view with more elements than its storage of 3"), std::string::npos)
      << expanded.output;
  run_command("head -c 500 " + py + "/state.pt > " + py + "/cut.pt");
  const CommandResult cut = cli("convert " + py + "/cut.pt " + tmp_.path() + "/cut --to distckpt");
  EXPECT_EQ(cut.exit_code, 2);
  EXPECT_NE(cut.output.find("cut.pt' cannot be read as a torch.save file"), std::string::npos) << cut.output;
}

// torch.save files are read from their zip directory: zip64 records are
// followed, every record read is checked against its CRC-32 (which
// torch.load ignores), and the export to safetensors streams tensors through
// its windows instead of holding the file.
TEST_F(SafetensorsInterop, TorchSaveFilesAreCheckedAndStreamed) {
  const std::string py = tmp_.path() + "/pt";
  const CommandResult written =
      run_command(fmt::format("cd {}/tests/interop && /usr/bin/python3 write_torch_save.py {}", kSource, py));
  ASSERT_EQ(written.exit_code, 0) << written.output;
  const auto cli = [](const std::string& args) { return run_command(kBin + "/distckpt " + args); };

  // Python's zipfile with every field in zip64 records, behind a comment.
  const std::string plain = tmp_.path() + "/plain", zip64 = tmp_.path() + "/zip64";
  ASSERT_EQ(cli("convert " + py + "/state.pt " + plain + " --to safetensors --quiet").exit_code, 0);
  const CommandResult from64 = cli("convert " + py + "/zip64.pt " + zip64 + " --to safetensors --quiet");
  ASSERT_EQ(from64.exit_code, 0) << from64.output;
  EXPECT_EQ(cli("digest " + zip64).output, cli("digest " + plain).output);

  // One flipped byte in a storage: refused by every conversion, nothing written.
  for (const char* to : {"safetensors", "distckpt", "torch"}) {
    const std::string dst = tmp_.path() + "/damaged-" + to;
    const CommandResult damaged = cli(fmt::format("convert {}/damaged.pt {} --to {}", py, dst, to));
    EXPECT_EQ(damaged.exit_code, 2) << to;
    EXPECT_NE(damaged.output.find("'" + py + "/damaged.pt': record 'state/data/0' fails its CRC-32"), std::string::npos)
        << damaged.output;
    EXPECT_FALSE(std::filesystem::exists(dst)) << dst;
  }

  // `distckpt verify` re-reads every record against its CRC-32.
  const CommandResult intact = cli("verify " + py + "/state.pt");
  EXPECT_EQ(intact.exit_code, 0) << intact.output;
  EXPECT_NE(intact.output.find("intact (torch.save, 5492 bytes re-read, every record's CRC-32 matches)"),
            std::string::npos)
      << intact.output;
  const CommandResult corrupt = cli("verify " + py + "/damaged.pt");
  EXPECT_EQ(corrupt.exit_code, 1) << corrupt.output;
  EXPECT_NE(corrupt.output.find("record 'state/data/0' (bytes [1472, 4032)) fails its CRC-32"), std::string::npos)
      << corrupt.output;
  EXPECT_EQ(cli("verify " + py + "/list.pt").exit_code, 2);  // a torch.save file, but no state dict

  // 48 MiB through 1 MiB windows: the buffers held stay a few windows (plus
  // the one strided view's storage), and every value arrives.
  ConvertOptions options;
  options.window_bytes = uint64_t{1} << 20;
  const std::string big = tmp_.path() + "/big";
  const ConvertReport report = convert_to_safetensors(py + "/big.pt", big, options);
  EXPECT_EQ(report.tensors, 3u);
  EXPECT_EQ(report.bytes, (uint64_t{12} << 20) * 4 + 6 * 4 + 3);
  EXPECT_LE(report.peak_buffer, uint64_t{5} << 20);
  const StateDict loaded = load_plain_tensors(big);
  EXPECT_TRUE(at::equal(loaded.at("big").as_tensor(), at::arange(int64_t{12} << 20, at::kFloat)));
  EXPECT_TRUE(at::equal(loaded.at("cols").as_tensor(), at::arange(12, at::kFloat).reshape({3, 4}).slice(1, 1, 3)));
  EXPECT_TRUE(at::equal(loaded.at("flag").as_tensor(), at::tensor({1, 0, 1}, at::kByte).to(at::kBool)));

  // torch.save -> torch.save streams the same way, and torch.load reads it.
  const std::string again = tmp_.path() + "/again.pt";
  const ConvertReport rewritten = convert_to_torch(py + "/big.pt", again, options);
  EXPECT_EQ(rewritten.bytes, report.bytes);
  EXPECT_LE(rewritten.peak_buffer, uint64_t{5} << 20);
  const CommandResult python =
      run_command("/usr/bin/python3 -c \"import torch; d = torch.load('" + again +
                  "'); base = torch.arange(12.0).reshape(3, 4); "
                  "print(sorted(d), torch.equal(d['big'], torch.arange(12 << 20, dtype=torch.float32)), "
                  "torch.equal(d['cols'], base[:, 1:3]), d['flag'].tolist())\"");
  EXPECT_EQ(python.output, "['big', 'cols', 'flag'] True True [True, False, True]\n") << python.output;

  // torch.save -> distckpt streams too, into save()'s layout: windows that
  // end inside checksum blocks still give every block its checksum.
  options.window_bytes = (uint64_t{1} << 20) + 12;
  const std::string ours = tmp_.path() + "/big-distckpt";
  const ConvertReport saved = convert_to_distckpt(py + "/big.pt", ours, options);
  EXPECT_EQ(saved.tensors, 3u);
  EXPECT_EQ(saved.bytes, report.bytes);
  EXPECT_LE(saved.peak_buffer, uint64_t{5} << 20);
  const CommandResult checked = cli("verify " + ours);
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_NE(checked.output.find("every checksum matches"), std::string::npos) << checked.output;
  EXPECT_EQ(cli("digest " + ours).output, cli("digest " + big).output);
}

}  // namespace
}  // namespace distckpt
