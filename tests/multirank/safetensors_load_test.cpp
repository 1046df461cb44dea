// Loading Hugging Face safetensors through the storage interface: whole
// tensors, sharded loads from several ranks that read only their bytes, a
// sharded directory with its index, digests equal to a distckpt checkpoint
// of the same tensors, verify, and every way the files can be wrong.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <utility>

#include "distckpt/distckpt.h"
#include "format/safetensors.h"
#include "load/checkpoint_reader.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using Named = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` as one safetensors file (the writer the format defines:
// header, then each tensor's bytes in order).
void write_safetensors(const std::string& path, const Named& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) {
  std::vector<safetensors::Entry> entries;
  for (const auto& [name, t] : tensors) entries.push_back({name, t.scalar_type(), t.sizes().vec(), 0, 0});
  std::ofstream out(path, std::ios::binary);
  out << safetensors::encode_header(entries, metadata);
  for (const auto& [name, t] : tensors) {
    const at::Tensor c = t.contiguous();
    out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
  }
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

Named model_tensors() {
  return {{"model.embed.weight", testing::global_tensor("embed", {64, 32})},
          {"model.layers.0.mlp.weight", testing::global_tensor("mlp", {48, 64}, at::kBFloat16)},
          {"model.norm.weight", testing::global_tensor("norm", {32}, at::kHalf)},
          {"step", at::scalar_tensor(7, at::kLong)}};
}

TEST(SafetensorsLoad, PlainTensorsMetadataAndCommonStateFromOneFile) {
  TempDir tmp("st-plain");
  const std::string file = tmp.path() + "/model.safetensors";
  write_safetensors(file, model_tensors());
  for (const std::string& path : {file, tmp.path()}) {  // the file, or the directory holding it
    const StateDict plain = load_plain_tensors(path);
    for (const auto& [name, t] : model_tensors()) {
      ASSERT_TRUE(plain.contains(name)) << name;
      EXPECT_TRUE(at::equal(plain.at(name).as_tensor(), t)) << name;
    }
    const StateDict meta = load_tensors_metadata(path);
    EXPECT_EQ(meta.at("model.layers.0.mlp.weight").as_sharded_tensor().global_shape, (Shape{48, 64}));
    EXPECT_EQ(meta.at("model.layers.0.mlp.weight").as_sharded_tensor().dtype, at::kBFloat16);
    EXPECT_FALSE(load_common_state_dict(path).contains("format"));  // it describes the files
    EXPECT_EQ(load_content_metadata(path)->at("format").as_string(), "pt");
    EXPECT_EQ(detect_storage_format(path), StorageFormat::safetensors());
  }
}

// Four ranks each load a row shard of one tensor and a column shard of
// another (tp=4), straight from the file.
TEST(SafetensorsLoad, ShardedLoadReadsOnlyEachRanksBytes) {
  TempDir tmp("st-sharded");
  write_safetensors(tmp.path() + "/model.safetensors", model_tensors());
  const at::Tensor embed = testing::global_tensor("embed", {64, 32});
  const at::Tensor mlp = testing::global_tensor("mlp", {48, 64}, at::kBFloat16);
  std::vector<uint64_t> bytes(4);
  run_ranks(4, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sd = Value::dict();
    sd["model.embed.weight"] = ShardedTensor::from_rank_offsets("model.embed.weight", at::empty({16, 32}), {{0, r, 4}});
    LoadOptions options;
    options.exchange = LoadExchange::kNone;  // each rank reads for itself: its bytes are its own
    const LoadResult rows = load(sd, tmp.path(), comm, options);
    EXPECT_TRUE(at::equal(rows.state_dict.at("model.embed.weight").as_tensor(), embed.narrow(0, 16 * r, 16)));
    bytes[r] = rows.bytes_read;

    StateDict cols = Value::dict();
    cols["model.layers.0.mlp.weight"] =
        ShardedTensor::from_rank_offsets("model.layers.0.mlp.weight", at::empty({48, 16}, at::kBFloat16), {{1, r, 4}});
    const LoadResult c = load(cols, tmp.path(), comm, options);
    EXPECT_TRUE(at::equal(c.state_dict.at("model.layers.0.mlp.weight").as_tensor(), mlp.narrow(1, 16 * r, 16)));
    // A column strip is read in slabs of whole rows (a few long reads, not
    // 48 short ones): the rows it spans, here the whole 48 x 64 tensor.
    EXPECT_EQ(c.bytes_read, uint64_t{48 * 64 * 2});
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(bytes[r], uint64_t{16 * 32 * 4}) << "rank " << r;
}

TEST(SafetensorsLoad, ShardedDirectoryWithIndexAndDigestEqualToDistckpt) {
  TempDir tmp("st-index");
  const std::string hf = tmp.path() + "/hf";
  ASSERT_EQ(::mkdir(hf.c_str(), 0755), 0);
  const Named all = model_tensors();
  write_safetensors(hf + "/model-00001-of-00002.safetensors", {all[0], all[3]});
  write_safetensors(hf + "/model-00002-of-00002.safetensors", {all[1], all[2]});
  safetensors::Index index;
  index.weight_map = {{all[0].first, "model-00001-of-00002.safetensors"},
                      {all[3].first, "model-00001-of-00002.safetensors"},
                      {all[1].first, "model-00002-of-00002.safetensors"},
                      {all[2].first, "model-00002-of-00002.safetensors"}};
  write_text(hf + "/model.safetensors.index.json", safetensors::encode_index(index));

  // The same tensors saved by two ranks in distckpt's format digest the same.
  const std::string ours = tmp.path() + "/ours";
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    for (const auto& [name, t] : all) {
      sd[name] = t.dim() == 0 || t.size(0) % 2 != 0
                     ? ShardedTensor::from_rank_offsets(name, t, {}, ReplicaId{comm.rank()})
                     : ShardedTensor::from_rank_offsets(name, t.chunk(2)[comm.rank()].clone(), {{0, comm.rank(), 2}});
    }
    save(sd, ours, comm);
  });
  const auto a = digest_checkpoint(hf);
  const auto b = digest_checkpoint(ours);
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].line(), b[i].line());

  const VerifyReport report = verify_checkpoint(hf);
  EXPECT_TRUE(report.intact()) << (report.problems.empty() ? "" : report.problems[0]);
  EXPECT_EQ(report.format, "safetensors");
  EXPECT_EQ(report.files, 3u);
  EXPECT_EQ(report.bytes_checked, uint64_t{64 * 32 * 4 + 48 * 64 * 2 + 32 * 2 + 8});

  // A rank of another layout (rows split 4 ways) loads from the index.
  run_ranks(4, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["model.layers.0.mlp.weight"] = ShardedTensor::from_rank_offsets(
        "model.layers.0.mlp.weight", at::empty({12, 64}, at::kBFloat16), {{0, comm.rank(), 4}});
    sd["step"] = ShardedTensor::from_rank_offsets("step", at::empty({}, at::kLong), {}, ReplicaId{comm.rank()});
    const LoadResult out = load(sd, hf, comm);
    EXPECT_TRUE(at::equal(out.state_dict.at("model.layers.0.mlp.weight").as_tensor(),
                          all[1].second.narrow(0, 12 * comm.rank(), 12)));
    EXPECT_EQ(out.state_dict.at("step").as_tensor().item<int64_t>(), 7);
  });
}

TEST(SafetensorsLoad, LoadsThroughAStorageTheCallerOpened) {
  TempDir tmp("st-storage");
  write_safetensors(tmp.path() + "/weights.safetensors", model_tensors());
  const std::unique_ptr<StorageReader> storage = open_storage(tmp.path());
  EXPECT_EQ(storage->format(), StorageFormat::safetensors());
  EXPECT_EQ(storage->index().tensors.size(), 4u);
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["model.norm.weight"] = ShardedTensor::from_rank_offsets("model.norm.weight", at::empty({32}, at::kHalf), {});
    const LoadResult out = load(sd, *storage, comm);
    EXPECT_TRUE(
        at::equal(out.state_dict.at("model.norm.weight").as_tensor(), testing::global_tensor("norm", {32}, at::kHalf)));
  });
  EXPECT_EQ(storage->bytes_read(), 64u);
}

TEST(SafetensorsLoad, BadFilesAreRefusedNamingFileAndTensor) {
  TempDir tmp("st-bad");
  const std::string dir = tmp.path();
  // Truncated inside the header, then inside the data.
  const std::string file = dir + "/model.safetensors";
  write_safetensors(file, model_tensors());
  ASSERT_EQ(::truncate(file.c_str(), 100), 0);
  EXPECT_TRUE(throws_with<CorruptionError>([&] { load_plain_tensors(dir); },
                                           file + ": the header length is 344 bytes but the file has only 100"));
  EXPECT_EQ(verify_checkpoint(dir).status, VerifyReport::Status::kCorrupt);
  write_safetensors(file, model_tensors());
  ASSERT_EQ(::truncate(file.c_str(), 1000), 0);
  EXPECT_TRUE(throws_with<CorruptionError>([&] { load_plain_tensors(dir); },
                                           file + ": tensor 'model.embed.weight': data_offsets [0, 8192] are "
                                                  "outside the 648 data bytes of the file; it is truncated"));

  // An index naming a tensor its shard lacks, then a shard missing.
  const std::string hf = dir + "/hf";
  ASSERT_EQ(::mkdir(hf.c_str(), 0755), 0);
  write_safetensors(hf + "/a.safetensors", {model_tensors()[0]});
  safetensors::Index index;
  index.weight_map = {{"model.embed.weight", "a.safetensors"}, {"lm_head.weight", "a.safetensors"}};
  write_text(hf + "/model.safetensors.index.json", safetensors::encode_index(index));
  EXPECT_TRUE(throws_with<CorruptionError>(
      [&] { load_plain_tensors(hf); }, "the index model.safetensors.index.json puts tensor 'lm_head.weight' in " + hf +
                                           "/a.safetensors, which does not hold it"));
  index.weight_map = {{"model.embed.weight", "a.safetensors"}, {"lm_head.weight", "b.safetensors"}};
  write_text(hf + "/model.safetensors.index.json", safetensors::encode_index(index));
  EXPECT_TRUE(throws_with<CorruptionError>([&] { load_plain_tensors(hf); }, hf + "/b.safetensors: No such file"));

  // Several files and no index: which tensor is where is unknown.
  const std::string two = dir + "/two";
  ASSERT_EQ(::mkdir(two.c_str(), 0755), 0);
  write_safetensors(two + "/x.safetensors", {model_tensors()[0]});
  write_safetensors(two + "/y.safetensors", {model_tensors()[1]});
  EXPECT_TRUE(
      throws_with<CheckpointError>([&] { load_plain_tensors(two); }, "several .safetensors files but no index"));

  // A request that disagrees with the stored shape.
  run_ranks(1, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["model.embed.weight"] = ShardedTensor::from_rank_offsets("model.embed.weight", at::empty({64, 31}), {});
    EXPECT_THROW(load(sd, two + "/x.safetensors", comm), ShardingError);
  });
}

// Two ranks' chunks consolidate into safetensors (streamed: four 4 MiB
// windows at most, far below the 48 MiB tensor) and come back to distckpt with the same digests.
TEST(SafetensorsConvert, ApiRoundTripFromTwoRanksStreamsLargeTensors) {
  TempDir tmp("st-convert");
  const std::string ckpt = tmp.path() + "/ckpt", hf = tmp.path() + "/hf", back = tmp.path() + "/back";
  const at::Tensor big = testing::global_tensor("big", {3072, 4096});
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sd = Value::dict();
    sd["big"] = ShardedTensor::from_rank_offsets("big", big.chunk(2, 1)[r].contiguous(), {{1, r, 2}});
    for (const auto& [name, t] : model_tensors()) {
      sd[name] = ShardedTensor::from_rank_offsets(name, t, {}, ReplicaId{r});
    }
    sd["note"] = Value("kept");
    save(sd, ckpt, comm);
  });
  ConvertOptions options;
  options.max_shard_bytes = uint64_t{40} << 20;
  options.window_bytes = uint64_t{4} << 20;
  const ConvertReport report = convert_to_safetensors(ckpt, hf, options);
  EXPECT_EQ(report.tensors, 5u);
  EXPECT_EQ(report.files, 3u);  // [step], [big] (a file of its own), [embed, mlp, norm]: widest dtype first
  EXPECT_EQ(report.bytes, uint64_t{3072 * 4096 * 4 + 64 * 32 * 4 + 48 * 64 * 2 + 32 * 2 + 8});
  EXPECT_LE(report.peak_buffer, 4 * options.window_bytes);  // read, its copy, one written, one waiting
  EXPECT_EQ(detect_storage_format(hf), StorageFormat::safetensors());
  EXPECT_TRUE(at::equal(load_plain_tensors(hf).at("big").as_tensor(), big));

  convert_to_distckpt(hf, back);
  const auto a = digest_checkpoint(ckpt), b = digest_checkpoint(back);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].line(), b[i].line());
  EXPECT_TRUE(throws_with<CheckpointError>([&] { convert_to_safetensors(ckpt, hf); }, "already exists"));
  // An empty directory made beforehand is a free target; a link to one, or a file, is not.
  for (const std::string& empty : {tmp.path() + "/made-st", tmp.path() + "/made-dc"}) {
    ASSERT_EQ(::mkdir(empty.c_str(), 0755), 0);
  }
  convert_to_safetensors(ckpt, tmp.path() + "/made-st");
  convert_to_distckpt(hf, tmp.path() + "/made-dc");
  EXPECT_TRUE(at::equal(load_plain_tensors(tmp.path() + "/made-st").at("big").as_tensor(), big));
  EXPECT_TRUE(at::equal(load_plain_tensors(tmp.path() + "/made-dc").at("big").as_tensor(), big));
  const std::string empty = tmp.path() + "/still-empty", link = tmp.path() + "/link-to-empty";
  ASSERT_EQ(::mkdir(empty.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(empty.c_str(), link.c_str()), 0);
  EXPECT_TRUE(throws_with<CheckpointError>([&] { convert_to_safetensors(ckpt, link); }, "already exists"));
  EXPECT_TRUE(throws_with<CheckpointError>([&] { convert_to_torch(ckpt, empty); }, "already exists"));
}

TEST(SafetensorsLoad, SymlinksOutOfTheDirectoryAreNotFollowed) {
  TempDir tmp("st-links");
  const std::string outside = tmp.path() + "/outside";
  const std::string hf = tmp.path() + "/hf";
  ASSERT_EQ(::mkdir(outside.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(hf.c_str(), 0755), 0);
  write_safetensors(outside + "/real.safetensors", model_tensors());
  ASSERT_EQ(::symlink((outside + "/real.safetensors").c_str(), (hf + "/model.safetensors").c_str()), 0);
  EXPECT_TRUE(throws_with<CorruptionError>([&] { load_plain_tensors(hf); },
                                           "outside the checkpoint " + hf + "; distckpt does not follow links"));
  // A link that stays inside is fine.
  ASSERT_EQ(::unlink((hf + "/model.safetensors").c_str()), 0);
  ASSERT_EQ(::rename((outside + "/real.safetensors").c_str(), (hf + "/real.bin").c_str()), 0);
  ASSERT_EQ(::symlink("real.bin", (hf + "/model.safetensors").c_str()), 0);
  EXPECT_EQ(load_plain_tensors(hf).at("step").as_tensor().item<int64_t>(), 7);
  // The file a user names may be a link anywhere: the user chose it.
  const std::string named = outside + "/named.safetensors";
  ASSERT_EQ(::symlink((hf + "/real.bin").c_str(), named.c_str()), 0);
  EXPECT_EQ(load_plain_tensors(named).at("step").as_tensor().item<int64_t>(), 7);
}

// The Hugging Face hub cache: <repo>/snapshots/<revision>/* are links to
// <repo>/blobs/<hash>, shards and index alike.
TEST(SafetensorsLoad, HubCacheSnapshotsLoadThroughTheirBlobLinks) {
  TempDir tmp("st-hub");
  const std::string repo = tmp.path() + "/models--org--tiny";
  const std::string snapshot = repo + "/snapshots/4f2a9c";
  ASSERT_EQ(::system(("mkdir -p " + snapshot + " " + repo + "/blobs").c_str()), 0);
  const Named tensors = model_tensors();
  write_safetensors(repo + "/blobs/aa01", {tensors[0], tensors[1]});
  write_safetensors(repo + "/blobs/aa02", {tensors[2], tensors[3]});
  write_text(repo + "/blobs/aa03",
             R"({"metadata":{},"weight_map":{"model.embed.weight":"model-00001-of-00002.safetensors",)"
             R"("model.layers.0.mlp.weight":"model-00001-of-00002.safetensors",)"
             R"("model.norm.weight":"model-00002-of-00002.safetensors","step":"model-00002-of-00002.safetensors"}})");
  ASSERT_EQ(::symlink("../../blobs/aa01", (snapshot + "/model-00001-of-00002.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink("../../blobs/aa02", (snapshot + "/model-00002-of-00002.safetensors").c_str()), 0);
  ASSERT_EQ(::symlink("../../blobs/aa03", (snapshot + "/model.safetensors.index.json").c_str()), 0);
  const StateDict plain = load_plain_tensors(snapshot);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(at::equal(plain.at(name).as_tensor(), t)) << name;
  EXPECT_TRUE(verify_checkpoint(snapshot).problems.empty());
}

}  // namespace
}  // namespace distckpt
