#include "storage/safetensors_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "distckpt/core/errors.h"
#include "format/safetensors.h"

namespace distckpt::storage {
namespace {

constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The objects at the top of the backend's root named "*suffix", sorted.
std::vector<std::string> names_ending(Backend& backend, const std::string& suffix) {
  std::vector<std::string> out;
  for (const StoredObject& o : backend.list("", 0, /*below=*/false)) {
    if (ends_with(o.name, suffix)) out.push_back(o.name);
  }
  return out;
}

// A file the index or the directory names, for reading.
std::unique_ptr<ObjectReader> open_file(Backend& backend, const std::string& name) {
  try {
    return backend.open(name);
  } catch (const IoError& e) {
    if (e.error_number() != ENOENT) throw;
    const std::string path = backend.describe(name);
    throw CorruptionError(fmt::format("{}: {}; the safetensors files are incomplete", path, std::strerror(ENOENT)),
                          path);
  }
}

}  // namespace

bool is_safetensors_name(const std::string& path) { return ends_with(path, safetensors::kFileSuffix); }

bool holds_safetensors(Backend& backend) {
  return !names_ending(backend, safetensors::kIndexSuffix).empty() ||
         !names_ending(backend, safetensors::kFileSuffix).empty();
}

SafetensorsStorage::SafetensorsStorage(std::shared_ptr<Backend> backend, const std::string& file)
    : backend_(std::move(backend)), location_(file.empty() ? backend_->location() : backend_->describe(file)) {
  std::vector<std::string> files;
  std::optional<safetensors::Index> index;
  const std::string& where = backend_->location();
  if (!file.empty()) {
    files.push_back(file);
  } else {
    const std::vector<std::string> indexes = names_ending(*backend_, safetensors::kIndexSuffix);
    if (indexes.size() > 1) {
      throw CheckpointError(
          fmt::format("'{}' holds {} safetensors indexes ({}, ...); pass the one to load with its "
                      "shards in a directory of their own",
                      where, indexes.size(), indexes[0]));
    }
    if (indexes.size() == 1) {
      index_file_ = indexes[0];
      const std::unique_ptr<ObjectReader> reader = open_file(*backend_, index_file_);
      if (reader->size() > kMaxIndexBytes) {
        throw CorruptionError(fmt::format("{} has {} bytes, more than an index may have ({})",
                                          backend_->describe(index_file_), reader->size(), kMaxIndexBytes),
                              backend_->describe(index_file_));
      }
      std::string text(reader->size(), '\0');
      reader->read(0, text.size(), reinterpret_cast<uint8_t*>(text.data()));
      index = safetensors::parse_index(text, backend_->describe(index_file_));
      std::set<std::string> unique;
      for (const auto& [name, shard] : index->weight_map) unique.insert(shard);
      files.assign(unique.begin(), unique.end());
    } else {
      files = names_ending(*backend_, safetensors::kFileSuffix);
      if (files.size() != 1) {
        throw CheckpointError(
            files.empty()
                ? fmt::format("'{}' holds no checkpoint: no metadata.json, no safetensors index, no .safetensors file",
                              where)
                : fmt::format("'{}' holds several .safetensors files but no index saying which tensor is where; add "
                              "its model.safetensors.index.json or pass one file",
                              where));
      }
    }
  }
  // The tensors each file must hold, by the index.
  std::map<std::string, std::vector<std::string>> expected;
  if (index) {
    for (const auto& [name, shard] : index->weight_map) expected[shard].push_back(name);
  }
  for (const std::string& f : files) add_file(f, index ? &expected[f] : nullptr);
  std::sort(index_.tensors.begin(), index_.tensors.end(),
            [](const TensorRecord& a, const TensorRecord& b) { return a.key < b.key; });
  for (size_t i = 1; i < index_.tensors.size(); ++i) {
    if (index_.tensors[i].key == index_.tensors[i - 1].key) {
      throw CorruptionError(fmt::format("tensor '{}' is stored twice, in '{}' and '{}'", index_.tensors[i].key,
                                        index_.files[index_.tensors[i - 1].chunks[0].file].path,
                                        index_.files[index_.tensors[i].chunks[0].file].path));
    }
  }
  ranges_ = std::make_unique<FileRanges>(backend_, index_, true);
}

void SafetensorsStorage::add_file(const std::string& name, const std::vector<std::string>* expected) {
  const std::string path = backend_->describe(name);
  const std::unique_ptr<ObjectReader> f = open_file(*backend_, name);
  const uint64_t size = f->size();
  uint8_t prefix[safetensors::kPrefixBytes] = {};
  if (size >= sizeof prefix) f->read(0, sizeof prefix, prefix);
  const uint64_t header_bytes = safetensors::header_length(prefix, size, path);
  std::string json(header_bytes, '\0');
  f->read(safetensors::kPrefixBytes, header_bytes, reinterpret_cast<uint8_t*>(json.data()));
  const safetensors::Header header = safetensors::parse_header(json, size, path);

  if (expected != nullptr) {
    std::set<std::string> listed(expected->begin(), expected->end());
    for (const safetensors::Entry& e : header.tensors) {
      if (listed.erase(e.name) == 0) {
        throw CorruptionError(fmt::format("{} holds tensor '{}', which the index {} does not list in this file", path,
                                          e.name, index_file_),
                              path);
      }
    }
    if (!listed.empty()) {
      throw CorruptionError(fmt::format("the index {} puts tensor '{}' in {}, which does not hold it", index_file_,
                                        *listed.begin(), path),
                            path);
    }
  }
  const auto file_index = static_cast<uint32_t>(index_.files.size());
  index_.files.push_back(FileRecord{name, size, 0});
  for (const safetensors::Entry& e : header.tensors) {
    TensorRecord t;
    t.key = e.name;
    t.dtype = e.dtype;
    t.unrepresentable = e.unrepresentable;
    t.global_shape = e.shape;
    ChunkRecord c;
    c.box = Box{Shape(e.shape.size(), 0), e.shape};
    c.file = file_index;
    c.byte_offset = e.begin;
    c.byte_length = e.end - e.begin;
    t.chunks.push_back(std::move(c));
    index_.tensors.push_back(std::move(t));
  }
  // "__metadata__" of every file, as strings (the first file that sets a key wins).
  for (const auto& [key, value] : header.metadata) {
    Value& into = key == safetensors::kFormatKey ? content_ : common_;
    if (!into.contains(key)) into[key] = Value(value);
  }
}

std::optional<Value> SafetensorsStorage::read_content_metadata() const {
  if (content_.size() == 0) return std::nullopt;
  return content_;
}

void SafetensorsStorage::verify(VerifyReport& report, const VerifyProgress& progress) {
  report.files += index_.files.size() + (index_file_.empty() ? 0 : 1);
  ranges_->verify_all(index_, report, progress);
}

}  // namespace distckpt::storage
