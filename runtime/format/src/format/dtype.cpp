// The dtype names written to disk. They are part of the file format: never
// rename one, only add new ones.
#include "format/dtype.h"

#include <c10/core/ScalarType.h>
#include <fmt/format.h>

#include <array>
#include <utility>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

constexpr std::array<std::pair<const char*, at::ScalarType>, 12> kDtypeNames{{
    {"float64", at::kDouble},
    {"float32", at::kFloat},
    {"float16", at::kHalf},
    {"bfloat16", at::kBFloat16},
    {"int64", at::kLong},
    {"int32", at::kInt},
    {"int16", at::kShort},
    {"int8", at::kChar},
    {"uint8", at::kByte},
    {"bool", at::kBool},
    {"complex64", at::kComplexFloat},
    {"complex128", at::kComplexDouble},
}};

std::string known_names() {
  std::string names;
  for (const auto& [name, type] : kDtypeNames) {
    if (!names.empty()) names += ", ";
    names += name;
  }
  return names;
}

}  // namespace

std::string dtype_name(at::ScalarType t) {
  for (const auto& [name, type] : kDtypeNames) {
    if (type == t) return name;
  }
  throw Error(
      fmt::format("dtype {} cannot be stored in a distckpt checkpoint (supported: {}); convert the "
                  "tensor first",
                  c10::toString(t), known_names()));
}

at::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& [known, type] : kDtypeNames) {
    if (name == known) return type;
  }
  throw CorruptionError(
      fmt::format("unknown dtype '{}' (known: {}); the checkpoint is corrupted or was "
                  "written by a newer distckpt",
                  name, known_names()));
}

size_t dtype_size(at::ScalarType t) { return c10::elementSize(t); }

}  // namespace distckpt
