// Name mappings as JSON files: how a mapping of the layout schema reaches
// a checkpoint that does not record it (PyTorch DCP, Megatron torch_dist).
// The file is the user's input, read field by field: every error names the
// file and the entry.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "distckpt/core/errors.h"
#include "distckpt/format/name_mapping.h"

namespace distckpt {
namespace {

using nlohmann::json;

// A field of `object` of the JSON type `want`; UsageError naming it otherwise.
const json& field(const json& object, const char* name, json::value_t want, const std::string& where) {
  const auto it = object.find(name);
  const bool number = want == json::value_t::number_integer;
  if (it == object.end() || (number ? !it->is_number_integer() : it->type() != want)) {
    throw UsageError(fmt::format("{}: '{}' is missing or not {}", where, name,
                                 number                           ? "an integer"
                                 : want == json::value_t::string  ? "a string"
                                 : want == json::value_t::array   ? "a list"
                                 : want == json::value_t::boolean ? "true or false"
                                                                  : "an object"));
  }
  return *it;
}

int64_t integer(const json& value, const char* name, const std::string& where) {
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    throw UsageError(fmt::format("{}: '{}' is past 64-bit integers", where, name));
  }
  return value.get<int64_t>();
}

int small_dim(const json& value, const char* name, const std::string& where) {
  const int64_t dim = integer(value, name, where);
  if (dim < -1 || dim > 64) throw UsageError(fmt::format("{}: '{}' is {}, not a dim", where, name, dim));
  return static_cast<int>(dim);
}

}  // namespace

std::string NameMapping::to_json() const {
  json tensors = json::array();
  for (const MappedTensor& t : tensors_) {
    json entry = {{"key", t.key}, {"external", t.external}, {"shape", t.shape}, {"indices", json::array()}};
    for (const MappedTensor::Index& index : t.indices) {
      entry["indices"].push_back({{"name", index.name}, {"count", index.count}, {"leading_axis", index.leading_axis}});
    }
    if (t.part_dim >= 0) entry["part"] = {{"dim", t.part_dim}, {"offset", t.part_offset}, {"extent", t.part_extent}};
    if (t.pad_dim >= 0) entry["pad_dim"] = t.pad_dim;
    tensors.push_back(std::move(entry));
  }
  return json{{"name", name_}, {"tensors", std::move(tensors)}}.dump(1) + "\n";
}

NameMapping NameMapping::from_json(const std::string& text, const std::string& where) {
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) {
    throw UsageError(
        fmt::format("{}: not a name mapping (a JSON object with \"name\" and \"tensors\" expected)", where));
  }
  NameMapping out(field(root, "name", json::value_t::string, where).get<std::string>());
  const json& tensors = field(root, "tensors", json::value_t::array, where);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const json& t = tensors[i];
    const std::string at = fmt::format("{}: tensors[{}]", where, i);
    if (!t.is_object()) throw UsageError(fmt::format("{} is not an object", at));
    Shape shape;
    for (const json& extent : field(t, "shape", json::value_t::array, at)) {
      if (!extent.is_number_integer()) throw UsageError(fmt::format("{}: 'shape' holds a non-integer", at));
      shape.push_back(integer(extent, "shape", at));
    }
    MappedTensor& entry = out.map(field(t, "key", json::value_t::string, at).get<std::string>(),
                                  field(t, "external", json::value_t::string, at).get<std::string>(), std::move(shape));
    if (const auto indices = t.find("indices"); indices != t.end()) {
      if (!indices->is_array()) throw UsageError(fmt::format("{}: 'indices' is not a list", at));
      for (const json& index : *indices) {
        if (!index.is_object()) throw UsageError(fmt::format("{}: an index is not an object", at));
        entry.indices.push_back({field(index, "name", json::value_t::string, at).get<std::string>(),
                                 integer(field(index, "count", json::value_t::number_integer, at), "count", at),
                                 index.contains("leading_axis")
                                     ? field(index, "leading_axis", json::value_t::boolean, at).get<bool>()
                                     : true});
      }
    }
    if (const auto part = t.find("part"); part != t.end()) {
      if (!part->is_object()) throw UsageError(fmt::format("{}: 'part' is not an object", at));
      entry.part(small_dim(field(*part, "dim", json::value_t::number_integer, at), "dim", at),
                 integer(field(*part, "offset", json::value_t::number_integer, at), "offset", at),
                 integer(field(*part, "extent", json::value_t::number_integer, at), "extent", at));
    }
    if (t.contains("pad_dim")) {
      entry.with_pad(small_dim(field(t, "pad_dim", json::value_t::number_integer, at), "pad_dim", at));
    }
  }
  try {
    out.expand();  // every entry's checks, now, with the file named
  } catch (const Error& e) {
    throw UsageError(fmt::format("{}: {}", where, e.what()));
  }
  return out;
}

}  // namespace distckpt
