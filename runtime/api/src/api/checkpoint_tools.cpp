// Reading checkpoints without a model or a job: common state, tensor
// metadata, objects, whole tensors; and removing tensors from a checkpoint.
#include <ATen/Functions.h>
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "core/quoted_list.h"
#include "core/state_dict_split.h"
#include "distckpt/api/checkpoint.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "distckpt/storage/backend.h"
#include "format/commit.h"
#include "format/dtype.h"
#include "io/checksum.h"
#include "io/file.h"
#include "load/checkpoint_reader.h"
#include "load/load_requests.h"
#include "storage/distckpt_storage.h"
#include "storage/posix_backend.h"

namespace distckpt {
namespace {

// For the readers every rank of a job may call: the data files are checked
// as they are opened, not all of them by every rank (R x F checks).
loading::CheckpointReader per_rank_reader(const std::string& dir) {
  StorageOptions options;
  options.check_every_file = false;
  return loading::CheckpointReader(open_storage(dir, options));
}

}  // namespace

StateDict load_common_state_dict(const std::string& dir) { return per_rank_reader(dir).read_common_state(); }

std::optional<StateDict> load_content_metadata(const std::string& dir) {
  return per_rank_reader(dir).storage().read_content_metadata();
}

namespace {

// The places of the tensors `selection` names (CheckpointError for a key not
// stored or a prefix no key starts with), sorted.
std::set<size_t> selected_places(loading::CheckpointReader& reader, const TensorSelection& selection,
                                 const std::string& dir) {
  const StorageReader& storage = reader.storage();
  std::set<size_t> places;
  for (const std::string& key : selection.keys) places.insert(reader.tensor_index(reader.tensor_record(key)));
  for (const std::string& prefix : selection.prefixes) {
    size_t i = storage.lower_bound_tensor(prefix);
    const size_t first = i;
    for (; i < storage.tensor_count() && storage.tensor_at(i).key.compare(0, prefix.size(), prefix) == 0; ++i) {
      places.insert(i);
    }
    if (i == first) {
      throw CheckpointError(
          fmt::format("no tensor key of '{}' starts with '{}'; `distckpt inspect {}` lists them", dir, prefix, dir));
    }
  }
  return places;
}

StateDict tensors_metadata(const std::string& dir, const std::vector<const TensorRecord*>& records) {
  StateDict out = Value::dict();
  std::vector<std::string> skipped;
  for (const TensorRecord* record : records) {
    if (record->unrepresentable) {
      skipped.push_back(record->key);
      continue;
    }
    ShardedTensor t;
    t.key = record->key;
    t.dtype = record->dtype;
    t.local_shape = record->global_shape;
    t.global_shape = record->global_shape;
    t.global_offset = Shape(record->global_shape.size(), 0);
    t.axis_fragmentations = Shape(record->global_shape.size(), 1);
    out[record->key] = Value(std::move(t));
  }
  if (!skipped.empty()) {
    log_message(LogLevel::kWarning,
                fmt::format("load_tensors_metadata('{}') leaves out {}: their dtypes have no type in this "
                            "build (`distckpt inspect` lists them)",
                            dir, quoted_list(skipped)));
  }
  return out;
}

}  // namespace

StateDict load_tensors_metadata(const std::string& dir) {
  const loading::CheckpointReader reader = per_rank_reader(dir);
  std::vector<const TensorRecord*> records;
  for (const TensorRecord& record : reader.index().tensors) records.push_back(&record);
  return tensors_metadata(dir, records);
}

StateDict load_tensors_metadata(const std::string& dir, const TensorSelection& selection) {
  loading::CheckpointReader reader = per_rank_reader(dir);
  std::vector<const TensorRecord*> records;
  for (const size_t i : selected_places(reader, selection, dir)) records.push_back(&reader.tensor_at(i));
  return tensors_metadata(dir, records);
}

StateDict load_sharded_objects(const StateDict& sharded_state_dict, const std::string& dir) {
  loading::CheckpointReader reader = per_rank_reader(dir);
  Value objects = extract_matching(apply_factories(sharded_state_dict), [](const Value& leaf) {
                    return leaf.kind() == Kind::kShardedObject;
                  }).first;
  for (Value* leaf : nested_values(objects)) *leaf = loading::load_object(reader, leaf->as_sharded_object());
  return objects;
}

namespace {

ShardedObject object_of(const ObjectRecord& record) {
  return ShardedObject{record.key, "", record.global_shape, record.global_offset, {0}};
}

}  // namespace

StateDict load_plain_tensors(const std::string& dir) {
  loading::CheckpointReader reader(dir);
  StateDict out = Value::dict();
  for (const TensorRecord& record : reader.index().tensors) out[record.key] = Value(reader.read_whole(record));
  return out;
}

StateDict load_plain_tensors(const std::string& dir, const TensorSelection& selection) {
  loading::CheckpointReader reader(dir);
  StateDict out = Value::dict();
  for (const size_t i : selected_places(reader, selection, dir)) {
    const TensorRecord& record = reader.tensor_at(i);
    out[record.key] = Value(reader.read_whole(record));
  }
  return out;
}

at::Tensor load_plain_tensor(const std::string& dir, const std::string& key) {
  loading::CheckpointReader reader(dir);
  return reader.read_whole(reader.tensor_record(key));
}

StateDict load_sharded_objects_metadata(const std::string& dir) {
  const loading::CheckpointReader reader(dir);
  StateDict out = Value::dict();
  for (const ObjectRecord& record : reader.objects()) out[record.unique_key()] = Value(object_of(record));
  return out;
}

StateDict load_all_sharded_objects(const std::string& dir) {
  loading::CheckpointReader reader(dir);
  StateDict out = Value::dict();
  for (const ObjectRecord& record : reader.objects()) {
    ShardedObject object = object_of(record);
    object.data = reader.read_object(record);
    out[record.unique_key()] = Value(std::move(object));
  }
  return out;
}

size_t remove_sharded_tensors(const std::string& dir, const std::string& key_prefix) {
  if (key_prefix.empty()) {
    throw Error(
        fmt::format("remove_sharded_tensors: an empty prefix would remove every tensor of '{}'; name the "
                    "prefix of the tensors to remove",
                    dir));
  }
  if (is_object_store(dir)) {
    throw UsageError(
        fmt::format("remove_sharded_tensors: '{}' is in an object store; it rewrites a local checkpoint "
                    "only (convert it without those keys instead)",
                    dir));
  }
  const storage::DistckptStorage stored(std::make_shared<storage::PosixBackend>(dir));
  CheckpointMetadata metadata = stored.metadata();
  CheckpointConfig config = stored.config();
  // Every entry under the prefix goes, objects too (Megatron's rule): an
  // optimizer's per-rank objects must not outlive its tensors.
  const auto removed_key = [&](const std::string& key) { return key.rfind(key_prefix, 0) == 0; };
  const size_t before = metadata.tensors.size();
  metadata.tensors.erase(std::remove_if(metadata.tensors.begin(), metadata.tensors.end(),
                                        [&](const TensorRecord& t) { return removed_key(t.key); }),
                         metadata.tensors.end());
  std::set<std::string> object_keys;
  for (const ObjectRecord& o : metadata.objects) {
    if (removed_key(o.key)) object_keys.insert(o.key);
  }
  metadata.objects.erase(std::remove_if(metadata.objects.begin(), metadata.objects.end(),
                                        [&](const ObjectRecord& o) { return removed_key(o.key); }),
                         metadata.objects.end());
  const size_t removed = before - metadata.tensors.size() + object_keys.size();
  if (removed == 0) return 0;

  // Drop files nothing refers to any more and renumber the rest.
  std::vector<bool> used(metadata.files.size(), false);
  for (const TensorRecord& t : metadata.tensors) {
    for (const ChunkRecord& c : t.chunks) used[c.file] = true;
  }
  for (const ObjectRecord& o : metadata.objects) used[o.file] = true;
  std::vector<uint32_t> new_index(metadata.files.size(), 0);
  std::vector<FileRecord> kept;
  std::vector<std::string> unused;
  for (size_t i = 0; i < metadata.files.size(); ++i) {
    if (used[i]) {
      new_index[i] = static_cast<uint32_t>(kept.size());
      kept.push_back(metadata.files[i]);
    } else {
      unused.push_back(metadata.files[i].path);
    }
  }
  for (TensorRecord& t : metadata.tensors) {
    for (ChunkRecord& c : t.chunks) c.file = new_index[c.file];
  }
  for (ObjectRecord& o : metadata.objects) o.file = new_index[o.file];
  metadata.files = std::move(kept);

  // The swap is atomic, so the checkpoint stays committed and consistent;
  // files are deleted only once nothing points at them. Version 1 has no
  // record of the metadata: it is replaced in place.
  const std::string encoded = encode_metadata(metadata);
  if (!config.metadata) {
    io::write_file_atomic(io::safe_join(dir, kMetadataFile), encoded);
  } else {
    // The new metadata goes under a new name and the marker, replaced
    // atomically, switches to it: no instant where the two disagree.
    const std::string old_path = config.metadata->path;
    config.metadata =
        record_metadata(fmt::format("metadata-{}.fb", io::hex64(io::xxh3(encoded.data(), encoded.size()))), encoded);
    io::write_file_atomic(io::safe_join(dir, config.metadata->path), encoded);
    write_commit_marker(dir, config);
    if (old_path != config.metadata->path) unused.push_back(old_path);
  }
  for (const std::string& path : unused) io::remove_tree(io::safe_join(dir, path));
  return removed;
}

}  // namespace distckpt
