// Storage formats are registered, not an enum: the built-in ones are listed
// and found by name, a format a program registers is detected and opened
// wherever a checkpoint path is taken (on a directory and, written once
// against the Backend interface, on an object store too), and a save's knobs
// travel with its format.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>

#include "distckpt/distckpt.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"
#include "support/s3_server.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using testing::global_tensor;

// A toy format: "raw.txt" says "KEY ROWS COLS" and "raw.bin" holds that
// many float32 values, row-major: one tensor, one chunk. Everything it does
// goes through the Backend, so it works on any.
class RawReader final : public StorageReader {
 public:
  explicit RawReader(std::shared_ptr<Backend> backend) : backend_(std::move(backend)) {
    std::istringstream header(backend_->read_small("raw.txt", 1024));
    TensorRecord t;
    int64_t rows = 0, cols = 0;
    if (!(header >> t.key >> rows >> cols) || rows <= 0 || cols <= 0) {
      throw CorruptionError("raw.txt is not 'KEY ROWS COLS'", backend_->describe("raw.txt"));
    }
    t.dtype = at::kFloat;
    t.global_shape = {rows, cols};
    ChunkRecord c;
    c.box = Box{{0, 0}, {rows, cols}};
    c.byte_length = static_cast<uint64_t>(rows * cols) * sizeof(float);
    t.chunks.push_back(c);
    index_.tensors.push_back(std::move(t));
    index_.files.push_back({"raw.bin", c.byte_length, 0});
    data_ = backend_->open("raw.bin");
  }
  StorageFormat format() const override { return StorageFormat("raw-test"); }
  const std::string& location() const override { return backend_->location(); }
  const StorageIndex& index() const override { return index_; }
  void read_chunk(const TensorRecord&, uint32_t, uint64_t begin, uint64_t end, uint8_t* out) override {
    data_->read(begin, end - begin, out);
    bytes_read_ += end - begin;
  }
  std::string read_object(const ObjectRecord&) override { return {}; }
  Value read_common_state() const override { return Value::dict(); }
  void verify(VerifyReport& report, const VerifyProgress&) override {
    ++report.files;
    if (data_->size() != index_.files[0].size) report.problems.push_back("raw.bin has the wrong size");
  }
  uint64_t bytes_read() const override { return bytes_read_; }

 private:
  std::shared_ptr<Backend> backend_;
  StorageIndex index_;
  std::unique_ptr<ObjectReader> data_;
  std::atomic<uint64_t> bytes_read_{0};
};

class RawFormat final : public Format {
 public:
  std::string name() const override { return "raw-test"; }
  bool detect(Backend& backend, const std::string& file) const override {
    return file.empty() && backend.size_of("raw.txt").has_value();
  }
  std::unique_ptr<StorageReader> open(std::shared_ptr<Backend> backend, const std::string&,
                                      const StorageOptions&) const override {
    return std::make_unique<RawReader>(std::move(backend));
  }
};

// Registered once for the whole test program.
void register_raw_format() {
  static const bool registered = [] {
    register_format(std::make_shared<RawFormat>());
    return true;
  }();
  (void)registered;
}

// Writes the raw format's files of tensor `key` ([rows, cols]) through `location`'s backend.
void write_raw(const std::string& location, const std::string& key, const at::Tensor& values) {
  if (!is_object_store(location)) std::filesystem::create_directories(location);
  std::unique_ptr<Backend> backend = open_backend(location);
  const at::Tensor v = values.contiguous();
  std::unique_ptr<ObjectWriter> data = backend->create("raw.bin", v.nbytes());
  data->write(0, static_cast<const uint8_t*>(v.data_ptr()), v.nbytes());
  data->finish(v.nbytes());
  backend->publish("raw.txt", key + " " + std::to_string(v.size(0)) + " " + std::to_string(v.size(1)), true);
}

// Two ranks load rows of "w" from `location` and check them; returns the bytes they read together.
uint64_t load_rows(const std::string& location, const at::Tensor& expected) {
  std::atomic<uint64_t> fetched{0};
  run_ranks(2, [&](Communicator& comm) {
    const int64_t mine = expected.size(0) / 2;
    StateDict request = Value::dict();
    request["w"] = ShardedTensor::from_rank_offsets("w", at::empty({mine, expected.size(1)}), {{0, comm.rank(), 2}});
    LoadOptions options;
    options.exchange = LoadExchange::kNone;
    const LoadResult r = load(request, location, comm, options);
    EXPECT_TRUE(at::equal(r.state_dict.at("w").as_tensor(), expected.narrow(0, mine * comm.rank(), mine)));
    fetched += r.bytes_read;
  });
  return fetched;
}

TEST(FormatRegistry, BuiltInFormatsAreRegisteredFirstAndFoundByName) {
  const std::vector<std::string> names = registered_formats();
  ASSERT_GE(names.size(), 4u);
  EXPECT_EQ(names[0], "dcp");  // by .metadata, before distckpt's metadata.json (which torch_dist carries too)
  EXPECT_EQ(names[1], "distckpt");
  EXPECT_EQ(names[2], "safetensors");
  EXPECT_EQ(names[3], "torch");
  EXPECT_EQ(find_format("safetensors").name(), "safetensors");
  EXPECT_TRUE(throws_with<UsageError>([] { find_format("zarr"); },
                                      "no storage format is registered as 'zarr'; the registered ones: dcp, distckpt, "
                                      "safetensors, torch"));
  EXPECT_EQ(StorageFormat::detected().name(), "auto");
  EXPECT_TRUE(StorageFormat{}.is_detected());
  EXPECT_EQ(safetensors_format(), StorageFormat::safetensors());  // the same format, whatever the knobs
}

TEST(FormatRegistry, ANameIsRegisteredOnce) {
  register_raw_format();
  EXPECT_TRUE(throws_with<UsageError>([] { register_format(std::make_shared<RawFormat>()); },
                                      "a storage format named 'raw-test' is already registered"));
  EXPECT_TRUE(throws_with<UsageError>([] { register_format(nullptr); }, "register_format needs a format"));
  EXPECT_TRUE(throws_with<UsageError>([] { StorageFormat(""); }, "a storage format needs a name"));
}

TEST(FormatRegistry, ARegisteredFormatIsDetectedAndLoadedWithResharding) {
  register_raw_format();
  TempDir tmp;
  const std::string dir = tmp.path() + "/raw";
  const at::Tensor w = global_tensor("w", {8, 16});
  write_raw(dir, "w", w);
  EXPECT_EQ(detect_storage_format(dir).name(), "raw-test");
  EXPECT_EQ(open_storage(dir)->format(), StorageFormat("raw-test"));
  // Each rank reads only its rows.
  EXPECT_EQ(load_rows(dir, w), w.nbytes());
  EXPECT_TRUE(at::equal(load_plain_tensor(dir, "w"), w));
  EXPECT_TRUE(verify_checkpoint(dir).intact());
  // Named explicitly, the same; a format that does not exist is refused by name.
  LoadOptions options;
  options.format = StorageFormat("raw-test");
  run_ranks(1, [&](Communicator& comm) {
    StateDict request = Value::dict();
    request["w"] = ShardedTensor::from_rank_offsets("w", at::empty({8, 16}), {});
    EXPECT_TRUE(at::equal(load(request, dir, comm, options).state_dict.at("w").as_tensor(), w));
    options.format = StorageFormat("zarr");
    EXPECT_TRUE(throws_with<UsageError>([&] { load(request, dir, comm, options); },
                                        "no storage format is registered as 'zarr'"));
  });
}

TEST(FormatRegistry, ARegisteredFormatWorksOnAnObjectStoreUnchanged) {
  DISTCKPT_REQUIRE_MOTO_WITHOUT_SIGNATURE_CHECKS(server);
  server->export_environment();
  register_raw_format();
  const std::string url = fmt::format("s3://{}/{}raw", MotoServer::kBucket, s3_test_keys("registry"));
  const at::Tensor w = global_tensor("w", {8, 16});
  write_raw(url, "w", w);
  EXPECT_EQ(detect_storage_format(url).name(), "raw-test");
  EXPECT_EQ(load_rows(url, w), w.nbytes());
}

TEST(FormatRegistry, ASaveTakesItsFormatsKnobsAndRefusesAReadOnlyFormat) {
  TempDir tmp;
  run_ranks(2, [&](Communicator& comm) {
    StateDict sd = Value::dict();
    sd["w"] = ShardedTensor::from_rank_offsets("w", global_tensor("w", {8, 512}).narrow(0, 4 * comm.rank(), 4),
                                               {{0, comm.rank(), 2}});
    sd["b"] = ShardedTensor::from_rank_offsets("b", global_tensor("b", {512}), {}, {comm.rank()});
    SafetensorsWriteOptions knobs;
    knobs.max_shard_bytes = 4096;  // "w" and "b" in files of their own
    SaveOptions options;
    options.format = safetensors_format(knobs);
    save(sd, tmp.path() + "/st", comm, options);
    options.format = StorageFormat::torch();
    EXPECT_TRUE(throws_with<UsageError>([&] { save(sd, tmp.path() + "/pt", comm, options); },
                                        "write a torch.save file from a checkpoint with convert_to_torch"));
    options.format = StorageFormat("raw-test");
    register_raw_format();
    EXPECT_TRUE(throws_with<UsageError>([&] { save(sd, tmp.path() + "/raw", comm, options); },
                                        "saves do not write the raw-test format"));
  });
  EXPECT_TRUE(std::filesystem::exists(tmp.path() + "/st/model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(tmp.path() + "/st/model-00002-of-00002.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/pt"));
  EXPECT_FALSE(std::filesystem::exists(tmp.path() + "/raw"));
}

}  // namespace
}  // namespace distckpt
