// Fuzzes the safetensors readers (format/safetensors.h): the first input
// byte picks what the rest is:
//   0: a whole file (8-byte header length, JSON header, data);
//   1: an index file (model.safetensors.index.json).
// Readers must throw CheckpointError or return what they promise: tensors
// sorted by name whose byte ranges tile the data exactly, each the size its
// shape and dtype need; index entries naming plain files.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "distckpt/core/errors.h"
#include "format/dtype.h"
#include "format/safetensors.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

void check_file(std::string_view bytes) {
  namespace st = distckpt::safetensors;
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  uint8_t prefix[st::kPrefixBytes] = {};
  for (size_t i = 0; i < st::kPrefixBytes && i < bytes.size(); ++i) prefix[i] = data[i];
  const uint64_t n = st::header_length(prefix, bytes.size(), "fuzz.safetensors");
  const st::Header h = st::parse_header(bytes.substr(st::kPrefixBytes, n), bytes.size(), "fuzz.safetensors");
  require(h.data_start == st::kPrefixBytes + n);
  uint64_t total = 0;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const st::Entry& e = h.tensors[i];
    if (i > 0) require(h.tensors[i - 1].name < e.name);
    require(e.begin >= h.data_start && e.begin <= e.end && e.end <= bytes.size());
    require(static_cast<uint64_t>(distckpt::numel(e.shape)) * distckpt::dtype_size(e.dtype) == e.end - e.begin);
    total += e.end - e.begin;
  }
  require(total == bytes.size() - h.data_start);
}

void check_index(std::string_view bytes) {
  const distckpt::safetensors::Index index = distckpt::safetensors::parse_index(bytes, "fuzz.index.json");
  for (const auto& [name, file] : index.weight_map) {
    require(!file.empty() && file.find('/') == std::string::npos && file != "..");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] % 2 == 0) {
      check_file(rest);
    } else {
      check_index(rest);
    }
  } catch (const distckpt::CheckpointError&) {
  }
  return 0;
}
