#include "local/local_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>
#include <filesystem>

#include "distckpt/api/options.h"
#include "distckpt/core/errors.h"
#include "format/local_state_codec.h"
#include "io/checksum.h"
#include "io/file.h"
#include "io/file_write_job.h"
#include "storage/write_items.h"

namespace distckpt::local {
namespace {

constexpr char kMagic[8] = {'D', 'C', 'K', 'L', 'O', 'C', 'A', 'L'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderSize = 64;
constexpr uint64_t kBlock = uint64_t{1} << 20;
// Metadata is small (shapes, keys, objects); anything larger is not ours.
constexpr uint64_t kMaxMetaSize = uint64_t{1} << 31;

struct RawHeader {
  char magic[8];
  uint32_t version;
  int32_t owner_rank;
  int32_t world_size;
  uint32_t reserved;
  int64_t iteration;
  uint64_t meta_offset;  // tensor bytes lie in [kHeaderSize, meta_offset)
  uint64_t meta_size;
  uint64_t meta_checksum;
  uint64_t header_checksum;  // XXH3 of the bytes before it
};
static_assert(sizeof(RawHeader) == kHeaderSize, "the header is 64 bytes");

uint64_t header_checksum(const RawHeader& h) { return io::xxh3(&h, offsetof(RawHeader, header_checksum)); }

// The header, checked; throws CorruptionError.
RawHeader read_header(const io::File& f) {
  const uint64_t size = f.size();
  if (size < kHeaderSize)
    throw CorruptionError(fmt::format("{}: {} bytes, shorter than a header", f.path(), size), f.path());
  RawHeader h;
  f.pread_all(&h, sizeof h, 0);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    throw CorruptionError(fmt::format("{}: not a distckpt local checkpoint file", f.path()), f.path());
  }
  if (h.header_checksum != header_checksum(h)) {
    throw CorruptionError(fmt::format("{}: the header's checksum does not match", f.path()), f.path());
  }
  if (h.version != kVersion) {
    throw CheckpointError(fmt::format("{}: local file version {}, this build reads {}", f.path(), h.version, kVersion),
                          f.path());
  }
  if (h.meta_size > kMaxMetaSize || h.meta_offset < kHeaderSize || h.meta_offset > size ||
      h.meta_offset + h.meta_size != size) {
    throw CorruptionError(fmt::format("{}: the header announces metadata at {} + {} bytes, the file has {}", f.path(),
                                      h.meta_offset, h.meta_size, size),
                          f.path());
  }
  return h;
}

}  // namespace

uint64_t write_local_file(const TensorAwareStateDict& state, int64_t iteration, const std::string& path) {
  if (state.is_hollow()) throw UsageError("write_local_file: the tensor-aware state dict is hollow");
  if (io::exists(path)) {
    throw CheckpointError(fmt::format("{} already holds a complete local checkpoint; it is never overwritten — save "
                                      "a later iteration or remove it first",
                                      path),
                          path);
  }
  const std::string tmp = path + ".tmp";
  LocalState meta = state.state();
  meta.iteration = iteration;
  meta.checksum_block_size = kBlock;
  try {
    // The tensor bytes as the global save writes them (writer threads,
    // O_DIRECT, checksums); item 0 reserves the header's place.
    std::vector<io::WriteItem> items{
        io::WriteItem{kHeaderSize, [](uint64_t, uint64_t n, uint8_t* dst) { std::memset(dst, 0, n); }}};
    std::vector<size_t> record_of_item{0};
    for (size_t i = 0; i < meta.tensors.size(); ++i) {
      LocalTensorEntry& e = meta.tensors[i];
      e.byte_offset = e.byte_length = 0;
      e.block_checksums.clear();
      const at::Tensor& t = state.tensors()[i];
      if (!e.held || !t.defined() || t.numel() == 0) continue;
      items.push_back(storage::tensor_write_item(t.detach()));
      record_of_item.push_back(i);
    }
    io::FileWriteOptions options;
    options.checksum_block = kBlock;
    options.threads = resolve_io_threads(0);
    const io::FileWritten written = io::FileWriteJob(tmp, std::move(items), storage::sync_write_pool(), options).wait();
    for (size_t k = 1; k < written.items.size(); ++k) {
      LocalTensorEntry& e = meta.tensors[record_of_item[k]];
      e.byte_offset = written.items[k].byte_offset;
      e.byte_length = written.items[k].byte_length;
      e.block_checksums = written.items[k].block_checksums;
    }
    const std::string encoded = encode_local_state(meta);
    RawHeader h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kVersion;
    h.owner_rank = meta.owner_rank;
    h.world_size = meta.world_size;
    h.iteration = iteration;
    h.meta_offset = written.file_size;
    h.meta_size = encoded.size();
    h.meta_checksum = io::xxh3(encoded.data(), encoded.size());
    h.header_checksum = header_checksum(h);
    io::File f(tmp, io::File::Mode::kUpdate);
    f.pwrite_all(encoded.data(), encoded.size(), h.meta_offset);
    f.pwrite_all(&h, sizeof h, 0);
    f.sync();
    f.close();
    io::rename_path(tmp, path);
    io::fsync_dir(std::filesystem::path(path).parent_path().string());
    return h.meta_offset + h.meta_size;
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
}

std::optional<LocalFileHeader> probe_local_file(const std::string& path) {
  try {
    const io::File f(path, io::File::Mode::kRead);
    const RawHeader h = read_header(f);
    return LocalFileHeader{h.iteration, h.owner_rank, h.world_size, h.meta_offset, h.meta_size};
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

TensorAwareStateDict read_local_file(const std::string& path) {
  const io::File f(path, io::File::Mode::kRead);
  const RawHeader h = read_header(f);
  std::string encoded(h.meta_size, '\0');
  f.pread_all(encoded.data(), encoded.size(), h.meta_offset);
  if (io::xxh3(encoded.data(), encoded.size()) != h.meta_checksum) {
    throw CorruptionError(fmt::format("{}: the metadata's checksum does not match", path));
  }
  LocalState meta = decode_local_state(encoded, path);
  if (meta.iteration != h.iteration || meta.owner_rank != h.owner_rank || meta.world_size != h.world_size) {
    throw CorruptionError(fmt::format("{}: header and metadata disagree on iteration/rank/world size", path));
  }
  std::vector<at::Tensor> tensors(meta.tensors.size());
  for (size_t i = 0; i < meta.tensors.size(); ++i) {
    const LocalTensorEntry& e = meta.tensors[i];
    if (!e.held) continue;
    const ShardedTensor& m = e.meta;
    const Shape shape = m.flattened_range ? Shape{m.flattened_range->size()} : m.local_shape;
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(m.dtype));
    if (t.nbytes() != e.byte_length ||
        (e.byte_length > 0 && (e.byte_offset < kHeaderSize || e.byte_offset > h.meta_offset ||
                               e.byte_length > h.meta_offset - e.byte_offset))) {
      throw CorruptionError(fmt::format("{}: tensor '{}' has bytes [{}, +{}) for {} bytes, outside the data [{}, {})",
                                        path, m.key, e.byte_offset, e.byte_length, t.nbytes(), kHeaderSize,
                                        h.meta_offset));
    }
    if (e.byte_length > 0) {
      f.pread_all(t.data_ptr(), e.byte_length, e.byte_offset);
      if (io::block_checksums(t.data_ptr(), e.byte_length, meta.checksum_block_size) != e.block_checksums) {
        throw CorruptionError(
            fmt::format("{}: the bytes of tensor '{}' ({}) do not match their checksums", path, m.key, m.describe()));
      }
    }
    tensors[i] = std::move(t);
  }
  // Recorded devices are where the tensors lived; they load on the CPU
  // (restore_tensor_device moves them back).
  return TensorAwareStateDict(std::move(meta), std::move(tensors));
}

}  // namespace distckpt::local
