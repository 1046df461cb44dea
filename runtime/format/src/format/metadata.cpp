// metadata.fb: encoding of CheckpointMetadata and its decoding from untrusted
// bytes. Decoding verifies the FlatBuffers structure first, then checks every
// record semantically, so the planner and the readers can trust what they
// get: no box outside its tensor, no byte range outside its file, no path
// outside the checkpoint directory.
#include "format/metadata.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "distckpt/core/errors.h"
#include "distckpt/fb/checkpoint_generated.h"
#include "fb_support.h"
#include "format/commit.h"
#include "format/dtype.h"
#include "io/checksum.h"
#include "io/file.h"

namespace distckpt {
namespace {

using fb_support::ceil_div;
using fb_support::checked_mul;
using fb_support::checked_numel;
using fb_support::ensure_room;

bool verify_header(const fb::CheckpointMetadata& root, flatbuffers::Verifier& v, bool head_only);

constexpr uint32_t kMaxVerifierDepth = 64;

// --- encoding ---

// Rough serialized size of one record, used to reserve the builder and to
// stop before the 2 GiB FlatBuffers limit.
uint64_t chunk_bytes(const ChunkRecord& chunk) { return 96 + 16 * chunk.box.ndim() + 8 * chunk.block_checksums.size(); }

uint64_t mapping_bytes(const NameMapping& m) {
  uint64_t total = 32 + m.name().size();
  for (const MappedTensor& t : m.tensors()) {
    total += 96 + t.key.size() + t.external.size() + 8 * t.shape.size();
    for (const auto& index : t.indices) total += 32 + index.name.size();
  }
  return total;
}

uint64_t estimated_size(const CheckpointMetadata& m) {
  uint64_t total = 1024 + m.layout_schema.size() + m.layout_name.size() + m.layout_fingerprint.size();
  for (const auto& t : m.tensors) {
    total += 64 + t.key.size() + 8 * t.global_shape.size();
    for (const auto& c : t.chunks) total += chunk_bytes(c);
  }
  for (const auto& o : m.objects) total += 96 + o.key.size() + 16 * o.global_shape.size();
  for (const auto& f : m.files) total += 32 + f.path.size();
  for (const auto& mapping : m.name_mappings) total += mapping_bytes(mapping);
  return total;
}

// A builder whose vtables are shared within one record only (format 3): a
// record that borrowed another's vtable could not be read alone.
class RecordBuilder : public flatbuffers::FlatBufferBuilder {
 public:
  using FlatBufferBuilder::FlatBufferBuilder;
  // Between tables the scratch area holds only the vtables written so far.
  void start_record() { buf_.clear_scratch(); }
};

// The extent of the bytes written since the builder held `before` bytes
// (they do not move again: a builder grows towards the front).
fb::Extent extent_since(const flatbuffers::FlatBufferBuilder& fbb, uint32_t before) {
  const uint32_t size = fbb.GetSize() - before;
  return fb::Extent(fbb.GetSize(), size, io::xxh3(fbb.GetCurrentBufferPointer(), size));
}

// Where the file record a chunk or object names lies (format 3), or none
// (a file that does not exist is the decoder's to report).
const fb::Extent* file_extent_of(const std::vector<fb::Extent>* file_extents, uint32_t file) {
  return file_extents == nullptr || file >= file_extents->size() ? nullptr : &(*file_extents)[file];
}

flatbuffers::Offset<fb::ChunkRecord> encode_chunk(flatbuffers::FlatBufferBuilder& fbb, const ChunkRecord& c,
                                                  const std::vector<fb::Extent>* file_extents) {
  ensure_room(fbb, chunk_bytes(c), "the checkpoint metadata");
  const auto offset = fbb.CreateVector(c.box.offset);
  const auto length = fbb.CreateVector(c.box.length);
  const auto checksums = fbb.CreateVector(c.block_checksums);
  return fb::CreateChunkRecord(fbb, offset, length, c.flat ? c.flat->start : -1, c.flat ? c.flat->stop : -1, c.file,
                               c.byte_offset, c.byte_length, checksums, file_extent_of(file_extents, c.file));
}

flatbuffers::Offset<fb::TensorRecord> encode_tensor(flatbuffers::FlatBufferBuilder& fbb, const TensorRecord& t,
                                                    const std::vector<fb::Extent>* file_extents) {
  std::vector<flatbuffers::Offset<fb::ChunkRecord>> chunks;
  chunks.reserve(t.chunks.size());
  for (const auto& c : t.chunks) chunks.push_back(encode_chunk(fbb, c, file_extents));
  ensure_room(fbb, t.key.size() + 8 * t.global_shape.size() + 4 * chunks.size(), "the checkpoint metadata");
  const auto key = fbb.CreateString(t.key);
  const auto dtype = fbb.CreateString(stored_dtype_name(t));
  const auto shape = fbb.CreateVector(t.global_shape);
  const auto chunk_vector = fbb.CreateVector(chunks);
  return fb::CreateTensorRecord(fbb, key, dtype, shape, chunk_vector, static_cast<uint32_t>(t.element_size()));
}

flatbuffers::Offset<fb::ObjectRecord> encode_object(flatbuffers::FlatBufferBuilder& fbb, const ObjectRecord& o,
                                                    const std::vector<fb::Extent>* file_extents) {
  ensure_room(fbb, 96 + o.key.size() + 16 * o.global_shape.size() + 8 * o.block_checksums.size(),
              "the checkpoint metadata");
  const auto key = fbb.CreateString(o.key);
  const auto shape = fbb.CreateVector(o.global_shape);
  const auto offset = fbb.CreateVector(o.global_offset);
  const auto checksums = fbb.CreateVector(o.block_checksums);
  return fb::CreateObjectRecord(fbb, key, shape, offset, o.file, o.byte_offset, o.byte_length, checksums,
                                file_extent_of(file_extents, o.file));
}

flatbuffers::Offset<fb::NameMapping> encode_mapping(flatbuffers::FlatBufferBuilder& fbb, const NameMapping& m) {
  ensure_room(fbb, mapping_bytes(m), "the checkpoint metadata");
  std::vector<flatbuffers::Offset<fb::MappedTensor>> tensors;
  for (const MappedTensor& t : m.tensors()) {
    std::vector<flatbuffers::Offset<fb::MappingIndex>> indices;
    for (const auto& index : t.indices) {
      indices.push_back(fb::CreateMappingIndex(fbb, fbb.CreateString(index.name), index.count, index.leading_axis));
    }
    const auto key = fbb.CreateString(t.key);
    const auto external = fbb.CreateString(t.external);
    const auto index_vector = fbb.CreateVector(indices);
    const auto shape = fbb.CreateVector(t.shape);
    tensors.push_back(fb::CreateMappedTensor(fbb, key, external, index_vector, shape, t.part_dim, t.part_offset,
                                             t.part_extent, t.pad_dim));
  }
  const auto name = fbb.CreateString(m.name());
  return fb::CreateNameMapping(fbb, name, fbb.CreateVector(tensors));
}

// --- decoding ---

std::string_view view(const flatbuffers::String* s) {
  return s == nullptr ? std::string_view() : std::string_view(s->c_str(), s->size());
}

template <typename T>
size_t length_of(const flatbuffers::Vector<T>* v) {
  return v == nullptr ? 0 : v->size();
}

// How a decoder finds the file record a chunk or object names: in the list
// decoded whole, or (format 3, records read alone) where the chunk says it
// lies. Throws CorruptionError for an index or extent that does not hold.
class FileResolver {
 public:
  virtual ~FileResolver() = default;
  virtual uint32_t count() const = 0;
  virtual const FileRecord& resolve(uint32_t index, const fb::Extent* extent) = 0;
};

// Checks one verified buffer record by record and copies it out. Every
// failure names the origin and the record; checks that compare two numbers
// are written so that no intermediate value can overflow.
class MetadataDecoder {
 public:
  // `buffer`: the verified bytes `root` lies in (the whole file, or a
  // format 3 head); `file_size`: the whole file's, which bounds what
  // decoding may expand to.
  MetadataDecoder(const fb::CheckpointMetadata& root, std::string_view buffer, uint64_t file_size,
                  const std::string& origin)
      : root_(root), buffer_(buffer), origin_(origin), budget_(file_size, origin) {}

  // Where chunks' and objects' files come from when the file list is not
  // decoded (a format 3 head read alone), and for decode_tensor.
  void set_files(FileResolver* files) { files_ = files; }

  // Everything but the tensor records (and the checks that need them all).
  // `listed`: the file list is in the buffer and decoded, else files are
  // resolved through set_files.
  CheckpointMetadata decode_header(bool listed) { return decode_records(false, listed); }

  CheckpointMetadata decode() { return decode_records(true, true); }

  // Checks one file record (not that its path is unique: that needs them all).
  FileRecord decode_file(const fb::FileRecord& r, size_t index) {
    budget_.charge_table();
    budget_.charge_string(r.path());
    FileRecord f;
    f.path = std::string(view(r.path()));
    f.size = r.size();
    f.writer_rank = r.writer_rank();
    check_path(f.path, fmt::format("file {}", index));
    // A data file named like the marker, the metadata or the common state:
    // removing tensors (which deletes data files no longer used) would
    // delete those.
    if (f.path == kCommitFile || f.path == kCommonFile || f.path == view(root_.common_file()) ||
        f.path.rfind("metadata", 0) == 0) {
      fail(fmt::format("file '{}' has the name of a file that is not data", f.path));
    }
    if (f.writer_rank < 0 || f.writer_rank >= root_.world_size()) {
      fail(fmt::format("file '{}' has writer rank {}, outside the world of {} ranks", f.path, f.writer_rank,
                       root_.world_size()));
    }
    return f;
  }

  uint32_t check_version(uint32_t version) const {
    if (version > kFormatVersion) {
      throw CheckpointError(
          fmt::format("{}: written by a newer distckpt (version {}); this build reads version {}. Upgrade distckpt to "
                      "load this checkpoint",
                      origin_, version, kFormatVersion),
          origin_);
    }
    if (version < kOldestFormatVersion) fail(fmt::format("format_version {} is not a valid version", version));
    return version;
  }

  // The file list (root().files(), or the same vector read alone).
  std::vector<FileRecord> decode_files(const flatbuffers::Vector<flatbuffers::Offset<fb::FileRecord>>* records) {
    std::vector<FileRecord> files;
    files.reserve(length_of(records));
    std::unordered_set<std::string_view> seen;
    for (size_t i = 0; records != nullptr && i < records->size(); ++i) {
      const auto* r = records->Get(static_cast<flatbuffers::uoffset_t>(i));
      files.push_back(decode_file(*r, i));
      if (!seen.insert(view(r->path())).second) fail(fmt::format("file '{}' is listed twice", files.back().path));
    }
    if (root_.format_version() >= 3 && root_.file_count() != files.size()) {
      fail(fmt::format("the index counts {} files but {} are listed", root_.file_count(), files.size()));
    }
    return files;
  }

  const fb::CheckpointMetadata& root() const { return root_; }
  std::string_view buffer() const { return buffer_; }

  TensorRecord decode_tensor(const fb::TensorRecord& r) {
    budget_.charge_table();
    budget_.charge_string(r.key());
    budget_.charge_string(r.dtype());
    TensorRecord t;
    t.key = std::string(view(r.key()));
    if (t.key.empty()) fail("a tensor record has an empty key");
    try {
      ResolvedDtype dtype = resolve_stored_dtype(std::string(view(r.dtype())), r.element_size());
      t.dtype = dtype.type;
      t.unrepresentable = std::move(dtype.unrepresentable);
    } catch (const CorruptionError& e) {
      fail(fmt::format("tensor '{}': {}", t.key, e.what()), e.path());
    }
    t.global_shape = budget_.copy_vector(r.global_shape());
    if (!checked_numel(t.global_shape.begin(), t.global_shape.end())) {
      fail(
          fmt::format("tensor '{}' has global shape {}: extents must be non-negative and the element count "
                      "must fit in int64",
                      t.key, to_string(t.global_shape)));
    }
    const auto* chunks = r.chunks();
    t.chunks.reserve(length_of(chunks));
    for (size_t i = 0; chunks != nullptr && i < chunks->size(); ++i) {
      t.chunks.push_back(decode_chunk(*chunks->Get(static_cast<flatbuffers::uoffset_t>(i)), t, i));
    }
    return t;
  }

  // `path`: the file the failure is about, when a check names one other than the metadata file.
  [[noreturn]] void fail(const std::string& what, const std::string& path = {}) const {
    throw CorruptionError(fmt::format("{}: {}; the checkpoint metadata is corrupted", origin_, what),
                          path.empty() ? origin_ : path);
  }

 private:
  CheckpointMetadata decode_records(bool with_tensors, bool listed);
  void check_index(const std::vector<TensorRecord>& tensors) const;

  // Only what the buffer itself can get wrong is checked here: negative
  // counts and extents. NameMapping::expand() checks the rest when used.
  std::vector<NameMapping> decode_mappings() {
    std::vector<NameMapping> out;
    if (root_.name_mappings() == nullptr) return out;
    // Charged as the other records are, what the buffer holds of each (a
    // table, its strings): a genuine buffer stays within its own size.
    for (const fb::NameMapping* m : *root_.name_mappings()) {
      budget_.charge_table();
      budget_.charge_string(m->name());
      NameMapping& mapping = out.emplace_back(std::string(view(m->name())));
      if (m->tensors() == nullptr) continue;
      for (const fb::MappedTensor* t : *m->tensors()) {
        budget_.charge_table();
        budget_.charge_string(t->key());
        budget_.charge_string(t->external());
        MappedTensor& entry =
            mapping.map(std::string(view(t->key())), std::string(view(t->external())), budget_.copy_vector(t->shape()));
        for (const int64_t extent : entry.shape) {
          if (extent < 0) fail(fmt::format("name mapping '{}': negative extent for '{}'", mapping.name(), entry.key));
        }
        entry.part_dim = t->part_dim();
        entry.part_offset = t->part_offset();
        entry.part_extent = t->part_extent();
        entry.pad_dim = t->pad_dim();
        if (t->indices() == nullptr) continue;
        for (const fb::MappingIndex* index : *t->indices()) {
          if (index->count() < 0) fail(fmt::format("name mapping '{}': negative index count", mapping.name()));
          budget_.charge_table();
          budget_.charge_string(index->name());
          entry.indices.push_back({std::string(view(index->name())), index->count(), index->leading_axis()});
        }
      }
    }
    return out;
  }

  void check_path(const std::string& path, const std::string& what) const {
    try {
      io::validate_relative_path(path);
    } catch (const CorruptionError& e) {
      fail(fmt::format("{}: {}", what, e.what()), e.path());
    }
  }

  // Where a chunk or object points: a valid file, a byte range inside the
  // recorded file size and one checksum per block. `what()` names the record
  // (only called on failure: formatting for each of 10^7 chunks would cost).
  template <typename Describe>
  void check_storage(const Describe& what, uint32_t file, uint64_t byte_offset, uint64_t byte_length,
                     size_t checksum_count, const fb::Extent* file_extent) const {
    if (file >= files_->count()) {
      fail(fmt::format("{} refers to file {}, but the checkpoint has {} files", what(), file, files_->count()));
    }
    if (root_.format_version() >= 3 && file_extent == nullptr) {
      fail(fmt::format("{} does not say where the record of its file lies", what()));
    }
    const FileRecord& record = files_->resolve(file, file_extent);
    const uint64_t file_size = record.size;
    if (byte_offset > file_size || byte_length > file_size - byte_offset) {
      fail(fmt::format("{} spans bytes [{}, +{}) of '{}', which has {} bytes", what(), byte_offset, byte_length,
                       record.path, file_size));
    }
    const uint64_t block = root_.checksum_block_size();
    const uint64_t expected = block == 0 ? 0 : ceil_div(byte_length, block);
    if (checksum_count != expected) {
      fail(fmt::format("{} has {} block checksums, expected {} ({} bytes in blocks of {})", what(), checksum_count,
                       expected, byte_length, block));
    }
  }

  std::vector<TensorRecord> decode_tensors() {
    std::vector<TensorRecord> tensors;
    const auto* records = root_.tensors();
    tensors.reserve(length_of(records));
    for (size_t i = 0; records != nullptr && i < records->size(); ++i) {
      tensors.push_back(decode_tensor(*records->Get(static_cast<flatbuffers::uoffset_t>(i))));
      if (i > 0 && !(tensors[i - 1].key < tensors[i].key)) {
        fail(fmt::format("tensor keys are not sorted and unique: '{}' is followed by '{}'", tensors[i - 1].key,
                         tensors[i].key));
      }
    }
    return tensors;
  }

  ChunkRecord decode_chunk(const fb::ChunkRecord& r, const TensorRecord& t, size_t index) {
    budget_.charge_table();
    const auto where = [&] { return fmt::format("tensor '{}' chunk {}", t.key, index); };
    ChunkRecord c;
    c.box.offset = budget_.copy_vector(r.offset());
    c.box.length = budget_.copy_vector(r.length());
    if (c.box.offset.size() != t.global_shape.size() || c.box.length.size() != t.global_shape.size()) {
      fail(fmt::format("{}: box has offset rank {} and length rank {}, but the tensor has rank {}", where(),
                       c.box.offset.size(), c.box.length.size(), t.global_shape.size()));
    }
    for (size_t axis = 0; axis < t.global_shape.size(); ++axis) {
      const int64_t offset = c.box.offset[axis];
      const int64_t length = c.box.length[axis];
      const int64_t extent = t.global_shape[axis];
      if (offset < 0 || length < 0 || offset > extent || length > extent - offset) {
        fail(fmt::format("{}: box {} lies outside the global shape {} on axis {}", where(), to_string(c.box),
                         to_string(t.global_shape), axis));
      }
    }
    // Inside a shape whose element count fits in int64, so this cannot overflow.
    const int64_t box_numel = *checked_numel(c.box.length.begin(), c.box.length.end());
    if (r.flat_start() != -1 || r.flat_stop() != -1) {
      const FlatRange flat{r.flat_start(), r.flat_stop()};
      if (flat.start < 0 || flat.start >= flat.stop || flat.stop > box_numel) {
        fail(fmt::format("{}: flat range [{}, {}) is empty or outside the box's {} elements", where(), flat.start,
                         flat.stop, box_numel));
      }
      c.flat = flat;
    }
    c.file = r.file();
    c.byte_offset = r.byte_offset();
    c.byte_length = r.byte_length();
    c.block_checksums = budget_.copy_vector(r.block_checksums());
    const auto expected_bytes = checked_mul(static_cast<uint64_t>(c.stored_numel()), t.element_size());
    if (!expected_bytes || *expected_bytes != c.byte_length) {
      fail(fmt::format("{}: byte length is {}, but {} elements of {} take {} bytes", where(), c.byte_length,
                       c.stored_numel(), stored_dtype_name(t),
                       expected_bytes ? std::to_string(*expected_bytes) : std::string("more than 2^64")));
    }
    check_storage(where, c.file, c.byte_offset, c.byte_length, c.block_checksums.size(), r.file_extent());
    return c;
  }

  std::vector<ObjectRecord> decode_objects() {
    std::vector<ObjectRecord> objects;
    const auto* records = root_.objects();
    objects.reserve(length_of(records));
    std::string previous_key;
    for (size_t i = 0; records != nullptr && i < records->size(); ++i) {
      objects.push_back(decode_object(*records->Get(static_cast<flatbuffers::uoffset_t>(i))));
      std::string unique_key = objects.back().unique_key();
      if (i > 0 && !(previous_key < unique_key)) {
        fail(fmt::format("object keys are not sorted and unique: '{}' is followed by '{}'", previous_key, unique_key));
      }
      previous_key = std::move(unique_key);
    }
    return objects;
  }

  ObjectRecord decode_object(const fb::ObjectRecord& r) {
    budget_.charge_table();
    budget_.charge_string(r.key());
    ObjectRecord o;
    o.key = std::string(view(r.key()));
    if (o.key.empty()) fail("an object record has an empty key");
    o.global_shape = budget_.copy_vector(r.global_shape());
    o.global_offset = budget_.copy_vector(r.global_offset());
    bool inside = o.global_shape.size() == o.global_offset.size();
    for (size_t axis = 0; inside && axis < o.global_shape.size(); ++axis) {
      inside = o.global_offset[axis] >= 0 && o.global_offset[axis] < o.global_shape[axis];
    }
    if (!inside) {
      fail(fmt::format("object '{}': shard offset {} is not inside the shard grid {}", o.key,
                       to_string(o.global_offset), to_string(o.global_shape)));
    }
    o.file = r.file();
    o.byte_offset = r.byte_offset();
    o.byte_length = r.byte_length();
    o.block_checksums = budget_.copy_vector(r.block_checksums());
    const auto where = [&] { return fmt::format("object '{}'", o.unique_key()); };
    check_storage(where, o.file, o.byte_offset, o.byte_length, o.block_checksums.size(), r.file_extent());
    return o;
  }

  // Each byte of a data file belongs to one chunk or object: records that
  // share bytes would let a small checkpoint claim any amount of data, and
  // are never written.
  void check_disjoint_bytes(const CheckpointMetadata& m) const {
    struct Range {
      uint32_t file;
      uint64_t begin, end;
      bool operator<(const Range& o) const { return file != o.file ? file < o.file : begin < o.begin; }
    };
    std::vector<Range> ranges;
    for (const TensorRecord& t : m.tensors) {
      for (const ChunkRecord& c : t.chunks) {
        if (c.byte_length > 0) ranges.push_back({c.file, c.byte_offset, c.byte_offset + c.byte_length});
      }
    }
    for (const ObjectRecord& o : m.objects) {
      if (o.byte_length > 0) ranges.push_back({o.file, o.byte_offset, o.byte_offset + o.byte_length});
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      const Range& a = ranges[i - 1];
      const Range& b = ranges[i];
      if (a.file == b.file && b.begin < a.end) {
        fail(fmt::format("two records share bytes [{}, {}) of '{}'", b.begin, std::min(a.end, b.end),
                         m.files[a.file].path));
      }
    }
  }

  const fb::CheckpointMetadata& root_;
  std::string_view buffer_;
  const std::string& origin_;
  fb_support::ExpansionBudget budget_;
  FileResolver* files_ = nullptr;
};

// Where a record of `extent` begins in a file of `file_size` bytes, and
// whether it lies inside [floor, file_size).
std::optional<uint64_t> extent_begin(const fb::Extent& extent, uint64_t floor, uint64_t file_size) {
  if (extent.from_end() > file_size || extent.size() > extent.from_end()) return std::nullopt;
  const uint64_t begin = file_size - extent.from_end();
  if (begin < floor) return std::nullopt;
  return begin;
}

// Bytes [begin, begin + size) of the file, read alone, stored at their
// alignment in the file: FlatBuffers checks a scalar's alignment from the
// start of the buffer it verifies, here the 8-byte boundary below `begin`.
class RecordBytes {
 public:
  RecordBytes(const LazyMetadata::RangeRead& read, uint64_t begin, uint32_t size)
      : begin_(begin), pad_(begin % alignof(uint64_t)), storage_((pad_ + size + 7) / 8 + 1, 0), size_(size) {
    read(begin, size, bytes());
  }
  const uint8_t* bytes() const { return reinterpret_cast<const uint8_t*>(storage_.data()) + pad_; }
  uint64_t xxh3() const { return io::xxh3(bytes(), size_); }
  // The address of file offset `offset` (inside the record).
  const uint8_t* at(uint64_t offset) const { return bytes() + (offset - begin_); }
  // Whether `check` passes with a verifier over these bytes alone, both
  // from the aligned start (alignment) and from `begin` (bounds: the bytes
  // below it belong to another record, here zeros). A verifier wants every
  // item to end before its buffer does: the buffers reach one byte past the
  // record (a zero in storage), so that an item may end where the record does.
  template <typename Check>
  bool verifies(const Check& check) const {
    const auto* base = reinterpret_cast<const uint8_t*>(storage_.data());
    const size_t aligned_size = pad_ + size_ + 1;
    flatbuffers::Verifier aligned(base, aligned_size, fb_support::verifier_options(aligned_size, kMaxVerifierDepth));
    flatbuffers::Verifier::Options options = fb_support::verifier_options(size_ + 1, kMaxVerifierDepth);
    options.check_alignment = false;
    flatbuffers::Verifier bounded(bytes(), size_ + 1, options);
    return check(aligned) && check(bounded);
  }

 private:
  uint8_t* bytes() { return reinterpret_cast<uint8_t*>(storage_.data()) + pad_; }

  uint64_t begin_;
  uint64_t pad_;
  std::vector<uint64_t> storage_;  // one word more: never empty
  uint32_t size_;
};

// A RangeRead over bytes in memory.
LazyMetadata::RangeRead memory_reader(std::string_view bytes) {
  return [bytes](uint64_t offset, uint64_t length, uint8_t* out) {
    if (length != 0) std::memcpy(out, bytes.data() + offset, length);
  };
}

// The table of a record whose bytes `bytes` (at `begin` in the file) begin
// with its vtable: a record written alone (format 3).
std::optional<uint64_t> table_after_vtable(const uint8_t* bytes, uint64_t size) {
  if (size < sizeof(flatbuffers::voffset_t)) return std::nullopt;
  const auto vtable_size = flatbuffers::ReadScalar<flatbuffers::voffset_t>(bytes);
  if (vtable_size < 2 * sizeof(flatbuffers::voffset_t) || vtable_size % 2 != 0 || vtable_size >= size) {
    return std::nullopt;
  }
  return vtable_size;
}

bool same_extent(const fb::Extent& a, const fb::Extent& b) {
  return a.from_end() == b.from_end() && a.size() == b.size() && a.xxh3() == b.xxh3();
}

// A file record is a table, its vtable and a path: far less than this.
constexpr uint32_t kMaxFileRecordBytes = 64 << 10;

// Where the file list (format 3) begins, checked: it ends the file.
std::optional<uint64_t> file_list_begin(const fb::CheckpointMetadata& root, uint64_t head, uint64_t file_size) {
  const fb::Extent* list = root.file_list();
  if (list == nullptr || list->size() != list->from_end() || list->size() < sizeof(flatbuffers::uoffset_t)) {
    return std::nullopt;
  }
  return extent_begin(*list, head, file_size);
}

// The tensor records tile the bytes between the head and the file list, in
// order (the first written lies last): no record shares bytes with another,
// so reading or hashing every record costs the file once.
bool tensor_records_tile(const fb::CheckpointMetadata& root) {
  const fb::Extent* list = root.file_list();
  if (list == nullptr) return false;
  uint64_t end = list->from_end();  // of the previous record, from the end of the file
  for (size_t i = 0; i < length_of(root.tensor_extents()); ++i) {
    const fb::Extent* extent = root.tensor_extents()->Get(static_cast<flatbuffers::uoffset_t>(i));
    if (extent->size() == 0 || uint64_t{extent->from_end()} - extent->size() != end) return false;
    end = extent->from_end();
  }
  return end == root.records_from_end();
}

// The FileRecord of a record read alone, verified, or nullptr.
const fb::FileRecord* file_record_alone(const RecordBytes& bytes, uint64_t begin, uint32_t size) {
  const std::optional<uint64_t> vtable = table_after_vtable(bytes.at(begin), size);
  if (!vtable) return nullptr;
  const auto* table = reinterpret_cast<const fb::FileRecord*>(bytes.at(begin + *vtable));
  return bytes.verifies([&](flatbuffers::Verifier& v) { return v.VerifyTable(table); }) ? table : nullptr;
}

// The files of a buffer decoded whole. In format 3 each chunk's extent must
// be where files[index] lies, with its XXH3: a reader of records alone
// would otherwise read another file record than this list holds.
class ListedFiles : public FileResolver {
 public:
  ListedFiles(const MetadataDecoder& decoder, const std::vector<FileRecord>& files)
      : decoder_(decoder), files_(files), checked_(decoder.root().format_version() >= 3 ? files.size() : 0) {}

  uint32_t count() const override { return static_cast<uint32_t>(files_.size()); }

  const FileRecord& resolve(uint32_t index, const fb::Extent* extent) override {
    if (index < checked_.size()) check_extent(index, *extent);
    return files_[index];
  }

 private:
  // The records were written one after another, file 0 last in the file:
  // record i lies from its vtable up to record i - 1 (the end, for 0), so
  // the extents tile the file list and hashing them costs it once.
  void check_extent(uint32_t index, const fb::Extent& extent) {
    std::optional<fb::Extent>& seen = checked_[index];
    if (seen) {
      if (!same_extent(*seen, extent)) decoder_.fail(fmt::format("records disagree on where file {} lies", index));
      return;
    }
    const std::string_view buffer = decoder_.buffer();
    const auto* base = reinterpret_cast<const uint8_t*>(buffer.data());
    const auto vtable_of = [&](uint32_t i) {
      const auto* table =
          reinterpret_cast<const uint8_t*>(decoder_.root().files()->Get(static_cast<flatbuffers::uoffset_t>(i)));
      return static_cast<uint64_t>(table - flatbuffers::ReadScalar<flatbuffers::soffset_t>(table) - base);
    };
    const uint64_t begin = vtable_of(index);
    const uint64_t end = index == 0 ? buffer.size() : vtable_of(index - 1);
    const std::optional<uint64_t> recorded = extent_begin(extent, 0, buffer.size());
    bool valid =
        recorded == begin && end > begin && extent.size() == end - begin && extent.size() <= kMaxFileRecordBytes;
    if (valid) {
      const RecordBytes bytes(memory_reader(buffer), begin, extent.size());
      valid = bytes.xxh3() == extent.xxh3() && file_record_alone(bytes, begin, extent.size()) != nullptr;
    }
    if (!valid) decoder_.fail(fmt::format("the index says file {} lies elsewhere than it does", index));
    seen = extent;
  }

  const MetadataDecoder& decoder_;
  const std::vector<FileRecord>& files_;
  std::vector<std::optional<fb::Extent>> checked_;  // format 3: the extent checked per file
};

CheckpointMetadata MetadataDecoder::decode_records(bool with_tensors, bool listed) {
  CheckpointMetadata m;
  m.format_version = check_version(root_.format_version());
  m.world_size = root_.world_size();
  if (m.world_size < 1) fail(fmt::format("world_size is {}, it must be at least 1", m.world_size));
  m.checksum_block_size = root_.checksum_block_size();
  if (m.checksum_block_size > StorageIndex::kMaxChecksumBlockSize) {
    fail(fmt::format("checksum blocks of {} bytes, more than the {} a writer uses", m.checksum_block_size,
                     StorageIndex::kMaxChecksumBlockSize));
  }
  std::optional<ListedFiles> own;
  FileResolver* const outer = files_;
  if (listed) {
    m.files = decode_files(root_.files());
    files_ = &own.emplace(*this, m.files);
  }
  try {
    if (with_tensors) {
      m.tensors = decode_tensors();
      if (m.format_version >= 3) check_index(m.tensors);
    }
    m.objects = decode_objects();
  } catch (...) {
    files_ = outer;
    throw;
  }
  files_ = outer;
  if (with_tensors) check_disjoint_bytes(m);
  m.common_file = std::string(view(root_.common_file()));
  if (!m.common_file.empty()) check_path(m.common_file, "the common state file");
  m.layout_name = std::string(view(root_.layout_name()));
  m.layout_fingerprint = std::string(view(root_.layout_fingerprint()));
  m.layout_schema = std::string(view(root_.layout_schema()));
  budget_.charge(m.common_file.size() + m.layout_name.size() + m.layout_fingerprint.size() + m.layout_schema.size());
  m.plan_hashes = budget_.copy_vector(root_.plan_hashes());
  if (!m.plan_hashes.empty() && m.plan_hashes.size() != static_cast<size_t>(m.world_size)) {
    fail(fmt::format("{} plan hashes recorded for a world of {} ranks", m.plan_hashes.size(), m.world_size));
  }
  m.writer_policy = std::string(view(root_.writer_policy()));
  budget_.charge(m.writer_policy.size());
  m.name_mappings = decode_mappings();
  return m;
}

// Format 3, decoded whole: the index says what the records say (keys, and
// where each record lies with its XXH3), so that a reader of records alone
// reads the same checkpoint. Linear in the buffer.
void MetadataDecoder::check_index(const std::vector<TensorRecord>& tensors) const {
  const auto* keys = root_.tensor_keys();
  const auto* extents = root_.tensor_extents();
  if (length_of(keys) != tensors.size() || length_of(extents) != tensors.size()) {
    fail(fmt::format("the index lists {} keys and {} extents for {} tensor records", length_of(keys),
                     length_of(extents), tensors.size()));
  }
  const uint64_t head = buffer_.size() - std::min<uint64_t>(root_.records_from_end(), buffer_.size());
  const auto* base = reinterpret_cast<const uint8_t*>(buffer_.data());
  if (!tensor_records_tile(root_)) fail("the index's tensor records overlap or leave gaps");
  // Each record, and the file list, must read alone as a reader by parts
  // reads it (verified within its own bytes), with the XXH3 the index says.
  const LazyMetadata::RangeRead memory = memory_reader(buffer_);
  const std::optional<uint64_t> list_begin = file_list_begin(root_, head, buffer_.size());
  const auto* files = reinterpret_cast<const uint8_t*>(root_.files());
  const bool list_valid = [&] {
    if (!list_begin || base + *list_begin != files) return false;
    const RecordBytes list(memory, *list_begin, root_.file_list()->size());
    const auto* vector =
        reinterpret_cast<const flatbuffers::Vector<flatbuffers::Offset<fb::FileRecord>>*>(list.at(*list_begin));
    return list.xxh3() == root_.file_list()->xxh3() && list.verifies([&](flatbuffers::Verifier& v) {
      return v.VerifyVector(vector) && v.VerifyVectorOfTables(vector);
    });
  }();
  if (!list_valid) fail("the index says the file list lies elsewhere than it does");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto at = static_cast<flatbuffers::uoffset_t>(i);
    if (view(keys->Get(at)) != tensors[i].key) {
      fail(fmt::format("the index names tensor record {} '{}', the record says '{}'", i, view(keys->Get(at)),
                       tensors[i].key));
    }
    const fb::Extent& extent = *extents->Get(at);
    const auto table = static_cast<uint64_t>(reinterpret_cast<const uint8_t*>(root_.tensors()->Get(at)) - base);
    const std::optional<uint64_t> begin = extent_begin(extent, head, buffer_.size());
    bool valid = begin && table >= *begin && table - *begin + sizeof(flatbuffers::soffset_t) <= extent.size();
    if (valid) {
      const RecordBytes record(memory, *begin, extent.size());
      const auto* alone = reinterpret_cast<const fb::TensorRecord*>(record.at(table));
      valid = record.xxh3() == extent.xxh3() &&
              record.verifies([&](flatbuffers::Verifier& v) { return v.VerifyTable(alone); });
    }
    if (!valid) fail(fmt::format("the index says tensor '{}' lies elsewhere than it does", tensors[i].key));
  }
}

}  // namespace

std::string ObjectRecord::unique_key() const {
  return fmt::format("{}/shard_{}_{}", key, fmt::join(global_offset, "."), fmt::join(global_shape, "."));
}

size_t TensorRecord::element_size() const {
  return unrepresentable ? unrepresentable->element_size : dtype_size(dtype);
}

const TensorRecord* StorageIndex::find_tensor(const std::string& key) const {
  const auto it = std::lower_bound(tensors.begin(), tensors.end(), key,
                                   [](const TensorRecord& t, const std::string& k) { return t.key < k; });
  return it != tensors.end() && it->key == key ? &*it : nullptr;
}

std::string encode_metadata(const CheckpointMetadata& metadata) {
  // The estimate is only the initial reservation; the builder grows as needed.
  const uint64_t reserve = std::min<uint64_t>(estimated_size(metadata), uint64_t{1} << 30);
  RecordBuilder fbb(static_cast<size_t>(reserve));
  // Format 3 lays the file out as [head][tensor records][file records], each
  // record's bytes together (see checkpoint.fbs); older ones as they were.
  const bool indexed = metadata.format_version >= 3;

  std::vector<flatbuffers::Offset<fb::FileRecord>> files;
  std::vector<fb::Extent> file_extents;
  files.reserve(metadata.files.size());
  for (const auto& f : metadata.files) {
    ensure_room(fbb, 32 + f.path.size(), "the checkpoint metadata");
    fbb.start_record();
    const uint32_t before = fbb.GetSize();
    files.push_back(fb::CreateFileRecord(fbb, fbb.CreateString(f.path), f.size, f.writer_rank));
    if (indexed) file_extents.push_back(extent_since(fbb, before));
  }
  ensure_room(fbb, 4 * files.size(), "the checkpoint metadata");
  const auto files_vec = fbb.CreateVector(files);
  const fb::Extent file_list = extent_since(fbb, 0);
  const std::vector<fb::Extent>* file_index = indexed ? &file_extents : nullptr;

  std::vector<flatbuffers::Offset<fb::TensorRecord>> tensors;
  std::vector<fb::Extent> tensor_extents;
  tensors.reserve(metadata.tensors.size());
  for (const auto& t : metadata.tensors) {
    fbb.start_record();
    const uint32_t before = fbb.GetSize();
    tensors.push_back(encode_tensor(fbb, t, file_index));
    if (indexed) tensor_extents.push_back(extent_since(fbb, before));
  }
  const uint32_t records_from_end = fbb.GetSize();  // the head is everything written after this
  fbb.start_record();                               // and shares no vtable with a record

  std::vector<flatbuffers::Offset<fb::ObjectRecord>> objects;
  objects.reserve(metadata.objects.size());
  for (const auto& o : metadata.objects) objects.push_back(encode_object(fbb, o, file_index));
  ensure_room(fbb,
              4 * (objects.size() + tensors.size()) + metadata.common_file.size() + metadata.layout_name.size() +
                  metadata.layout_fingerprint.size() + metadata.layout_schema.size(),
              "the checkpoint metadata");
  const auto objects_vec = fbb.CreateVector(objects);
  const auto tensors_vec = fbb.CreateVector(tensors);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> keys_vec = 0;
  flatbuffers::Offset<flatbuffers::Vector<const fb::Extent*>> extents_vec = 0;
  if (indexed) {
    std::vector<flatbuffers::Offset<flatbuffers::String>> keys;
    keys.reserve(metadata.tensors.size());
    for (const auto& t : metadata.tensors) {
      ensure_room(fbb, 8 + t.key.size() + sizeof(fb::Extent), "the checkpoint metadata");
      keys.push_back(fbb.CreateString(t.key));
    }
    keys_vec = fbb.CreateVector(keys);
    extents_vec = fbb.CreateVectorOfStructs(tensor_extents);
  }
  const auto common = metadata.common_file.empty() ? 0 : fbb.CreateString(metadata.common_file);
  const auto name = fbb.CreateString(metadata.layout_name);
  const auto fingerprint = fbb.CreateString(metadata.layout_fingerprint);
  const auto schema = fbb.CreateString(metadata.layout_schema);
  ensure_room(fbb, 8 * metadata.plan_hashes.size() + metadata.writer_policy.size(), "the checkpoint metadata");
  const auto hashes = metadata.plan_hashes.empty() ? 0 : fbb.CreateVector(metadata.plan_hashes);
  const auto policy = metadata.writer_policy.empty() ? 0 : fbb.CreateString(metadata.writer_policy);
  std::vector<flatbuffers::Offset<fb::NameMapping>> mappings;
  for (const NameMapping& m : metadata.name_mappings) mappings.push_back(encode_mapping(fbb, m));
  const auto mappings_vec = mappings.empty() ? 0 : fbb.CreateVector(mappings);
  const auto root = fb::CreateCheckpointMetadata(
      fbb, metadata.format_version, metadata.world_size, metadata.checksum_block_size, tensors_vec, objects_vec,
      files_vec, common, name, fingerprint, schema, hashes, policy, mappings_vec, keys_vec, extents_vec,
      indexed ? static_cast<uint32_t>(files.size()) : 0, indexed ? records_from_end : 0,
      indexed ? &file_list : nullptr);
  fb::FinishCheckpointMetadataBuffer(fbb, root);
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

uint64_t metadata_head_bytes(std::string_view encoded) {
  // Our own buffer, just encoded: read, not verified.
  const auto* root = fb::GetCheckpointMetadata(encoded.data());
  return root->format_version() >= 3 ? encoded.size() - root->records_from_end() : encoded.size();
}

CheckpointMetadata decode_metadata(std::string_view bytes, const std::string& origin) {
  const auto invalid = [&] {
    return CorruptionError(
        fmt::format("{}: not a valid distckpt metadata buffer (failed FlatBuffers verification)", origin), origin);
  };
  if (bytes.size() >= fb_support::kMaxBufferSize) throw invalid();
  const fb_support::AlignedBytes aligned(bytes);
  flatbuffers::Verifier verifier(aligned.data(), aligned.size(),
                                 fb_support::verifier_options(aligned.size(), kMaxVerifierDepth));
  if (!fb::VerifyCheckpointMetadataBuffer(verifier)) throw invalid();
  const std::string_view buffer(reinterpret_cast<const char*>(aligned.data()), aligned.size());
  const auto& root = *fb::GetCheckpointMetadata(aligned.data());
  CheckpointMetadata m = MetadataDecoder(root, buffer, buffer.size(), origin).decode();
  // Format 3: what a reader of the head alone verifies lies in the head.
  if (m.format_version >= 3) {
    const size_t head = aligned.size() - std::min<size_t>(root.records_from_end(), aligned.size());
    flatbuffers::Verifier in_head(aligned.data(), head, fb_support::verifier_options(head, kMaxVerifierDepth));
    if (!verify_header(root, in_head, /*head_only=*/true)) {
      throw CorruptionError(
          fmt::format("{}: the head refers to bytes outside it; the checkpoint metadata is corrupted", origin), origin);
    }
  }
  return m;
}

namespace {

// The root table verified like the generated Verify, but for the records a
// reader decodes when it first needs them: the tensor records (only the
// vector of their offsets is checked here) and, for a format 3 head read
// alone (`head_only`), the file list, which lies outside the head. Keep in
// step with checkpoint.fbs.
bool verify_header(const fb::CheckpointMetadata& root, flatbuffers::Verifier& v, bool head_only) {
  using M = fb::CheckpointMetadata;
  // Generated tables hide their flatbuffers::Table base; the bytes are one.
  const auto& t = *reinterpret_cast<const flatbuffers::Table*>(&root);
  // Read by parts, only the offset to the file list is in the head. (Called
  // once the table's start is verified.)
  const auto files = [&] {
    return head_only
               ? t.VerifyField<flatbuffers::uoffset_t>(v, M::VT_FILES, 4)
               : t.VerifyOffset(v, M::VT_FILES) && v.VerifyVector(root.files()) && v.VerifyVectorOfTables(root.files());
  };
  return t.VerifyTableStart(v) && t.VerifyField<uint32_t>(v, M::VT_FORMAT_VERSION, 4) &&
         t.VerifyField<int32_t>(v, M::VT_WORLD_SIZE, 4) && t.VerifyField<uint64_t>(v, M::VT_CHECKSUM_BLOCK_SIZE, 8) &&
         t.VerifyOffset(v, M::VT_TENSORS) && v.VerifyVector(root.tensors()) && t.VerifyOffset(v, M::VT_OBJECTS) &&
         v.VerifyVector(root.objects()) && v.VerifyVectorOfTables(root.objects()) && files() &&
         t.VerifyOffset(v, M::VT_COMMON_FILE) && v.VerifyString(root.common_file()) &&
         t.VerifyOffset(v, M::VT_LAYOUT_NAME) && v.VerifyString(root.layout_name()) &&
         t.VerifyOffset(v, M::VT_LAYOUT_FINGERPRINT) && v.VerifyString(root.layout_fingerprint()) &&
         t.VerifyOffset(v, M::VT_LAYOUT_SCHEMA) && v.VerifyString(root.layout_schema()) &&
         t.VerifyOffset(v, M::VT_PLAN_HASHES) && v.VerifyVector(root.plan_hashes()) &&
         t.VerifyOffset(v, M::VT_WRITER_POLICY) && v.VerifyString(root.writer_policy()) &&
         t.VerifyOffset(v, M::VT_NAME_MAPPINGS) && v.VerifyVector(root.name_mappings()) &&
         v.VerifyVectorOfTables(root.name_mappings()) && t.VerifyOffset(v, M::VT_TENSOR_KEYS) &&
         v.VerifyVector(root.tensor_keys()) && v.VerifyVectorOfStrings(root.tensor_keys()) &&
         t.VerifyOffset(v, M::VT_TENSOR_EXTENTS) && v.VerifyVector(root.tensor_extents()) &&
         (root.tensor_extents() == nullptr ||  // structs of 8-byte values, read in place
          reinterpret_cast<uintptr_t>(root.tensor_extents()->Data()) % alignof(uint64_t) == 0) &&
         t.VerifyField<uint32_t>(v, M::VT_FILE_COUNT, 4) && t.VerifyField<uint32_t>(v, M::VT_RECORDS_FROM_END, 4) &&
         t.VerifyField<fb::Extent>(v, M::VT_FILE_LIST, 8) && v.EndTable();
}

// Only the key of a record, for a binary search's probe.
bool verify_key(const fb::TensorRecord& record, flatbuffers::Verifier& v) {
  const auto& t = *reinterpret_cast<const flatbuffers::Table*>(&record);
  return t.VerifyTableStart(v) && t.VerifyOffset(v, fb::TensorRecord::VT_KEY) && v.VerifyString(record.key()) &&
         v.EndTable();
}

// The files of a format 3 head read alone: each read where the first chunk
// (or object) that names it says, checked against that XXH3, then kept; a
// later chunk must name the same extent.
class RangedFiles : public FileResolver {
 public:
  RangedFiles(const LazyMetadata::RangeRead& read, uint64_t head_bytes, uint64_t file_size,
              std::atomic<uint64_t>& bytes_read)
      : read_(read), head_bytes_(head_bytes), file_size_(file_size), bytes_read_(bytes_read) {}
  void attach(MetadataDecoder& decoder) { decoder_ = &decoder; }

  uint32_t count() const override { return decoder_->root().file_count(); }

  const FileRecord& resolve(uint32_t index, const fb::Extent* extent) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = files_.find(index);
    if (it != files_.end()) {
      if (!same_extent(it->second.extent, *extent)) {
        decoder_->fail(fmt::format("records disagree on where file {} lies", index));
      }
      return it->second.record;
    }
    // Inside the file list (past its vector's length), no larger than a
    // file record can be, and no other file's.
    const std::optional<uint64_t> list = file_list_begin(decoder_->root(), head_bytes_, file_size_);
    const std::optional<uint64_t> begin = list ? extent_begin(*extent, *list + 4, file_size_) : std::nullopt;
    if (!begin || extent->size() > kMaxFileRecordBytes || !taken_.emplace(extent->from_end(), index).second) {
      decoder_->fail(fmt::format("file {}'s record lies outside the file list or over another's", index));
    }
    const RecordBytes bytes(read_, *begin, extent->size());
    bytes_read_ += extent->size();
    if (bytes.xxh3() != extent->xxh3()) {
      decoder_->fail(fmt::format("checksum mismatch in the record of file {} (bytes {}..{})", index, *begin,
                                 *begin + extent->size()));
    }
    const fb::FileRecord* table = file_record_alone(bytes, *begin, extent->size());
    if (table == nullptr) decoder_->fail(fmt::format("the record of file {} fails FlatBuffers verification", index));
    Entry& entry = files_.try_emplace(index, Entry{*extent, decoder_->decode_file(*table, index)}).first->second;
    return entry.record;
  }

  // A file resolved so far.
  const FileRecord* find(uint32_t index) const {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = files_.find(index);
    return it == files_.end() ? nullptr : &it->second.record;
  }

 private:
  struct Entry {
    fb::Extent extent;
    FileRecord record;
  };
  const LazyMetadata::RangeRead& read_;
  uint64_t head_bytes_, file_size_;
  std::atomic<uint64_t>& bytes_read_;
  MetadataDecoder* decoder_ = nullptr;
  mutable std::mutex mutex_;
  std::unordered_map<uint32_t, Entry> files_;     // nodes stay put: references are handed out
  std::unordered_map<uint32_t, uint32_t> taken_;  // from_end -> the file whose record lies there
};

}  // namespace

struct LazyMetadata::State {
  // `r` null: `b` is the whole file (`size` is ignored).
  State(std::string b, uint64_t size, RangeRead r, std::string o)
      : bytes(std::move(b)),
        file_size(r ? size : bytes.size()),
        read(std::move(r)),
        origin(std::move(o)),
        aligned(bytes),
        verifier(aligned.data(), aligned.size(), fb_support::verifier_options(aligned.size(), kMaxVerifierDepth)),
        bytes_read(bytes.size()),
        ranged(read, bytes.size(), file_size, bytes_read) {}
  std::string bytes;  // the whole file, or a format 3 file's head
  uint64_t file_size;
  RangeRead read;  // set when `bytes` is the head
  std::string origin;
  fb_support::AlignedBytes aligned;
  // One verifier for every record decoded: its table count is cumulative,
  // so records that alias each other cannot make verification quadratic.
  flatbuffers::Verifier verifier;
  std::atomic<uint64_t> bytes_read;
  const fb::CheckpointMetadata* root = nullptr;
  std::optional<MetadataDecoder> decoder;
  CheckpointMetadata header;
  std::optional<ListedFiles> listed;  // opened from the whole file
  RangedFiles ranged;                 // opened from the head
  // The first record that failed: the buffer is corrupt, and the verifier's
  // depth and the budget are spent, so every later decode reports it.
  std::exception_ptr failed;

  flatbuffers::Verifier probe_verifier() const {
    return flatbuffers::Verifier(aligned.data(), aligned.size(), fb_support::verifier_options(aligned.size(), 4));
  }
  const fb::TensorRecord* record(size_t i) const {
    return root->tensors()->Get(static_cast<flatbuffers::uoffset_t>(i));
  }
  bool indexed() const { return root->format_version() >= 3; }
  // Format 3 opened from the head: record `i` read alone and verified.
  const fb::TensorRecord* read_record(size_t i, std::optional<RecordBytes>& holder);
  std::vector<FileRecord> read_file_list();

  std::once_flag file_list_read;
  std::vector<FileRecord> file_list;  // read_file_list()'s, once asked for
};

namespace {

std::string checked_size(std::string bytes, const std::string& origin) {
  if (bytes.size() >= fb_support::kMaxBufferSize) {
    throw CorruptionError(
        fmt::format("{}: not a valid distckpt metadata buffer (failed FlatBuffers verification)", origin), origin);
  }
  return bytes;
}

}  // namespace

const fb::TensorRecord* LazyMetadata::State::read_record(size_t i, std::optional<RecordBytes>& holder) {
  const auto at = static_cast<flatbuffers::uoffset_t>(i);
  const fb::Extent& extent = *root->tensor_extents()->Get(at);
  const std::optional<uint64_t> begin = extent_begin(extent, aligned.size(), file_size);
  // Where the head's vector of offsets says the record's table is.
  const auto* slot = reinterpret_cast<const uint8_t*>(root->tensors()->Data()) + 4 * uint64_t{i};
  const uint64_t table = static_cast<uint64_t>(slot - aligned.data()) + flatbuffers::ReadScalar<uint32_t>(slot);
  if (!begin || table < *begin || table - *begin + sizeof(flatbuffers::soffset_t) > extent.size()) {
    decoder->fail(fmt::format("the index says tensor record {} lies outside the file's records", i));
  }
  const RecordBytes& bytes = holder.emplace(read, *begin, extent.size());
  bytes_read += extent.size();
  if (bytes.xxh3() != extent.xxh3()) {
    decoder->fail(fmt::format("checksum mismatch in the record of tensor '{}' (bytes {}..{})",
                              view(root->tensor_keys()->Get(at)), *begin, *begin + extent.size()));
  }
  // Each record gets its own verifiers: its bytes are its own buffer.
  const auto* record = reinterpret_cast<const fb::TensorRecord*>(bytes.at(table));
  if (!bytes.verifies([&](flatbuffers::Verifier& v) { return v.VerifyTable(record); })) {
    decoder->fail(fmt::format("tensor record {} fails FlatBuffers verification", i));
  }
  return record;
}

std::vector<FileRecord> LazyMetadata::State::read_file_list() {
  const fb::Extent* extent = root->file_list();
  const std::optional<uint64_t> begin = file_list_begin(*root, aligned.size(), file_size);
  // Where the head's root says the vector of files is.
  const auto* field =
      reinterpret_cast<const uint8_t*>(root) +
      reinterpret_cast<const flatbuffers::Table*>(root)->GetOptionalFieldOffset(fb::CheckpointMetadata::VT_FILES);
  const uint64_t vector =
      field == reinterpret_cast<const uint8_t*>(root)
          ? 0
          : static_cast<uint64_t>(field - aligned.data()) + flatbuffers::ReadScalar<uint32_t>(field);
  if (!begin || vector != *begin) decoder->fail("the index says the file list lies outside the file");
  const RecordBytes bytes(read, *begin, extent->size());
  bytes_read += extent->size();
  if (bytes.xxh3() != extent->xxh3()) {
    decoder->fail(fmt::format("checksum mismatch in the file list (bytes {}..{})", *begin, file_size));
  }
  const auto* files =
      reinterpret_cast<const flatbuffers::Vector<flatbuffers::Offset<fb::FileRecord>>*>(bytes.at(vector));
  if (!bytes.verifies(
          [&](flatbuffers::Verifier& v) { return v.VerifyVector(files) && v.VerifyVectorOfTables(files); })) {
    decoder->fail("the file list fails FlatBuffers verification");
  }
  return decoder->decode_files(files);
}

LazyMetadata::LazyMetadata(std::string bytes, std::string origin)
    : LazyMetadata(std::move(bytes), 0, nullptr, std::move(origin)) {}

LazyMetadata::LazyMetadata(std::string head, uint64_t file_size, RangeRead read, std::string origin)
    : state_(std::make_unique<State>(checked_size(std::move(head), origin), file_size, std::move(read), origin)) {
  State& s = *state_;
  file_size = s.file_size;
  const auto invalid = [&] {
    return CorruptionError(
        fmt::format("{}: not a valid distckpt metadata buffer (failed FlatBuffers verification)", s.origin), s.origin);
  };
  if (file_size >= fb_support::kMaxBufferSize || s.aligned.size() > file_size) throw invalid();
  flatbuffers::Verifier v(s.aligned.data(), s.aligned.size(),
                          fb_support::verifier_options(s.aligned.size(), kMaxVerifierDepth));
  // What VerifyBuffer checks before the root table: room, identifier, root offset.
  const bool framed = s.aligned.size() >= sizeof(flatbuffers::uoffset_t) + flatbuffers::kFileIdentifierLength &&
                      fb::CheckpointMetadataBufferHasIdentifier(s.aligned.data()) && v.VerifyOffset(0) != 0;
  if (!framed) throw invalid();
  s.root = fb::GetCheckpointMetadata(s.aligned.data());
  if (!verify_header(*s.root, v, /*head_only=*/s.read != nullptr)) throw invalid();
  const std::string_view buffer(reinterpret_cast<const char*>(s.aligned.data()), s.aligned.size());
  s.decoder.emplace(*s.root, buffer, file_size, s.origin);
  if (s.read) {
    // A head read alone: it must be a format 3 head, exactly as long as the
    // file says (the marker recorded both), and every record after it.
    if (s.decoder->check_version(s.root->format_version()) < 3) {
      s.decoder->fail(
          fmt::format("it says format {}, but the commit marker says format 3 or later (read by parts): the two files "
                      "disagree (mixed from two checkpoints?); load an intact copy",
                      s.root->format_version()));
    }
    if (uint64_t{s.root->records_from_end()} != file_size - s.aligned.size()) {
      s.decoder->fail(fmt::format(
          "the commit marker records a head of {} bytes of {}, but the file's records take its last {}: the two "
          "files disagree (mixed from two checkpoints?); load an intact copy",
          s.aligned.size(), file_size, s.root->records_from_end()));
    }
    s.ranged.attach(*s.decoder);
    s.decoder->set_files(&s.ranged);
    s.header = s.decoder->decode_header(false);
  } else {
    s.header = s.decoder->decode_header(true);
    s.decoder->set_files(&s.listed.emplace(*s.decoder, s.header.files));
  }
  const size_t count = tensor_count();
  if (s.indexed() && (length_of(s.root->tensor_keys()) != count || length_of(s.root->tensor_extents()) != count)) {
    s.decoder->fail(fmt::format("the index lists {} keys and {} extents for {} tensor records",
                                length_of(s.root->tensor_keys()), length_of(s.root->tensor_extents()), count));
  }
  if (s.indexed() && (!tensor_records_tile(*s.root) || !file_list_begin(*s.root, 0, file_size))) {
    s.decoder->fail("the index's records overlap, leave gaps or leave the file");
  }
  // Lookups binary-search the keys: check their order now (the keys alone,
  // no record decoded), so that a damaged order is corruption, not a key
  // that seems missing.
  std::string_view previous;
  for (size_t i = 0; i < count; ++i) {
    const std::string_view key = key_at(i);
    if (i > 0 && !(previous < key)) {
      s.decoder->fail(fmt::format("tensor keys are not sorted and unique: '{}' is followed by '{}'", previous, key));
    }
    previous = key;
  }
}

LazyMetadata::~LazyMetadata() = default;

const CheckpointMetadata& LazyMetadata::header() const { return state_->header; }

size_t LazyMetadata::tensor_count() const { return length_of(state_->root->tensors()); }

std::string_view LazyMetadata::key_at(size_t i) const {
  const State& s = *state_;
  if (i >= tensor_count()) throw std::out_of_range("LazyMetadata::key_at");
  if (s.indexed()) return view(s.root->tensor_keys()->Get(static_cast<flatbuffers::uoffset_t>(i)));
  flatbuffers::Verifier v = s.probe_verifier();
  const fb::TensorRecord* r = s.record(i);
  if (!verify_key(*r, v)) s.decoder->fail(fmt::format("tensor record {} fails FlatBuffers verification", i));
  return view(r->key());
}

size_t LazyMetadata::lower_bound(const std::string& key) const {
  size_t low = 0, high = tensor_count();  // tensor records are sorted by key
  while (low < high) {
    const size_t mid = low + (high - low) / 2;
    if (key_at(mid) < key) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low;
}

std::optional<size_t> LazyMetadata::find(const std::string& key) const {
  const size_t i = lower_bound(key);
  if (i < tensor_count() && key_at(i) == key) return i;
  return std::nullopt;
}

TensorRecord LazyMetadata::tensor(size_t i) {
  State& s = *state_;
  if (i >= tensor_count()) throw std::out_of_range("LazyMetadata::tensor");
  if (s.failed) std::rethrow_exception(s.failed);
  try {
    std::optional<RecordBytes> bytes;  // a record read alone lives here while it is decoded
    const fb::TensorRecord* r = s.read ? s.read_record(i, bytes) : s.record(i);
    if (!s.read && !s.verifier.VerifyTable(r)) {
      s.decoder->fail(fmt::format("tensor record {} fails FlatBuffers verification", i));
    }
    if (s.indexed() && view(r->key()) != key_at(i)) {
      s.decoder->fail(
          fmt::format("the index names tensor record {} '{}', the record says '{}'", i, key_at(i), view(r->key())));
    }
    return s.decoder->decode_tensor(*r);
  } catch (const CheckpointError&) {  // corrupt (not an I/O error, which a retry may not meet)
    s.failed = std::current_exception();
    throw;
  }
}

const FileRecord* LazyMetadata::find_file(uint32_t index) const {
  const State& s = *state_;
  if (!s.read) return index < s.header.files.size() ? &s.header.files[index] : nullptr;
  return s.ranged.find(index);
}

const FileRecord& LazyMetadata::file(uint32_t index) const {
  const FileRecord* found = find_file(index);
  if (found == nullptr) throw std::out_of_range(fmt::format("LazyMetadata::file: file {} was not read", index));
  return *found;
}

const std::vector<FileRecord>& LazyMetadata::files() {
  State& s = *state_;
  if (!s.read) return s.header.files;
  std::call_once(s.file_list_read, [&] { s.file_list = s.read_file_list(); });
  return s.file_list;
}

size_t LazyMetadata::file_count() const {
  const State& s = *state_;
  return s.read ? s.root->file_count() : s.header.files.size();
}

uint64_t LazyMetadata::bytes_read() const { return state_->bytes_read; }

CheckpointMetadata LazyMetadata::decode_all() const {
  const State& s = *state_;
  if (s.read) throw std::logic_error("LazyMetadata::decode_all: opened from the head; decode the whole file");
  return decode_metadata(s.bytes, s.origin);
}

CorruptionError missing_listed_file(const std::string& path) {
  return CorruptionError(fmt::format("checkpoint file {} listed in the metadata is missing; the checkpoint is "
                                     "incomplete or was moved partially",
                                     path),
                         path);
}

void check_file_size(const std::string& path, uint64_t actual, uint64_t recorded) {
  if (actual != recorded) {
    throw CorruptionError(fmt::format("checkpoint file {} has {} bytes but the metadata records {} bytes; it "
                                      "was truncated, overwritten or belongs to another checkpoint",
                                      path, actual, recorded),
                          path);
  }
}

}  // namespace distckpt
