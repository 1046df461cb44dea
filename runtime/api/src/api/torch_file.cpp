#include "api/torch_file.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>

#include "distckpt/core/errors.h"
#include "format/torch_pickle.h"
#include "io/file.h"

namespace distckpt::api {
namespace {

// torch.save's zip archive: a local file header first.
constexpr char kZipSignature[4] = {'P', 'K', 3, 4};

c10::IValue to_ivalue(const Value& v, const std::string& where) {
  switch (v.kind()) {
    case Kind::kNone:
      return c10::IValue();
    case Kind::kBool:
      return v.as_bool();
    case Kind::kInt:
      return v.as_int();
    case Kind::kFloat:
      return v.as_float();
    case Kind::kString:
      return v.as_string();
    case Kind::kTensor:
      return v.as_tensor();
    case Kind::kDict: {
      c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
      for (const auto& [key, item] : v.as_dict()) dict.insert(key, to_ivalue(item, where + "." + key));
      return dict;
    }
    case Kind::kList: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (size_t i = 0; i < v.as_list().size(); ++i) list.push_back(to_ivalue(v.as_list()[i], where));
      return list;
    }
    default:
      throw Error(fmt::format("common value '{}' is a {} and has no torch.save form", where, kind_name(v.kind())));
  }
}

// The nesting a state dict needs, with room; a deeper (or cyclic) pickle is refused.
constexpr int kMaxDepth = 64;

// Turns the unpickled tree into tensors (at any depth of dicts, named by
// their dotted path) and common values.
class Converter {
 public:
  explicit Converter(const std::string& path) : path_(path) {}

  // A value of the dict at `where`; tensors go to `out` (nullopt: nothing
  // stays in the common values).
  std::optional<Value> take(const torch_pickle::Node& n, const std::string& where, TorchFileContents& out,
                            int depth) const {
    check_depth(depth, where);
    if (const auto* t = std::get_if<at::Tensor>(&n.value)) {
      out.tensors.emplace_back(where, *t);
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

TorchFileContents read_torch_file(const std::string& path) {
  TorchFileContents out;
  try {
    caffe2::serialize::PyTorchStreamReader archive(path);
    const auto [pickle, pickle_bytes] = archive.getRecord("data.pkl");
    const torch_pickle::StorageLoader load = [&](const std::string& key, at::ScalarType dtype, int64_t numel) {
      const std::string record = "data/" + key;
      if (key.find('/') != std::string::npos || !archive.hasRecord(record)) {
        throw CheckpointError(fmt::format("'{}': storage '{}' has no record in the archive", path, key));
      }
      const size_t expected = static_cast<size_t>(numel) * at::elementSize(dtype);
      const auto [data, bytes] = archive.getRecord(record);
      if (bytes < expected) {
        throw CheckpointError(fmt::format("'{}': storage '{}' holds {} bytes, {} elements of {} need {}", path, key,
                                          bytes, numel, at::toString(dtype), expected));
      }
      at::Tensor storage = at::empty({numel}, at::TensorOptions().dtype(dtype));
      if (expected > 0) std::memcpy(storage.data_ptr(), data.get(), expected);
      if (dtype == at::kBool) storage.view(at::kByte).clamp_max_(1);  // any byte but 0 and 1 is no bool
      return storage;
    };
    const torch_pickle::NodeRef root =
        torch_pickle::unpickle(std::string_view(static_cast<const char*>(pickle.get()), pickle_bytes), load, path);
    if (!std::holds_alternative<std::shared_ptr<torch_pickle::Dict>>(root->value)) {
      throw CheckpointError(fmt::format("'{}' holds no dict of tensors (torch.save(model.state_dict(), ...))", path));
    }
    std::optional<Value> common = Converter(path).take(*root, "", out, 0);
    out.common = common ? std::move(*common) : Value::dict();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {  // the archive reader's errors
    std::string_view what(e.what());
    what = what.substr(0, what.find('\n'));  // LibTorch appends a stack trace
    throw CheckpointError(fmt::format("'{}' cannot be read as a torch.save file: {}", path, what.substr(0, 300)));
  }
  return out;
}

void write_torch_file(const std::string& path, const StateDict& common, const NamedTensors& tensors) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [key, value] : common.as_dict()) dict.insert(key, to_ivalue(value, key));
  for (const auto& [key, tensor] : tensors) dict.insert(key, tensor);
  const std::vector<char> bytes = torch::jit::pickle_save(dict);
  io::write_file_atomic(path, std::string_view(bytes.data(), bytes.size()));
}

}  // namespace distckpt::api
