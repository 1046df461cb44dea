// The safetensors format (Hugging Face), read as untrusted input and written:
//
//   8 bytes    N, little-endian u64: the length of the header
//   N bytes    JSON: {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...,
//                     "__metadata__": {"KEY": "VALUE", ...}}   (optional), padded with spaces
//   the rest   every tensor's row-major bytes at [BEGIN, END) from the end of the header
//
// A model split over several files comes with an index,
// `model.safetensors.index.json`: {"metadata": {...}, "weight_map": {"NAME": "FILE", ...}}.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "distckpt/core/box.h"
#include "distckpt/format/storage_index.h"

namespace distckpt::safetensors {

// The reference implementation's limit: a larger header is not a model.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
constexpr uint64_t kPrefixBytes = 8;
constexpr const char* kIndexSuffix = ".safetensors.index.json";
constexpr const char* kFileSuffix = ".safetensors";
// The "__metadata__" key naming the framework the files are for ("pt").
constexpr const char* kFormatKey = "format";

struct Entry {
  std::string name;
  at::ScalarType dtype = at::kFloat;  // Undefined when `unrepresentable`
  Shape shape;
  uint64_t begin = 0;  // absolute offsets in the file
  uint64_t end = 0;
  std::optional<UnrepresentableDtype> unrepresentable{};  // a dtype this LibTorch lacks
};

struct Header {
  uint64_t data_start = 0;     // 8 + N
  std::vector<Entry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
};

// N from the first 8 bytes of a file of `file_size` bytes; CorruptionError
// naming `origin` when the file cannot hold that header.
uint64_t header_length(const uint8_t prefix[kPrefixBytes], uint64_t file_size, const std::string& origin);
// Parses the N header bytes of a file of `file_size` bytes. Rejects (with a
// CorruptionError naming `origin` and the tensor): invalid JSON, duplicate
// names, unknown or unsupported dtypes, shapes whose bytes disagree with the
// offsets, offsets that overlap, leave holes or pass the end of the file.
Header parse_header(std::string_view json, uint64_t file_size, const std::string& origin);

// The names safetensors uses ("F32", "BF16"); CheckpointError for a dtype it cannot store.
const char* dtype_name(at::ScalarType dtype);

// The header for tensors laid out back to back in `tensors`' order, padded
// to a multiple of 8 bytes; returns the 8-byte prefix and the JSON together.
// Each entry's begin/end are filled in (absolute offsets).
std::string encode_header(std::vector<Entry>& tensors, const std::map<std::string, std::string>& metadata);

struct Index {
  std::map<std::string, std::string> weight_map;  // tensor name -> file (a plain name in the same directory)
  std::map<std::string, std::string> metadata;    // the "metadata" block, values as JSON text
};
// Parses an index file; CorruptionError naming `origin` for anything but a
// weight map of names to plain file names.
Index parse_index(std::string_view json, const std::string& origin);
std::string encode_index(const Index& index);

}  // namespace distckpt::safetensors
