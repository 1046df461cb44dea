// Fuzzes the reader of PyTorch DCP's `.metadata` (format/dcp_metadata.h):
// the restricted pickle machine with its allow-list of DCP's classes, then
// the walk that checks what they say. It must return checked metadata or
// throw distckpt::Error; nothing else, and never run past its bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "distckpt/core/errors.h"
#include "format/dcp_metadata.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const distckpt::dcp::Metadata m =
        distckpt::dcp::parse_metadata(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/.metadata");
    for (const distckpt::dcp::Tensor& t : m.tensors) {
      for (const distckpt::dcp::Chunk& c : t.chunks) {
        for (size_t d = 0; d < t.size.size(); ++d) {
          if (c.offsets[d] + c.sizes[d] > t.size[d]) __builtin_trap();  // a chunk outside its tensor got through
        }
      }
    }
  } catch (const distckpt::Error&) {
  }
  return 0;
}
