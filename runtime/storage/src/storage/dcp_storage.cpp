#include "storage/dcp_storage.h"

#include <ATen/core/Tensor.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <regex>

#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "format/dcp_metadata.h"
#include "format/dtype.h"
#include "format/zip_archive.h"
#include "format/zstd_stream.h"
#include "storage/torch_file_reader.h"

namespace distckpt::storage {
namespace {

// `.metadata` grows with chunks (about 300 bytes each): 4 GiB is ten million.
constexpr uint64_t kMaxMetadataBytes = uint64_t{4} << 30;
constexpr const char* kMegatronCommonFile = "common.pt";
// A compressed tensor item decompresses to a torch.save archive: the
// values plus its pickle, headers and alignment, far less than this.
constexpr uint64_t kArchiveOverheadBytes = uint64_t{1} << 20;
// A compressed bytes item (common state, a sharded object): no size is
// recorded for it, so this bounds what one may decompress to.
constexpr uint64_t kMaxInflatedObjectBytes = uint64_t{1} << 30;

// An item's decompressed bytes as an object.
class InflatedReader final : public ObjectReader {
 public:
  InflatedReader(std::shared_ptr<const std::string> bytes, std::string what)
      : bytes_(std::move(bytes)), what_(std::move(what)) {}
  uint64_t size() const override { return bytes_->size(); }
  void read(uint64_t offset, uint64_t length, uint8_t* out) const override {
    if (offset > bytes_->size() || length > bytes_->size() - offset) {
      throw CorruptionError(fmt::format("{}: {} bytes at {} pass the decompressed item's end ({} bytes)", what_, length,
                                        offset, bytes_->size()),
                            what_);
    }
    std::memcpy(out, bytes_->data() + offset, length);
  }

 private:
  std::shared_ptr<const std::string> bytes_;
  std::string what_;
};

// PyTorch's descriptors are "name[@domain][/version]"; distckpt reads
// zstd, whose version 1 is the only one there is.
bool is_zstd_v1(const std::string& descriptor) {
  const size_t slash = descriptor.find('/');
  if (descriptor.substr(0, slash) != "stream.zstd" || slash == std::string::npos) return false;
  const std::string version = descriptor.substr(slash + 1);
  return version.substr(0, version.find('.')) == "1";
}

// Bytes [base, base + length) of another object, as an object of their own.
// Opening an item's archive takes a handful of small reads at its two ends
// (the directory at the end, local headers and the pickle at the start):
// each end is read once, in one request, and the small reads served from it.
class WindowReader final : public ObjectReader {
 public:
  static constexpr uint64_t kEndBytes = 4096;

  WindowReader(std::unique_ptr<ObjectReader> whole, uint64_t base, uint64_t length, std::string what)
      : whole_(std::move(whole)), base_(base), length_(length), what_(std::move(what)) {}
  uint64_t size() const override { return length_; }
  void read(uint64_t offset, uint64_t length, uint8_t* out) const override {
    if (offset > length_ || length > length_ - offset) {
      throw CorruptionError(
          fmt::format("{}: {} bytes at {} pass the item's end ({} bytes)", what_, length, offset, length_), what_);
    }
    const uint64_t ends = std::min(kEndBytes, length_);
    if (length < ends && offset + length <= ends) return copy(head_, 0, offset, length, out);
    if (length < ends && offset >= length_ - ends) return copy(tail_, length_ - ends, offset, length, out);
    whole_->read(base_ + offset, length, out);
  }

 private:
  // Serves [offset, offset + length) from `end`, bytes [from, from + its size) of the window.
  void copy(std::string& end, uint64_t from, uint64_t offset, uint64_t length, uint8_t* out) const {
    if (end.empty()) {
      end.resize(std::min(kEndBytes, length_));
      whole_->read(base_ + from, end.size(), reinterpret_cast<uint8_t*>(end.data()));
    }
    std::memcpy(out, end.data() + (offset - from), length);
  }

  std::unique_ptr<ObjectReader> whole_;
  uint64_t base_, length_;
  std::string what_;
  mutable std::string head_, tail_;  // read on first use; the reader serves one thread
};

// Megatron's sharded objects: "KEY/shard_OFFSETS_SHAPE", dot-separated.
std::optional<ObjectRecord> sharded_object(const std::string& key) {
  static const std::regex pattern(R"((.+)/shard_([0-9]+(?:\.[0-9]+)*)_([0-9]+(?:\.[0-9]+)*))");
  std::smatch m;
  if (!std::regex_match(key, m, pattern)) return std::nullopt;
  const auto numbers = [](const std::string& text) {
    Shape out;
    size_t at = 0;
    while (at <= text.size()) {
      const size_t dot = std::min(text.find('.', at), text.size());
      out.push_back(std::stoll(text.substr(at, dot - at)));
      at = dot + 1;
    }
    return out;
  };
  ObjectRecord o;
  o.key = m[1];
  try {
    o.global_offset = numbers(m[2]);
    o.global_shape = numbers(m[3]);
  } catch (const std::out_of_range&) {
    return std::nullopt;  // not Megatron's: numbers past 64 bits
  }
  if (o.global_offset.size() != o.global_shape.size() || o.unique_key() != key) return std::nullopt;
  return o;
}

}  // namespace

bool holds_dcp(Backend& backend) { return backend.size_of(kDcpMetadataFile).has_value(); }

DcpStorage::DcpStorage(std::shared_ptr<Backend> backend, bool verify_checksums)
    : backend_(std::move(backend)), verify_checksums_(verify_checksums) {
  const std::string origin = backend_->describe(kDcpMetadataFile);
  if (!backend_->size_of(kDcpMetadataFile)) {
    throw CheckpointError(fmt::format("'{}' holds no PyTorch DCP checkpoint (no .metadata)", backend_->location()),
                          backend_->location());
  }
  const std::string bytes = backend_->read_small(kDcpMetadataFile, kMaxMetadataBytes);
  dcp::Metadata metadata = dcp::parse_metadata(bytes, origin);
  naming_ = metadata.naming;

  // Every file an item names, checked once: inside the checkpoint, large enough.
  std::map<std::string, uint32_t> file_index;
  const auto compressed = [&](const dcp::StorageInfo& s, const std::string& what) {
    if (s.transforms.empty()) return false;
    if (s.transforms.size() == 1 && is_zstd_v1(s.transforms[0])) return true;
    throw CheckpointError(fmt::format("{}: {} is stored through transforms ({}); distckpt reads items stored plain or "
                                      "through stream.zstd/1 only: save it without the others",
                                      origin, what, fmt::join(s.transforms, ", ")),
                          origin);
  };
  const auto file_of = [&](const dcp::StorageInfo& s, const std::string& what) {
    const auto [it, added] = file_index.emplace(s.relative_path, static_cast<uint32_t>(index_.files.size()));
    if (added) {
      try {
        check_object_name(s.relative_path, fmt::format("the file of {} in {}", what, origin));
      } catch (const Error& e) {
        throw CorruptionError(e.what(), origin);
      }
      index_.files.push_back(FileRecord{s.relative_path, 0, 0});
    }
    return it->second;
  };
  std::vector<std::pair<const dcp::StorageInfo*, std::string>> items;  // to check against file sizes
  for (dcp::Tensor& t : metadata.tensors) {
    TensorRecord record;
    record.key = t.key;
    record.dtype = t.dtype;
    record.unrepresentable = t.unrepresentable;
    record.global_shape = t.size;
    std::vector<Item> chunk_items;
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      const dcp::Chunk& chunk = t.chunks[c];
      const std::string what = fmt::format("chunk {} of '{}'", c, t.key);
      ChunkRecord stored;
      stored.box = Box{chunk.offsets, chunk.sizes};
      stored.file = file_of(chunk.storage, what);
      stored.byte_offset = chunk.storage.offset;  // of the item; the record inside it is found when read
      stored.byte_length = static_cast<uint64_t>(stored.box.numel()) * record.element_size();
      const bool zstd = compressed(chunk.storage, what);
      if (!zstd && stored.byte_length > chunk.storage.length) {
        throw CorruptionError(fmt::format("{}: {} needs {} bytes; its item has {}", origin, what, stored.byte_length,
                                          chunk.storage.length),
                              origin);
      }
      chunk_items.push_back(Item{t.key, stored.file, chunk.storage.offset, chunk.storage.length,
                                 zstd ? stored.byte_length + kArchiveOverheadBytes : 0});
      items.emplace_back(&chunk.storage, what);
      record.chunks.push_back(std::move(stored));
    }
    index_.tensors.push_back(std::move(record));
    tensor_items_.push_back(std::move(chunk_items));
  }
  for (const dcp::BytesItem& b : metadata.bytes) {
    const std::string what = fmt::format("'{}'", b.key);
    const uint32_t file = file_of(b.storage, what);
    const uint64_t limit = compressed(b.storage, what) ? kMaxInflatedObjectBytes : 0;
    items.emplace_back(&b.storage, what);
    if (std::optional<ObjectRecord> o = sharded_object(b.key)) {
      o->file = file;
      o->byte_offset = b.storage.offset;
      o->byte_length = b.storage.length;
      if (limit != 0) compressed_objects_.insert(o->unique_key());
      index_.objects.push_back(std::move(*o));
    } else {
      common_items_.push_back(Item{b.key, file, b.storage.offset, b.storage.length, limit});
    }
  }
  std::sort(index_.objects.begin(), index_.objects.end(),
            [](const ObjectRecord& a, const ObjectRecord& b) { return a.unique_key() < b.unique_key(); });

  std::vector<std::string> names;
  for (const FileRecord& f : index_.files) names.push_back(f.path);
  const std::vector<std::optional<uint64_t>> sizes = backend_->sizes_of(names);
  for (size_t i = 0; i < names.size(); ++i) {
    if (!sizes[i]) {
      throw CorruptionError(fmt::format("{} names '{}', which is missing: the checkpoint is incomplete", origin,
                                        backend_->describe(names[i])),
                            origin);
    }
    index_.files[i].size = *sizes[i];
  }
  for (const auto& [s, what] : items) {
    const uint64_t size = index_.files[file_index.at(s->relative_path)].size;
    if (s->offset > size || s->length > size - s->offset) {
      throw CorruptionError(fmt::format("{}: {} is at bytes [{}, {}) of '{}', which has {}", origin, what, s->offset,
                                        s->offset + s->length, s->relative_path, size),
                            origin);
    }
  }
  has_common_file_ = backend_->size_of(kMegatronCommonFile).has_value();
  ranges_ = std::make_unique<FileRanges>(backend_, index_, /*verify_checksums=*/false);
}

DcpStorage::~DcpStorage() = default;

std::string DcpStorage::describe(const Item& item) const {
  return fmt::format("{} (item '{}' at bytes [{}, {}))", backend_->describe(index_.files[item.file].path), item.key,
                     item.offset, item.offset + item.length);
}

std::unique_ptr<ObjectReader> DcpStorage::open_item(const Item& item) const {
  if (item.inflated_limit != 0) return std::make_unique<InflatedReader>(inflate(item), describe(item));
  return std::make_unique<WindowReader>(ranges_->open_uncached(item.file), item.offset, item.length, describe(item));
}

std::shared_ptr<const std::string> DcpStorage::inflate(const Item& item) const {
  const std::pair<uint32_t, uint64_t> at{item.file, item.offset};
  {
    std::lock_guard<std::mutex> lock(inflated_mutex_);
    if (inflated_at_ == at) return inflated_;
  }
  // Decompressed outside the lock: two threads may both inflate one item, harmlessly.
  std::string packed(item.length, '\0');
  ranges_->read(item.file, item.offset, item.length, {}, 0, item.length, reinterpret_cast<uint8_t*>(packed.data()),
                describe(item));
  auto bytes = std::make_shared<const std::string>(zstd::inflate(reinterpret_cast<const uint8_t*>(packed.data()),
                                                                 packed.size(), item.inflated_limit, describe(item)));
  std::lock_guard<std::mutex> lock(inflated_mutex_);
  inflated_at_ = at;
  inflated_ = bytes;
  return bytes;
}

DcpStorage::Item DcpStorage::item_of(const ObjectRecord& object) const {
  const bool compressed = compressed_objects_.count(object.unique_key()) != 0;
  return Item{object.unique_key(), object.file, object.byte_offset, object.byte_length,
              compressed ? kMaxInflatedObjectBytes : 0};
}

DcpStorage::Record DcpStorage::find_record(const TensorRecord& tensor, uint32_t chunk, const Item& item) const {
  const std::string where = describe(item);
  if (tensor.unrepresentable) {
    throw CheckpointError(fmt::format("{}: '{}' is stored as {}; {}", where, tensor.key, tensor.unrepresentable->name,
                                      "this LibTorch has no such type"),
                          where);
  }
  TorchFileReader archive(open_item(item), where, TorchFileReader::Root::kTensor);
  const at::Tensor& layout = archive.tensors().at(0).layout;
  const Box& box = tensor.chunks[chunk].box;
  if (layout.scalar_type() != tensor.dtype || layout.sizes().vec() != box.length || !archive.contiguous(0)) {
    throw CorruptionError(
        fmt::format("{} holds a{} {} tensor of shape [{}], where .metadata says chunk {} of '{}' is {} of shape [{}]",
                    where, archive.contiguous(0) ? "" : " non-contiguous", dtype_name(layout.scalar_type()),
                    fmt::join(layout.sizes(), ", "), chunk, tensor.key, dtype_name(tensor.dtype),
                    fmt::join(box.length, ", ")),
        where);
  }
  const TorchFileReader::Placement at = archive.placement(0);
  Record r;
  r.inflated = item.inflated_limit != 0;
  r.file_offset = (r.inflated ? 0 : item.offset) + at.file_offset;
  r.bytes = at.bytes;
  r.whole_record = at.record && at.file_offset == at.record->data_offset && at.bytes == at.record->size;
  r.crc32 = at.record ? at.record->crc32 : 0;
  return r;
}

DcpStorage::Record DcpStorage::record_of(size_t tensor, uint32_t chunk) {
  const uint64_t id = (static_cast<uint64_t>(tensor) << 32) | chunk;
  {
    std::lock_guard<std::mutex> lock(records_mutex_);
    const auto it = records_.find(id);
    if (it != records_.end()) return it->second;
  }
  // Found outside the lock: two threads may both open one item, harmlessly.
  const TensorRecord& t = index_.tensors[tensor];
  const Item& item = tensor_items_[tensor][chunk];
  const Record r = find_record(t, chunk, item);
  std::lock_guard<std::mutex> lock(records_mutex_);
  return records_.emplace(id, r).first->second;
}

DcpStorage::Located DcpStorage::located(const TensorRecord& tensor, uint32_t chunk) {
  const TensorRecord* mine = index_.find_tensor(tensor.key);
  if (!mine || chunk >= mine->chunks.size()) {
    throw UsageError(fmt::format("chunk {} of '{}' is not stored in '{}'", chunk, tensor.key, location()));
  }
  Located out;
  out.tensor = static_cast<size_t>(mine - index_.tensors.data());
  out.stored = record_of(out.tensor, chunk);
  TensorRecord& r = out.record;
  r.key = mine->key;
  r.dtype = mine->dtype;
  r.unrepresentable = mine->unrepresentable;
  r.global_shape = mine->global_shape;
  r.chunks.push_back(mine->chunks[chunk]);
  r.chunks[0].byte_offset = out.stored.file_offset;
  return out;
}

void DcpStorage::read_chunk(const TensorRecord& tensor, uint32_t chunk, uint64_t begin, uint64_t end, uint8_t* out) {
  const Located at = located(tensor, chunk);
  const Record& r = at.stored;
  if (r.inflated) {
    copy_inflated(at, chunk, {ByteRun{begin, end - begin, out}});
  } else {
    ranges_->read_chunk(at.record, 0, begin, end, out);
  }
  if (verify_checksums_ && r.whole_record && begin == 0 && end == r.bytes && r.bytes > 0) {
    zip::Crc32 crc;
    crc.update(out, r.bytes);
    if (crc.value() != r.crc32) {
      const std::string where = describe(tensor_items_[at.tensor][chunk]);
      throw CorruptionError(fmt::format("{}: the values of chunk {} of '{}' fail their CRC-32 (recorded {:08x}, read "
                                        "{:08x}): the file is damaged",
                                        where, chunk, tensor.key, r.crc32, crc.value()),
                            where);
    }
  }
}

void DcpStorage::read_chunk_runs(const TensorRecord& tensor, uint32_t chunk, const std::vector<ByteRun>& runs) {
  const Located at = located(tensor, chunk);
  if (!at.stored.inflated) return ranges_->read_chunk_runs(at.record, 0, runs);
  copy_inflated(at, chunk, runs);
}

void DcpStorage::copy_inflated(const Located& at, uint32_t chunk, const std::vector<ByteRun>& runs) const {
  const std::shared_ptr<const std::string> item = inflate(tensor_items_[at.tensor][chunk]);
  for (const ByteRun& run : runs) {
    if (run.offset > at.stored.bytes || run.bytes > at.stored.bytes - run.offset) {
      throw UsageError(fmt::format("read of '{}' chunk {}: bytes [{}, +{}) leave the chunk ({} bytes)", at.record.key,
                                   chunk, run.offset, run.bytes, at.stored.bytes));
    }
    // The archive's parse checked that the record lies inside it.
    std::memcpy(run.out, item->data() + at.stored.file_offset + run.offset, run.bytes);
  }
}

std::string DcpStorage::read_object(const ObjectRecord& object) {
  const Item item = item_of(object);
  if (item.inflated_limit == 0) return FileBackedStorage::read_object(object);
  return *inflate(item);
}

// A torch.save archive's value: plain values and tensors (each at its
// dotted path: torch 1.13 stores a nested dict whole, tensors included);
// nullopt for anything else (a class the restricted reader does not know).
std::optional<Value> DcpStorage::decode_archive(std::unique_ptr<ObjectReader> reader, const std::string& where) {
  if (!is_torch_file(*reader)) return std::nullopt;
  try {
    TorchFileReader archive(std::move(reader), where, TorchFileReader::Root::kAny);
    Value value = archive.common();
    for (auto& [name, tensor] : archive.read_all()) {
      if (name.empty()) return Value(tensor);
      Value* at = &value;
      size_t begin = 0;
      for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', begin = dot + 1)) {
        at = &(*at)[name.substr(begin, dot - begin)];
        if (at->kind() == Kind::kNone) *at = Value::dict();
      }
      (*at)[name.substr(begin)] = Value(tensor);
    }
    return value;
  } catch (const Error&) {
    return std::nullopt;
  }
}

Value DcpStorage::decode_bytes(const Item& item) const {
  if (std::optional<Value> value = decode_archive(open_item(item), describe(item))) return std::move(*value);
  std::string bytes(item.length, '\0');  // kept as they are
  open_item(item)->read(0, item.length, reinterpret_cast<uint8_t*>(bytes.data()));
  return Value(std::move(bytes));
}

Value DcpStorage::read_common_state() const {
  std::lock_guard<std::mutex> lock(common_mutex_);
  if (common_) return *common_;
  Value common = Value::dict();
  if (has_common_file_) {
    // Megatron's common state; when it holds what the restricted reader does
    // not know (an argparse.Namespace), it is kept whole, as its bytes.
    const std::string where = backend_->describe(kMegatronCommonFile);
    std::optional<Value> decoded = decode_archive(backend_->open(kMegatronCommonFile), where);
    if (decoded && decoded->kind() == Kind::kDict) {
      common = std::move(*decoded);
    } else {
      log_message(LogLevel::kWarning,
                  fmt::format("'{}' holds values the restricted reader does not decode: kept as its bytes under '{}'",
                              where, kMegatronCommonFile));
      common[kMegatronCommonFile] = Value(backend_->read_small(kMegatronCommonFile, uint64_t{1} << 32));
    }
  }
  for (const Item& item : common_items_) common[item.key] = decode_bytes(item);
  common_ = common;
  return common;
}

void DcpStorage::verify(VerifyReport& report, const VerifyProgress& progress) {
  uint64_t total = 0, done = 0;
  for (const auto& chunks : tensor_items_) {
    for (const Item& item : chunks) total += item.length;
  }
  for (const Item& item : common_items_) total += item.length;
  for (const ObjectRecord& o : index_.objects) total += o.byte_length;
  report.files += index_.files.size() + 1;
  const auto check_archive = [&](std::unique_ptr<ObjectReader> reader, const std::string& where) {
    if (!is_torch_file(*reader)) return;  // a raw bytes value: nothing recorded to check against
    VerifyReport items;
    verify_zip_records(*reader, where, items, {});
    report.problems.insert(report.problems.end(), items.problems.begin(), items.problems.end());
    report.bytes_checked += items.bytes_checked;
  };
  const auto step = [&](uint64_t bytes) {
    done += bytes;
    if (progress) progress(done, total);
  };
  for (size_t t = 0; t < tensor_items_.size(); ++t) {
    for (uint32_t c = 0; c < tensor_items_[t].size(); ++c) {
      const Item& item = tensor_items_[t][c];
      try {
        record_of(t, c);  // the archive agrees with .metadata
        check_archive(open_item(item), describe(item));
      } catch (const Error& e) {
        report.problems.push_back(e.what());
      }
      step(item.length);
    }
  }
  for (const Item& item : common_items_) {
    try {
      check_archive(open_item(item), describe(item));
    } catch (const Error& e) {
      report.problems.push_back(e.what());
    }
    step(item.length);
  }
  for (const ObjectRecord& o : index_.objects) {
    const Item item = item_of(o);
    try {
      check_archive(open_item(item), describe(item));
    } catch (const Error& e) {
      report.problems.push_back(e.what());
    }
    step(o.byte_length);
  }
  if (!report.problems.empty()) report.status = VerifyReport::Status::kCorrupt;
}

}  // namespace distckpt::storage
