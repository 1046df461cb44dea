// Fuzzes the zip index torch.save files are read through
// (format/zip_archive.h). It must throw CorruptionError or return entries
// that lie inside the input, in no two overlapping ranges; each entry's data
// is then read and its CRC-32 computed, as the torch.save reader does.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "distckpt/core/errors.h"
#include "format/zip_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto read = [&](void* out, size_t n, uint64_t offset) {
    if (offset > size || size - offset < n) throw distckpt::CorruptionError("read past the end");
    if (n > 0) std::memcpy(out, data + offset, n);
  };
  try {
    const distckpt::zip::Index index(read, size, "fuzz.pt");
    for (const distckpt::zip::Entry& e : index.entries()) {
      if (e.data_offset > size || size - e.data_offset < e.size) std::abort();  // the index let a range escape
      distckpt::zip::Crc32 crc;
      crc.update(data + e.data_offset, e.size);
      if (index.find(e.name) != &e) std::abort();
      (void)crc.value();
    }
  } catch (const distckpt::CorruptionError&) {
  }
  return 0;
}
