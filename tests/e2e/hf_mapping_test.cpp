// The schema's name mappings with real processes: a GPT trained under
// (tp=2, pp=2) is exported with the Llama mapping of gpt.shard, then loaded
// straight from the Hugging Face directory under other meshes through the
// generated mapping, and saved again: digests equal the original's. The
// same for a MoE model and the Mixtral mapping of moe.shard. Each rank
// reports the bytes it read; a load without tensor parallelism reads
// exactly its shards.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "support/process.h"
#include "support/ranks.h"

namespace {

const std::string kBin = DISTCKPT_BIN_DIR;

// ep folds into tp * dp (Megatron's parallel folding; etp defaults to tp).
struct Mesh {
  int tp, pp, dp, ep;
  int size() const { return tp * pp * dp; }
};

CommandResult trainer(const Mesh& m, const std::string& flags) {
  return run_command(fmt::format(
      "OMP_NUM_THREADS=1 {0}/distckpt-launch -n {1} -- {0}/distckpt-gpt-trainer --tp {2} --pp {3} --dp {4} --ep {5} "
      "{6} 2>&1",
      kBin, m.size(), m.tp, m.pp, m.dp, m.ep, flags));
}

std::string digest(const std::string& dir) {
  const CommandResult r = run_command(kBin + "/distckpt digest " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

// "rank R read X bytes for Y bytes of shards" lines: (X, Y) per rank.
std::vector<std::pair<uint64_t, uint64_t>> reads(const std::string& output, int ranks) {
  std::vector<std::pair<uint64_t, uint64_t>> out(static_cast<size_t>(ranks), {0, 0});
  const std::regex line(R"(rank (\d+) read (\d+) bytes for (\d+) bytes of shards)");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    out.at(std::stoul((*it)[1])) = {std::stoull((*it)[2]), std::stoull((*it)[3])};
  }
  return out;
}

class HfMapping : public ::testing::Test {
 protected:
  // Saves under `from`, exports under `mapping`; returns the original's digest.
  std::string save_and_export(const Mesh& from, const std::string& model, const std::string& mapping) {
    const CommandResult saved = trainer(from, model + " --steps 2 --save " + path("a"));
    EXPECT_EQ(saved.exit_code, 0) << saved.output;
    const CommandResult exported = run_command(kBin + "/distckpt convert " + path("a") + " " + path("hf") +
                                               " --to safetensors --quiet --map " + mapping + " 2>&1");
    EXPECT_EQ(exported.exit_code, 0) << exported.output;
    return digest(path("a"));
  }
  // Loads the export under `to` through `mapping` and saves it as `name`.
  // Each rank reads what it needs itself (--load-exchange none) unless `exchange` says otherwise.
  CommandResult load_mapped(const Mesh& to, const std::string& model, const std::string& mapping,
                            const std::string& name, const std::string& exchange = "none") {
    return trainer(to, model + " --load " + path("hf") + " --load-mapping " + mapping + " --save " + path(name) +
                           " --load-exchange " + exchange);
  }
  // Loads "a" under `mesh` and saves it straight as safetensors under
  // `mapping`, every rank writing its shards: the export's bytes.
  void expect_direct_save_equals_export(const Mesh& mesh, const std::string& model, const std::string& mapping) {
    const CommandResult direct =
        trainer(mesh, model + " --load " + path("a") + " --save " + path("direct") + " --save-mapping " + mapping);
    ASSERT_EQ(direct.exit_code, 0) << direct.output;
    EXPECT_EQ(run_command("diff -r " + path("hf") + " " + path("direct") + " && echo identical").output, "identical\n");
  }
  std::string path(const std::string& rel) const { return tmp_.path() + "/" + rel; }
  TempDir tmp_{"hf-mapping"};
};

// 4 layers, hidden 64, 8 query heads of 8 in 2 key/value groups, SwiGLU 128.
const std::string kGpt = "--model gpt --layers 4 --hidden 64 --heads 8 --kv-groups 2 --ffn 128 --vocab 256";
const std::string kMoe = "--model moe --layers 2 --hidden 32 --heads 4 --kv-groups 2 --ffn 64 --vocab 128 --experts 4";

TEST_F(HfMapping, GptExportedWithTheLlamaMappingLoadsUnderOtherMeshes) {
  const std::string original = save_and_export({2, 2, 1, 1}, kGpt, "gpt.llama");
  ASSERT_FALSE(original.empty());

  // The export has Llama's names and shapes (grouped-query attention: k and v have 2 heads of 8).
  const CommandResult listed = run_command(kBin + "/distckpt inspect --json " + path("hf"));
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  std::map<std::string, std::vector<int64_t>> shapes;
  const nlohmann::json listing = nlohmann::json::parse(listed.output);
  for (const auto& t : listing["tensors"]) shapes[t["key"].get<std::string>()] = t["shape"].get<std::vector<int64_t>>();
  EXPECT_EQ(shapes.size(), 2 + 4 * 9 + 1U);  // embeddings, 9 per layer, final norm
  EXPECT_EQ(shapes["model.layers.3.self_attn.q_proj.weight"], (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes["model.layers.3.self_attn.k_proj.weight"], (std::vector<int64_t>{16, 64}));
  EXPECT_EQ(shapes["model.layers.3.self_attn.v_proj.weight"], (std::vector<int64_t>{16, 64}));
  EXPECT_EQ(shapes["model.layers.0.mlp.gate_proj.weight"], (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(shapes["model.layers.2.post_attention_layernorm.weight"], (std::vector<int64_t>{64}));
  EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{256, 64}));

  const CommandResult tp4 = load_mapped({4, 1, 1, 1}, kGpt, "llama", "tp4");
  ASSERT_EQ(tp4.exit_code, 0) << tp4.output;
  EXPECT_EQ(digest(path("tp4")), original);
  // Rows of the row-split tensors are read exactly; a column strip (linear_proj,
  // linear_fc2: 4 layers of [64, 64] and [64, 128], split on dim 1) is read as
  // the whole rows it spans: 147456 bytes beyond the 174336 of each rank's shards.
  for (const auto& [read, shards] : reads(tp4.output, 4)) {
    EXPECT_EQ(shards, 174336U);
    EXPECT_EQ(read, shards + 147456U);
  }
  // By default the ranks of one host read each of those rows once between
  // them (one reads, the others copy from shared memory), and the norm
  // weights every rank holds (8 layer norms and the final one, 64 floats
  // each: 2304 bytes) once instead of four times: the host reads each byte
  // it needs once.
  const CommandResult once = load_mapped({4, 1, 1, 1}, kGpt, "llama", "tp4once", "auto");
  ASSERT_EQ(once.exit_code, 0) << once.output;
  EXPECT_EQ(digest(path("tp4once")), original);
  uint64_t host_read = 0;
  for (const auto& [read, shards] : reads(once.output, 4)) host_read += read;
  EXPECT_EQ(host_read, 4 * 174336U - 3 * 2304U);

  expect_direct_save_equals_export({2, 2, 1, 1}, kGpt, "llama");

  const CommandResult pp4 = load_mapped({1, 4, 2, 1}, kGpt, "llama", "pp4dp2");
  ASSERT_EQ(pp4.exit_code, 0) << pp4.output;
  EXPECT_EQ(digest(path("pp4dp2")), original);
  // Without tensor parallelism each rank reads its layers' bytes and nothing else.
  for (const auto& [read, shards] : reads(pp4.output, 8)) {
    EXPECT_GT(shards, 0U);
    EXPECT_EQ(read, shards);
  }
}

// A checkpoint that records no mappings (Megatron torch_dist, PyTorch DCP)
// exports under the schema's mapping given as a file: the program built
// from the schema writes it for its config; the export is byte for byte
// the one from the distckpt checkpoint that recorded the mapping.
TEST_F(HfMapping, ATorchDistCheckpointExportsToLlamaThroughAMappingFile) {
  ASSERT_FALSE(save_and_export({2, 2, 1, 1}, kGpt, "gpt.llama").empty());
  const CommandResult to_dist =
      run_command(kBin + "/distckpt convert " + path("a") + " " + path("td") + " --to torch_dist --quiet 2>&1");
  ASSERT_EQ(to_dist.exit_code, 0) << to_dist.output;

  const CommandResult recorded = run_command(kBin + "/distckpt convert " + path("td") + " " + path("hf-td") +
                                             " --to safetensors --map llama 2>&1");
  EXPECT_NE(recorded.exit_code, 0);
  EXPECT_NE(recorded.output.find("--map FILE.json"), std::string::npos) << recorded.output;

  const CommandResult written = trainer({1, 1, 1, 1}, kGpt + " --write-mapping llama " + path("llama.json"));
  ASSERT_EQ(written.exit_code, 0) << written.output;
  const CommandResult exported = run_command(kBin + "/distckpt convert " + path("td") + " " + path("hf-td") +
                                             " --to safetensors --quiet --map " + path("llama.json") + " 2>&1");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_EQ(run_command("diff -r " + path("hf") + " " + path("hf-td") + " && echo identical").output, "identical\n");
}

TEST_F(HfMapping, MoeExportedWithTheMixtralMappingLoadsUnderTwoMeshes) {
  const std::string original = save_and_export({2, 2, 1, 1}, kMoe, "moe.mixtral");
  ASSERT_FALSE(original.empty());
  const CommandResult listed = run_command(kBin + "/distckpt inspect " + path("hf"));
  EXPECT_NE(listed.output.find("model.layers.1.block_sparse_moe.experts.3.w3.weight"), std::string::npos)
      << listed.output;
  EXPECT_NE(listed.output.find("model.layers.0.block_sparse_moe.gate.weight"), std::string::npos) << listed.output;

  const CommandResult ep4 = load_mapped({1, 1, 4, 4}, kMoe, "mixtral", "ep4");
  ASSERT_EQ(ep4.exit_code, 0) << ep4.output;
  EXPECT_EQ(digest(path("ep4")), original);
  // Each expert-parallel rank reads its experts plus the replicated dense weights.
  for (const auto& [read, shards] : reads(ep4.output, 4)) EXPECT_EQ(read, shards);

  expect_direct_save_equals_export({1, 1, 4, 4}, kMoe, "mixtral");

  const CommandResult mixed = load_mapped({2, 2, 2, 2}, kMoe, "mixtral", "tp2pp2ep2");
  ASSERT_EQ(mixed.exit_code, 0) << mixed.output;
  EXPECT_EQ(digest(path("tp2pp2ep2")), original);
}

TEST_F(HfMapping, AMappingThatDisagreesWithTheFilesIsAClearError) {
  save_and_export({1, 1, 1, 1}, kGpt, "llama");
  // Another grouping of the heads: k_proj has 32 rows in the files, the mapping expects 64.
  const CommandResult groups = load_mapped(
      {1, 1, 1, 1}, "--model gpt --layers 4 --hidden 64 --heads 8 --kv-groups 4 --ffn 128 --vocab 256", "llama", "x");
  EXPECT_NE(groups.exit_code, 0);
  EXPECT_NE(groups.output.find("tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16, 64], but name mapping "
                               "'llama' expects [32, 64]"),
            std::string::npos)
      << groups.output;
  // The Mixtral mapping names tensors a dense Llama export lacks.
  const CommandResult moe = load_mapped(
      {1, 1, 1, 1}, "--model moe --layers 4 --hidden 64 --heads 8 --kv-groups 2 --ffn 128 --vocab 256 --experts 2",
      "mixtral", "y");
  EXPECT_NE(moe.exit_code, 0);
  EXPECT_NE(moe.output.find(path("hf")), std::string::npos) << moe.output;
  EXPECT_NE(moe.output.find("expects tensor 'model.layers.0.block_sparse_moe.gate.weight'"), std::string::npos)
      << moe.output;
  // An export names a mapping the checkpoint records, under the layout that saved it.
  const CommandResult unknown = run_command(kBin + "/distckpt convert " + path("a") + " " + path("hf2") +
                                            " --to safetensors --map gpt.qwen 2>&1");
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.output.find("has no name mapping 'qwen' (it has: llama)"), std::string::npos) << unknown.output;
  const CommandResult other = run_command(kBin + "/distckpt convert " + path("a") + " " + path("hf2") +
                                          " --to safetensors --map moe.llama 2>&1");
  EXPECT_EQ(other.exit_code, 2);
  EXPECT_NE(other.output.find("not by layout 'moe'"), std::string::npos) << other.output;
}

}  // namespace
