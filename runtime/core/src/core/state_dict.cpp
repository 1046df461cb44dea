// Value: typed access to the state dict tree and deep equality.
#include "distckpt/core/state_dict.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "distckpt/core/errors.h"

namespace distckpt {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kTensor:
      return "tensor";
    case Kind::kShardedTensor:
      return "ShardedTensor";
    case Kind::kShardedObject:
      return "ShardedObject";
    case Kind::kFactory:
      return "ShardedTensorFactory";
    case Kind::kNonPersistent:
      return "LocalNonPersistentObject";
    case Kind::kDict:
      return "dict";
    case Kind::kList:
      return "list";
  }
  return "unknown";
}

namespace {

[[noreturn]] void wrong_kind(Kind expected, Kind actual) {
  throw UsageError(fmt::format("expected {} but the value is {}", kind_name(expected), kind_name(actual)));
}

// Checked std::get: a wrong kind becomes a distckpt::UsageError naming both kinds.
template <Kind K, typename Variant>
auto& get_checked(Variant& v) {
  if (v.index() != static_cast<size_t>(K)) wrong_kind(K, static_cast<Kind>(v.index()));
  return std::get<static_cast<size_t>(K)>(v);
}

// Tensors are equal when dtype, shape and values agree, wherever they live.
bool tensors_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  return at::equal(a.cpu(), b.cpu());
}

bool equal_leaves(const ShardedTensor& a, const ShardedTensor& b) {
  return a.key == b.key && a.dtype == b.dtype && a.local_shape == b.local_shape && a.global_shape == b.global_shape &&
         a.global_offset == b.global_offset && a.axis_fragmentations == b.axis_fragmentations &&
         a.replica_id == b.replica_id && a.prepend_axis_num == b.prepend_axis_num &&
         a.allow_shape_mismatch == b.allow_shape_mismatch && a.flattened_range == b.flattened_range &&
         tensors_equal(a.data, b.data);
}

bool equal_leaves(const ShardedObject& a, const ShardedObject& b) {
  return a.key == b.key && a.data == b.data && a.global_shape == b.global_shape && a.global_offset == b.global_offset &&
         a.replica_id == b.replica_id;
}

// Build/merge functions cannot be compared; the described tensor can.
bool equal_leaves(const ShardedTensorFactory& a, const ShardedTensorFactory& b) {
  return a.key == b.key && a.replica_id == b.replica_id && a.flattened_range == b.flattened_range &&
         tensors_equal(a.data, b.data);
}

bool equal_leaves(const LocalNonPersistentObject& a, const LocalNonPersistentObject& b) {
  if (!a.value || !b.value) return a.value == b.value;
  return a.value->equals(*b.value);
}

}  // namespace

bool Value::is_sharded() const {
  switch (kind()) {
    case Kind::kShardedTensor:
    case Kind::kShardedObject:
    case Kind::kFactory:
    case Kind::kNonPersistent:
      return true;
    default:
      return false;
  }
}

bool Value::as_bool() const { return get_checked<Kind::kBool>(v_); }
int64_t Value::as_int() const { return get_checked<Kind::kInt>(v_); }
double Value::as_float() const {
  if (kind() == Kind::kInt) return static_cast<double>(std::get<int64_t>(v_));
  return get_checked<Kind::kFloat>(v_);
}
const std::string& Value::as_string() const { return get_checked<Kind::kString>(v_); }
const at::Tensor& Value::as_tensor() const { return get_checked<Kind::kTensor>(v_); }
at::Tensor& Value::as_tensor() { return get_checked<Kind::kTensor>(v_); }
const ShardedTensor& Value::as_sharded_tensor() const { return get_checked<Kind::kShardedTensor>(v_); }
ShardedTensor& Value::as_sharded_tensor() { return get_checked<Kind::kShardedTensor>(v_); }
const ShardedObject& Value::as_sharded_object() const { return get_checked<Kind::kShardedObject>(v_); }
ShardedObject& Value::as_sharded_object() { return get_checked<Kind::kShardedObject>(v_); }
const ShardedTensorFactory& Value::as_factory() const { return get_checked<Kind::kFactory>(v_); }
ShardedTensorFactory& Value::as_factory() { return get_checked<Kind::kFactory>(v_); }
const LocalNonPersistentObject& Value::as_non_persistent() const { return get_checked<Kind::kNonPersistent>(v_); }
const Dict& Value::as_dict() const& { return get_checked<Kind::kDict>(v_); }
Dict& Value::as_dict() & { return get_checked<Kind::kDict>(v_); }
Dict Value::as_dict() && { return std::move(get_checked<Kind::kDict>(v_)); }
const List& Value::as_list() const& { return get_checked<Kind::kList>(v_); }
List& Value::as_list() & { return get_checked<Kind::kList>(v_); }
List Value::as_list() && { return std::move(get_checked<Kind::kList>(v_)); }

Value& Value::operator[](const std::string& key) {
  if (is_none()) v_ = Dict{};
  return as_dict()[key];
}

const Value& Value::at(const std::string& key) const {
  const Dict& dict = as_dict();
  auto it = dict.find(key);
  if (it != dict.end()) return it->second;

  // Name a few neighbours so a typo is easy to spot without dumping huge dicts.
  constexpr size_t kShownKeys = 10;
  std::vector<std::string> shown;
  for (auto k = dict.begin(); k != dict.end() && shown.size() < kShownKeys; ++k) {
    shown.push_back(k->first);
  }
  const std::string more = dict.size() > kShownKeys ? fmt::format(", ... ({} more)", dict.size() - kShownKeys) : "";
  throw UsageError(
      fmt::format("key '{}' not found; the dict has {} keys: [{}{}]", key, dict.size(), fmt::join(shown, ", "), more));
}

Value& Value::at(const std::string& key) { return const_cast<Value&>(static_cast<const Value&>(*this).at(key)); }

bool Value::contains(const std::string& key) const {
  if (is_none()) return false;  // None is an empty dict-to-be (see operator[])
  return as_dict().count(key) != 0;
}

Value& Value::operator[](size_t index) { return const_cast<Value&>(static_cast<const Value&>(*this)[index]); }

const Value& Value::operator[](size_t index) const {
  const List& list = as_list();
  if (index >= list.size()) {
    throw UsageError(fmt::format("list index {} is out of range for a list of {} elements", index, list.size()));
  }
  return list[index];
}

void Value::push_back(Value v) {
  if (is_none()) v_ = List{};  // mirrors operator[]'s None -> dict
  as_list().push_back(std::move(v));
}

size_t Value::size() const {
  if (is_dict()) return as_dict().size();
  if (is_list()) return as_list().size();
  throw UsageError(fmt::format("size() needs a dict or a list, but the value is {}", kind_name(kind())));
}

bool Value::equals(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return as_bool() == other.as_bool();
    case Kind::kInt:
      return as_int() == other.as_int();
    case Kind::kFloat:
      return std::get<double>(v_) == std::get<double>(other.v_);
    case Kind::kString:
      return as_string() == other.as_string();
    case Kind::kTensor:
      return tensors_equal(as_tensor(), other.as_tensor());
    case Kind::kShardedTensor:
      return equal_leaves(as_sharded_tensor(), other.as_sharded_tensor());
    case Kind::kShardedObject:
      return equal_leaves(as_sharded_object(), other.as_sharded_object());
    case Kind::kFactory:
      return equal_leaves(as_factory(), other.as_factory());
    case Kind::kNonPersistent:
      return equal_leaves(as_non_persistent(), other.as_non_persistent());
    case Kind::kDict: {
      const Dict& a = as_dict();
      const Dict& b = other.as_dict();
      if (a.size() != b.size()) return false;
      for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
        if (ia->first != ib->first || !ia->second.equals(ib->second)) return false;
      }
      return true;
    }
    case Kind::kList: {
      const List& a = as_list();
      const List& b = other.as_list();
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].equals(b[i])) return false;
      }
      return true;
    }
  }
  return false;
}

}  // namespace distckpt
