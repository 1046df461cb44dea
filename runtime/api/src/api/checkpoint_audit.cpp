// verify and digest: whole-checkpoint audits used by the CLI and tests.
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <memory>
#include <optional>

#include "distckpt/api/checkpoint.h"
#include "distckpt/core/errors.h"
#include "distckpt/storage/backend.h"
#include "format/commit.h"
#include "format/dtype.h"
#include "io/checksum.h"
#include "io/file.h"
#include "io/tensor_digest.h"
#include "load/checkpoint_reader.h"
#include "storage/torch_file_reader.h"

namespace distckpt {
namespace {

constexpr uint64_t kDigestWindowBytes = uint64_t{32} << 20;

// Where a directory without a commit marker came from: a save of ours that
// never committed leaves its files behind (corrupt: not loadable); anything
// else is simply not a checkpoint.
bool has_uncommitted_save(const std::string& location) {
  if (!is_object_store(location)) {  // an empty data/ folder counts: a save was there
    if (io::is_dir(io::safe_join(location, "data"))) return true;
  }
  const std::unique_ptr<Backend> backend = open_backend(location);
  return backend->size_of(kMetadataFile) || backend->size_of(kCommonFile) || !backend->list("data/", 1).empty();
}

// Every tensor's stored pieces must tile its global shape exactly once, as
// the save checked before writing them.
void check_tiling(loading::CheckpointReader& reader, VerifyReport& report) {
  for (const TensorRecord& t : reader.index().tensors) {
    try {
      reader.index_for(t);  // checks the tiling
    } catch (const CorruptionError& e) {
      report.problems.push_back(e.what());
    }
  }
}

}  // namespace

VerifyReport verify_checkpoint(const std::string& path, const VerifyProgress& progress) {
  VerifyReport report;
  const auto stop = [&](VerifyReport::Status status, std::string problem) {
    report.status = status;
    report.problems.push_back(std::move(problem));
    return report;
  };
  if (!location_exists(path)) {
    return stop(VerifyReport::Status::kNotACheckpoint, fmt::format("'{}' does not exist", path));
  }
  if (storage::is_torch_file(path)) {  // a torch.save file: its records against their CRC-32
    report.format = "torch";
    try {
      storage::TorchFileReader(path).verify(report, progress);
    } catch (const CorruptionError& e) {
      return stop(VerifyReport::Status::kCorrupt, e.what());
    } catch (const Error& e) {  // readable, but no state dict distckpt reads
      return stop(VerifyReport::Status::kNotACheckpoint, e.what());
    }
    report.status = report.problems.empty() ? VerifyReport::Status::kIntact : VerifyReport::Status::kCorrupt;
    return report;
  }
  StorageFormat format = StorageFormat::detected();
  try {
    format = detect_storage_format(path);
  } catch (const CheckpointError& e) {
    return stop(VerifyReport::Status::kNotACheckpoint, e.what());
  }
  report.format = format.name();
  if (format == StorageFormat::distckpt()) {
    // The marker first: without one, say whether a save of ours was cut short.
    std::optional<CheckpointConfig> config;
    try {
      config = maybe_load_config(path);
    } catch (const CorruptionError& e) {
      return stop(VerifyReport::Status::kCorrupt, e.what());
    } catch (const CheckpointError& e) {
      return stop(VerifyReport::Status::kNotACheckpoint, e.what());
    } catch (const Error& e) {
      return stop(VerifyReport::Status::kCorrupt, e.what());
    }
    if (!config) {
      try {
        if (const std::optional<std::string> writer = checkpoint_writer(path)) {
          return stop(VerifyReport::Status::kNotACheckpoint,
                      fmt::format("{}/{}: was written by '{}', not distckpt; verify it with the tool that wrote it",
                                  path, kCommitFile, *writer));
        }
      } catch (const Error& e) {
        return stop(VerifyReport::Status::kCorrupt, e.what());
      }
      if (has_uncommitted_save(path)) {
        return stop(VerifyReport::Status::kCorrupt,
                    fmt::format("'{}' holds the files of a save that never committed ({} is missing); it cannot be "
                                "loaded",
                                path, kCommitFile));
      }
      return stop(VerifyReport::Status::kNotACheckpoint,
                  fmt::format("'{}' holds no checkpoint ({} is missing, and no safetensors)", path, kCommitFile));
    }
    report.format_version = config->version;
  }
  std::unique_ptr<StorageReader> storage;
  try {
    storage = open_storage(path, StorageOptions{format, /*verify_checksums=*/false});
    storage->index();  // every record decoded and checked (a format may decode them on demand)
  } catch (const CorruptionError& e) {
    return stop(VerifyReport::Status::kCorrupt, e.what());
  } catch (const CheckpointError& e) {
    // Safetensors files that do not say which checkpoint they make (several
    // files or indexes, no index) are not one: nothing in them is damaged.
    return stop(
        format == StorageFormat::safetensors() ? VerifyReport::Status::kNotACheckpoint : VerifyReport::Status::kCorrupt,
        e.what());
  } catch (const Error& e) {
    return stop(VerifyReport::Status::kCorrupt, e.what());
  }
  loading::CheckpointReader reader(*storage);
  check_tiling(reader, report);
  storage->verify(report, progress);
  report.status = report.problems.empty() ? VerifyReport::Status::kIntact : VerifyReport::Status::kCorrupt;
  return report;
}

std::string TensorDigest::line() const {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? "," : "") + std::to_string(shape[i]);
  return fmt::format("{} {} [{}] {}", key, dtype, dims, io::hex64(hash));
}

std::vector<TensorDigest> digest_checkpoint(const std::string& dir) {
  loading::CheckpointReader reader(dir);
  std::vector<TensorDigest> out;
  for (const TensorRecord& record : reader.index().tensors) {
    uint64_t digest = 0;  // the sum of its windows' digests (io/tensor_digest.h)
    loading::read_in_windows(reader, record, kDigestWindowBytes, [&](int64_t start, const at::Tensor& values) {
      digest += io::digest_run(values.data_ptr(), static_cast<uint64_t>(values.numel()), record.element_size(),
                               static_cast<uint64_t>(start));
    });
    out.push_back(TensorDigest{record.key, stored_dtype_name(record), record.global_shape, digest});
  }
  return out;
}

}  // namespace distckpt
