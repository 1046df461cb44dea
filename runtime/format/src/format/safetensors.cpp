#include "format/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "distckpt/core/errors.h"
#include "format/dtype.h"

namespace distckpt::safetensors {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr size_t kMaxDims = 64;
constexpr const char* kMetadataKey = "__metadata__";

// safetensors' dtype names and distckpt's (format/dtype.cpp decides whether
// this LibTorch has the type; a tensor of one it lacks is listed, not loaded).
struct DtypeName {
  const char* name;
  const char* distckpt_name;
};
constexpr DtypeName kDtypes[] = {
    {"BOOL", "bool"},
    {"U8", "uint8"},
    {"I8", "int8"},
    {"I16", "int16"},
    {"I32", "int32"},
    {"I64", "int64"},
    {"F16", "float16"},
    {"BF16", "bfloat16"},
    {"F32", "float32"},
    {"F64", "float64"},
    {"C64", "complex64"},
    {"U16", "uint16"},
    {"U32", "uint32"},
    {"U64", "uint64"},
    {"F8_E4M3", "float8_e4m3fn"},
    {"F8_E5M2", "float8_e5m2"},
    {"F8_E8M0", "float8_e8m0fnu"},
};
// Names the format defines whose elements are not whole bytes (packed).
constexpr const char* kUnsupported[] = {"F6_E2M3", "F6_E3M2", "F4"};

// nlohmann keeps the last of two equal keys, and its parser with a callback
// rescans an object as each child closes (quadratic in a 100k-tensor header):
// duplicates and nesting are found by a SAX pass first, then the plain
// parser builds the document. Both passes are linear.
class JsonPrecheck {
 public:
  static constexpr size_t kMaxDepth = 64;  // a header nests three deep

  bool null() { return true; }
  bool boolean(bool /*value*/) { return true; }
  bool number_integer(Json::number_integer_t /*value*/) { return true; }
  bool number_unsigned(Json::number_unsigned_t /*value*/) { return true; }
  bool number_float(Json::number_float_t /*value*/, const std::string& /*text*/) { return true; }
  bool string(std::string& /*value*/) { return true; }
  bool binary(Json::binary_t& /*value*/) { return true; }
  bool start_object(size_t /*elements*/) { return open(true); }
  bool start_array(size_t /*elements*/) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& key) {
    if (!keys_.back()->insert(key).second) {
      duplicate = key;
      return false;
    }
    return true;
  }
  bool parse_error(size_t /*position*/, const std::string& /*token*/, const nlohmann::detail::exception& e) {
    error = e.what();
    return false;
  }

  std::string duplicate, error;
  bool too_deep = false;

 private:
  bool open(bool object) {
    if (keys_.size() >= kMaxDepth) {
      too_deep = true;
      return false;
    }
    keys_.push_back(object ? std::make_unique<std::unordered_set<std::string>>() : nullptr);
    return true;
  }
  bool close() {
    keys_.pop_back();
    return true;
  }

  std::vector<std::unique_ptr<std::unordered_set<std::string>>> keys_;  // null for an array
};

Json parse_json(std::string_view text, const std::string& origin, const char* what) {
  JsonPrecheck precheck;
  Json::sax_parse(text.begin(), text.end(), &precheck);
  if (!precheck.error.empty()) {
    throw CorruptionError(fmt::format("{}: the {} is not valid JSON ({}); the file is damaged or not safetensors",
                                      origin, what, precheck.error));
  }
  if (precheck.too_deep) {
    throw CorruptionError(fmt::format("{}: the {} nests more than {} levels deep; the file is not safetensors", origin,
                                      what, JsonPrecheck::kMaxDepth));
  }
  if (!precheck.duplicate.empty()) {
    throw CorruptionError(
        fmt::format("{}: the {} names '{}' twice; the file is damaged", origin, what, precheck.duplicate));
  }
  Json json;
  try {
    json = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {
    throw CorruptionError(fmt::format("{}: the {} is not valid JSON ({}); the file is damaged or not safetensors",
                                      origin, what, e.what()));
  }
  if (!json.is_object()) throw CorruptionError(fmt::format("{}: the {} is not a JSON object", origin, what));
  return json;
}

ResolvedDtype parse_dtype(const Json& value, const std::string& origin, const std::string& name) {
  if (!value.is_string()) throw CorruptionError(fmt::format("{}: tensor '{}' has no dtype string", origin, name));
  const std::string text = value.get<std::string>();
  for (const DtypeName& d : kDtypes) {
    if (text == d.name) return resolve_stored_dtype(d.distckpt_name, 0);
  }
  for (const char* unsupported : kUnsupported) {
    if (text == unsupported) {
      throw CheckpointError(fmt::format(
          "{}: tensor '{}' has dtype {}, whose packed elements distckpt cannot address; convert it (e.g. to BF16 or "
          "F32) before loading",
          origin, name, text));
    }
  }
  throw CorruptionError(fmt::format("{}: tensor '{}' has the unknown dtype '{}'", origin, name, text));
}

uint64_t parse_unsigned(const Json& value, const std::string& origin, const std::string& name, const char* field) {
  if (!value.is_number_unsigned()) {
    throw CorruptionError(
        fmt::format("{}: tensor '{}': {} holds {}, not a non-negative integer", origin, name, field, value.dump()));
  }
  return value.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const Json& value, uint64_t data_start, uint64_t file_size,
                  const std::string& origin) {
  if (name.empty()) throw CorruptionError(fmt::format("{}: a tensor has an empty name", origin));
  if (!value.is_object()) throw CorruptionError(fmt::format("{}: tensor '{}' is not a JSON object", origin, name));
  Entry e;
  e.name = name;
  const auto field = [&](const char* key) -> const Json& {
    const auto it = value.find(key);
    if (it == value.end()) throw CorruptionError(fmt::format("{}: tensor '{}' has no '{}'", origin, name, key));
    return *it;
  };
  ResolvedDtype dtype = parse_dtype(field("dtype"), origin, name);
  e.dtype = dtype.type;
  e.unrepresentable = std::move(dtype.unrepresentable);
  const Json& shape = field("shape");
  if (!shape.is_array() || shape.size() > kMaxDims) {
    throw CorruptionError(
        fmt::format("{}: tensor '{}': shape must be an array of at most {} sizes", origin, name, kMaxDims));
  }
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& dim : shape) {
    const uint64_t size = parse_unsigned(dim, origin, name, "shape");
    if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
    if (size != 0 && numel > std::numeric_limits<uint64_t>::max() / size) overflow = true;
    numel *= size;
    e.shape.push_back(static_cast<int64_t>(size));
  }
  const uint64_t element = e.unrepresentable ? e.unrepresentable->element_size : dtype_size(e.dtype);
  if (overflow || numel > std::numeric_limits<uint64_t>::max() / element) {
    throw CorruptionError(fmt::format("{}: tensor '{}': shape {} is too large", origin, name, shape.dump()));
  }
  const Json& offsets = field("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    throw CorruptionError(fmt::format("{}: tensor '{}': data_offsets must be [BEGIN, END]", origin, name));
  }
  const uint64_t begin = parse_unsigned(offsets[0], origin, name, "data_offsets");
  const uint64_t end = parse_unsigned(offsets[1], origin, name, "data_offsets");
  const uint64_t data_bytes = file_size - data_start;
  if (begin > end || end > data_bytes) {
    throw CorruptionError(fmt::format(
        "{}: tensor '{}': data_offsets [{}, {}] are outside the {} data bytes of the file; it is truncated or damaged",
        origin, name, begin, end, data_bytes));
  }
  if (end - begin != numel * element) {
    throw CorruptionError(fmt::format("{}: tensor '{}': shape {} of {} needs {} bytes but data_offsets span {}", origin,
                                      name, shape.dump(), field("dtype").get<std::string>(), numel * element,
                                      end - begin));
  }
  e.begin = data_start + begin;
  e.end = data_start + end;
  return e;
}

// Like the reference reader: the tensors' bytes tile the data exactly, no
// overlaps, no holes, nothing after the last.
void check_tiling(const std::vector<Entry>& tensors, uint64_t data_start, uint64_t file_size,
                  const std::string& origin) {
  std::vector<const Entry*> by_offset;
  by_offset.reserve(tensors.size());
  for (const Entry& e : tensors) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return std::tie(a->begin, a->end) < std::tie(b->begin, b->end); });
  uint64_t covered = data_start;
  const Entry* previous = nullptr;
  for (const Entry* e : by_offset) {
    if (e->begin < covered) {
      throw CorruptionError(
          fmt::format("{}: tensors '{}' and '{}' overlap (bytes {}..{} and {}..{}); the file is "
                      "damaged",
                      origin, previous->name, e->name, previous->begin - data_start, previous->end - data_start,
                      e->begin - data_start, e->end - data_start));
    }
    if (e->begin > covered) {
      throw CorruptionError(fmt::format("{}: data bytes {}..{} belong to no tensor (before '{}'); the file is damaged",
                                        origin, covered - data_start, e->begin - data_start, e->name));
    }
    covered = e->end;
    if (e->end > e->begin) previous = e;
  }
  if (covered != file_size) {
    throw CorruptionError(
        fmt::format("{}: the tensors end at byte {} but the file has {} bytes; it was appended to "
                    "or is damaged",
                    origin, covered, file_size));
  }
}

std::map<std::string, std::string> string_map(const Json& value, const std::string& origin, const char* what) {
  if (!value.is_object()) throw CorruptionError(fmt::format("{}: {} is not a JSON object", origin, what));
  std::map<std::string, std::string> out;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      throw CorruptionError(fmt::format("{}: {} maps '{}' to {}, not a string", origin, what, key, item.dump()));
    }
    out.emplace(key, item.get<std::string>());
  }
  return out;
}

}  // namespace

uint64_t header_length(const uint8_t prefix[kPrefixBytes], uint64_t file_size, const std::string& origin) {
  if (file_size < kPrefixBytes) {
    throw CorruptionError(
        fmt::format("{}: {} bytes, too short for a safetensors file; it is truncated", origin, file_size));
  }
  uint64_t n = 0;
  for (size_t i = 0; i < kPrefixBytes; ++i) n |= uint64_t{prefix[i]} << (8 * i);
  if (n > kMaxHeaderBytes) {
    throw CorruptionError(fmt::format(
        "{}: the header length is {} bytes, more than any safetensors file has ({} at most); the file is damaged "
        "or not safetensors",
        origin, n, kMaxHeaderBytes));
  }
  if (n > file_size - kPrefixBytes) {
    throw CorruptionError(fmt::format("{}: the header length is {} bytes but the file has only {}; it is truncated",
                                      origin, n, file_size));
  }
  return n;
}

Header parse_header(std::string_view json, uint64_t file_size, const std::string& origin) {
  Header header;
  header.data_start = kPrefixBytes + json.size();
  if (file_size < header.data_start) {
    throw CorruptionError(fmt::format("{}: the file is shorter than its header; it is truncated", origin));
  }
  const Json root = parse_json(json, origin, "safetensors header");
  for (const auto& [name, value] : root.items()) {
    if (name == kMetadataKey) {
      header.metadata = string_map(value, origin, "__metadata__");
      continue;
    }
    header.tensors.push_back(parse_entry(name, value, header.data_start, file_size, origin));
  }
  check_tiling(header.tensors, header.data_start, file_size, origin);
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const Entry& a, const Entry& b) { return a.name < b.name; });
  return header;
}

const char* dtype_name(at::ScalarType dtype) {
  const std::string name = distckpt::dtype_name(dtype);
  for (const DtypeName& d : kDtypes) {
    if (name == d.distckpt_name) return d.name;
  }
  throw CheckpointError(fmt::format("safetensors has no dtype for {}", name));
}

std::string encode_header(std::vector<Entry>& tensors, const std::map<std::string, std::string>& metadata) {
  // Written member by member: the JSON library's ordered object finds each
  // key by a linear search, quadratic in the tensors (minutes for 100k).
  std::string text = "{";
  const auto member = [&](const std::string& key, const OrderedJson& value) {
    if (text.size() > 1) text += ',';
    text += Json(key).dump() + ":" + value.dump();
  };
  if (!metadata.empty()) member(kMetadataKey, OrderedJson(metadata));
  uint64_t offset = 0;
  for (Entry& e : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(numel(e.shape)) * dtype_size(e.dtype);
    member(e.name, {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}});
    e.begin = offset;
    e.end = offset + bytes;
    offset += bytes;
  }
  text += '}';
  text.resize((text.size() + 7) / 8 * 8, ' ');  // the data starts 8-byte aligned
  if (text.size() > kMaxHeaderBytes) {
    throw UsageError(
        fmt::format("the safetensors header of {} tensors would take {} bytes, more than readers "
                    "accept ({}); write fewer tensors per file (--max-shard-size)",
                    tensors.size(), text.size(), kMaxHeaderBytes));
  }
  std::string out(kPrefixBytes, '\0');
  for (size_t i = 0; i < kPrefixBytes; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  for (Entry& e : tensors) {
    e.begin += kPrefixBytes + text.size();
    e.end += kPrefixBytes + text.size();
  }
  return out + text;
}

Index parse_index(std::string_view json, const std::string& origin) {
  const Json root = parse_json(json, origin, "safetensors index");
  const auto map = root.find("weight_map");
  if (map == root.end()) throw CorruptionError(fmt::format("{}: the index has no weight_map", origin));
  Index index;
  index.weight_map = string_map(*map, origin, "weight_map");
  for (const auto& [name, file] : index.weight_map) {
    // Shards live next to the index: a path could leave the directory.
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos) {
      throw CorruptionError(fmt::format(
          "{}: weight_map puts '{}' in '{}', which is not a file name in the index's directory", origin, name, file));
    }
  }
  const auto metadata = root.find("metadata");
  if (metadata != root.end()) {
    if (!metadata->is_object()) throw CorruptionError(fmt::format("{}: the index's metadata is not an object", origin));
    for (const auto& [key, value] : metadata->items()) index.metadata.emplace(key, value.dump());
  }
  return index;
}

std::string encode_index(const Index& index) {
  OrderedJson root = OrderedJson::object();
  OrderedJson metadata = OrderedJson::object();
  for (const auto& [key, value] : index.metadata) metadata[key] = OrderedJson::parse(value);
  root["metadata"] = metadata;
  root["weight_map"] = index.weight_map;
  return root.dump(2) + "\n";
}

}  // namespace distckpt::safetensors
