// Fuzzes the metadata readers (metadata.fb): decode_metadata must either throw
// CheckpointError or return records that keep every promise it documents, and
// LazyMetadata (records decoded one at a time) must never crash and must
// decode every record alike where decode_metadata accepts the buffer.
// Anything else (another exception, a crash, a broken promise) is a bug.
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "distckpt/core/errors.h"
#include "format/metadata.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

// What decode_metadata promises of a buffer it accepts.
void check_consistent(const distckpt::CheckpointMetadata& m) {
  require(m.world_size >= 1);
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const distckpt::TensorRecord& t = m.tensors[i];
    if (i > 0) require(m.tensors[i - 1].key < t.key);
    require(m.find_tensor(t.key) == &t);
    for (const distckpt::ChunkRecord& c : t.chunks) {
      require(c.file < m.files.size());
      require(c.box.ndim() == t.global_shape.size());
      require(c.byte_offset <= m.files[c.file].size && c.byte_length <= m.files[c.file].size - c.byte_offset);
      require(c.byte_length == static_cast<uint64_t>(c.stored_numel()) * c10::elementSize(t.dtype));
    }
  }
  for (size_t i = 0; i < m.objects.size(); ++i) {
    require(m.objects[i].file < m.files.size());
    if (i > 0) require(m.objects[i - 1].unique_key() < m.objects[i].unique_key());
  }
}

bool same_record(const distckpt::TensorRecord& a, const distckpt::TensorRecord& b) {
  if (a.key != b.key || a.dtype != b.dtype || a.global_shape != b.global_shape || a.chunks.size() != b.chunks.size()) {
    return false;
  }
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    const distckpt::ChunkRecord& x = a.chunks[i];
    const distckpt::ChunkRecord& y = b.chunks[i];
    if (!(x.box == y.box) || x.file != y.file || x.byte_offset != y.byte_offset || x.byte_length != y.byte_length ||
        x.block_checksums != y.block_checksums) {
      return false;
    }
  }
  return true;
}

// Looks up and decodes (at most 64) records lazily; where `whole` decoded
// the buffer, every lookup must succeed and agree with it.
void check_lazy(std::string_view bytes, const std::optional<distckpt::CheckpointMetadata>& whole) {
  try {
    distckpt::LazyMetadata lazy{std::string(bytes), "metadata.fb"};
    if (whole) require(lazy.tensor_count() == whole->tensors.size());
    for (size_t i = 0; i < lazy.tensor_count() && i < 64; ++i) {
      try {
        const std::string key(lazy.key_at(i));
        const distckpt::TensorRecord record = lazy.tensor(i);
        require(record.key == key);
        if (whole) require(lazy.find(key) == i && lazy.lower_bound(key) == i && same_record(record, whole->tensors[i]));
      } catch (const distckpt::CheckpointError&) {
        require(!whole);
      }
    }
  } catch (const distckpt::CheckpointError&) {
    require(!whole);
  }
}

// The same file opened from its head, records read alone: where `whole`
// decoded the buffer (so its head is known), every record must read alike;
// otherwise the input's last byte chooses where the head ends.
void check_by_parts(std::string_view bytes, const std::optional<distckpt::CheckpointMetadata>& whole) {
  if (bytes.empty() || (whole && whole->format_version < 3)) return;  // older formats have no index
  const uint64_t head =
      whole ? distckpt::metadata_head_bytes(bytes) : bytes.size() * static_cast<uint8_t>(bytes.back()) / 256;
  try {
    distckpt::LazyMetadata lazy(
        std::string(bytes.substr(0, head)), bytes.size(),
        [&](uint64_t offset, uint64_t length, uint8_t* out) {
          require(offset <= bytes.size() && length <= bytes.size() - offset);
          std::memcpy(out, bytes.data() + offset, length);
        },
        "metadata.fb");
    if (whole) require(lazy.tensor_count() == whole->tensors.size());
    for (size_t i = 0; i < lazy.tensor_count() && i < 64; ++i) {
      try {
        const distckpt::TensorRecord record = lazy.tensor(i);
        require(record.key == lazy.key_at(i));
        if (whole) require(same_record(record, whole->tensors[i]));
      } catch (const distckpt::CheckpointError&) {
        require(!whole);
      }
    }
  } catch (const distckpt::CheckpointError&) {
    require(!whole);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::optional<distckpt::CheckpointMetadata> whole;
  try {
    whole = distckpt::decode_metadata(bytes, "metadata.fb");
  } catch (const distckpt::CheckpointError&) {  // CorruptionError, or a newer format version
  }
  check_lazy(bytes, whole);
  check_by_parts(bytes, whole);
  if (!whole) return 0;
  const distckpt::CheckpointMetadata& m = *whole;
  check_consistent(m);
  // What was accepted encodes and decodes back to the same bytes.
  const std::string encoded = distckpt::encode_metadata(m);
  require(distckpt::encode_metadata(distckpt::decode_metadata(encoded, "re-encoded")) == encoded);
  return 0;
}
