// verify and digest: whole-checkpoint audits used by the CLI and tests.
#include <ATen/Functions.h>
#include <fmt/format.h>

#include "api/checkpoint_reader.h"
#include "distckpt/api/checkpoint.h"
#include "format/dtype.h"
#include "io/checksum.h"

namespace distckpt {
namespace {

constexpr uint64_t kDigestWindowBytes = uint64_t{32} << 20;

// Checks the blocks of one stored byte range; appends a line per bad block.
void verify_range(const CheckpointMetadata& md, const std::string& dir, uint32_t file, uint64_t offset, uint64_t length,
                  const std::vector<uint64_t>& checksums, const std::string& what, std::vector<uint8_t>& buffer,
                  std::vector<std::string>& problems) {
  const std::string path = io::safe_join(dir, md.files[file].path);
  io::File f(path, io::File::Mode::kRead);
  const uint64_t block = md.checksum_block_size;
  for (uint64_t i = 0; i * block < length; ++i) {
    const uint64_t s = i * block, n = std::min(block, length - s);
    buffer.resize(n);
    f.pread_all(buffer.data(), n, offset + s);
    if (io::xxh3(buffer.data(), n) != checksums[i]) {
      problems.push_back(fmt::format("checksum mismatch: {} (file '{}', bytes {}..{})", what, md.files[file].path,
                                     offset + s, offset + s + n));
    }
  }
}

}  // namespace

std::vector<std::string> verify_checkpoint(const std::string& dir) {
  const api::CheckpointReader reader(dir, false);
  const CheckpointMetadata& md = reader.metadata();
  std::vector<std::string> problems;
  std::vector<uint8_t> buffer;
  for (const TensorRecord& t : md.tensors) {
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      const ChunkRecord& chunk = t.chunks[c];
      verify_range(md, dir, chunk.file, chunk.byte_offset, chunk.byte_length, chunk.block_checksums,
                   fmt::format("tensor '{}' chunk {} ({})", t.key, c, to_string(chunk.box)), buffer, problems);
    }
  }
  for (const ObjectRecord& o : md.objects) {
    verify_range(md, dir, o.file, o.byte_offset, o.byte_length, o.block_checksums,
                 fmt::format("object '{}'", o.unique_key()), buffer, problems);
  }
  return problems;
}

std::string TensorDigest::line() const {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? "," : "") + std::to_string(shape[i]);
  return fmt::format("{} {} [{}] {}", key, dtype, dims, io::hex64(hash));
}

std::vector<TensorDigest> digest_checkpoint(const std::string& dir) {
  api::CheckpointReader reader(dir);
  std::vector<TensorDigest> out;
  for (const TensorRecord& record : reader.metadata().tensors) {
    const int64_t total = numel(record.global_shape);
    const auto window = static_cast<int64_t>(std::max<uint64_t>(1, kDigestWindowBytes / dtype_size(record.dtype)));
    const Box whole{Shape(record.global_shape.size(), 0), record.global_shape};
    io::StreamingHash hash;
    at::Tensor buffer = at::empty({std::min(window, total)}, at::TensorOptions().dtype(record.dtype));
    for (int64_t start = 0; start < total; start += window) {
      const FlatRange range{start, std::min(start + window, total)};
      at::Tensor part = buffer.narrow(0, 0, range.size());
      if (record.global_shape.empty()) {
        reader.read_region(record, whole, part.view({}));
      } else {
        for (const FlatPiece& piece : decompose_flat_range(whole, range)) {
          reader.read_region(record, piece.box,
                             part.narrow(0, piece.flat_start - start, piece.box.numel()).view(piece.box.length));
        }
      }
      hash.update(part.data_ptr(), static_cast<size_t>(range.size()) * part.element_size());
    }
    out.push_back(TensorDigest{record.key, dtype_name(record.dtype), record.global_shape, hash.digest()});
  }
  return out;
}

}  // namespace distckpt
