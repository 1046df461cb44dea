#include "api/torch_file.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>
#include <unordered_map>

#include "distckpt/core/errors.h"
#include "format/torch_pickle.h"
#include "io/file.h"
#include "storage/torch_file_writer.h"

namespace distckpt::api {
namespace {

// torch.save's zip archive: a local file header first.
constexpr char kZipSignature[4] = {'P', 'K', 3, 4};

// The nesting a state dict needs, with room; a deeper (or cyclic) pickle is refused.
constexpr int kMaxDepth = 64;

// Turns the unpickled tree into tensors (at any depth of dicts, named by
// their dotted path) and common values.
class Converter {
 public:
  explicit Converter(const std::string& path) : path_(path) {}

  // A value of the dict at `where`; tensors go to `out` (nullopt: nothing
  // stays in the common values).
  std::optional<Value> take(const torch_pickle::Node& n, const std::string& where, NamedTensors& out, int depth) const {
    check_depth(depth, where);
    if (const auto* t = std::get_if<at::Tensor>(&n.value)) {
      out.emplace_back(where, *t);
      return std::nullopt;
    }
    if (const auto* d = std::get_if<std::shared_ptr<torch_pickle::Dict>>(&n.value)) {
      Value dict = Value::dict();
      for (const auto& [k, v] : (*d)->items) {
        const std::string key = key_of(k);
        std::optional<Value> kept = take(*v, where.empty() ? key : where + "." + key, out, depth + 1);
        if (kept) dict[key] = std::move(*kept);
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

  void check_depth(int depth, const std::string& where) const {
    if (depth > kMaxDepth) {
      throw CheckpointError(
          fmt::format("'{}': '{}' is nested more than {} levels deep (or refers to itself)", path_, where, kMaxDepth));
    }
  }

  Value plain(const torch_pickle::Node& n, const std::string& where, int depth) const {
    check_depth(depth, where);
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
                    fmt::format("'{}': '{}' is a list holding tensors; store them in a dict", path_, where));
              }
              list.push_back(plain(*v->items[i], fmt::format("{}[{}]", where, i), depth + 1));
            }
            return Value(std::move(list));
          } else if constexpr (std::is_same_v<T, std::shared_ptr<torch_pickle::Dict>>) {
            Value dict = Value::dict();
            for (const auto& [k, item] : v->items) {
              dict[key_of(k)] = plain(*item, where + "." + key_of(k), depth + 1);
            }
            return dict;
          } else {
            throw CheckpointError(
                fmt::format("'{}': '{}' is a class or a bare storage, which distckpt cannot store", path_, where));
          }
        },
        n.value);
  }

  const std::string& path_;
};

}  // namespace

bool is_torch_file(const std::string& path) {
  if (!io::exists(path) || io::is_dir(path)) return false;
  io::File f(path, io::File::Mode::kRead);
  char head[sizeof kZipSignature] = {};
  if (f.size() < sizeof head) return false;
  f.pread_all(head, sizeof head, 0);
  return std::memcmp(head, kZipSignature, sizeof head) == 0;
}

TorchFileReader::TorchFileReader(const std::string& path) : path_(path), file_(path, io::File::Mode::kRead) {
  const std::string context = fmt::format("'{}' cannot be read as a torch.save file", path);
  index_ = std::make_unique<zip::Index>(
      [this](void* data, size_t n, uint64_t offset) {
        if (offset > file_.size() || file_.size() - offset < n) {
          throw CorruptionError(fmt::format("'{}': {} bytes at {} pass the end of the file", path_, n, offset));
        }
        file_.pread_all(data, n, offset);
      },
      file_.size(), context);
  // torch.save puts every record in one folder, named after the file it was first saved as.
  const std::vector<zip::Entry>& entries = index_->entries();
  const size_t slash = entries.empty() ? std::string::npos : entries[0].name.find('/');
  if (slash == std::string::npos) throw CheckpointError(context + ": its records are not in one folder");
  const std::string folder = entries[0].name.substr(0, slash + 1);
  const auto record = [&](const std::string& name) { return index_->find(folder + name); };

  if (const zip::Entry* order = record("byteorder")) {
    std::string value(order->size > 16 ? 0 : order->size, '\0');
    if (!value.empty()) file_.pread_all(value.data(), value.size(), order->data_offset);
    if (value != "little") {
      throw CheckpointError(fmt::format("{}: it was written on a big-endian machine ('byteorder' is '{}')", context,
                                        value.substr(0, 16)));
    }
  }
  const zip::Entry* pickle_record = record("data.pkl");
  if (!pickle_record) throw CheckpointError(context + ": it has no data.pkl");
  std::string pickle(pickle_record->size, '\0');  // the file's own bytes: bounded by its size
  Storage whole{pickle_record, at::kByte, static_cast<int64_t>(pickle.size())};
  zip::Crc32 crc;
  read_bytes(whole, 0, pickle.size(), pickle.data(), &crc);
  check_crc(whole, crc);

  // Storages are described, not read: a meta tensor stands for each.
  std::unordered_map<const c10::StorageImpl*, size_t> storage_index;
  const torch_pickle::StorageLoader describe = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
    const zip::Entry* r = key.find('/') == std::string::npos ? record("data/" + key) : nullptr;
    if (!r) throw CheckpointError(fmt::format("'{}': storage '{}' has no record in the archive", path_, key));
    const uint64_t element = at::elementSize(dtype);
    if (numel < 0 || static_cast<uint64_t>(numel) > r->size / element) {
      throw CheckpointError(fmt::format("'{}': storage '{}' holds {} bytes, fewer than {} elements of {} need", path_,
                                        key, r->size, numel, at::toString(dtype)));
    }
    at::Tensor layout = at::empty({numel}, at::TensorOptions().dtype(dtype).device(at::kMeta));
    storage_index.emplace(layout.storage().unsafeGetStorageImpl(), storages_.size());
    storages_.push_back(Storage{r, dtype, numel});
    return layout;
  };
  const torch_pickle::NodeRef root = torch_pickle::unpickle(pickle, describe, path_);
  if (!std::holds_alternative<std::shared_ptr<torch_pickle::Dict>>(root->value)) {
    throw CheckpointError(fmt::format("'{}' holds no dict of tensors (torch.save(model.state_dict(), ...))", path_));
  }
  NamedTensors found;
  std::optional<Value> common = Converter(path_).take(*root, "", found, 0);
  common_ = common ? std::move(*common) : Value::dict();
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

void TorchFileReader::read_bytes(const Storage& s, uint64_t begin, uint64_t n, void* data, zip::Crc32* crc) const {
  // Pieces small enough to be checked while still in cache.
  constexpr uint64_t kPiece = uint64_t{8} << 20;
  auto* out = static_cast<char*>(data);
  for (uint64_t done = 0; done < n;) {
    const uint64_t piece = std::min(kPiece, n - done);
    file_.pread_all(out + done, piece, s.record->data_offset + begin + done);
    if (crc) crc->update(out + done, piece);
    done += piece;
  }
}

void TorchFileReader::check_crc(const Storage& s, const zip::Crc32& crc) const {
  if (crc.value() != s.record->crc32) {
    throw CorruptionError(fmt::format(
        "'{}': record '{}' fails its CRC-32 (recorded {:08x}, read {:08x}): the file is damaged: copy or save it again",
        path_, s.record->name, s.record->crc32, crc.value()));
  }
}

void TorchFileReader::clamp_bools(const at::Tensor& t) const {
  if (t.scalar_type() == at::kBool) t.view(at::kByte).clamp_max_(1);  // any byte but 0 and 1 is no bool
}

at::Tensor TorchFileReader::read_storage(Storage& s) {
  at::Tensor data = at::empty({s.numel}, at::TensorOptions().dtype(s.dtype));
  const uint64_t bytes = data.nbytes();
  zip::Crc32 crc;
  read_bytes(s, 0, bytes, data.data_ptr(), &crc);
  if (s.record->size > bytes) {  // bytes past the elements still count for the CRC
    std::vector<char> rest(std::min<uint64_t>(s.record->size - bytes, uint64_t{1} << 20));
    for (uint64_t at = bytes; at < s.record->size;) {
      const uint64_t n = std::min<uint64_t>(rest.size(), s.record->size - at);
      read_bytes(s, at, n, rest.data(), &crc);
      at += n;
    }
  }
  check_crc(s, crc);
  s.verified = true;
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

bool TorchFileReader::contiguous(size_t i) const { return tensors_.at(i).layout.is_contiguous(); }

void TorchFileReader::verify(Storage& s, const at::Tensor& scratch) {
  if (s.verified) return;
  zip::Crc32 crc;
  for (uint64_t at = 0; at < s.record->size;) {
    const uint64_t n = std::min<uint64_t>(scratch.nbytes(), s.record->size - at);
    read_bytes(s, at, n, scratch.data_ptr(), &crc);
    at += n;
  }
  check_crc(s, crc);
  s.verified = true;
}

void TorchFileReader::read_in_windows(size_t i, const at::Tensor& scratch,
                                      const std::function<void(int64_t, const at::Tensor&)>& fn) {
  if (!contiguous(i)) throw Error(fmt::format("'{}' in '{}' is not contiguous", tensors_[i].name, path_));
  Storage* s = tensor_storage_[i] == SIZE_MAX ? nullptr : &storages_[tensor_storage_[i]];
  if (!s) return;
  const at::Tensor& layout = tensors_[i].layout;
  const uint64_t element = layout.element_size();
  const uint64_t window = scratch.nbytes() / element;
  if (window == 0) throw Error(fmt::format("a window of {} bytes is smaller than one element", scratch.nbytes()));
  const uint64_t first = static_cast<uint64_t>(layout.storage_offset()), count = layout.numel();
  // A tensor that is its whole record is checked as it streams; any other
  // part of a record is checked whole first.
  const bool whole = first == 0 && count * element == s->record->size;
  if (!whole) verify(*s, scratch);
  zip::Crc32 crc;
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(window, count - done);
    const at::Tensor values = scratch.narrow(0, 0, static_cast<int64_t>(n * element)).view(layout.scalar_type());
    read_bytes(*s, (first + done) * element, n * element, values.data_ptr(), whole ? &crc : nullptr);
    if (whole && done + n == count) check_crc(*s, crc);
    clamp_bools(values);
    fn(static_cast<int64_t>(done), values);
    done += n;
  }
  if (whole) s->verified = true;
}

void TorchFileReader::verify(VerifyReport& report, const VerifyProgress& progress) const {
  uint64_t total = 0, done = 0;
  for (const zip::Entry& e : index_->entries()) total += e.size;
  std::vector<char> window(std::min<uint64_t>(total, uint64_t{8} << 20));
  ++report.files;
  for (const zip::Entry& e : index_->entries()) {
    zip::Crc32 crc;
    try {
      for (uint64_t at = 0; at < e.size;) {
        const uint64_t n = std::min<uint64_t>(window.size(), e.size - at);
        file_.pread_all(window.data(), n, e.data_offset + at);
        crc.update(window.data(), n);
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
          fmt::format("'{}': record '{}' (bytes [{}, {})) fails its CRC-32 (recorded {:08x}, read {:08x})", path_,
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

}  // namespace distckpt::api
