// Where a load gets its bytes. A StorageReader presents one checkpoint, in
// whatever format, as a StorageIndex (tensors, their stored chunks and the
// byte ranges that hold them) plus ranged reads; the load planner and the
// read engine use nothing else. Each registered format opens its own
// (distckpt/storage/format_registry.h; built in: distckpt's own, PyTorch
// DCP, Hugging Face safetensors, torch.save files); docs/STORAGE.md walks
// through what each method must do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/core/state_dict.h"
#include "distckpt/format/checkpoint_config.h"
#include "distckpt/format/name_mapping.h"
#include "distckpt/format/storage_index.h"
#include "distckpt/storage/storage_format.h"

namespace distckpt {

// What a verification found. kCorrupt covers anything a load would reject
// (and an uncommitted save: a directory of ours without its commit marker);
// kNotACheckpoint a path that holds no checkpoint at all (absent, empty,
// another program's, or a newer format version).
struct VerifyReport {
  enum class Status { kIntact, kCorrupt, kNotACheckpoint };
  Status status = Status::kIntact;
  std::vector<std::string> problems;  // one line each: what, file, byte range
  std::string format;                 // the name of the format found
  int format_version = 0;             // distckpt only
  uint64_t files = 0;                 // files checked
  uint64_t bytes_checked = 0;         // stored bytes re-read (and hashed where checksums exist)
  uint64_t blocks_checked = 0;        // checksum blocks compared
  bool intact() const { return status == Status::kIntact; }
};
// "intact", "corrupt", "not_a_checkpoint" (the CLI's --json status).
const char* status_name(VerifyReport::Status status);
// Called as bytes are checked (done, total), at most a few times a second.
using VerifyProgress = std::function<void(uint64_t done, uint64_t total)>;

// A run of a chunk's bytes, [offset, offset + bytes) from the chunk's first
// byte, and where it goes.
struct ByteRun {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint8_t* out = nullptr;
};

class StorageReader {
 public:
  virtual ~StorageReader() = default;

  virtual StorageFormat format() const = 0;
  // The path it was opened from (for messages).
  virtual const std::string& location() const = 0;
  // Everything stored, checked when the reader was opened: boxes inside
  // their tensors, byte ranges inside their files. Valid as long as the reader.
  virtual const StorageIndex& index() const = 0;
  // What a load looks up, for formats that decode a record when first asked
  // for it (distckpt's): a rank then decodes only the tensors it reads, not
  // the whole index. Records are numbered as in index().tensors (sorted by
  // key); references stay valid as long as the reader. The defaults answer
  // from index(). Thread-safe.
  virtual size_t tensor_count() const { return index().tensors.size(); }
  // std::out_of_range when `i` >= tensor_count().
  virtual const TensorRecord& tensor_at(size_t i) const { return index().tensors.at(i); }
  virtual std::optional<size_t> find_tensor(const std::string& key) const;
  // The place of the first tensor whose key is not less than `key`
  // (tensor_count() when none), to walk the keys under a prefix.
  virtual size_t lower_bound_tensor(const std::string& key) const;
  virtual const std::vector<FileRecord>& files() const { return index().files; }
  // File `file` of a chunk or object looked up so far (a format that reads
  // records alone reads their files with them); std::out_of_range if none.
  virtual const FileRecord& file_at(uint32_t file) const { return files().at(file); }
  virtual const std::vector<ObjectRecord>& objects() const { return index().objects; }
  virtual uint64_t checksum_block_size() const { return index().checksum_block_size; }
  // How many tensor records tensor_at decoded so far (a format that decodes
  // every record when opened: all).
  virtual size_t tensors_decoded() const { return tensor_count(); }

  // Bytes [begin, end) of chunk `chunk` of `tensor` (relative to the chunk's
  // first byte) into `out`, checking whatever the format records about them
  // (distckpt: every checksum block they touch). Thread-safe: the read
  // engine calls it from several threads. Errors name the file and offset.
  virtual void read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) = 0;
  // The bytes of `runs` (ascending offsets, none overlapping) of the same
  // chunk into their outputs, checked like read_chunk; the bytes between runs
  // are read (and checked) too but not kept. Reads a strided part without an
  // intermediate copy where the format can scatter; this default reads the
  // span in windows and copies the runs out.
  virtual void read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs);
  // A serialized object's bytes (a format without objects never lists any).
  virtual std::string read_object(const ObjectRecord& object) = 0;
  // Values saved outside tensors: distckpt's common state; for safetensors
  // the file's "__metadata__" strings but "format". An empty dict when
  // there are none.
  virtual Value read_common_state() const = 0;
  // The small dict saved with SaveOptions::content_metadata; for
  // safetensors, {"format": F} when the files say it; nullopt when none
  // was (or the format has no place for one).
  virtual std::optional<Value> read_content_metadata() const { return std::nullopt; }
  // Re-reads every stored byte and checks it against what the format
  // records, adding one line to `report.problems` per damaged range.
  virtual void verify(VerifyReport& report, const VerifyProgress& progress) = 0;
  // Bytes read from storage so far (loads assert they read only their shards).
  virtual uint64_t bytes_read() const = 0;
  // The layout schema's name mappings saved with the checkpoint (the
  // distckpt format records them; other formats have none).
  virtual std::vector<NameMapping> name_mappings() const { return {}; }
};

struct StorageOptions {
  StorageFormat format{};  // detected from what the location holds
  // Check every checksum block read (formats that record checksums).
  bool verify_checksums = true;
  // Check the kind, size and place of every data file when opening (the
  // distckpt format). Off, each file is checked as it is first opened for
  // reading: load() asks only its coordinator for the whole check, and
  // load_common_state_dict, load_tensors_metadata and the like none, so that
  // R ranks do not stat F files each (R x F metadata operations on a
  // parallel file system).
  bool check_every_file = true;
};

// The commit marker of the distckpt checkpoint at LOCATION (a directory or
// an s3:// prefix) parsed; nullopt when there is none (not a committed
// checkpoint) or one another program wrote (a Megatron torch_dist
// checkpoint, say). Throws CorruptionError for a damaged marker and
// CheckpointError for one written by a newer distckpt.
std::optional<CheckpointConfig> maybe_load_config(const std::string& location);
// Like Megatron's: a damaged marker is reported (it throws), not taken for
// "no checkpoint here", so a save never silently overwrites it.
bool is_distributed_checkpoint(const std::string& location);
// Which program committed LOCATION: "distckpt", the other tool's name as its
// marker gives it ("torch_dist"), or nullopt without a marker. Throws
// CorruptionError for a damaged marker of ours.
std::optional<std::string> checkpoint_writer(const std::string& location);

// What `path` holds: the first registered format that recognises it;
// CheckpointError saying what was found when none does.
StorageFormat detect_storage_format(const std::string& path);
// Opens the checkpoint at `path`. Throws CheckpointError when there is none
// and CorruptionError when its metadata or files are inconsistent.
std::unique_ptr<StorageReader> open_storage(const std::string& path, const StorageOptions& options = {});

// `external` (say, a Hugging Face directory) seen through `mapping`: its
// tensors under checkpoint keys, each external tensor a stored chunk of the
// key's tensor at the place the mapping gives it (a layer of a stacked
// tensor, a fused part). Loads then read only the byte ranges a rank's
// shards overlap. External tensors the mapping does not name are not listed.
// CheckpointError naming the location and the tensor when one the mapping
// names is missing or its shape or dtype disagrees.
std::unique_ptr<StorageReader> map_storage(std::unique_ptr<StorageReader> external, const NameMapping& mapping);

}  // namespace distckpt
