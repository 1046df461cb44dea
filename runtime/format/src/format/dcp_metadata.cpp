#include "format/dcp_metadata.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>
#include <unordered_map>

#include "distckpt/core/errors.h"
#include "format/dtype.h"
#include "format/pickle_writer.h"
#include "format/torch_pickle.h"

namespace distckpt::dcp {
namespace {

namespace tp = torch_pickle;

// The module paths of DCP's classes: torch 1.13 kept them under _shard.
struct Naming {
  const char* name;
  const char* metadata;    // module of Metadata, TensorStorageMetadata, ...
  const char* filesystem;  // module of _StorageInfo
  const char* properties;  // module of TensorProperties and its memory-format enum
  const char* memory_format_enum;
};
constexpr std::array<Naming, 2> kNamings = {{
    {"torch 1.13", "torch.distributed._shard.checkpoint.metadata", "torch.distributed._shard.checkpoint.filesystem",
     "torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"},
    {"torch 2", "torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
     "torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"},
}};
constexpr const char* kMegatronMetadata = "megatron.core.dist_checkpointing.strategies.torch.MCoreMetadata";

// Callables kept as objects, never called: torch.Size(tuple), a layout by
// name, an enum member through getattr (Python >= 3.11), a path.
constexpr std::array<const char*, 8> kHelpers = {
    "torch.Size",        "torch.serialization._get_layout", "builtins.getattr",    "collections.OrderedDict",
    "pathlib.PosixPath", "pathlib.PurePosixPath",           "pathlib.WindowsPath", "pathlib.PureWindowsPath"};

bool known_dtype(const std::string& global) {
  if (global.rfind("torch.", 0) != 0) return false;
  try {
    resolve_stored_dtype(global.substr(6), 0);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::set<std::string> allowed_classes() {
  std::set<std::string> out(kHelpers.begin(), kHelpers.end());
  for (const Naming& n : kNamings) {
    for (const char* c : {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                          "MetadataIndex", "StorageMeta", "TensorProperties"}) {
      out.insert(fmt::format("{}.{}", n.metadata, c));
    }
    out.insert(fmt::format("{}._StorageInfo", n.filesystem));
    out.insert(fmt::format("{}.TensorProperties", n.properties));
    out.insert(fmt::format("{}.{}", n.properties, n.memory_format_enum));
  }
  out.insert(kMegatronMetadata);
  return out;
}

// Reads the unpickled tree: every node visited counts against a budget
// proportional to the file, so a memo that names one list from many places
// cannot make a small file cost any amount of time.
class Reader {
 public:
  Reader(const std::string& origin, uint64_t bytes) : origin_(origin), budget_(64 * bytes + (uint64_t{1} << 20)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw CorruptionError(fmt::format("'{}' is no PyTorch DCP metadata file: {}", origin_, what), origin_);
  }

  void spend(uint64_t units = 1) {
    spent_ += units;
    if (spent_ > budget_) fail("it refers to the same values from too many places (more than 64 visits per byte)");
  }

  const tp::Object& object(const tp::NodeRef& n, const std::string& what) {
    spend();
    const auto* o = std::get_if<std::shared_ptr<tp::Object>>(&n->value);
    if (!o) fail(fmt::format("{} is not an object", what));
    return **o;
  }
  // The class's short name ("TensorStorageMetadata"): the allow-list has
  // already admitted only DCP's own modules.
  static std::string class_of(const tp::Object& o) {
    const size_t dot = o.name.rfind('.');
    return std::string(dot == std::string_view::npos ? o.name : o.name.substr(dot + 1));
  }

  // An object's attributes: BUILD's dict, or (dict, slots) for classes with __slots__.
  std::unordered_map<std::string, tp::NodeRef> attributes(const tp::Object& o, const std::string& what) {
    std::unordered_map<std::string, tp::NodeRef> out;
    if (!o.state) return out;
    const auto add = [&](const tp::NodeRef& n) {
      if (std::holds_alternative<std::monostate>(n->value)) return;
      const auto* d = std::get_if<std::shared_ptr<tp::Dict>>(&n->value);
      if (!d) fail(fmt::format("{} has a state that is not a dict of attributes", what));
      for (const auto& [k, v] : (*d)->items) {
        spend();
        const auto* name = std::get_if<std::string>(&k);
        if (!name) fail(fmt::format("{} has an attribute that is not named by a string", what));
        out[*name] = v;
      }
    };
    const auto* t = std::get_if<std::shared_ptr<tp::List>>(&o.state->value);
    if (t && (*t)->tuple && (*t)->items.size() == 2) {
      add((*t)->items[0]);
      add((*t)->items[1]);
    } else {
      add(o.state);
    }
    return out;
  }
  const tp::NodeRef& attribute(const std::unordered_map<std::string, tp::NodeRef>& attrs, const std::string& name,
                               const std::string& what) const {
    const auto it = attrs.find(name);
    if (it == attrs.end()) fail(fmt::format("{} has no '{}'", what, name));
    return it->second;
  }

  std::string string(const tp::NodeRef& n, const std::string& what) {
    spend();
    const auto* s = std::get_if<std::string>(&n->value);
    if (!s) fail(fmt::format("{} is not a string", what));
    spend(s->size() / 64);
    return *s;
  }
  int64_t integer(const tp::NodeRef& n, const std::string& what) {
    spend();
    const auto* i = std::get_if<int64_t>(&n->value);
    if (!i) fail(fmt::format("{} is not an int", what));
    return *i;
  }
  bool is_none(const tp::NodeRef& n) const { return std::holds_alternative<std::monostate>(n->value); }

  // A torch.Size (which the pickle machine keeps as its tuple), or a plain
  // tuple or list, of non-negative ints.
  Shape shape(const tp::NodeRef& n, const std::string& what) {
    spend();
    const auto* l = std::get_if<std::shared_ptr<tp::List>>(&n->value);
    if (!l) fail(fmt::format("{} is not a torch.Size or a tuple of ints", what));
    if ((*l)->items.size() > 64) fail(fmt::format("{} has {} dimensions", what, (*l)->items.size()));
    Shape out;
    for (const tp::NodeRef& i : (*l)->items) {
      out.push_back(integer(i, what));
      if (out.back() < 0) fail(fmt::format("{} holds a negative extent", what));
    }
    return out;
  }

  // TensorProperties: __setstate__'s tuple (dtype, layout, requires_grad,
  // memory_format, pin_memory), or its attributes.
  void dtype(const tp::NodeRef& properties, Tensor& t, const std::string& what) {
    const tp::Object& o = object(properties, what);
    if (class_of(o) != "TensorProperties") fail(fmt::format("{} is a {}, not TensorProperties", what, o.name));
    tp::NodeRef dtype;
    const auto* t_state = o.state ? std::get_if<std::shared_ptr<tp::List>>(&o.state->value) : nullptr;
    if (t_state && (*t_state)->tuple && (*t_state)->items.size() == 5) {
      dtype = (*t_state)->items[0];
    } else {
      dtype = attribute(attributes(o, what), "dtype", what);
    }
    const auto* g = std::get_if<tp::Global>(&dtype->value);
    if (!g || g->name.rfind("torch.", 0) != 0) fail(fmt::format("{} has a dtype that is not a torch dtype", what));
    const ResolvedDtype resolved = resolve_stored_dtype(g->name.substr(6), 0);
    t.dtype = resolved.type;
    t.unrepresentable = resolved.unrepresentable;
  }

  StorageInfo storage_info(const tp::NodeRef& n, const std::string& what) {
    const tp::Object& o = object(n, what);
    if (class_of(o) != "_StorageInfo") fail(fmt::format("{} is a {}, not a _StorageInfo", what, o.name));
    const auto attrs = attributes(o, what);
    StorageInfo s;
    s.relative_path = string(attribute(attrs, "relative_path", what), what + "'s relative_path");
    const int64_t offset = integer(attribute(attrs, "offset", what), what + "'s offset");
    const int64_t length = integer(attribute(attrs, "length", what), what + "'s length");
    if (offset < 0 || length < 0) fail(fmt::format("{} has a negative offset or length", what));
    s.offset = static_cast<uint64_t>(offset);
    s.length = static_cast<uint64_t>(length);
    const auto transforms = attrs.find("transform_descriptors");
    if (transforms != attrs.end() && !is_none(transforms->second)) {
      const auto* l = std::get_if<std::shared_ptr<tp::List>>(&transforms->second->value);
      if (!l) fail(fmt::format("{}'s transform_descriptors is not a list", what));
      for (const tp::NodeRef& d : (*l)->items) s.transforms.push_back(string(d, what + "'s transform descriptor"));
    }
    return s;
  }

  Metadata read(const tp::NodeRef& root) {
    const tp::Object& top = object(root, "the pickled value");
    Metadata out;
    for (const Naming& n : kNamings) {
      if (top.name == fmt::format("{}.Metadata", n.metadata)) {
        out.naming = n.name;
      }
    }
    if (top.name == kMegatronMetadata) {
      // Its fields' classes are DCP's own, of whichever torch wrote it.
      out.naming = "Megatron MCoreMetadata";
    } else if (out.naming.empty()) {
      fail(fmt::format("it holds a {}, not a DCP Metadata", top.name));
    }
    const auto attrs = attributes(top, "Metadata");

    // storage_data: MetadataIndex(fqn, offset) -> _StorageInfo
    std::map<std::pair<std::string, Shape>, StorageInfo> stored;
    const auto* storage_data =
        std::get_if<std::shared_ptr<tp::Dict>>(&attribute(attrs, "storage_data", "Metadata")->value);
    if (!storage_data) fail("its storage_data is not a dict");
    for (const auto& [k, v] : (*storage_data)->items) {
      const auto* index = std::get_if<tp::NodeRef>(&k);
      if (!index) fail("a storage_data key that is not a MetadataIndex");
      const tp::Object& key = object(*index, "a storage_data key");
      if (class_of(key) != "MetadataIndex") fail(fmt::format("a storage_data key is a {}", key.name));
      const auto key_attrs = attributes(key, "a MetadataIndex");
      const std::string fqn = string(attribute(key_attrs, "fqn", "a MetadataIndex"), "a MetadataIndex's fqn");
      const auto offset = key_attrs.find("offset");
      Shape at = offset == key_attrs.end() || is_none(offset->second)
                     ? Shape{}
                     : shape(offset->second, fmt::format("the offset of '{}' in storage_data", fqn));
      StorageInfo info = storage_info(v, fmt::format("the storage of '{}'", fqn));
      if (!stored.emplace(std::make_pair(fqn, std::move(at)), std::move(info)).second) {
        fail(fmt::format("storage_data names an item of '{}' twice", fqn));
      }
    }
    const auto take_storage = [&](const std::string& fqn, const Shape& at, const std::string& what) {
      const auto it = stored.find({fqn, at});
      if (it == stored.end()) fail(fmt::format("{} has no entry in storage_data", what));
      StorageInfo s = std::move(it->second);
      stored.erase(it);
      return s;
    };

    const auto* items =
        std::get_if<std::shared_ptr<tp::Dict>>(&attribute(attrs, "state_dict_metadata", "Metadata")->value);
    if (!items) fail("its state_dict_metadata is not a dict");
    for (const auto& [k, v] : (*items)->items) {
      const auto* fqn = std::get_if<std::string>(&k);
      if (!fqn) fail("a state_dict_metadata key that is not a string");
      const std::string what = fmt::format("'{}'", *fqn);
      const tp::Object& item = object(v, what);
      const std::string kind = class_of(item);
      if (kind == "BytesStorageMetadata") {
        out.bytes.push_back(BytesItem{*fqn, take_storage(*fqn, {}, what)});
        continue;
      }
      if (kind != "TensorStorageMetadata") fail(fmt::format("{} is described by a {}", what, item.name));
      const auto item_attrs = attributes(item, what);
      Tensor t;
      t.key = *fqn;
      dtype(attribute(item_attrs, "properties", what), t, what + "'s properties");
      t.size = shape(attribute(item_attrs, "size", what), what + "'s size");
      const auto* chunks = std::get_if<std::shared_ptr<tp::List>>(&attribute(item_attrs, "chunks", what)->value);
      if (!chunks) fail(fmt::format("{}'s chunks are not a list", what));
      for (const tp::NodeRef& c : (*chunks)->items) {
        const std::string chunk_what = fmt::format("a chunk of {}", what);
        const tp::Object& chunk = object(c, chunk_what);
        if (class_of(chunk) != "ChunkStorageMetadata") fail(fmt::format("{} is a {}", chunk_what, chunk.name));
        const auto chunk_attrs = attributes(chunk, chunk_what);
        Chunk out_chunk;
        out_chunk.offsets = shape(attribute(chunk_attrs, "offsets", chunk_what), chunk_what + "'s offsets");
        out_chunk.sizes = shape(attribute(chunk_attrs, "sizes", chunk_what), chunk_what + "'s sizes");
        if (out_chunk.offsets.size() != t.size.size() || out_chunk.sizes.size() != t.size.size()) {
          fail(fmt::format("{} has {} dimensions, its tensor {}", chunk_what, out_chunk.sizes.size(), t.size.size()));
        }
        for (size_t d = 0; d < t.size.size(); ++d) {
          if (out_chunk.offsets[d] > t.size[d] || out_chunk.sizes[d] > t.size[d] - out_chunk.offsets[d]) {
            fail(fmt::format("{} reaches past the tensor's size in dimension {}", chunk_what, d));
          }
        }
        out_chunk.storage = take_storage(*fqn, out_chunk.offsets, chunk_what);
        t.chunks.push_back(std::move(out_chunk));
      }
      out.tensors.push_back(std::move(t));
    }
    if (!stored.empty()) {
      fail(fmt::format("storage_data names an item of '{}' that state_dict_metadata does not describe",
                       stored.begin()->first.first));
    }
    const auto by_key = [](const auto& a, const auto& b) { return a.key < b.key; };
    std::sort(out.tensors.begin(), out.tensors.end(), by_key);
    std::sort(out.bytes.begin(), out.bytes.end(), by_key);
    return out;
  }

 private:
  const std::string& origin_;
  const uint64_t budget_;
  uint64_t spent_ = 0;
};

// Writes DCP's dataclasses as Python pickles them: NEWOBJ of the class,
// then BUILD with its attributes (TensorProperties: its __getstate__ tuple).
class Encoder {
 public:
  explicit Encoder(const Naming& n) : n_(n) {}

  std::string encode(const Metadata& m) && {
    p_.proto();
    object_of(n_.metadata, "Metadata");
    p_.op('}');
    p_.mark();
    p_.string("state_dict_metadata");
    p_.op('}');
    p_.mark();
    for (const Tensor& t : m.tensors) {
      p_.string(t.key);
      tensor(t);
    }
    for (const BytesItem& b : m.bytes) {
      p_.string(b.key);
      object_of(n_.metadata, "BytesStorageMetadata");
    }
    p_.op('u');
    // {key: (key,)}: the state dict is flat (2.x's loaders that rebuild it read this).
    p_.string("planner_data");
    p_.op('}');
    p_.mark();
    for (const Tensor& t : m.tensors) path(t.key);
    for (const BytesItem& b : m.bytes) path(b.key);
    p_.op('u');
    p_.string("storage_data");
    p_.op('}');
    p_.mark();
    for (const Tensor& t : m.tensors) {
      for (size_t c = 0; c < t.chunks.size(); ++c) {
        index(t.key, &t.chunks[c].offsets, static_cast<int64_t>(c));
        storage(t.chunks[c].storage);
      }
    }
    for (const BytesItem& b : m.bytes) {
      index(b.key, nullptr, -1);
      storage(b.storage);
    }
    p_.op('u');
    p_.op('u');
    p_.op('b');
    p_.stop();
    return std::move(p_).take();
  }

 private:
  // cls() on the stack: GLOBAL, EMPTY_TUPLE, NEWOBJ.
  void object_of(const char* module, const char* name) {
    p_.global(module, name);
    p_.tuple(0);
    p_.op('\x81');
  }
  void size(const Shape& s) {  // torch.Size((..,))
    p_.global("torch", "Size");
    p_.mark();
    for (const int64_t i : s) p_.integer(i);
    p_.op('t');
    p_.tuple(1);
    p_.op('R');
  }
  void path(const std::string& key) {
    p_.string(key);
    p_.string(key);
    p_.tuple(1);
  }
  void tensor(const Tensor& t) {
    object_of(n_.metadata, "TensorStorageMetadata");
    p_.op('}');
    p_.mark();
    p_.string("properties");
    object_of(n_.properties, "TensorProperties");
    p_.mark();  // (dtype, layout, requires_grad, memory_format, pin_memory)
    p_.global("torch", dtype_name(t.dtype));
    p_.global("torch.serialization", "_get_layout");
    p_.string("torch.strided");
    p_.tuple(1);
    p_.op('R');
    p_.boolean(false);
    p_.global("builtins", "getattr");
    p_.global(n_.properties, n_.memory_format_enum);
    p_.string("TORCH_CONTIGUOUS_FORMAT");
    p_.tuple(2);
    p_.op('R');
    p_.boolean(false);
    p_.op('t');
    p_.op('b');
    p_.string("size");
    size(t.size);
    p_.string("chunks");
    p_.op(']');
    if (!t.chunks.empty()) {
      p_.mark();
      for (const Chunk& c : t.chunks) {
        object_of(n_.metadata, "ChunkStorageMetadata");
        p_.op('}');
        p_.mark();
        p_.string("offsets");
        size(c.offsets);
        p_.string("sizes");
        size(c.sizes);
        p_.op('u');
        p_.op('b');
      }
      p_.op('e');
    }
    p_.op('u');
    p_.op('b');
  }
  // MetadataIndex(fqn, offset, index): a bytes item has neither.
  void index(const std::string& fqn, const Shape* offsets, int64_t chunk) {
    object_of(n_.metadata, "MetadataIndex");
    p_.op('}');
    p_.mark();
    p_.string("fqn");
    p_.string(fqn);
    p_.string("offset");
    if (offsets) {
      size(*offsets);
    } else {
      p_.none();
    }
    p_.string("index");
    if (chunk >= 0) {
      p_.integer(chunk);
    } else {
      p_.none();
    }
    p_.op('u');
    p_.op('b');
  }
  void storage(const StorageInfo& s) {
    object_of(n_.filesystem, "_StorageInfo");
    p_.op('}');
    p_.mark();
    p_.string("relative_path");
    p_.string(s.relative_path);
    p_.string("offset");
    p_.integer(static_cast<int64_t>(s.offset));
    p_.string("length");
    p_.integer(static_cast<int64_t>(s.length));
    p_.op('u');
    p_.op('b');
  }

  const Naming& n_;
  tp::PickleWriter p_;
};

}  // namespace

std::string encode_metadata(const Metadata& metadata, ModuleNaming naming) {
  return Encoder(kNamings[naming == ModuleNaming::kTorch113 ? 0 : 1]).encode(metadata);
}

Metadata parse_metadata(std::string_view bytes, const std::string& origin) {
  static const std::set<std::string> classes = allowed_classes();
  const tp::GlobalAllowed allowed = [](const std::string& name) {
    return classes.count(name) > 0 || known_dtype(name);
  };
  std::optional<tp::Unpickled> unpickled;
  try {
    unpickled.emplace(tp::unpickle_objects(bytes, allowed, fmt::format("'{}'", origin)));
  } catch (const CheckpointError& e) {
    throw CorruptionError(e.what(), origin);  // what is not DCP's metadata is a damaged (or hostile) file
  }
  return Reader(origin, bytes.size()).read(unpickled->root);
}

}  // namespace distckpt::dcp
