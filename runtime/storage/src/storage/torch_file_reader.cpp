#include "storage/torch_file_reader.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "distckpt/core/errors.h"
#include "format/torch_pickle.h"
#include "io/file.h"
#include "storage/locate.h"
#include "storage/torch_file_writer.h"

namespace distckpt::storage {
namespace {

// torch.save's zip archive: a local file header first.
constexpr char kZipSignature[4] = {'P', 'K', 3, 4};

// The nesting a state dict needs, with room; a deeper (or cyclic) pickle is refused.
constexpr int kMaxDepth = 64;

// A state dict is a tree. The pickle's memo can make a node (a list, a
// dict, a string) appear at many places, each copy costing memory: a few
// bytes of pickle could stand for any amount. Every node visited and every
// byte of key, path and string copied count against this many units per
// byte of pickle, far above what a state dict needs.
constexpr uint64_t kUnitsPerPickleByte = 64;
constexpr uint64_t kUnitsSlack = uint64_t{1} << 20;

// Turns the unpickled tree into tensors (at any depth of dicts, named by
// their dotted path) and common values.
class Converter {
 public:
  Converter(const std::string& path, uint64_t pickle_bytes)
      : path_(path), budget_(kUnitsPerPickleByte * pickle_bytes + kUnitsSlack) {}

  // A value of the dict at `where`; tensors go to `out` (nullopt: nothing
  // stays in the common values).
  std::optional<Value> take(const torch_pickle::Node& n, const std::string& where, NamedTensors& out, int depth) {
    check_depth(depth, where);
    spend(1 + where.size());
    if (const auto* t = std::get_if<at::Tensor>(&n.value)) {
      out.emplace_back(where, *t);
      return std::nullopt;
    }
    if (const auto* d = std::get_if<std::shared_ptr<torch_pickle::Dict>>(&n.value)) {
      Value dict = Value::dict();
      for (const auto& [k, v] : (*d)->items) {
        const std::string key = key_of(k);
        std::optional<Value> kept = take(*v, where.empty() ? key : where + "." + key, out, depth + 1);
        if (kept) put(dict, key, std::move(*kept), where);
      }
      if (dict.as_dict().empty() && !(*d)->items.empty()) return std::nullopt;  // held only tensors
      return dict;
    }
    return plain(n, where, depth);
  }

 private:
  static std::string key_of(const torch_pickle::Key& k) {
    // Optimizer state is keyed by parameter index.
    return std::holds_alternative<int64_t>(k) ? std::to_string(std::get<int64_t>(k)) : std::get<std::string>(k);
  }

  void spend(uint64_t units) {
    spent_ += units;
    if (spent_ > budget_) {
      throw CheckpointError(
          fmt::format(
              "'{}': its pickle expands to more than {} times its size (the same list, dict or string referred to from "
              "many places); a state dict is a tree",
              path_, kUnitsPerPickleByte),
          path_);
    }
  }

  // An int key and a string key of one dict ({0: a, "0": b}) would name one value.
  void put(Value& dict, const std::string& key, Value value, const std::string& where) const {
    if (dict.contains(key)) {
      throw CheckpointError(fmt::format("'{}': {} holds the key '{}' twice (as an int and as a string)", path_,
                                        where.empty() ? "the top-level dict" : "'" + where + "'", key),
                            path_);
    }
    dict[key] = std::move(value);
  }

  void check_depth(int depth, const std::string& where) const {
    if (depth > kMaxDepth) {
      throw CheckpointError(
          fmt::format("'{}': '{}' is nested more than {} levels deep (or refers to itself)", path_, where, kMaxDepth),
          path_);
    }
  }

  Value plain(const torch_pickle::Node& n, const std::string& where, int depth) {
    check_depth(depth, where);
    spend(1 + where.size());
    if (const auto* s = std::get_if<std::string>(&n.value)) spend(s->size());
    return std::visit(
        [&](const auto& v) -> Value {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::monostate>) {
            return Value();
          } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, int64_t> || std::is_same_v<T, double> ||
                               std::is_same_v<T, std::string>) {
            return Value(v);
          } else if constexpr (std::is_same_v<T, std::shared_ptr<torch_pickle::List>>) {
            List list;
            for (size_t i = 0; i < v->items.size(); ++i) {
              if (std::holds_alternative<at::Tensor>(v->items[i]->value)) {
                throw CheckpointError(
                    fmt::format("'{}': '{}' is a list holding tensors; store them in a dict", path_, where), path_);
              }
              list.push_back(plain(*v->items[i], fmt::format("{}[{}]", where, i), depth + 1));
            }
            return Value(std::move(list));
          } else if constexpr (std::is_same_v<T, std::shared_ptr<torch_pickle::Dict>>) {
            Value dict = Value::dict();
            for (const auto& [k, item] : v->items) {
              const std::string key = key_of(k);
              put(dict, key, plain(*item, where + "." + key, depth + 1), where);
            }
            return dict;
          } else {
            throw CheckpointError(
                fmt::format("'{}': '{}' is a class or a bare storage, which distckpt cannot store", path_, where),
                path_);
          }
        },
        n.value);
  }

  const std::string& path_;
  const uint64_t budget_;
  uint64_t spent_ = 0;
};

// The tensors of a file may add up to more than the file (tied weights name
// one storage twice), but not to any amount: many names for one storage
// would make a small file any size once exported.
constexpr uint64_t kTensorBytesPerFileByte = 4;
constexpr uint64_t kTensorBytesSlack = uint64_t{64} << 20;

}  // namespace

bool is_torch_file(const ObjectReader& f) {
  uint8_t head[sizeof kZipSignature] = {};
  if (f.size() < sizeof head) return false;
  f.read(0, sizeof head, head);
  return std::memcmp(head, kZipSignature, sizeof head) == 0;
}

bool is_torch_file(const std::string& location) {
  const Located at = locate(location);
  return !at.file.empty() && is_torch_file(*at.backend->open(at.file));
}

bool is_legacy_torch_file(const ObjectReader& f) {
  // Its first pickle op after the protocol (and, from protocol 4, a frame
  // header) is the legacy format's magic number as a 10-byte LONG1.
  static constexpr unsigned char kMagic[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
  unsigned char head[32] = {};
  const size_t n = static_cast<size_t>(std::min<uint64_t>(f.size(), sizeof head));
  f.read(0, n, head);
  if (n < sizeof kMagic + 2 || head[0] != 0x80) return false;
  return std::search(head, head + n, kMagic, kMagic + sizeof kMagic) != head + n;
}

namespace {

// The zip index's reads of `file` (`path` in messages), none past its end.
zip::ReadAt reads_of(const ObjectReader& file, const std::string& path) {
  return [&file, &path](void* data, size_t n, uint64_t offset) {
    if (offset > file.size() || file.size() - offset < n) {
      throw CorruptionError(fmt::format("'{}': {} bytes at {} pass the end of the file", path, n, offset), path);
    }
    file.read(offset, n, static_cast<uint8_t*>(data));
  };
}

std::unique_ptr<ObjectReader> open_single_file(const std::string& location) {
  const Located at = locate(location);
  if (at.file.empty()) throw CheckpointError(fmt::format("'{}' is not a file", location), location);
  return at.backend->open(at.file);
}

}  // namespace

TorchFileReader::TorchFileReader(const std::string& location) : TorchFileReader(open_single_file(location), location) {}

TorchFileReader::TorchFileReader(std::unique_ptr<ObjectReader> file, std::string location, Root root_kind)
    : path_(std::move(location)), file_(std::move(file)) {
  const std::string context = fmt::format("'{}' cannot be read as a torch.save file", path_);
  index_ = std::make_unique<zip::Index>(reads_of(*file_, path_), file_->size(), context);
  // torch.save puts every record in one folder, named after the file it was first saved as.
  const std::vector<zip::Entry>& entries = index_->entries();
  const size_t slash = entries.empty() ? std::string::npos : entries[0].name.find('/');
  if (slash == std::string::npos) throw CheckpointError(context + ": its records are not in one folder", path_);
  const std::string folder = entries[0].name.substr(0, slash + 1);
  const auto record = [&](const std::string& name) { return index_->find(folder + name); };

  if (const zip::Entry* order = record("byteorder")) {
    std::string value(order->size > 16 ? 0 : order->size, '\0');
    if (!value.empty()) file_->read(order->data_offset, value.size(), reinterpret_cast<uint8_t*>(value.data()));
    if (value != "little") {
      throw CheckpointError(
          fmt::format("{}: it was written on a big-endian machine ('byteorder' is '{}')", context, value.substr(0, 16)),
          path_);
    }
  }
  const zip::Entry* pickle_record = record("data.pkl");
  if (!pickle_record) throw CheckpointError(context + ": it has no data.pkl", path_);
  std::string pickle(pickle_record->size, '\0');  // the file's own bytes: bounded by its size
  zip::Crc32 crc;
  read_bytes(*pickle_record, 0, pickle.size(), pickle.data(), &crc);
  check_crc(*pickle_record, crc);

  // Storages are described, not read: a meta tensor stands for each.
  std::unordered_map<const c10::StorageImpl*, size_t> storage_index;
  const torch_pickle::StorageLoader describe = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    const zip::Entry* r = key.find('/') == std::string::npos ? record("data/" + key) : nullptr;
    if (!r) throw CheckpointError(fmt::format("'{}': storage '{}' has no record in the archive", path_, key), path_);
    const uint64_t element = at::elementSize(dtype);
    if (numel < 0 || static_cast<uint64_t>(numel) > r->size / element) {
      throw CheckpointError(fmt::format("'{}': storage '{}' holds {} bytes, fewer than {} elements of {} need", path_,
                                        key, r->size, numel, at::toString(dtype)),
                            path_);
    }
    at::Tensor layout = at::empty({numel}, at::TensorOptions().dtype(dtype).device(at::kMeta));
    storage_index.emplace(layout.storage().unsafeGetStorageImpl(), storages_.size());
    storages_.push_back(Storage{r, dtype, numel});
    return layout;
  };
  const torch_pickle::Unpickled unpickled = torch_pickle::unpickle(pickle, describe, path_);
  const torch_pickle::NodeRef& root = unpickled.root;
  if (root_kind == Root::kDict && !std::holds_alternative<std::shared_ptr<torch_pickle::Dict>>(root->value)) {
    throw CheckpointError(fmt::format("'{}' holds no dict of tensors (torch.save(model.state_dict(), ...))", path_),
                          path_);
  }
  if (root_kind == Root::kTensor && !std::holds_alternative<at::Tensor>(root->value)) {
    throw CheckpointError(fmt::format("'{}' holds no tensor", path_), path_);
  }
  NamedTensors found;
  std::optional<Value> common = Converter(path_, pickle.size()).take(*root, "", found, 0);
  common_ = common ? std::move(*common) : Value::dict();
  std::set<std::string> names;
  uint64_t tensor_bytes = 0;
  for (const auto& [name, layout] : found) {
    if (!names.insert(name).second) {  // {"a": {"b": x}, "a.b": y}
      throw CheckpointError(
          fmt::format("'{}': '{}' names two tensors (a nested dict and a dotted key, or an int and a string key)",
                      path_, name),
          path_);
    }
    tensor_bytes += static_cast<uint64_t>(layout.numel()) * layout.element_size();  // each within its record
  }
  if (tensor_bytes > kTensorBytesPerFileByte * file_->size() + kTensorBytesSlack) {
    throw CheckpointError(
        fmt::format(
            "'{}': its tensors add up to {} bytes, more than {} times the file's {} bytes (many names for the same "
            "storage); refused",
            path_, tensor_bytes, kTensorBytesPerFileByte, file_->size()),
        path_);
  }
  for (auto& [name, layout] : found) {
    const auto it =
        layout.numel() == 0 ? storage_index.end() : storage_index.find(layout.storage().unsafeGetStorageImpl());
    tensor_storage_.push_back(it == storage_index.end() ? SIZE_MAX : it->second);
    tensors_.push_back(Tensor{std::move(name), std::move(layout)});
  }
}

TorchFileReader::~TorchFileReader() = default;

const TorchFileReader::Storage* TorchFileReader::storage_of(size_t i) const {
  return tensor_storage_.at(i) == SIZE_MAX ? nullptr : &storages_[tensor_storage_[i]];
}

void TorchFileReader::read_bytes(const zip::Entry& record, uint64_t begin, uint64_t n, void* data,
                                 zip::Crc32* crc) const {
  // Pieces small enough to be checked while still in cache.
  constexpr uint64_t kPiece = uint64_t{8} << 20;
  auto* out = static_cast<char*>(data);
  for (uint64_t done = 0; done < n;) {
    const uint64_t piece = std::min(kPiece, n - done);
    file_->read(record.data_offset + begin + done, piece, reinterpret_cast<uint8_t*>(out + done));
    if (crc) crc->update(out + done, piece);
    done += piece;
  }
}

void TorchFileReader::check_crc(const zip::Entry& record, const zip::Crc32& crc) const {
  if (crc.value() != record.crc32) {
    throw CorruptionError(fmt::format("'{}': record '{}' fails its CRC-32 (recorded {:08x}, read {:08x}): the file is "
                                      "damaged: copy or save it again",
                                      path_, record.name, record.crc32, crc.value()),
                          path_);
  }
}

void TorchFileReader::add_to_crc(const zip::Entry& record, uint64_t begin, zip::Crc32& crc,
                                 const std::function<void(uint64_t)>& read) const {
  std::vector<char> buffer(std::min<uint64_t>(record.size - std::min(begin, record.size), uint64_t{8} << 20));
  for (uint64_t at = begin; at < record.size;) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), record.size - at);
    read_bytes(record, at, n, buffer.data(), &crc);
    if (read) read(n);
    at += n;
  }
}

void TorchFileReader::clamp_bools(const at::Tensor& t) const {
  if (t.scalar_type() == at::kBool) t.view(at::kByte).clamp_max_(1);  // any byte but 0 and 1 is no bool
}

at::Tensor TorchFileReader::read_storage(Storage& s) {
  at::Tensor data = at::empty({s.numel}, at::TensorOptions().dtype(s.dtype));
  const uint64_t bytes = data.nbytes();
  zip::Crc32 crc;
  read_bytes(*s.record, 0, bytes, data.data_ptr(), &crc);
  add_to_crc(*s.record, bytes, crc);  // bytes past the elements still count
  check_crc(*s.record, crc);
  clamp_bools(data);
  return data;
}

at::Tensor TorchFileReader::read(size_t i) {
  const at::Tensor& layout = tensors_.at(i).layout;
  if (tensor_storage_[i] == SIZE_MAX) return at::empty(layout.sizes(), at::TensorOptions().dtype(layout.dtype()));
  return read_storage(storages_[tensor_storage_[i]])
      .as_strided(layout.sizes(), layout.strides(), layout.storage_offset());
}

NamedTensors TorchFileReader::read_all() {
  std::vector<at::Tensor> loaded(storages_.size());
  NamedTensors out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const at::Tensor& layout = tensors_[i].layout;
    const size_t s = tensor_storage_[i];
    if (s == SIZE_MAX) {
      out.emplace_back(tensors_[i].name, read(i));
      continue;
    }
    if (!loaded[s].defined()) loaded[s] = read_storage(storages_[s]);
    out.emplace_back(tensors_[i].name, loaded[s].as_strided(layout.sizes(), layout.strides(), layout.storage_offset()));
  }
  return out;
}

TorchFileReader::Placement TorchFileReader::placement(size_t i) const {
  if (!contiguous(i)) throw UsageError(fmt::format("'{}' in '{}' is not contiguous", tensors_[i].name, path_));
  const Storage* s = storage_of(i);
  if (!s) return {};
  const at::Tensor& layout = tensors_[i].layout;
  const uint64_t element = layout.element_size();
  return {s->record, s->record->data_offset + static_cast<uint64_t>(layout.storage_offset()) * element,
          static_cast<uint64_t>(layout.numel()) * element};
}

void TorchFileReader::check_record(const zip::Entry& record, const void* data) const {
  zip::Crc32 crc;
  crc.update(data, record.size);
  check_crc(record, crc);
}

bool TorchFileReader::contiguous(size_t i) const { return tensors_.at(i).layout.is_contiguous(); }

// One pass over the tensor's whole record, every byte into the CRC-32, the
// windows that overlap the tensor handed on: the bytes checked are the bytes
// delivered. The check comes after the last window, before this returns.
void TorchFileReader::read_in_windows(size_t i, const at::Tensor& scratch,
                                      const std::function<void(int64_t, const at::Tensor&)>& fn) {
  if (!contiguous(i)) throw UsageError(fmt::format("'{}' in '{}' is not contiguous", tensors_[i].name, path_));
  const Storage* s = storage_of(i);
  if (!s) return;
  const at::Tensor& layout = tensors_[i].layout;
  const uint64_t element = layout.element_size();
  const uint64_t window = scratch.nbytes() / element * element;
  if (window == 0) throw UsageError(fmt::format("a window of {} bytes is smaller than one element", scratch.nbytes()));
  const uint64_t begin = static_cast<uint64_t>(layout.storage_offset()) * element;
  const uint64_t end = begin + static_cast<uint64_t>(layout.numel()) * element;
  auto* bytes = static_cast<char*>(scratch.data_ptr());
  zip::Crc32 crc;
  for (uint64_t at = 0; at < s->record->size;) {
    const uint64_t n = std::min(window, s->record->size - at);
    read_bytes(*s->record, at, n, bytes, &crc);
    const uint64_t from = std::max(at, begin), to = std::min(at + n, end);
    if (from < to) {
      const at::Tensor values = scratch.narrow(0, static_cast<int64_t>(from - at), static_cast<int64_t>(to - from))
                                    .view(layout.scalar_type());
      clamp_bools(values);
      fn(static_cast<int64_t>((from - begin) / element), values);
    }
    at += n;
  }
  check_crc(*s->record, crc);
}

void TorchFileReader::verify(VerifyReport& report, const VerifyProgress& progress) const {
  verify_zip_records(*file_, path_, report, progress);
}

void verify_zip_records(const ObjectReader& file, const std::string& path, VerifyReport& report,
                        const VerifyProgress& progress) {
  const zip::Index index(reads_of(file, path), file.size(), fmt::format("'{}' cannot be read as a zip archive", path));
  uint64_t total = 0, done = 0;
  for (const zip::Entry& e : index.entries()) total += e.size;
  ++report.files;
  std::vector<uint8_t> buffer;
  for (const zip::Entry& e : index.entries()) {
    zip::Crc32 crc;
    try {
      buffer.resize(std::min<uint64_t>(e.size, uint64_t{8} << 20));
      for (uint64_t at = 0; at < e.size;) {
        const uint64_t n = std::min<uint64_t>(buffer.size(), e.size - at);
        file.read(e.data_offset + at, n, buffer.data());
        crc.update(buffer.data(), n);
        at += n;
        done += n;
        if (progress) progress(done, total);
      }
    } catch (const Error& error) {
      report.problems.push_back(fmt::format("record '{}': {}", e.name, error.what()));
      continue;
    }
    report.bytes_checked += e.size;
    if (crc.value() != e.crc32) {
      report.problems.push_back(
          fmt::format("'{}': record '{}' (bytes [{}, {})) fails its CRC-32 (recorded {:08x}, read {:08x})", path,
                      e.name, e.data_offset, e.data_offset + e.size, e.crc32, crc.value()));
    }
  }
}

TorchFileContents read_torch_file(const std::string& path) {
  TorchFileReader reader(path);
  TorchFileContents out;
  out.tensors = reader.read_all();
  out.common = reader.common();
  return out;
}

void write_torch_file(const std::string& path, const StateDict& common, const NamedTensors& tensors) {
  std::vector<storage::TorchFileWriter::Tensor> described;
  for (const auto& [key, tensor] : tensors) described.push_back({key, tensor.scalar_type(), tensor.sizes().vec()});
  storage::TorchFileWriter writer(path, common, std::move(described));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor t = tensors[i].second.contiguous();
    writer.write(i, 0, t.data_ptr(), t.nbytes());
  }
  writer.commit();
}

}  // namespace distckpt::storage
