// verify and digest: whole-checkpoint audits used by the CLI and tests.
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <chrono>
#include <optional>

#include "api/checkpoint_reader.h"
#include "distckpt/api/checkpoint.h"
#include "distckpt/core/errors.h"
#include "format/commit.h"
#include "format/dtype.h"
#include "io/checksum.h"
#include "plan/coverage.h"

namespace distckpt {
namespace {

constexpr uint64_t kDigestWindowBytes = uint64_t{32} << 20;

// Re-reads stored byte ranges block by block for verify_checkpoint,
// collecting problems instead of stopping at the first, and reporting
// progress at most every kProgressInterval.
class BlockChecker {
 public:
  BlockChecker(const CheckpointMetadata& md, const std::string& dir, uint64_t total, const VerifyProgress& progress,
               VerifyReport& report)
      : md_(md), dir_(dir), total_(total), progress_(progress), report_(report) {}

  void check(uint32_t file, uint64_t offset, uint64_t length, const std::vector<uint64_t>& checksums,
             const std::string& what) {
    const std::string& name = md_.files[file].path;
    try {
      io::File f(io::safe_join(dir_, name), io::File::Mode::kRead);
      const uint64_t block = md_.checksum_block_size;
      for (uint64_t i = 0; i * block < length; ++i) {
        const uint64_t s = i * block, n = std::min(block, length - s);
        buffer_.resize(n);
        f.pread_all(buffer_.data(), n, offset + s);
        ++report_.blocks_checked;
        report_.bytes_checked += n;
        if (io::xxh3(buffer_.data(), n) != checksums[i]) {
          report_.problems.push_back(
              fmt::format("checksum mismatch: {} (file '{}', bytes {}..{})", what, name, offset + s, offset + s + n));
        }
        tick();
      }
    } catch (const Error& e) {
      report_.problems.push_back(fmt::format("cannot read {}: {}", what, e.what()));
    }
  }

  void finish() {
    if (progress_) progress_(report_.bytes_checked, total_);
  }

 private:
  static constexpr auto kProgressInterval = std::chrono::milliseconds(250);

  void tick() {
    if (!progress_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < kProgressInterval) return;
    last_ = now;
    progress_(report_.bytes_checked, total_);
  }

  const CheckpointMetadata& md_;
  const std::string& dir_;
  uint64_t total_;
  const VerifyProgress& progress_;
  VerifyReport& report_;
  std::vector<uint8_t> buffer_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// Where a directory without a commit marker came from: a save of ours that
// never committed leaves its files behind (corrupt: not loadable); anything
// else is simply not a checkpoint.
bool has_uncommitted_save(const std::string& dir) {
  return io::exists(io::safe_join(dir, kMetadataFile)) || io::exists(io::safe_join(dir, kCommonFile)) ||
         io::is_dir(io::safe_join(dir, "data"));
}

// Every tensor's stored pieces must tile its global shape exactly once, as
// the save checked before writing them.
void check_tiling(api::CheckpointReader& reader, VerifyReport& report) {
  const CheckpointMetadata& md = reader.metadata();
  for (const TensorRecord& t : md.tensors) {
    std::vector<plan::OwnedBox> boxes;
    for (const plan::StoredPiece& piece : reader.index_for(t).pieces()) {
      boxes.push_back(plan::OwnedBox{piece.box, md.files[t.chunks[piece.chunk].file].writer_rank});
    }
    try {
      plan::check_exact_cover(t.key, t.global_shape, boxes);
    } catch (const ShardingError& e) {
      report.problems.push_back(fmt::format("the stored chunks do not tile the tensor: {}", e.what()));
    }
  }
}

}  // namespace

VerifyReport verify_checkpoint(const std::string& dir, const VerifyProgress& progress) {
  VerifyReport report;
  const auto stop = [&](VerifyReport::Status status, std::string problem) {
    report.status = status;
    report.problems.push_back(std::move(problem));
    return report;
  };
  if (!io::is_dir(dir)) {
    return stop(VerifyReport::Status::kNotACheckpoint, fmt::format("'{}' is not a directory", dir));
  }
  std::optional<CheckpointConfig> config;
  try {
    config = maybe_load_config(dir);
  } catch (const CorruptionError& e) {
    return stop(VerifyReport::Status::kCorrupt, e.what());
  } catch (const CheckpointError& e) {
    return stop(VerifyReport::Status::kNotACheckpoint, e.what());
  } catch (const Error& e) {
    return stop(VerifyReport::Status::kCorrupt, e.what());
  }
  if (!config) {
    if (has_uncommitted_save(dir)) {
      return stop(VerifyReport::Status::kCorrupt,
                  fmt::format("'{}' holds the files of a save that never committed ({} is missing); it cannot be "
                              "loaded",
                              dir, kCommitFile));
    }
    return stop(VerifyReport::Status::kNotACheckpoint,
                fmt::format("'{}' holds no distckpt checkpoint ({} is missing)", dir, kCommitFile));
  }
  report.format_version = config->version;
  std::optional<api::CheckpointReader> reader;
  try {
    reader.emplace(dir, false);
  } catch (const Error& e) {
    return stop(VerifyReport::Status::kCorrupt, e.what());
  }
  const CheckpointMetadata& md = reader->metadata();
  report.files = 2 + md.files.size() + (md.common_file.empty() ? 0 : 1);
  try {
    reader->read_common_state();
  } catch (const Error& e) {
    report.problems.push_back(e.what());
  }
  check_tiling(*reader, report);

  uint64_t total = 0;
  for (const TensorRecord& t : md.tensors) {
    for (const ChunkRecord& chunk : t.chunks) total += chunk.byte_length;
  }
  for (const ObjectRecord& o : md.objects) total += o.byte_length;
  BlockChecker checker(md, dir, total, progress, report);
  for (const TensorRecord& t : md.tensors) {
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      const ChunkRecord& chunk = t.chunks[c];
      checker.check(chunk.file, chunk.byte_offset, chunk.byte_length, chunk.block_checksums,
                    fmt::format("tensor '{}' chunk {} ({})", t.key, c, to_string(chunk.box)));
    }
  }
  for (const ObjectRecord& o : md.objects) {
    checker.check(o.file, o.byte_offset, o.byte_length, o.block_checksums, fmt::format("object '{}'", o.unique_key()));
  }
  checker.finish();
  report.status = report.problems.empty() ? VerifyReport::Status::kIntact : VerifyReport::Status::kCorrupt;
  return report;
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
