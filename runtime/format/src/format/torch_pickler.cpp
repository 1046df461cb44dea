#include "format/torch_pickler.h"

#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <set>

#include "distckpt/core/errors.h"
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

// Protocol 2 opcodes (Python's pickletools names).
class Pickler {
 public:
  std::string take() && { return std::move(out_); }
  void op(char c) { out_.push_back(c); }
  void proto() { out_ += "\x80\x02"; }
  void stop() { op('.'); }
  void mark() { op('('); }
  void global(const std::string& module, const std::string& name) { out_ += "c" + module + "\n" + name + "\n"; }
  void none() { op('N'); }
  void boolean(bool v) { op(v ? '\x88' : '\x89'); }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');  // BININT1
      out_.push_back(static_cast<char>(v));
    } else if (v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()) {
      op('J');  // BININT, 4 bytes little-endian, signed
      le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      out_ += "\x8a\x08";  // LONG1 of 8 bytes, two's complement little-endian
      le(static_cast<uint64_t>(v), 8);
    }
  }
  void real(double v) {
    op('G');  // BINFLOAT: big-endian IEEE 754
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  }
  void string(const std::string& s) {
    op('X');  // BINUNICODE: Python decodes it as UTF-8
    le(s.size(), 4);
    out_ += s;
  }
  void tuple(size_t n) {
    static const char kTuple[] = {')', '\x85', '\x86', '\x87'};
    if (n < 4) op(kTuple[n]);  // the items are on the stack
  }
  void ints(const std::vector<int64_t>& v) {
    if (v.size() > 3) mark();
    for (int64_t i : v) integer(i);
    if (v.size() > 3)
      op('t');
    else
      tuple(v.size());
  }

 private:
  void le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  std::string out_;
};

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

void value(Pickler& p, const Value& v, const std::string& where, int depth) {
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
        value(p, v.as_list()[i], fmt::format("{}[{}]", where, i), depth + 1);
      }
      return p.op('e');
    case Kind::kDict:
      p.op('}');  // EMPTY_DICT, MARK, keys and values, SETITEMS
      if (v.as_dict().empty()) return;
      p.mark();
      for (const auto& [key, item] : v.as_dict()) {
        check_utf8(key, where + "." + key);
        p.string(key);
        value(p, item, where + "." + key, depth + 1);
      }
      return p.op('u');
    default:
      throw UsageError(fmt::format("common value '{}' is a {} and has no torch.save form", where, kind_name(v.kind())));
  }
}

// torch._utils._rebuild_tensor_v2(storage, offset, sizes, strides,
// requires_grad, backward_hooks), the storage a persistent id.
void tensor(Pickler& p, const TensorEntry& t) {
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

std::string pickle_dict(const StateDict& common, const std::vector<TensorEntry>& tensors) {
  Pickler p;
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
