#include "storage/safetensors_storage.h"

#include <dirent.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "distckpt/core/errors.h"
#include "format/safetensors.h"
#include "io/file.h"

namespace distckpt::storage {
namespace {

constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> names_ending(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    if (ends_with(e->d_name, suffix)) out.emplace_back(e->d_name);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// A regular file of `dir`, opened; inside it (a symlink is followed only
// within the checkpoint) unless `links` allows it anywhere.
io::File open_file(const std::string& dir, const std::string& name, FileRanges::Links links) {
  const std::string path = io::safe_join(dir, name);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    throw CorruptionError(fmt::format("{}: {}; the safetensors files are incomplete", path, std::strerror(err)), path);
  }
  if (!S_ISREG(st.st_mode)) throw CorruptionError(fmt::format("{} is not a regular file", path), path);
  return FileRanges::open(dir, path, links);
}

}  // namespace

bool is_safetensors_name(const std::string& path) { return ends_with(path, safetensors::kFileSuffix); }

bool holds_safetensors(const std::string& dir) {
  return !names_ending(dir, safetensors::kIndexSuffix).empty() || !names_ending(dir, safetensors::kFileSuffix).empty();
}

SafetensorsStorage::SafetensorsStorage(const std::string& path) : location_(path) {
  std::vector<std::string> files;
  std::optional<safetensors::Index> index;
  if (!io::is_dir(path)) {
    const std::filesystem::path file(path);
    dir_ = file.has_parent_path() ? file.parent_path().string() : ".";
    files.push_back(file.filename().string());
    links_ = FileRanges::Links::kAnywhere;  // the file the user named, which may be a link
  } else {
    dir_ = path;
    const std::vector<std::string> indexes = names_ending(dir_, safetensors::kIndexSuffix);
    if (indexes.size() > 1) {
      throw CheckpointError(
          fmt::format("'{}' holds {} safetensors indexes ({}, ...); pass the one to load with its "
                      "shards in a directory of their own",
                      dir_, indexes.size(), indexes[0]));
    }
    if (indexes.size() == 1) {
      index_file_ = indexes[0];
      const std::string index_path = io::safe_join(dir_, index_file_);
      index = safetensors::parse_index(io::read_all(open_file(dir_, index_file_, links_), kMaxIndexBytes), index_path);
      std::set<std::string> unique;
      for (const auto& [name, file] : index->weight_map) unique.insert(file);
      files.assign(unique.begin(), unique.end());
    } else {
      files = names_ending(dir_, safetensors::kFileSuffix);
      if (files.size() != 1) {
        throw CheckpointError(
            files.empty()
                ? fmt::format("'{}' holds no checkpoint: no metadata.json, no safetensors index, no .safetensors file",
                              dir_)
                : fmt::format("'{}' holds several .safetensors files but no index saying which tensor is where; add "
                              "its model.safetensors.index.json or pass one file",
                              dir_));
      }
    }
  }
  // The tensors each file must hold, by the index.
  std::map<std::string, std::vector<std::string>> expected;
  if (index) {
    for (const auto& [name, file] : index->weight_map) expected[file].push_back(name);
  }
  for (const std::string& file : files) add_file(file, index ? &expected[file] : nullptr);
  std::sort(index_.tensors.begin(), index_.tensors.end(),
            [](const TensorRecord& a, const TensorRecord& b) { return a.key < b.key; });
  for (size_t i = 1; i < index_.tensors.size(); ++i) {
    if (index_.tensors[i].key == index_.tensors[i - 1].key) {
      throw CorruptionError(fmt::format("tensor '{}' is stored twice, in '{}' and '{}'", index_.tensors[i].key,
                                        index_.files[index_.tensors[i - 1].chunks[0].file].path,
                                        index_.files[index_.tensors[i].chunks[0].file].path));
    }
  }
  ranges_ = std::make_unique<FileRanges>(dir_, index_, true, links_);
}

void SafetensorsStorage::add_file(const std::string& name, const std::vector<std::string>* expected) {
  const std::string path = io::safe_join(dir_, name);
  const io::File f = open_file(dir_, name, links_);
  const uint64_t size = f.size();
  uint8_t prefix[safetensors::kPrefixBytes] = {};
  if (size >= sizeof prefix) f.pread_all(prefix, sizeof prefix, 0);
  const uint64_t header_bytes = safetensors::header_length(prefix, size, path);
  std::string json(header_bytes, '\0');
  f.pread_all(json.data(), header_bytes, safetensors::kPrefixBytes);
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
  ranges_->verify_all(report, progress);
}

}  // namespace distckpt::storage
