// The pickle inside a torch.save file (`data.pkl`), read by a small,
// restricted pickle machine instead of LibTorch's unpickler, which is meant
// for TorchScript and misses opcodes Python emits for ordinary dicts and
// lists (a dict of one entry, a list of one group). Only what state dicts
// hold is understood: None, bools, ints, floats, strings, lists, tuples,
// dicts (OrderedDict too), tensors (and parameters) over storages, which the
// caller supplies. Any other global, opcode or malformed byte is an error
// naming the file and the offset: nothing is ever executed or imported.
//
// Other pickles of known classes (PyTorch DCP's `.metadata`) are read with
// an allow-list of global names: an object of an allowed class, made by
// NEWOBJ or REDUCE, is kept as its class name, arguments and BUILD state for
// the caller to interpret (a torch.Size, a tuple subclass, as the tuple of
// its dims); any global off the list is refused where it is named.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <memory_resource>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

namespace distckpt::torch_pickle {

struct Node;
using NodeRef = std::shared_ptr<Node>;
// Dict keys: state dicts use ints and strings; objects (DCP's
// MetadataIndex) key dicts only in pickles read with an allow-list.
using Key = std::variant<int64_t, std::string, NodeRef>;

struct List {
  std::vector<NodeRef> items;
  bool tuple = false;
};
struct Dict {
  std::vector<std::pair<Key, NodeRef>> items;  // in insertion order; a repeated key replaces its value
  std::map<Key, size_t> positions;             // of each key in `items`, once it has 16 (smaller: searched)
};

// A class named by the pickle (only a few are ever called).
struct Global {
  std::string name;  // "module.name"
};
// What an allowed class or function would have made: `name(*args)`, then
// given BUILD's `state` (nullptr when none), all left for the caller.
struct Object {
  std::string_view name;  // interned in the Unpickled that made it
  std::vector<NodeRef> args;
  NodeRef state;
};
// A storage loaded for a persistent id: only tensors may use it.
struct Storage {
  at::Tensor data;  // 1-D, the whole storage
};

// Containers are shared: the pickle's memo may refer to one from several
// places (even from inside itself).
struct Node {
  std::variant<std::monostate, bool, int64_t, double, std::string, at::Tensor, std::shared_ptr<List>,
               std::shared_ptr<Dict>, Global, Storage, std::shared_ptr<Object>>
      value;
};

// Returns the whole storage `key` (`numel` elements of `dtype`), as the
// archive's "data/<key>" record holds it; throws when it does not.
using StorageLoader = std::function<at::Tensor(const std::string& key, at::ScalarType dtype, int64_t numel)>;

// The dtype of a typed storage class ("torch.FloatStorage"), and back.
std::optional<at::ScalarType> storage_dtype(const std::string& storage_class);
std::optional<std::string> storage_class(at::ScalarType dtype);

// The unpickled value and every container made for it. The memo can make a
// container hold itself, which shared pointers alone would never free:
// destroying this empties every container first. Nodes and containers live
// in one arena (a large DCP .metadata makes millions: one allocation each
// would cost more than the parse), freed with this object: use `root`, and
// keep no NodeRef, only while it lives.
struct Unpickled {
  std::shared_ptr<std::pmr::memory_resource> arena;  // first: destroyed after everything allocated from it
  std::unordered_set<std::string> names;             // the objects' class names
  NodeRef root;
  std::vector<std::shared_ptr<List>> lists;
  std::vector<std::shared_ptr<Dict>> dicts;
  std::vector<std::shared_ptr<Object>> objects;

  Unpickled() = default;
  Unpickled(Unpickled&&) = default;
  Unpickled& operator=(Unpickled&&) = delete;
  ~Unpickled();
};

// CheckpointError naming `origin` and the byte offset for anything outside
// the subset above.
Unpickled unpickle(std::string_view bytes, const StorageLoader& storage, const std::string& origin);

// Whether a pickle may name the global "module.name".
using GlobalAllowed = std::function<bool(const std::string& name)>;
// A pickle of objects: every global must be `allowed`, and NEWOBJ or REDUCE
// of one makes an Object; BUILD sets an Object's state. No persistent ids.
// `what` names the pickle in errors ("'ck/.metadata'").
Unpickled unpickle_objects(std::string_view bytes, const GlobalAllowed& allowed, const std::string& what);

}  // namespace distckpt::torch_pickle
