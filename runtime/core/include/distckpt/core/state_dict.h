// The state dict tree: nested dicts and lists whose leaves are plain values
// (None, bool, int, float, string, tensor) or sharded entries (ShardedTensor,
// ShardedObject, ShardedTensorFactory, LocalNonPersistentObject).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "distckpt/core/sharded_object.h"
#include "distckpt/core/sharded_tensor.h"

namespace distckpt {

class Value;
using Dict = std::map<std::string, Value>;  // sorted keys: deterministic order
using List = std::vector<Value>;

enum class Kind {
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kTensor,
  kShardedTensor,
  kShardedObject,
  kFactory,
  kNonPersistent,
  kDict,
  kList,
};
const char* kind_name(Kind kind);

class Value {
 public:
  Value() = default;  // None
  Value(bool v) : v_(v) {}
  template <typename I, typename = std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>>>
  Value(I v) : v_(static_cast<int64_t>(v)) {}
  Value(double v) : v_(v) {}
  Value(float v) : v_(static_cast<double>(v)) {}
  Value(std::string v) : v_(std::move(v)) {}
  Value(const char* v) : v_(std::string(v)) {}
  Value(at::Tensor v) : v_(std::move(v)) {}
  Value(ShardedTensor v) : v_(std::move(v)) {}
  Value(ShardedObject v) : v_(std::move(v)) {}
  Value(ShardedTensorFactory v) : v_(std::move(v)) {}
  Value(LocalNonPersistentObject v) : v_(std::move(v)) {}
  Value(Dict v) : v_(std::move(v)) {}
  Value(List v) : v_(std::move(v)) {}

  static Value dict() { return Value(Dict{}); }
  static Value list() { return Value(List{}); }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_container() const { return is_dict() || is_list(); }
  // ShardedTensor, ShardedObject, Factory or NonPersistent.
  bool is_sharded() const;

  // Typed access; throws distckpt::UsageError naming both kinds on mismatch.
  bool as_bool() const;
  int64_t as_int() const;
  double as_float() const;  // ints convert
  const std::string& as_string() const;
  const at::Tensor& as_tensor() const;
  at::Tensor& as_tensor();
  const ShardedTensor& as_sharded_tensor() const;
  ShardedTensor& as_sharded_tensor();
  const ShardedObject& as_sharded_object() const;
  ShardedObject& as_sharded_object();
  const ShardedTensorFactory& as_factory() const;
  ShardedTensorFactory& as_factory();
  const LocalNonPersistentObject& as_non_persistent() const;
  // On a temporary the container is moved out (by value), so
  // `for (auto& [k, v] : model.state_dict().as_dict())` does not dangle.
  const Dict& as_dict() const&;
  Dict& as_dict() &;
  Dict as_dict() &&;
  const List& as_list() const&;
  List& as_list() &;
  List as_list() &&;

  // Dict access. operator[] turns None into an empty dict first, like a
  // Python defaultdict; at() throws naming the missing key.
  Value& operator[](const std::string& key);
  const Value& at(const std::string& key) const;
  Value& at(const std::string& key);
  bool contains(const std::string& key) const;
  // List access.
  Value& operator[](size_t index);
  const Value& operator[](size_t index) const;
  void push_back(Value v);
  size_t size() const;  // dict or list length

  // Structural and value equality (tensors by dtype, shape and values).
  bool equals(const Value& other) const;

 private:
  std::variant<std::monostate, bool, int64_t, double, std::string, at::Tensor, ShardedTensor, ShardedObject,
               ShardedTensorFactory, LocalNonPersistentObject, Dict, List>
      v_;
};

// A state dict is a Value whose root is a Dict.
using StateDict = Value;

}  // namespace distckpt
