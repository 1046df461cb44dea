// Fuzzes the reader of local checkpoint files (local/local_file.h) and the
// codec of their metadata block (format/local_state_codec.h). The first input
// byte picks what the rest is:
//   0: a whole file, as found on disk (probe_local_file, read_local_file);
//   1: the metadata block alone (decode_local_state, then a round trip);
//   2: a whole file whose header and metadata checksums are recomputed, so
//      mutations reach the metadata and tensor checks behind them.
// Readers must throw CheckpointError or succeed; anything else is a bug.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include "distckpt/core/errors.h"
#include "format/local_state_codec.h"
#include "io/checksum.h"
#include "local/local_file.h"

namespace {

// The header's layout (local_file.cpp): field offsets in its 64 bytes.
constexpr size_t kHeaderSize = 64;
constexpr size_t kVersionAt = 8, kMetaOffsetAt = 32, kMetaSizeAt = 40, kMetaChecksumAt = 48, kChecksumAt = 56;

void require(bool ok) {
  if (!ok) std::abort();
}

// A file under the fastest scratch storage, one per fuzzing process.
const std::string& scratch_path() {
  static const std::string path = std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") +
                                  "/distckpt-fuzz-local-" + std::to_string(getpid()) + ".dcl";
  return path;
}

template <typename T>
T load(const std::string& s, size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}
template <typename T>
void store(std::string& s, size_t at, T v) {
  std::memcpy(s.data() + at, &v, sizeof v);
}

// Makes `file` pass the header checks: magic, version, metadata placed at a
// fuzzed offset and running to the end, both checksums right.
void fix_checksums(std::string& file) {
  if (file.size() < kHeaderSize) return;
  std::memcpy(file.data(), "DCKLOCAL", 8);
  store<uint32_t>(file, kVersionAt, 1);
  const uint64_t meta_offset = kHeaderSize + load<uint64_t>(file, kMetaOffsetAt) % (file.size() - kHeaderSize + 1);
  store<uint64_t>(file, kMetaOffsetAt, meta_offset);
  store<uint64_t>(file, kMetaSizeAt, file.size() - meta_offset);
  store<uint64_t>(file, kMetaChecksumAt, distckpt::io::xxh3(file.data() + meta_offset, file.size() - meta_offset));
  store<uint64_t>(file, kChecksumAt, distckpt::io::xxh3(file.data(), kChecksumAt));
}

void read_file(const std::string& bytes) {
  struct Remove {  // the file goes with each input: a run leaves nothing behind in /dev/shm
    ~Remove() { std::remove(scratch_path().c_str()); }
  } remove;
  {
    std::ofstream out(scratch_path(), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    require(static_cast<bool>(out));
  }
  const auto header = distckpt::local::probe_local_file(scratch_path());
  try {
    const distckpt::TensorAwareStateDict state = distckpt::local::read_local_file(scratch_path());
    require(header.has_value());  // a file that reads whole passes the cheap check too
  } catch (const distckpt::CheckpointError&) {
  }
}

void decode_block(std::string_view bytes) {
  distckpt::LocalState state;
  try {
    state = distckpt::decode_local_state(bytes, "metadata block");
  } catch (const distckpt::CheckpointError&) {
    return;
  }
  const std::string encoded = distckpt::encode_local_state(state);
  require(distckpt::encode_local_state(distckpt::decode_local_state(encoded, "re-encoded")) == encoded);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      read_file(rest);
      break;
    case 1:
      decode_block(rest);
      break;
    default:
      fix_checksums(rest);
      read_file(rest);
  }
  return 0;
}
