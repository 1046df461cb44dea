// Expansion of name mappings into one record per external tensor.
#include "distckpt/format/name_mapping.h"

#include <fmt/format.h>

#include <unordered_map>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

// `text` with every "{name}" replaced by its value; UsageError on unknown names.
std::string substitute(const std::string& text, const std::vector<MappedTensor::Index>& indices,
                       const std::vector<int64_t>& values, const std::string& where) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '{') {
      out += text[i];
      continue;
    }
    const size_t close = text.find('}', i);
    if (close == std::string::npos) throw UsageError(fmt::format("{}: '{{' without '}}' in '{}'", where, text));
    const std::string name = text.substr(i + 1, close - i - 1);
    size_t k = 0;
    while (k < indices.size() && indices[k].name != name) ++k;
    if (k == indices.size())
      throw UsageError(fmt::format("{}: '{{{}}}' in '{}' is not one of its indices", where, name, text));
    out += std::to_string(values[k]);
    i = close;
  }
  return out;
}

void check_entry(const MappedTensor& t, const std::string& where) {
  const auto dims = static_cast<int>(t.shape.size());
  for (const int64_t extent : t.shape) {
    if (extent < 0) throw UsageError(fmt::format("{}: negative extent in the shape of '{}'", where, t.key));
  }
  for (const MappedTensor::Index& index : t.indices) {
    if (index.count < 0) throw UsageError(fmt::format("{}: index '{}' has a negative count", where, index.name));
  }
  if (t.pad_dim >= dims || t.pad_dim < -1)
    throw UsageError(fmt::format("{}: pad dim {} of '{}'", where, t.pad_dim, t.key));
  if (t.part_dim == -1) return;
  if (t.part_dim < 0 || t.part_dim >= dims || t.part_offset < 0 || t.part_extent < 0 ||
      t.part_offset > t.shape[t.part_dim] - t.part_extent) {
    throw UsageError(fmt::format("{}: part [{}, +{}) along dim {} is not inside '{}' of shape {}", where, t.part_offset,
                                 t.part_extent, t.part_dim, t.key, to_string(t.shape)));
  }
}

}  // namespace

MappedTensor& MappedTensor::over(std::string name, int64_t count) {
  indices.push_back(Index{std::move(name), count, true});
  return *this;
}

MappedTensor& MappedTensor::over_keys(std::string name, int64_t count) {
  indices.push_back(Index{std::move(name), count, false});
  return *this;
}

MappedTensor& MappedTensor::part(int dim, int64_t offset, int64_t extent) {
  part_dim = dim;
  part_offset = offset;
  part_extent = extent;
  return *this;
}

MappedTensor& MappedTensor::with_pad(int dim) {
  pad_dim = dim;
  return *this;
}

Shape MappedName::external_shape() const { return Shape(region.length.begin() + leading_axes, region.length.end()); }

void MappedName::take_pad_extent(int64_t extent) {
  if (key_pad_dim < 0) return;
  key_shape[static_cast<size_t>(key_pad_dim)] = extent;
  region.length[static_cast<size_t>(key_pad_dim)] = extent;
}

MappedTensor& NameMapping::map(std::string key, std::string external, Shape shape) {
  MappedTensor& t = tensors_.emplace_back();
  t.key = std::move(key);
  t.external = std::move(external);
  t.shape = std::move(shape);
  return t;
}

std::vector<MappedName> NameMapping::expand() const {
  const std::string where = fmt::format("name mapping '{}'", name_);
  // Far beyond any model (61 layers x 256 experts x 3 parts is 47k), and a
  // bound on what a mapping read from a checkpoint can make us allocate.
  constexpr int64_t kMaxNames = int64_t{1} << 24;
  std::vector<MappedName> out;
  std::unordered_map<std::string, size_t> seen;  // external name -> position in `out`
  for (const MappedTensor& t : tensors_) {
    check_entry(t, where);
    Shape leading;
    for (const MappedTensor::Index& index : t.indices) {
      if (index.leading_axis) leading.push_back(index.count);
    }
    std::vector<int64_t> values(t.indices.size(), 0);
    int64_t combinations = 1;
    for (const MappedTensor::Index& index : t.indices) {
      if (index.count != 0 && combinations > (kMaxNames - static_cast<int64_t>(out.size())) / index.count) {
        throw CheckpointError(
            fmt::format("{}: '{}' expands to more than {} external names; a mapping this large is "
                        "damaged or not a model's",
                        where, t.external, kMaxNames));
      }
      combinations *= index.count;
    }
    for (int64_t n = 0; n < combinations; ++n) {
      int64_t rest = n;
      for (size_t k = t.indices.size(); k-- > 0;) {
        values[k] = rest % t.indices[k].count;
        rest /= t.indices[k].count;
      }
      MappedName name;
      name.external = substitute(t.external, t.indices, values, where);
      name.key = substitute(t.key, t.indices, values, where);
      name.key_shape = leading;
      name.key_shape.insert(name.key_shape.end(), t.shape.begin(), t.shape.end());
      for (size_t k = 0; k < t.indices.size(); ++k) {
        if (!t.indices[k].leading_axis) continue;
        name.region.offset.push_back(values[k]);
        name.region.length.push_back(1);
      }
      for (size_t d = 0; d < t.shape.size(); ++d) {
        const bool cut = static_cast<int>(d) == t.part_dim;
        name.region.offset.push_back(cut ? t.part_offset : 0);
        name.region.length.push_back(cut ? t.part_extent : t.shape[d]);
      }
      name.leading_axes = static_cast<int>(leading.size());
      name.key_pad_dim = t.pad_dim < 0 ? -1 : static_cast<int>(leading.size()) + t.pad_dim;
      const auto [it, inserted] = seen.emplace(name.external, out.size());
      if (!inserted) {
        throw UsageError(fmt::format("{} names the external tensor '{}' twice: for '{}' and for '{}'", where,
                                     name.external, out[it->second].key, name.key));
      }
      out.push_back(std::move(name));
    }
  }
  return out;
}

const NameMapping& find_mapping(const std::vector<NameMapping>& mappings, const std::string& name,
                                const std::string& where) {
  std::string names;
  for (const NameMapping& m : mappings) {
    if (m.name() == name) return m;
    names += (names.empty() ? "" : ", ") + m.name();
  }
  throw UsageError(fmt::format("{} has no name mapping '{}' ({})", where, name,
                               names.empty() ? "it records none: mappings come from the layout schema, saved through "
                                               "the generated API; for a checkpoint saved without them, give the "
                                               "mapping itself (a JSON file of NameMapping::to_json: --map FILE.json)"
                                             : "it has: " + names));
}

}  // namespace distckpt
