#include "format/torch_pickle.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cstring>
#include <memory_resource>
#include <optional>
#include <type_traits>
#include <unordered_map>

#include "distckpt/core/errors.h"

namespace distckpt::torch_pickle {
namespace {

// The machine's stack: values, and marks.
struct Item {
  bool mark = false;
  NodeRef node;
};

// The pickle's memo. Python's pickler numbers entries 0, 1, 2, ... and
// memoizes nearly every value (millions in a large DCP .metadata): those
// live in a vector. A memoized value needs an opcode of its own, so a
// pickle of n bytes has fewer than n / 2 of them; indices past that (legal,
// never written by Python) go to a map, so a crafted index cannot make the
// vector large.
class Memo {
 public:
  explicit Memo(uint64_t dense_limit) : dense_limit_(dense_limit) {}
  void put(uint64_t index, NodeRef node) {
    if (index < dense_limit_) {
      if (index >= dense_.size()) dense_.resize(index + 1);
      count_ += dense_[index] ? 0 : 1;
      dense_[index] = std::move(node);
    } else {
      count_ += sparse_.insert_or_assign(index, std::move(node)).second ? 1 : 0;
    }
  }
  const NodeRef* get(uint64_t index) const {
    if (index < dense_.size()) return dense_[index] ? &dense_[index] : nullptr;
    const auto it = sparse_.find(index);
    return it == sparse_.end() ? nullptr : &it->second;
  }
  uint64_t size() const { return count_; }

 private:
  uint64_t dense_limit_;
  std::vector<NodeRef> dense_;  // an entry without a node was never stored (marks are never memoized)
  std::unordered_map<uint64_t, NodeRef> sparse_;
  uint64_t count_ = 0;
};

class Machine {
 public:
  // With `allowed`, a pickle of objects (unpickle_objects); without, a state dict's.
  Machine(std::string_view bytes, const StorageLoader* storage, const GlobalAllowed* allowed, const std::string& origin)
      : in_(bytes), storage_(storage), allowed_(allowed), origin_(origin) {
    made_.arena = arena_;
  }

  // Every container is recorded in `made_`: emptied when it goes (here on
  // an error, with the caller on success), cycles included.
  std::shared_ptr<Dict> dict() { return made_.dicts.emplace_back(make<Dict>()); }
  std::shared_ptr<List> list(List l) { return made_.lists.emplace_back(make<List>(std::move(l))); }
  std::shared_ptr<Object> object(const std::string& name, std::vector<NodeRef> args) {
    const std::string_view interned = *made_.names.insert(name).first;
    return made_.objects.emplace_back(make<Object>(Object{interned, std::move(args), nullptr}));
  }

  Unpickled run() {
    made_.root = parse();
    return std::move(made_);
  }

  NodeRef parse() {
    while (true) {
      op_at_ = pos_;
      // Python's pickler batches list and dict items by the thousand; a
      // longer stack is a pickle made to exhaust memory one opcode at a time.
      if (stack_.size() > kMaxStack) fail(fmt::format("more than {} values waiting on the stack", kMaxStack));
      const uint8_t op = u8();
      switch (op) {
        case 0x80: {  // PROTO
          if (u8() > 5) fail("pickle protocol newer than 5");
          break;
        }
        case 0x95:  // FRAME: a length hint
          take(8);
          break;
        case '.': {  // STOP
          NodeRef root = pop_node("the result");
          if (!stack_.empty()) fail("values left on the stack at STOP");
          return root;
        }
        case '(':
          stack_.push_back(Item{true, nullptr});
          break;
        case '}':
          stack_.push_back(value_item(dict()));
          break;
        case ']':
          stack_.push_back(value_item(list(List{})));
          break;
        case ')':
          stack_.push_back(empty_tuple());
          break;
        case 'N':
          stack_.push_back(value_item(std::monostate{}));
          break;
        case 0x88:
          stack_.push_back(value_item(true));
          break;
        case 0x89:
          stack_.push_back(value_item(false));
          break;
        case 'J':
          stack_.push_back(value_item(static_cast<int64_t>(static_cast<int32_t>(le(4)))));
          break;
        case 'K':
          stack_.push_back(value_item(static_cast<int64_t>(le(1))));
          break;
        case 'M':
          stack_.push_back(value_item(static_cast<int64_t>(le(2))));
          break;
        case 0x8a:  // LONG1: little-endian two's complement of n bytes
          stack_.push_back(value_item(long1()));
          break;
        case 'G': {  // BINFLOAT, big-endian
          uint64_t bits = 0;
          for (const char c : take(8)) bits = (bits << 8) | static_cast<uint8_t>(c);
          double d;
          std::memcpy(&d, &bits, sizeof d);
          stack_.push_back(value_item(d));
          break;
        }
        case 'X':
        case 'T':
          stack_.push_back(value_item(std::string(take(le(4)))));
          break;
        case 0x8c:
        case 'U':
          stack_.push_back(value_item(std::string(take(le(1)))));
          break;
        case 0x8d:
        case 0x8e:  // BINBYTES8: bytes are kept as strings of their bytes
          stack_.push_back(value_item(std::string(take(le(8)))));
          break;
        case 'B':
          stack_.push_back(value_item(std::string(take(le(4)))));
          break;
        case 'C':
          stack_.push_back(value_item(std::string(take(le(1)))));
          break;
        case 'q':
          memo_.put(le(1), top().node);
          break;
        case 'r':
          memo_.put(le(4), top().node);
          break;
        case 0x94: {
          memo_.put(memo_.size(), top().node);
          break;
        }
        case 'h':
          stack_.push_back(get(le(1)));
          break;
        case 'j':
          stack_.push_back(get(le(4)));
          break;
        case 't':
          stack_.push_back(value_item(list(List{pop_to_mark(), true})));
          break;
        case 0x85:
        case 0x86:
        case 0x87: {
          std::vector<NodeRef> items(op - 0x84u);
          for (size_t i = items.size(); i-- > 0;) items[i] = pop_node("a tuple item");
          stack_.push_back(value_item(list(List{std::move(items), true})));
          break;
        }
        case 'a': {
          NodeRef v = pop_node("an appended value");
          list_below("APPEND").items.push_back(std::move(v));
          break;
        }
        case 'e': {
          std::vector<NodeRef> items = pop_to_mark();
          auto& list = list_below("APPENDS").items;
          list.insert(list.end(), items.begin(), items.end());
          break;
        }
        case 's': {
          NodeRef v = pop_node("a dict value");
          NodeRef k = pop_node("a dict key");
          set_item(dict_below("SETITEM"), k, std::move(v));
          break;
        }
        case 'u': {
          std::vector<NodeRef> items = pop_to_mark();
          if (items.size() % 2 != 0) fail("SETITEMS with an odd number of values");
          Dict& d = dict_below("SETITEMS");
          for (size_t i = 0; i < items.size(); i += 2) set_item(d, items[i], items[i + 1]);
          break;
        }
        case 'c': {  // GLOBAL "module\nname\n"
          const std::string module = line(), name = line();
          stack_.push_back(value_item(Global{global(module + "." + name)}));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          const std::string name = string_of(pop_node("a global's name"));
          const std::string module = string_of(pop_node("a global's module"));
          stack_.push_back(value_item(Global{global(module + "." + name)}));
          break;
        }
        case 'Q':
          if (!storage_) fail("a persistent id, which this pickle may not hold");
          stack_.push_back(persistent(pop_node("a persistent id")));
          break;
        case 'R': {
          NodeRef args = pop_node("arguments");
          NodeRef callable = pop_node("a callable");
          const auto* global = std::get_if<Global>(&callable->value);
          if (!global) fail("REDUCE of something that is not a global");
          if (allowed_ && global->name == "torch.Size" && size_tuple(args)) {
            // A tuple subclass that a DCP .metadata names millions of times:
            // kept as the tuple of its dims, without an object around it.
            stack_.push_back(Item{false, tuple_of(args)[0]});
          } else if (allowed_) {  // allowed where it was named: kept, not called
            stack_.push_back(value_item(object(global->name, tuple_of(args))));
          } else {
            stack_.push_back(reduce(global->name, tuple_of(args)));
          }
          break;
        }
        case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
          NodeRef args = pop_node("arguments");
          NodeRef cls = pop_node("a class");
          const auto* global = std::get_if<Global>(&cls->value);
          if (!allowed_ || !global) fail("NEWOBJ (an instance of a class), which a state dict does not hold");
          stack_.push_back(value_item(object(global->name, tuple_of(args))));
          break;
        }
        case 'b': {  // BUILD: tensors and OrderedDicts carry an empty state,
          // a module's state_dict() its attributes (`_metadata`: the modules'
          // versions), which are no items of the dict: dropped.
          NodeRef state = pop_node("a state");
          if (stack_.empty() || stack_.back().mark) fail("BUILD without an object");
          if (allowed_) {
            const auto* made = std::get_if<std::shared_ptr<Object>>(&stack_.back().node->value);
            if (made && !(*made)->state) {
              (*made)->state = std::move(state);
              break;
            }
          }
          const bool empty = std::holds_alternative<std::monostate>(state->value) ||
                             (std::holds_alternative<std::shared_ptr<Dict>>(state->value) &&
                              std::get<std::shared_ptr<Dict>>(state->value)->items.empty());
          const bool dict_attributes = std::holds_alternative<std::shared_ptr<Dict>>(stack_.back().node->value) &&
                                       std::holds_alternative<std::shared_ptr<Dict>>(state->value);
          if (!empty && !dict_attributes) fail("an object with state (BUILD), which a state dict does not hold");
          break;
        }
        default:
          fail(fmt::format("opcode 0x{:02x}, which torch.save does not write for state dicts", op));
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    if (allowed_) throw CheckpointError(fmt::format("{} at byte {}: {}", origin_, op_at_, what));
    throw CheckpointError(fmt::format("'{}': data.pkl at byte {}: {}", origin_, op_at_, what));
  }

  std::string global(std::string name) {
    if (allowed_ && !(*allowed_)(name)) {
      fail(fmt::format("global '{}', which this pickle may not name (nothing is imported)", name.substr(0, 256)));
    }
    return copied(std::move(name), "global names");
  }

  std::string_view take(uint64_t n) {
    if (n > in_.size() - pos_) fail(fmt::format("{} bytes wanted, {} left (truncated pickle)", n, in_.size() - pos_));
    const std::string_view out = in_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint64_t le(size_t n) {
    uint64_t v = 0;
    const std::string_view b = take(n);
    for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<uint8_t>(b[i]);
    return v;
  }
  int64_t long1() {
    const uint8_t n = u8();
    if (n > 8) fail("an integer wider than 64 bits");
    if (n == 0) return 0;
    uint64_t v = le(n);
    if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return static_cast<int64_t>(v);
  }
  std::string line() {
    const size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos || end - pos_ > 256) fail("a global's name without its newline");
    std::string out(in_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }

  const Item& top() const {
    if (stack_.empty() || stack_.back().mark) fail("memoizing a mark or an empty stack");
    return stack_.back();
  }
  Item get(uint64_t index) const {
    const NodeRef* node = memo_.get(index);
    if (!node) fail(fmt::format("memo entry {} was never stored", index));
    return Item{false, *node};
  }
  NodeRef pop_node(const char* what) {
    if (stack_.empty() || stack_.back().mark) fail(fmt::format("{} missing: a mark or an empty stack", what));
    NodeRef out = std::move(stack_.back().node);
    stack_.pop_back();
    return out;
  }
  std::vector<NodeRef> pop_to_mark() {
    size_t mark = stack_.size();
    while (mark > 0 && !stack_[mark - 1].mark) --mark;
    if (mark == 0) fail("no mark on the stack");
    std::vector<NodeRef> out;
    for (size_t i = mark; i < stack_.size(); ++i) out.push_back(stack_[i].node);
    stack_.resize(mark - 1);
    return out;
  }
  template <typename T>
  T& below(const char* op) {
    if (stack_.empty() || stack_.back().mark ||
        !std::holds_alternative<std::shared_ptr<T>>(stack_.back().node->value)) {
      fail(fmt::format("{} onto something that is not a {}", op, std::is_same_v<T, Dict> ? "dict" : "list"));
    }
    return *std::get<std::shared_ptr<T>>(stack_.back().node->value);
  }
  List& list_below(const char* op) {
    List& l = below<List>(op);
    if (l.tuple) fail(fmt::format("{} onto a tuple", op));
    return l;
  }
  Dict& dict_below(const char* op) { return below<Dict>(op); }

  void set_item(Dict& d, const NodeRef& key, NodeRef value) {
    Key k;
    if (const auto* i = std::get_if<int64_t>(&key->value)) {
      k = *i;
    } else if (const auto* s = std::get_if<std::string>(&key->value)) {
      k = *s;
    } else if (allowed_ && std::holds_alternative<std::shared_ptr<Object>>(key->value)) {
      k = key;  // distinct objects are distinct keys
    } else {
      fail("a dict key that is neither a string nor an int");
    }
    if (const auto* s = std::get_if<std::string>(&k)) charge(s->size(), "dict keys");
    // Small dicts (an object's attributes: millions of them in a large DCP
    // .metadata) find a repeated key by looking; larger ones index their keys.
    constexpr size_t kIndexedFrom = 16;
    if (d.items.size() < kIndexedFrom) {
      for (auto& [existing, v] : d.items) {
        if (existing == k) {
          v = std::move(value);
          return;
        }
      }
      d.items.emplace_back(std::move(k), std::move(value));
      return;
    }
    if (d.positions.empty()) {
      for (size_t i = 0; i < d.items.size(); ++i) d.positions.emplace(d.items[i].first, i);
    }
    const auto [at, added] = d.positions.emplace(k, d.items.size());
    if (!added) {
      d.items[at->second].second = std::move(value);
      return;
    }
    d.items.emplace_back(std::move(k), std::move(value));
  }

  std::string string_of(const NodeRef& n) const {
    const auto* s = std::get_if<std::string>(&n->value);
    if (!s) fail("a string was expected");
    return *s;
  }
  int64_t int_of(const NodeRef& n, const char* what) const {
    const auto* i = std::get_if<int64_t>(&n->value);
    if (!i) fail(fmt::format("{} is not an int", what));
    return *i;
  }
  const std::vector<NodeRef>& tuple_of(const NodeRef& n) const {
    const auto* l = std::get_if<std::shared_ptr<List>>(&n->value);
    if (!l || !(*l)->tuple) fail("arguments that are not a tuple");
    return (*l)->items;
  }
  // REDUCE arguments (dims,) with `dims` a tuple, as torch.Size pickles itself.
  bool size_tuple(const NodeRef& args) const {
    const std::vector<NodeRef>& a = tuple_of(args);
    const auto* dims = a.size() == 1 ? std::get_if<std::shared_ptr<List>>(&a[0]->value) : nullptr;
    return dims && (*dims)->tuple;
  }
  std::vector<int64_t> ints_of(const NodeRef& n, const char* what) const {
    std::vector<int64_t> out;
    for (const NodeRef& i : tuple_of(n)) out.push_back(int_of(i, what));
    return out;
  }

  // ('storage', StorageClass, key, location, numel): the archive's record
  // "data/<key>", loaded once however often the pickle names it.
  Item persistent(const NodeRef& pid) {
    const std::vector<NodeRef>& t = tuple_of(pid);
    if (t.size() != 5 || string_of(t[0]) != "storage") fail("a persistent id that is not a storage");
    const auto* type = std::get_if<Global>(&t[1]->value);
    const std::optional<at::ScalarType> dtype = type ? storage_dtype(type->name) : std::nullopt;
    if (!dtype) fail("a storage of an unknown class (a typed storage such as torch.FloatStorage)");
    const std::string key = string_of(t[2]);
    const int64_t numel = int_of(t[4], "a storage's size");
    if (numel < 0) fail("a negative storage size");
    auto& loaded = storages_[key];
    if (!loaded.defined()) {
      loaded = (*storage_)(key, *dtype, numel);
    } else if (loaded.scalar_type() != *dtype || loaded.numel() != numel) {
      fail(fmt::format("storage '{}' named twice with different types or sizes", key));
    }
    return value_item(Storage{loaded});
  }

  Item reduce(const std::string& global, const std::vector<NodeRef>& args) {
    if (global == "collections.OrderedDict") {
      if (!args.empty()) fail("OrderedDict built from arguments");
      return value_item(dict());
    }
    if (global == "torch._utils._rebuild_tensor_v2" || global == "torch._utils._rebuild_tensor") {
      if (args.size() < 4) fail(fmt::format("{} with {} arguments", global, args.size()));
      return value_item(rebuild_tensor(args));
    }
    if (global == "_codecs.encode") {  // bytes under protocol 2: encode(text, "latin1")
      if (args.size() != 2 || string_of(args[1]) != "latin1") fail("_codecs.encode other than of latin-1 text");
      return value_item(latin1(string_of(args[0])));
    }
    if (global == "torch._utils._rebuild_parameter" || global == "torch._utils._rebuild_parameter_with_state") {
      if (args.empty() || !std::holds_alternative<at::Tensor>(args[0]->value)) fail("a parameter without its tensor");
      return value_item(std::get<at::Tensor>(args[0]->value));
    }
    fail(fmt::format("global '{}', which a state dict does not use (nothing is imported)", global));
  }

  // The bytes whose latin-1 text `utf8` is: every code point below 256.
  std::string latin1(const std::string& utf8) const {
    std::string out;
    for (size_t i = 0; i < utf8.size(); ++i) {
      const auto c = static_cast<uint8_t>(utf8[i]);
      if (c < 0x80) {
        out.push_back(static_cast<char>(c));
      } else if ((c == 0xc2 || c == 0xc3) && i + 1 < utf8.size() &&
                 (static_cast<uint8_t>(utf8[i + 1]) & 0xc0) == 0x80) {
        out.push_back(static_cast<char>(((c & 0x03) << 6) | (static_cast<uint8_t>(utf8[++i]) & 0x3f)));
      } else {
        fail("latin-1 text with a character past U+00FF");
      }
    }
    return out;
  }

  at::Tensor rebuild_tensor(const std::vector<NodeRef>& args) {
    const auto* source = std::get_if<Storage>(&args[0]->value);
    if (!source) fail("a tensor whose first argument is not a storage");
    const at::Tensor* storage = &source->data;
    const int64_t offset = int_of(args[1], "a tensor's storage offset");
    const std::vector<int64_t> size = ints_of(args[2], "a tensor's size");
    const std::vector<int64_t> stride = ints_of(args[3], "a tensor's stride");
    if (size.size() != stride.size() || size.size() > 64) fail("a tensor's size and stride disagree");
    const int64_t numel = storage->numel();
    if (offset < 0 || offset > numel) fail(fmt::format("storage offset {} outside {} elements", offset, numel));
    bool empty = false;
    for (size_t d = 0; d < size.size(); ++d) {
      if (size[d] < 0 || stride[d] < 0) fail("a negative size or stride");
      empty = empty || size[d] == 0;
    }
    if (empty) return at::empty(size, storage->options());
    // Every element inside the storage, and no more elements than it holds:
    // an expanded view (stride 0) would otherwise turn a few bytes of file
    // into any amount of memory once made contiguous.
    __int128 last = offset, elements = 1;
    for (size_t d = 0; d < size.size(); ++d) {
      last += static_cast<__int128>(size[d] - 1) * stride[d];  // each term < 2^126: no overflow before the check
      elements *= size[d];
      if (last >= numel) fail(fmt::format("a tensor reaching past its storage of {} elements", numel));
      if (elements > numel) {
        fail(fmt::format("a view with more elements than its storage of {} (an expanded tensor: save it contiguous)",
                         numel));
      }
    }
    if (last >= numel) fail(fmt::format("a tensor reaching past its storage of {} elements", numel));  // 0-dim
    return storage->as_strided(size, stride, offset);
  }

  static constexpr uint64_t kCopiedBytesPerPickleByte = 8;
  static constexpr size_t kMaxStack = size_t{1} << 20;

  // Each copy of a string counts: a memoized string named by many SETITEMs
  // or STACK_GLOBALs would otherwise turn a small pickle into any amount of
  // memory.
  void charge(size_t bytes, const char* what) {
    copied_bytes_ += bytes;
    if (copied_bytes_ > kCopiedBytesPerPickleByte * in_.size() + 4096) {
      fail(fmt::format("{} adding up to more than {} times the pickle's size (one string copied many times)", what,
                       kCopiedBytesPerPickleByte));
    }
  }
  std::string copied(std::string s, const char* what) {
    charge(s.size(), what);
    return s;
  }

  // Values on the stack. Scalars are never changed once made, so the
  // common ones are made once: small ints (a DCP .metadata's offsets,
  // sizes and indices), and the empty tuple (every NEWOBJ's arguments).
  template <typename T>
  Item value_item(T v) {
    if constexpr (std::is_same_v<T, int64_t>) {
      if (v >= 0 && v < static_cast<int64_t>(kSmallInts)) {
        NodeRef& shared = small_ints_[static_cast<size_t>(v)];
        if (!shared) shared = node(v);
        return Item{false, shared};
      }
    }
    return Item{false, node(std::move(v))};
  }
  Item empty_tuple() {
    if (!empty_tuple_) empty_tuple_ = node(list(List{{}, true}));
    return Item{false, empty_tuple_};
  }
  template <typename T>
  NodeRef node(T v) {
    NodeRef n = make<Node>();
    n->value = std::move(v);
    return n;
  }
  template <typename T, typename... Args>
  std::shared_ptr<T> make(Args&&... args) {
    return std::allocate_shared<T>(std::pmr::polymorphic_allocator<T>(arena_.get()), std::forward<Args>(args)...);
  }

  static constexpr size_t kSmallInts = 1024;
  // First: every node below, on the stack, in the memo or in made_, is freed into it.
  std::shared_ptr<std::pmr::memory_resource> arena_ = std::make_shared<std::pmr::monotonic_buffer_resource>();
  std::vector<NodeRef> small_ints_ = std::vector<NodeRef>(kSmallInts);
  NodeRef empty_tuple_;
  std::string_view in_;
  size_t pos_ = 0, op_at_ = 0;
  uint64_t copied_bytes_ = 0;  // dict keys and global names
  const StorageLoader* storage_;
  const GlobalAllowed* allowed_;
  const std::string& origin_;
  std::vector<Item> stack_;
  Memo memo_{in_.size() / 2 + 16};
  std::unordered_map<std::string, at::Tensor> storages_;
  Unpickled made_;
};

}  // namespace

// The storage classes torch.save names in a storage's persistent id.
constexpr std::pair<const char*, at::ScalarType> kStorageClasses[] = {
    {"torch.FloatStorage", at::kFloat},
    {"torch.DoubleStorage", at::kDouble},
    {"torch.HalfStorage", at::kHalf},
    {"torch.BFloat16Storage", at::kBFloat16},
    {"torch.LongStorage", at::kLong},
    {"torch.IntStorage", at::kInt},
    {"torch.ShortStorage", at::kShort},
    {"torch.CharStorage", at::kChar},
    {"torch.ByteStorage", at::kByte},
    {"torch.BoolStorage", at::kBool},
    {"torch.ComplexFloatStorage", at::kComplexFloat},
    {"torch.ComplexDoubleStorage", at::kComplexDouble}};

std::optional<at::ScalarType> storage_dtype(const std::string& storage_class) {
  for (const auto& [name, dtype] : kStorageClasses) {
    if (storage_class == name) return dtype;
  }
  return std::nullopt;
}

std::optional<std::string> storage_class(at::ScalarType dtype) {
  for (const auto& [name, d] : kStorageClasses) {
    if (d == dtype) return std::string(name);
  }
  return std::nullopt;
}

Unpickled::~Unpickled() {
  for (const auto& l : lists) l->items.clear();
  for (const auto& d : dicts) {
    d->items.clear();
    d->positions.clear();
  }
  for (const auto& o : objects) {
    o->args.clear();
    o->state.reset();
  }
}

Unpickled unpickle(std::string_view bytes, const StorageLoader& storage, const std::string& origin) {
  return Machine(bytes, &storage, nullptr, origin).run();
}

Unpickled unpickle_objects(std::string_view bytes, const GlobalAllowed& allowed, const std::string& what) {
  return Machine(bytes, nullptr, &allowed, what).run();
}

}  // namespace distckpt::torch_pickle
