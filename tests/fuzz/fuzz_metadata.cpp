// Fuzzes the metadata reader (metadata.fb): decode_metadata must either throw
// CheckpointError or return records that keep every promise it documents.
// Anything else (another exception, a crash, a broken promise) is a bug.
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  distckpt::CheckpointMetadata m;
  try {
    m = distckpt::decode_metadata(bytes, "metadata.fb");
  } catch (const distckpt::CheckpointError&) {  // CorruptionError, or a newer format version
    return 0;
  }
  check_consistent(m);
  // What was accepted encodes and decodes back to the same bytes.
  const std::string encoded = distckpt::encode_metadata(m);
  require(distckpt::encode_metadata(distckpt::decode_metadata(encoded, "re-encoded")) == encoded);
  return 0;
}
