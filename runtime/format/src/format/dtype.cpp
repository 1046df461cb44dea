// The dtype names written to disk. They are part of the file format: never
// rename one, only add new ones. Each maps to the LibTorch type of a c10
// name, looked up at run time: float8 types exist since LibTorch 2.1 and
// uint16/32/64 since 2.3, so one source builds against any version, and a
// build whose LibTorch lacks a type still knows its name and size (such
// tensors stay listable and verifiable; see TensorRecord::unrepresentable).
#include "format/dtype.h"

#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

struct DtypeEntry {
  const char* name;      // on disk
  const char* c10_name;  // c10::toString of the LibTorch type
  uint32_t element_size;
};

constexpr DtypeEntry kDtypes[] = {
    {"float64", "Double", 8},
    {"float32", "Float", 4},
    {"float16", "Half", 2},
    {"bfloat16", "BFloat16", 2},
    {"int64", "Long", 8},
    {"int32", "Int", 4},
    {"int16", "Short", 2},
    {"int8", "Char", 1},
    {"uint8", "Byte", 1},
    {"bool", "Bool", 1},
    {"complex64", "ComplexFloat", 8},
    {"complex128", "ComplexDouble", 16},
    {"uint16", "UInt16", 2},
    {"uint32", "UInt32", 4},
    {"uint64", "UInt64", 8},
    {"float8_e4m3fn", "Float8_e4m3fn", 1},
    {"float8_e5m2", "Float8_e5m2", 1},
    {"float8_e4m3fnuz", "Float8_e4m3fnuz", 1},
    {"float8_e5m2fnuz", "Float8_e5m2fnuz", 1},
    {"float8_e8m0fnu", "Float8_e8m0fnu", 1},
};

struct Resolved {
  const DtypeEntry* entry;
  std::optional<at::ScalarType> type;  // absent: this LibTorch has none
};

// Every entry with its type in this LibTorch, found by c10 name once.
const std::vector<Resolved>& table() {
  static const std::vector<Resolved> resolved = [] {
    std::unordered_map<std::string_view, at::ScalarType> by_c10_name;
    for (int i = 0; i < static_cast<int>(at::ScalarType::NumOptions); ++i) {
      const auto type = static_cast<at::ScalarType>(i);
      by_c10_name.emplace(c10::toString(type), type);
    }
    std::vector<Resolved> out;
    for (const DtypeEntry& e : kDtypes) {
      const auto it = by_c10_name.find(e.c10_name);
      out.push_back({&e, it == by_c10_name.end() ? std::nullopt : std::optional<at::ScalarType>(it->second)});
    }
    return out;
  }();
  return resolved;
}

const Resolved* find_name(std::string_view name) {
  for (const Resolved& r : table()) {
    if (name == r.entry->name) return &r;
  }
  return nullptr;
}

const Resolved* find_type(at::ScalarType t) {
  for (const Resolved& r : table()) {
    if (r.type == t) return &r;
  }
  return nullptr;
}

std::string storable_names() {
  std::string names;
  for (const Resolved& r : table()) {
    if (!r.type) continue;
    if (!names.empty()) names += ", ";
    names += r.entry->name;
  }
  return names;
}

bool plausible_element_size(uint32_t size) { return size == 1 || size == 2 || size == 4 || size == 8 || size == 16; }

}  // namespace

bool is_storable_dtype(at::ScalarType t) { return find_type(t) != nullptr; }

std::string dtype_name(at::ScalarType t) {
  if (const Resolved* r = find_type(t)) return r->entry->name;
  throw UsageError(
      fmt::format("dtype {} cannot be stored in a distckpt checkpoint (supported: {}); convert the "
                  "tensor first",
                  c10::toString(t), storable_names()));
}

at::ScalarType dtype_from_name(const std::string& name) {
  const Resolved* r = find_name(name);
  if (!r) {
    throw CorruptionError(
        fmt::format("unknown dtype '{}' (known: {}); the checkpoint is corrupted or was written by a newer distckpt",
                    name, storable_names()));
  }
  if (!r->type) throw CheckpointError(fmt::format("this LibTorch has no {} type; a newer LibTorch has", name));
  return *r->type;
}

size_t dtype_size(at::ScalarType t) { return c10::elementSize(t); }

ResolvedDtype resolve_stored_dtype(const std::string& name, uint32_t recorded_size) {
  const Resolved* r = find_name(name);
  if (!r) {
    if (!plausible_element_size(recorded_size)) {
      throw CorruptionError(fmt::format(
          "unknown dtype '{}' with {} (known: {}); the checkpoint is corrupted", name,
          recorded_size == 0 ? std::string("no element size recorded") : fmt::format("element size {}", recorded_size),
          storable_names()));
    }
    return {at::ScalarType::Undefined, UnrepresentableDtype{name, recorded_size}};
  }
  if (recorded_size != 0 && recorded_size != r->entry->element_size) {
    throw CorruptionError(fmt::format("dtype {} is recorded with element size {}, but its elements take {} bytes", name,
                                      recorded_size, r->entry->element_size));
  }
  if (!r->type) return {at::ScalarType::Undefined, UnrepresentableDtype{name, r->entry->element_size}};
  return {*r->type, std::nullopt};
}

std::string stored_dtype_name(const TensorRecord& record) {
  return record.unrepresentable ? record.unrepresentable->name : dtype_name(record.dtype);
}

std::string unrepresentable_reason(const std::string& stored_name) {
  const Resolved* r = find_name(stored_name);
  if (r && r->type) return {};
  if (r) return fmt::format("this LibTorch has no {} type (a newer LibTorch has)", stored_name);
  return fmt::format("{} is a dtype this version of distckpt does not know (a newer one wrote it)", stored_name);
}

std::string unrepresentable_reason(const TensorRecord& record) {
  return record.unrepresentable ? unrepresentable_reason(record.unrepresentable->name) : std::string();
}

at::ScalarType carrier_dtype(const TensorRecord& record) {
  if (!record.unrepresentable) return record.dtype;
  switch (record.unrepresentable->element_size) {
    case 1:
      return at::kByte;
    case 2:
      return at::kShort;
    case 4:
      return at::kInt;
    case 8:
      return at::kLong;
    default:
      return at::kComplexDouble;  // 16 bytes; copies move them bit for bit
  }
}

}  // namespace distckpt
