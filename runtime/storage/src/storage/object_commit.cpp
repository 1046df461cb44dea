#include "storage/object_commit.h"

#include <fmt/format.h>

#include <exception>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "format/commit.h"
#include "storage/commit_marker.h"

namespace distckpt::storage {
namespace {

// metadata.fb and common.fb are FlatBuffers (at most 2 GiB).
constexpr uint64_t kMaxFlatBufferBytes = (uint64_t{1} << 31) - 1;

std::string tag_of(uint64_t save_id) { return fmt::format("{:016x}", save_id); }
std::string data_folder(uint64_t save_id) { return "data/" + tag_of(save_id) + "/"; }
std::string metadata_name(uint64_t save_id) { return "metadata." + tag_of(save_id) + ".fb"; }
std::string common_name(uint64_t save_id) { return "common." + tag_of(save_id) + ".fb"; }

// The objects the committed checkpoint under `backend` consists of (marker
// excluded); nullopt when there is none or it cannot be read (then nothing
// of it is removed).
std::optional<std::set<std::string>> committed_objects(Backend& backend) {
  try {
    const std::optional<std::string> marker = read_commit_marker(backend);
    if (!marker) return std::nullopt;
    const std::optional<CheckpointConfig> config = config_of_marker(*marker, backend.describe(kCommitFile));
    if (!config) return std::nullopt;
    const std::string name = config->metadata ? config->metadata->path : kMetadataFile;
    const CheckpointMetadata old =
        decode_metadata(backend.read_small(name, kMaxFlatBufferBytes), backend.describe(name));
    std::set<std::string> names{name};
    if (!old.common_file.empty()) names.insert(old.common_file);
    for (const FileRecord& f : old.files) names.insert(f.path);
    return names;
  } catch (const std::exception& e) {
    log_message(LogLevel::kWarning, fmt::format("the checkpoint being replaced at '{}' cannot be read ({}); its "
                                                "objects stay behind",
                                                backend.location(), e.what()));
    return std::nullopt;
  }
}

void remove_replaced(Backend& backend, const std::set<std::string>& old, const std::set<std::string>& kept) {
  for (const std::string& name : old) {
    if (kept.count(name) != 0) continue;
    try {
      backend.remove(name);
    } catch (const std::exception& e) {
      log_message(LogLevel::kWarning, fmt::format("saved '{}', but removing '{}' of the previous checkpoint failed: {}",
                                                  backend.location(), name, e.what()));
    }
  }
}

}  // namespace

uint64_t new_save_id() {
  std::random_device device;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{device()} << 32) ^ device();
  return id;
}

std::string object_data_name(int rank, uint64_t save_id) {
  return fmt::format("{}rank_{:05d}.bin", data_folder(save_id), rank);
}

void claim_object_prefix(Backend& backend, bool overwrite) {
  if (overwrite || !read_commit_marker(backend)) return;
  throw CheckpointError(fmt::format(
      "'{}' already holds a committed checkpoint; pass SaveOptions::overwrite = true to replace it (the old one is "
      "removed only after the new one is committed) or save under another prefix",
      backend.location()));
}

void commit_objects(Backend& backend, CheckpointMetadata metadata, const std::string& common_state, bool overwrite,
                    uint64_t save_id) {
  metadata.common_file = common_name(save_id);
  backend.publish(metadata.common_file, common_state, /*if_absent=*/false);
  const std::string encoded = encode_metadata(metadata);
  backend.publish(metadata_name(save_id), encoded, /*if_absent=*/false);
  const std::string marker =
      encode_commit_marker(commit_config(metadata.world_size, record_metadata(metadata_name(save_id), encoded),
                                         record_file(metadata.common_file, common_state)));

  const std::optional<std::set<std::string>> previous = overwrite ? committed_objects(backend) : std::nullopt;
  // A new checkpoint is created only where none is: two saves racing for
  // one prefix cannot both commit. An overwrite replaces the marker, so a
  // reader finds the previous checkpoint or this one, whole.
  const bool replacing = overwrite && read_commit_marker(backend).has_value();
  if (!backend.publish(kCommitFile, marker, /*if_absent=*/!replacing)) {
    throw CheckpointError(fmt::format(
        "another save committed a checkpoint at '{}' while this one was writing; this save's objects are removed. "
        "Give each job its own prefix, or pass SaveOptions::overwrite = true to replace",
        backend.location()));
  }
  if (previous) {
    std::set<std::string> kept{metadata_name(save_id), metadata.common_file};
    for (const FileRecord& f : metadata.files) kept.insert(f.path);
    remove_replaced(backend, *previous, kept);
  }
}

void discard_objects(Backend& backend, uint64_t save_id) noexcept {
  const auto step = [&](const auto& what) {
    try {
      what();
    } catch (const std::exception& e) {
      log_message(LogLevel::kWarning, fmt::format("removing the objects of a failed save under '{}' failed: {}",
                                                  backend.location(), e.what()));
    }
  };
  // A marker that names this save's metadata means it did commit (its
  // answer was lost): nothing of it may go.
  bool committed = false;
  step([&] {
    const std::optional<std::string> marker = read_commit_marker(backend);
    committed = marker && marker->find(metadata_name(save_id)) != std::string::npos;
  });
  if (committed) return;
  step([&] { backend.abort_unfinished(data_folder(save_id)); });
  step([&] {
    for (const StoredObject& o : backend.list(data_folder(save_id))) backend.remove(o.name);
  });
  step([&] { backend.remove(metadata_name(save_id)); });
  step([&] { backend.remove(common_name(save_id)); });
}

}  // namespace distckpt::storage
