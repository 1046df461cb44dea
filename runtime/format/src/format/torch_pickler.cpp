#include "format/torch_pickler.h"

#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <set>

#include "distckpt/core/errors.h"
#include "format/pickle_writer.h"
#include "format/torch_pickle.h"

namespace distckpt::torch_pickle {
namespace {

// "torch.FloatStorage" -> module "torch", name "FloatStorage".
std::pair<std::string, std::string> storage_global(at::ScalarType dtype) {
  const std::optional<std::string> name = storage_class(dtype);
  if (!name) throw UsageError(fmt::format("a {} tensor has no torch.save storage class", at::toString(dtype)));
  const size_t dot = name->rfind('.');
  return {name->substr(0, dot), name->substr(dot + 1)};
}

constexpr int kMaxDepth = 64;

// Python reads BINUNICODE as UTF-8: any other bytes would make torch.load fail.
void check_utf8(const std::string& s, const std::string& where) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size() && c != 0xC0 && c != 0xC1 && c <= 0xF4;  // no overlong 2-byte forms
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (!ok) {
      throw UsageError(
          fmt::format("'{}' holds a string that is not UTF-8 (byte {}); torch.load could not read it", where, i));
    }
    i += n;
  }
}

void tensor(PickleWriter& p, const TensorEntry& t);

// `tensors`: where a tensor's values go (each becomes storage "<index>"); none: tensors are refused.
void value(PickleWriter& p, const Value& v, const std::string& where, int depth,
           std::vector<at::Tensor>* tensors = nullptr) {
  if (depth > kMaxDepth) throw UsageError(fmt::format("'{}' is nested more than {} levels deep", where, kMaxDepth));
  switch (v.kind()) {
    case Kind::kNone:
      return p.none();
    case Kind::kBool:
      return p.boolean(v.as_bool());
    case Kind::kInt:
      return p.integer(v.as_int());
    case Kind::kFloat:
      return p.real(v.as_float());
    case Kind::kString:
      check_utf8(v.as_string(), where);
      return p.string(v.as_string());
    case Kind::kList:
      p.op(']');  // EMPTY_LIST, MARK, items, APPENDS
      if (v.as_list().empty()) return;
      p.mark();
      for (size_t i = 0; i < v.as_list().size(); ++i) {
        value(p, v.as_list()[i], fmt::format("{}[{}]", where, i), depth + 1, tensors);
      }
      return p.op('e');
    case Kind::kDict:
      p.op('}');  // EMPTY_DICT, MARK, keys and values, SETITEMS
      if (v.as_dict().empty()) return;
      p.mark();
      for (const auto& [key, item] : v.as_dict()) {
        check_utf8(key, where + "." + key);
        p.string(key);
        value(p, item, where + "." + key, depth + 1, tensors);
      }
      return p.op('u');
    case Kind::kTensor:
      if (tensors) {
        const at::Tensor& t = v.as_tensor();
        tensor(p, TensorEntry{where, t.scalar_type(), t.sizes().vec(), std::to_string(tensors->size())});
        tensors->push_back(t.contiguous().cpu());
        return;
      }
      [[fallthrough]];
    default:
      throw UsageError(fmt::format("common value '{}' is a {} and has no torch.save form", where, kind_name(v.kind())));
  }
}

// torch._utils._rebuild_tensor_v2(storage, offset, sizes, strides,
// requires_grad, backward_hooks), the storage a persistent id.
void tensor(PickleWriter& p, const TensorEntry& t) {
  p.global("torch._utils", "_rebuild_tensor_v2");
  p.mark();
  p.mark();  // ('storage', torch.<Class>Storage, key, 'cpu', numel)
  p.string("storage");
  const auto [module, name] = storage_global(t.dtype);
  p.global(module, name);
  p.string(t.storage);
  p.string("cpu");
  int64_t numel = 1;
  for (int64_t s : t.sizes) numel *= s;
  p.integer(numel);
  p.op('t');
  p.op('Q');  // BINPERSID
  p.integer(0);
  p.ints(t.sizes);
  std::vector<int64_t> strides(t.sizes.size(), 1);
  for (size_t d = t.sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * std::max<int64_t>(t.sizes[d], 1);
  p.ints(strides);
  p.boolean(false);
  p.global("collections", "OrderedDict");
  p.tuple(0);
  p.op('R');  // an empty OrderedDict of backward hooks
  p.op('t');
  p.op('R');
}

}  // namespace

std::string pickle_tensor(at::ScalarType dtype, const std::vector<int64_t>& sizes, const std::string& storage) {
  PickleWriter p;
  p.proto();
  tensor(p, TensorEntry{"", dtype, sizes, storage});
  p.stop();
  return std::move(p).take();
}

std::string pickle_value(const Value& v, const std::string& where, std::vector<at::Tensor>& tensors) {
  PickleWriter p;
  p.proto();
  value(p, v, where, 0, &tensors);
  p.stop();
  return std::move(p).take();
}

std::string pickle_dict(const StateDict& common, const std::vector<TensorEntry>& tensors) {
  PickleWriter p;
  p.proto();
  p.op('}');
  std::set<std::string> keys;
  if (!common.as_dict().empty() || !tensors.empty()) {
    p.mark();
    for (const auto& [key, item] : common.as_dict()) {
      check_utf8(key, key);
      keys.insert(key);
      p.string(key);
      value(p, item, key, 1);
    }
    for (const TensorEntry& t : tensors) {
      if (!keys.insert(t.key).second)
        throw UsageError(fmt::format("'{}' names both a tensor and a common value", t.key));
      check_utf8(t.key, t.key);
      p.string(t.key);
      tensor(p, t);
    }
    p.op('u');
  }
  p.stop();
  return std::move(p).take();
}

}  // namespace distckpt::torch_pickle
