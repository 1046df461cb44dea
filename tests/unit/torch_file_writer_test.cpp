// The torch.save writer (storage/torch_file_writer.h) read back by the
// reader (storage/torch_file_reader.h): tensors streamed in pieces, every dtype it
// names, empty tensors, common values; misuse refused and nothing left.
// (Python's torch.load opens its files: tests/e2e/safetensors_interop_test.cpp.)
#include "storage/torch_file_writer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "distckpt/core/errors.h"
#include "format/zip_archive.h"
#include "io/file.h"
#include "storage/torch_file_reader.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace distckpt {
namespace {

using storage::TorchFileWriter;

std::vector<TorchFileWriter::Tensor> described(const storage::NamedTensors& tensors) {
  std::vector<TorchFileWriter::Tensor> out;
  for (const auto& [name, t] : tensors) out.push_back({name, t.scalar_type(), t.sizes().vec()});
  return out;
}

TEST(TorchFileWriter, TensorsWrittenInPiecesReadBackEqualWithCommonValues) {
  TempDir tmp("torch-writer");
  const storage::NamedTensors tensors = {
      {"w", at::arange(1000, at::kFloat).reshape({10, 100})},
      {"empty", at::empty({0, 3}, at::kHalf)},
      {"bf", at::arange(7, at::kFloat).to(at::kBFloat16)},
      {"mask", at::arange(5, at::kInt).remainder(2).to(at::kBool)},
      {"step", at::scalar_tensor(3, at::kLong)},
      {"z", at::complex(at::ones({2}, at::kDouble), at::zeros({2}, at::kDouble))},
  };
  StateDict common = Value::dict();
  common["iteration"] = Value(int64_t{1} << 40);
  common["lr"] = Value(-0.25);
  common["args"] = Value::dict();
  common["args"]["names"] = Value(List{Value("a"), Value(), Value(true), Value(int64_t{-70000})});
  const std::string path = tmp.path() + "/out.pt";
  TorchFileWriter writer(path, common, described(tensors));
  EXPECT_EQ(writer.bytes(), 4000u + 0 + 14 + 5 + 8 + 32);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor t = tensors[i].second.contiguous();
    const auto* bytes = static_cast<const char*>(t.data_ptr());
    for (uint64_t at = 0; at < t.nbytes(); at += 300) {  // pieces, as windows arrive
      writer.write(i, at, bytes + at, std::min<uint64_t>(300, t.nbytes() - at));
    }
  }
  EXPECT_FALSE(std::filesystem::exists(path));  // only at commit
  writer.commit();

  const storage::TorchFileContents back = storage::read_torch_file(path);
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(back.tensors[i].first, tensors[i].first);
    EXPECT_EQ(back.tensors[i].second.scalar_type(), tensors[i].second.scalar_type()) << tensors[i].first;
    EXPECT_TRUE(at::equal(back.tensors[i].second, tensors[i].second)) << tensors[i].first;
  }
  EXPECT_TRUE(back.common.equals(common));

  // Tensor data lies on 64-byte boundaries, as torch.save puts it.
  io::File file(path, io::File::Mode::kRead);
  const zip::Index index([&](void* data, size_t n, uint64_t offset) { file.pread_all(data, n, offset); }, file.size(),
                         "out.pt");
  EXPECT_EQ(index.entries().front().name, "out/data.pkl");
  EXPECT_EQ(index.entries().back().name, "out/version");
  for (const zip::Entry& e : index.entries()) EXPECT_EQ(e.data_offset % 64, 0u) << e.name;
}

TEST(TorchFileWriter, BytesOutOfOrderAreRefusedAndNothingIsLeft) {
  TempDir tmp("torch-writer");
  const std::string path = tmp.path() + "/out.pt";
  const storage::NamedTensors tensors = {{"a", at::ones({4})}, {"b", at::ones({4})}};
  {
    TorchFileWriter writer(path, Value::dict(), described(tensors));
    const float values[4] = {1, 2, 3, 4};
    EXPECT_TRUE(throws_with<UsageError>([&] { writer.write(0, 4, values, 4); },
                                        "bytes [4, 8) of tensor 'a' arrive out of order"));
    writer.write(0, 0, values, 8);
    EXPECT_TRUE(
        throws_with<UsageError>([&] { writer.write(1, 0, values, 16); }, "tensor 'a' ended after 8 of its 16 bytes"));
    EXPECT_TRUE(throws_with<UsageError>([&] { writer.write(0, 8, values, 12); }, "bytes [8, 20) of tensor 'a'"));
  }
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));  // the staging file went with the writer
  {
    TorchFileWriter writer(path, Value::dict(), described(tensors));
    EXPECT_TRUE(throws_with<UsageError>([&] { writer.commit(); }, "tensor 'a' was never written"));
  }
  EXPECT_FALSE(std::filesystem::exists(path));

  StateDict common = Value::dict();
  common["a"] = Value(1);
  EXPECT_TRUE(throws_with<UsageError>([&] { TorchFileWriter(path, common, described(tensors)); },
                                      "'a' names both a tensor and a common value"));
  EXPECT_TRUE(throws_with<UsageError>(
      [&] {
        TorchFileWriter(path, Value::dict(), {{"u", at::kQInt8, {2}}});
      },
      "has no torch.save storage class"));
  StateDict latin1 = Value::dict();
  latin1["name"] = Value(std::string("caf\xe9"));
  EXPECT_TRUE(throws_with<UsageError>([&] { TorchFileWriter(path, latin1, {}); },
                                      "'name' holds a string that is not UTF-8 (byte 3)"));
  std::filesystem::create_directories(path);
  EXPECT_TRUE(throws_with<CheckpointError>([&] { TorchFileWriter(path, Value::dict(), {}); }, "already exists"));
}

// Another export of the same file while one writes is refused, leaving the
// first alone; a file someone else puts at the target meanwhile is kept
// and the export fails.
TEST(TorchFileWriter, ASecondWriterIsRefusedAndATargetThatAppearsIsKept) {
  TempDir tmp("torch-writer");
  const std::string path = tmp.path() + "/out.pt";
  const storage::NamedTensors tensors = {{"a", at::ones({4})}};
  const float values[4] = {1, 2, 3, 4};
  {
    TorchFileWriter first(path, Value::dict(), described(tensors));
    first.write(0, 0, values, 16);
    EXPECT_TRUE(throws_with<CheckpointError>([&] { TorchFileWriter(path, Value::dict(), described(tensors)); },
                                             "another save or export is writing '" + path + "'"));
    io::write_file_atomic(path, "theirs");
    EXPECT_TRUE(throws_with<CheckpointError>([&] { first.commit(); }, "appeared while it was being written"));
  }
  EXPECT_EQ(io::read_file(path, 100), "theirs");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(tmp.path()), {}), 1);  // no staging, no lock
}

// A link to nothing is in the way as much as a file: refused before writing.
TEST(TorchFileWriter, ADanglingLinkAtTheTargetIsAnExistingTarget) {
  TempDir tmp("torch-writer");
  const std::string path = tmp.path() + "/out.pt";
  ASSERT_EQ(::symlink((tmp.path() + "/nowhere").c_str(), path.c_str()), 0);
  EXPECT_TRUE(throws_with<CheckpointError>(
      [&] {
        TorchFileWriter(path, Value::dict(), described({{"a", at::ones({4})}}));
      },
      "'" + path + "' already exists; remove it or choose another destination (nothing was written)"));
}

}  // namespace
}  // namespace distckpt
