// metadata.fb: encoding of CheckpointMetadata and its decoding from untrusted
// bytes. Decoding verifies the FlatBuffers structure first, then checks every
// record semantically, so the planner and the readers can trust what they
// get: no box outside its tensor, no byte range outside its file, no path
// outside the checkpoint directory.
#include "format/metadata.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "distckpt/core/errors.h"
#include "distckpt/fb/checkpoint_generated.h"
#include "fb_support.h"
#include "format/commit.h"
#include "format/dtype.h"
#include "io/file.h"

namespace distckpt {
namespace {

using fb_support::ceil_div;
using fb_support::checked_mul;
using fb_support::checked_numel;
using fb_support::ensure_room;

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

flatbuffers::Offset<fb::ChunkRecord> encode_chunk(flatbuffers::FlatBufferBuilder& fbb, const ChunkRecord& c) {
  ensure_room(fbb, chunk_bytes(c), "the checkpoint metadata");
  const auto offset = fbb.CreateVector(c.box.offset);
  const auto length = fbb.CreateVector(c.box.length);
  const auto checksums = fbb.CreateVector(c.block_checksums);
  return fb::CreateChunkRecord(fbb, offset, length, c.flat ? c.flat->start : -1, c.flat ? c.flat->stop : -1, c.file,
                               c.byte_offset, c.byte_length, checksums);
}

flatbuffers::Offset<fb::TensorRecord> encode_tensor(flatbuffers::FlatBufferBuilder& fbb, const TensorRecord& t) {
  std::vector<flatbuffers::Offset<fb::ChunkRecord>> chunks;
  chunks.reserve(t.chunks.size());
  for (const auto& c : t.chunks) chunks.push_back(encode_chunk(fbb, c));
  ensure_room(fbb, t.key.size() + 8 * t.global_shape.size() + 4 * chunks.size(), "the checkpoint metadata");
  const auto key = fbb.CreateString(t.key);
  const auto dtype = fbb.CreateString(stored_dtype_name(t));
  const auto shape = fbb.CreateVector(t.global_shape);
  const auto chunk_vector = fbb.CreateVector(chunks);
  return fb::CreateTensorRecord(fbb, key, dtype, shape, chunk_vector, static_cast<uint32_t>(t.element_size()));
}

flatbuffers::Offset<fb::ObjectRecord> encode_object(flatbuffers::FlatBufferBuilder& fbb, const ObjectRecord& o) {
  ensure_room(fbb, 96 + o.key.size() + 16 * o.global_shape.size() + 8 * o.block_checksums.size(),
              "the checkpoint metadata");
  const auto key = fbb.CreateString(o.key);
  const auto shape = fbb.CreateVector(o.global_shape);
  const auto offset = fbb.CreateVector(o.global_offset);
  const auto checksums = fbb.CreateVector(o.block_checksums);
  return fb::CreateObjectRecord(fbb, key, shape, offset, o.file, o.byte_offset, o.byte_length, checksums);
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

// Checks one verified buffer record by record and copies it out. Every
// failure names the origin and the record; checks that compare two numbers
// are written so that no intermediate value can overflow.
class MetadataDecoder {
 public:
  MetadataDecoder(const fb::CheckpointMetadata& root, size_t buffer_size, const std::string& origin)
      : root_(root), origin_(origin), budget_(buffer_size, origin) {}

  // Everything but the tensor records (and the checks that need them all).
  CheckpointMetadata decode_header() { return decode_records(false); }

  CheckpointMetadata decode() { return decode_records(true); }

  TensorRecord decode_tensor(const fb::TensorRecord& r, const std::vector<FileRecord>& files) {
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
      t.chunks.push_back(decode_chunk(*chunks->Get(static_cast<flatbuffers::uoffset_t>(i)), t, i, files));
    }
    return t;
  }

  // `path`: the file the failure is about, when a check names one other than the metadata file.
  [[noreturn]] void fail(const std::string& what, const std::string& path = {}) const {
    throw CorruptionError(fmt::format("{}: {}; the checkpoint metadata is corrupted", origin_, what),
                          path.empty() ? origin_ : path);
  }

 private:
  CheckpointMetadata decode_records(bool with_tensors) {
    CheckpointMetadata m;
    m.format_version = check_version(root_.format_version());
    m.world_size = root_.world_size();
    if (m.world_size < 1) fail(fmt::format("world_size is {}, it must be at least 1", m.world_size));
    m.checksum_block_size = root_.checksum_block_size();
    if (m.checksum_block_size > StorageIndex::kMaxChecksumBlockSize) {
      fail(fmt::format("checksum blocks of {} bytes, more than the {} a writer uses", m.checksum_block_size,
                       StorageIndex::kMaxChecksumBlockSize));
    }
    m.files = decode_files();
    if (with_tensors) m.tensors = decode_tensors(m.files);
    m.objects = decode_objects(m.files);
    if (with_tensors) check_disjoint_bytes(m);
    m.common_file = std::string(view(root_.common_file()));
    if (!m.common_file.empty()) check_path(m.common_file, "the common state file");
    // A data file named like the marker, the metadata or the common state:
    // removing tensors (which deletes data files no longer used) would
    // delete those.
    for (const FileRecord& f : m.files) {
      if (f.path == kCommitFile || f.path == kCommonFile || f.path == m.common_file ||
          f.path.rfind("metadata", 0) == 0) {
        fail(fmt::format("file '{}' has the name of a file that is not data", f.path));
      }
    }
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

  void check_path(const std::string& path, const std::string& what) const {
    try {
      io::validate_relative_path(path);
    } catch (const CorruptionError& e) {
      fail(fmt::format("{}: {}", what, e.what()), e.path());
    }
  }

  std::vector<FileRecord> decode_files() {
    std::vector<FileRecord> files;
    const auto* records = root_.files();
    files.reserve(length_of(records));
    std::unordered_set<std::string_view> seen;
    for (size_t i = 0; records != nullptr && i < records->size(); ++i) {
      const auto* r = records->Get(static_cast<flatbuffers::uoffset_t>(i));
      budget_.charge_table();
      budget_.charge_string(r->path());
      FileRecord f;
      f.path = std::string(view(r->path()));
      f.size = r->size();
      f.writer_rank = r->writer_rank();
      check_path(f.path, fmt::format("file {}", i));
      if (!seen.insert(view(r->path())).second) fail(fmt::format("file '{}' is listed twice", f.path));
      if (f.writer_rank < 0 || f.writer_rank >= root_.world_size()) {
        fail(fmt::format("file '{}' has writer rank {}, outside the world of {} ranks", f.path, f.writer_rank,
                         root_.world_size()));
      }
      files.push_back(std::move(f));
    }
    return files;
  }

  // Where a chunk or object points: a valid file, a byte range inside the
  // recorded file size and one checksum per block. `what()` names the record
  // (only called on failure: formatting for each of 10^7 chunks would cost).
  template <typename Describe>
  void check_storage(const Describe& what, uint32_t file, uint64_t byte_offset, uint64_t byte_length,
                     size_t checksum_count, const std::vector<FileRecord>& files) const {
    if (file >= files.size()) {
      fail(fmt::format("{} refers to file {}, but the checkpoint has {} files", what(), file, files.size()));
    }
    const uint64_t file_size = files[file].size;
    if (byte_offset > file_size || byte_length > file_size - byte_offset) {
      fail(fmt::format("{} spans bytes [{}, +{}) of '{}', which has {} bytes", what(), byte_offset, byte_length,
                       files[file].path, file_size));
    }
    const uint64_t block = root_.checksum_block_size();
    const uint64_t expected = block == 0 ? 0 : ceil_div(byte_length, block);
    if (checksum_count != expected) {
      fail(fmt::format("{} has {} block checksums, expected {} ({} bytes in blocks of {})", what(), checksum_count,
                       expected, byte_length, block));
    }
  }

  std::vector<TensorRecord> decode_tensors(const std::vector<FileRecord>& files) {
    std::vector<TensorRecord> tensors;
    const auto* records = root_.tensors();
    tensors.reserve(length_of(records));
    for (size_t i = 0; records != nullptr && i < records->size(); ++i) {
      tensors.push_back(decode_tensor(*records->Get(static_cast<flatbuffers::uoffset_t>(i)), files));
      if (i > 0 && !(tensors[i - 1].key < tensors[i].key)) {
        fail(fmt::format("tensor keys are not sorted and unique: '{}' is followed by '{}'", tensors[i - 1].key,
                         tensors[i].key));
      }
    }
    return tensors;
  }

  ChunkRecord decode_chunk(const fb::ChunkRecord& r, const TensorRecord& t, size_t index,
                           const std::vector<FileRecord>& files) {
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
    check_storage(where, c.file, c.byte_offset, c.byte_length, c.block_checksums.size(), files);
    return c;
  }

  std::vector<ObjectRecord> decode_objects(const std::vector<FileRecord>& files) {
    std::vector<ObjectRecord> objects;
    const auto* records = root_.objects();
    objects.reserve(length_of(records));
    std::string previous_key;
    for (size_t i = 0; records != nullptr && i < records->size(); ++i) {
      objects.push_back(decode_object(*records->Get(static_cast<flatbuffers::uoffset_t>(i)), files));
      std::string unique_key = objects.back().unique_key();
      if (i > 0 && !(previous_key < unique_key)) {
        fail(fmt::format("object keys are not sorted and unique: '{}' is followed by '{}'", previous_key, unique_key));
      }
      previous_key = std::move(unique_key);
    }
    return objects;
  }

  ObjectRecord decode_object(const fb::ObjectRecord& r, const std::vector<FileRecord>& files) {
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
    check_storage(where, o.file, o.byte_offset, o.byte_length, o.block_checksums.size(), files);
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
  const std::string& origin_;
  fb_support::ExpansionBudget budget_;
};

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
  flatbuffers::FlatBufferBuilder fbb(static_cast<size_t>(reserve));

  std::vector<flatbuffers::Offset<fb::FileRecord>> files;
  files.reserve(metadata.files.size());
  for (const auto& f : metadata.files) {
    ensure_room(fbb, 32 + f.path.size(), "the checkpoint metadata");
    files.push_back(fb::CreateFileRecord(fbb, fbb.CreateString(f.path), f.size, f.writer_rank));
  }
  std::vector<flatbuffers::Offset<fb::ObjectRecord>> objects;
  objects.reserve(metadata.objects.size());
  for (const auto& o : metadata.objects) objects.push_back(encode_object(fbb, o));
  std::vector<flatbuffers::Offset<fb::TensorRecord>> tensors;
  tensors.reserve(metadata.tensors.size());
  for (const auto& t : metadata.tensors) tensors.push_back(encode_tensor(fbb, t));

  ensure_room(fbb,
              4 * (files.size() + objects.size() + tensors.size()) + metadata.common_file.size() +
                  metadata.layout_name.size() + metadata.layout_fingerprint.size() + metadata.layout_schema.size(),
              "the checkpoint metadata");
  const auto files_vec = fbb.CreateVector(files);
  const auto objects_vec = fbb.CreateVector(objects);
  const auto tensors_vec = fbb.CreateVector(tensors);
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
  const auto root = fb::CreateCheckpointMetadata(fbb, metadata.format_version, metadata.world_size,
                                                 metadata.checksum_block_size, tensors_vec, objects_vec, files_vec,
                                                 common, name, fingerprint, schema, hashes, policy, mappings_vec);
  fb::FinishCheckpointMetadataBuffer(fbb, root);
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
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
  return MetadataDecoder(*fb::GetCheckpointMetadata(aligned.data()), aligned.size(), origin).decode();
}

namespace {

// The root table verified like the generated Verify, but for the tensor
// records: only the vector of their offsets is checked here, each record when
// it is first decoded (LazyMetadata::tensor). Keep in step with checkpoint.fbs.
bool verify_header(const fb::CheckpointMetadata& root, flatbuffers::Verifier& v) {
  using M = fb::CheckpointMetadata;
  // Generated tables hide their flatbuffers::Table base; the bytes are one.
  const auto& t = *reinterpret_cast<const flatbuffers::Table*>(&root);
  return t.VerifyTableStart(v) && t.VerifyField<uint32_t>(v, M::VT_FORMAT_VERSION, 4) &&
         t.VerifyField<int32_t>(v, M::VT_WORLD_SIZE, 4) && t.VerifyField<uint64_t>(v, M::VT_CHECKSUM_BLOCK_SIZE, 8) &&
         t.VerifyOffset(v, M::VT_TENSORS) && v.VerifyVector(root.tensors()) && t.VerifyOffset(v, M::VT_OBJECTS) &&
         v.VerifyVector(root.objects()) && v.VerifyVectorOfTables(root.objects()) && t.VerifyOffset(v, M::VT_FILES) &&
         v.VerifyVector(root.files()) && v.VerifyVectorOfTables(root.files()) && t.VerifyOffset(v, M::VT_COMMON_FILE) &&
         v.VerifyString(root.common_file()) && t.VerifyOffset(v, M::VT_LAYOUT_NAME) &&
         v.VerifyString(root.layout_name()) && t.VerifyOffset(v, M::VT_LAYOUT_FINGERPRINT) &&
         v.VerifyString(root.layout_fingerprint()) && t.VerifyOffset(v, M::VT_LAYOUT_SCHEMA) &&
         v.VerifyString(root.layout_schema()) && t.VerifyOffset(v, M::VT_PLAN_HASHES) &&
         v.VerifyVector(root.plan_hashes()) && t.VerifyOffset(v, M::VT_WRITER_POLICY) &&
         v.VerifyString(root.writer_policy()) && t.VerifyOffset(v, M::VT_NAME_MAPPINGS) &&
         v.VerifyVector(root.name_mappings()) && v.VerifyVectorOfTables(root.name_mappings()) && v.EndTable();
}

// Only the key of a record, for a binary search's probe.
bool verify_key(const fb::TensorRecord& record, flatbuffers::Verifier& v) {
  const auto& t = *reinterpret_cast<const flatbuffers::Table*>(&record);
  return t.VerifyTableStart(v) && t.VerifyOffset(v, fb::TensorRecord::VT_KEY) && v.VerifyString(record.key()) &&
         v.EndTable();
}

}  // namespace

struct LazyMetadata::State {
  State(std::string b, std::string o)
      : bytes(std::move(b)),
        origin(std::move(o)),
        aligned(bytes),
        verifier(aligned.data(), aligned.size(), fb_support::verifier_options(aligned.size(), kMaxVerifierDepth)) {}
  std::string bytes;
  std::string origin;
  fb_support::AlignedBytes aligned;
  // One verifier for every record decoded: its table count is cumulative,
  // so records that alias each other cannot make verification quadratic.
  flatbuffers::Verifier verifier;
  const fb::CheckpointMetadata* root = nullptr;
  std::optional<MetadataDecoder> decoder;
  CheckpointMetadata header;
  // The first record that failed: the buffer is corrupt, and the verifier's
  // depth and the budget are spent, so every later decode reports it.
  std::exception_ptr failed;

  flatbuffers::Verifier probe_verifier() const {
    return flatbuffers::Verifier(aligned.data(), aligned.size(), fb_support::verifier_options(aligned.size(), 4));
  }
  const fb::TensorRecord* record(size_t i) const {
    return root->tensors()->Get(static_cast<flatbuffers::uoffset_t>(i));
  }
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

LazyMetadata::LazyMetadata(std::string bytes, std::string origin)
    : state_(std::make_unique<State>(checked_size(std::move(bytes), origin), origin)) {
  State& s = *state_;
  const auto invalid = [&] {
    return CorruptionError(
        fmt::format("{}: not a valid distckpt metadata buffer (failed FlatBuffers verification)", s.origin), s.origin);
  };
  flatbuffers::Verifier v(s.aligned.data(), s.aligned.size(),
                          fb_support::verifier_options(s.aligned.size(), kMaxVerifierDepth));
  // What VerifyBuffer checks before the root table: room, identifier, root offset.
  const bool framed = s.aligned.size() >= sizeof(flatbuffers::uoffset_t) + flatbuffers::kFileIdentifierLength &&
                      fb::CheckpointMetadataBufferHasIdentifier(s.aligned.data()) && v.VerifyOffset(0) != 0;
  if (!framed) throw invalid();
  s.root = fb::GetCheckpointMetadata(s.aligned.data());
  if (!verify_header(*s.root, v)) throw invalid();
  s.decoder.emplace(*s.root, s.aligned.size(), s.origin);
  s.header = s.decoder->decode_header();
  // Lookups binary-search the keys: check their order now (the keys alone,
  // no record decoded), so that a damaged order is corruption, not a key
  // that seems missing.
  std::string_view previous;
  for (size_t i = 0; i < tensor_count(); ++i) {
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
    const fb::TensorRecord* r = s.record(i);
    if (!s.verifier.VerifyTable(r)) {
      s.decoder->fail(fmt::format("tensor record {} fails FlatBuffers verification", i));
    }
    return s.decoder->decode_tensor(*r, s.header.files);
  } catch (const Error&) {
    s.failed = std::current_exception();
    throw;
  }
}

CheckpointMetadata LazyMetadata::decode_all() const { return decode_metadata(state_->bytes, state_->origin); }

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
