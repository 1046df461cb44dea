// The common (non-sharded) state as a FlatBuffers tree of Nodes (see the
// "common state" section of schema/checkpoint.fbs). Tensors are stored as
// dtype name, shape and the bytes of a contiguous CPU copy; decoding builds
// fresh CPU tensors that own their memory.
#include "format/common_state.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "distckpt/core/errors.h"
#include "distckpt/fb/checkpoint_generated.h"
#include "fb_support.h"
#include "format/dtype.h"
#include "format/metadata.h"

namespace distckpt {
namespace {

using fb_support::checked_mul;
using fb_support::checked_numel;
using fb_support::ensure_room;

// Distinct from metadata's "DCKP", so neither is mistaken for the other.
constexpr const char* kCommonIdentifier = "DCKC";
// Deep enough for any real training state, shallow enough that the
// recursive encoder and decoder cannot exhaust the stack.
constexpr size_t kMaxNesting = 48;
// The verifier counts nested tables: the CommonState root plus one per level.
constexpr uint32_t kMaxVerifierDepth = kMaxNesting + 2;

// "a/b/0" for messages; the root itself is "<root>".
std::string join_path(const std::vector<std::string>& path) {
  return path.empty() ? std::string("<root>") : fmt::format("{}", fmt::join(path, "/"));
}

class CommonEncoder {
 public:
  std::string encode(const Value& root, const std::optional<Value>& content_metadata) {
    const auto node = encode_node(root, nullptr);
    flatbuffers::Offset<fb::Node> content;
    if (content_metadata) {
      path_ = {"<content_metadata>"};
      content = encode_node(*content_metadata, nullptr);
    }
    const auto state = fb::CreateCommonState(fbb_, kFormatVersion, node, content);
    fbb_.Finish(state, kCommonIdentifier);
    return std::string(reinterpret_cast<const char*>(fbb_.GetBufferPointer()), fbb_.GetSize());
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw UsageError(fmt::format("common state at '{}': {}", join_path(path_), what));
  }

  // FlatBuffers builds bottom-up: everything a node refers to (children,
  // strings, vectors) is serialized before the node's own table.
  flatbuffers::Offset<fb::Node> encode_node(const Value& v, const std::string* key) {
    if (path_.size() > kMaxNesting) fail(fmt::format("nested deeper than {} levels", kMaxNesting));
    if (v.is_sharded()) {
      throw UsageError(
          fmt::format("common state cannot hold a {} at '{}'; sharded entries are saved separately, "
                      "split the state dict before encoding its common part",
                      kind_name(v.kind()), join_path(path_)));
    }
    flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Node>>> children;
    if (v.is_container()) children = encode_children(v);
    flatbuffers::Offset<flatbuffers::String> string_value;
    flatbuffers::Offset<flatbuffers::String> dtype;
    flatbuffers::Offset<flatbuffers::Vector<int64_t>> shape;
    flatbuffers::Offset<flatbuffers::Vector<uint8_t>> data;
    if (v.kind() == Kind::kString) {
      ensure_room(fbb_, v.as_string().size(), where());
      string_value = fbb_.CreateString(v.as_string());
    } else if (v.kind() == Kind::kTensor) {
      const at::Tensor dense = dense_cpu_copy(v.as_tensor());
      ensure_room(fbb_, dense.nbytes() + 8 * dense.dim(), where());
      dtype = fbb_.CreateString(dtype_name(dense.scalar_type()));
      shape = fbb_.CreateVector(dense.sizes().data(), dense.sizes().size());
      static const uint8_t kNoBytes = 0;  // an empty tensor may have no storage pointer at all
      const auto* bytes = dense.nbytes() == 0 ? &kNoBytes : static_cast<const uint8_t*>(dense.data_ptr());
      data = fbb_.CreateVector(bytes, dense.nbytes());
    }
    ensure_room(fbb_, 64 + (key ? key->size() : 0), where());
    const auto key_offset = key ? fbb_.CreateString(*key) : flatbuffers::Offset<flatbuffers::String>();
    // A field equal to its default (0.0) is left out, and -0.0 == 0.0: it
    // must be written, or it reads back as +0.0.
    const bool negative_zero = v.kind() == Kind::kFloat && v.as_float() == 0.0 && std::signbit(v.as_float());
    fbb_.ForceDefaults(negative_zero);
    const auto node =
        fb::CreateNode(fbb_, node_kind(v.kind()), key_offset, v.kind() == Kind::kBool && v.as_bool(),
                       v.kind() == Kind::kInt ? v.as_int() : 0, v.kind() == Kind::kFloat ? v.as_float() : 0.0,
                       string_value, dtype, shape, data, children);
    fbb_.ForceDefaults(false);
    return node;
  }

  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Node>>> encode_children(const Value& v) {
    std::vector<flatbuffers::Offset<fb::Node>> children;
    if (v.is_dict()) {
      children.reserve(v.as_dict().size());
      for (const auto& [child_key, child] : v.as_dict()) {  // std::map: already sorted
        path_.push_back(child_key);
        children.push_back(encode_node(child, &child_key));
        path_.pop_back();
      }
    } else {
      children.reserve(v.as_list().size());
      for (size_t i = 0; i < v.as_list().size(); ++i) {
        path_.push_back(std::to_string(i));
        children.push_back(encode_node(v.as_list()[i], nullptr));
        path_.pop_back();
      }
    }
    ensure_room(fbb_, 4 * children.size(), where());
    return fbb_.CreateVector(children);
  }

  // Row-major bytes of the logical values: on the CPU, contiguous, with lazy
  // conjugation/negation applied (their storage holds the unresolved values).
  at::Tensor dense_cpu_copy(const at::Tensor& t) const {
    if (!t.defined()) fail("the tensor is undefined; store None instead");
    if (t.layout() != at::kStrided) fail("only dense (strided) tensors can be stored; call to_dense() first");
    try {
      dtype_name(t.scalar_type());
    } catch (const Error& e) {
      fail(e.what());
    }
    return t.detach().resolve_conj().resolve_neg().to(at::kCPU).contiguous();
  }

  static fb::NodeKind node_kind(Kind kind) {
    switch (kind) {
      case Kind::kNone:
        return fb::NodeKind::None;
      case Kind::kBool:
        return fb::NodeKind::Bool;
      case Kind::kInt:
        return fb::NodeKind::Int;
      case Kind::kFloat:
        return fb::NodeKind::Float;
      case Kind::kString:
        return fb::NodeKind::String;
      case Kind::kTensor:
        return fb::NodeKind::Tensor;
      case Kind::kDict:
        return fb::NodeKind::Dict;
      case Kind::kList:
        return fb::NodeKind::List;
      default:
        break;  // sharded kinds are rejected before
    }
    throw Error(fmt::format("common state: unexpected {} value", kind_name(kind)));
  }

  std::string where() const { return fmt::format("the common state at '{}'", join_path(path_)); }

  flatbuffers::FlatBufferBuilder fbb_;
  std::vector<std::string> path_;
};

// Rebuilds the Value tree from a verified buffer. The verifier guarantees
// every offset stays inside the buffer; this checks what it cannot know:
// kinds, dtype names, byte counts, key order, nesting, and the total size of
// what gets copied (ExpansionBudget).
class CommonDecoder {
 public:
  CommonDecoder(size_t buffer_size, const std::string& origin) : origin_(origin), budget_(buffer_size, origin) {}

  Value decode(const fb::CommonState& state) {
    check_version(state);
    if (state.root() == nullptr) fail("the root node is missing");
    return decode_node(*state.root());
  }

  std::optional<Value> decode_content_metadata(const fb::CommonState& state) {
    check_version(state);
    if (state.content_metadata() == nullptr) return std::nullopt;
    path_ = {"<content_metadata>"};
    Value content = decode_node(*state.content_metadata());
    if (!content.is_dict()) fail(fmt::format("the content metadata is a {}, not a dict", kind_name(content.kind())));
    return content;
  }

 private:
  void check_version(const fb::CommonState& state) const {
    if (state.format_version() > kFormatVersion) {
      throw CheckpointError(fmt::format("{}: written by a newer distckpt (version {}); this build reads version "
                                        "{}. Upgrade distckpt to load this checkpoint",
                                        origin_, state.format_version(), kFormatVersion),
                            origin_);
    }
    if (state.format_version() < kOldestFormatVersion) {
      fail(fmt::format("format_version {} is not a valid version", state.format_version()));
    }
  }

  // `path`: the file the failure is about, when a check names one other than the common state file.
  [[noreturn]] void fail(const std::string& what, const std::string& path = {}) const {
    throw CorruptionError(
        fmt::format("{}: common state at '{}': {}; the file is corrupted", origin_, join_path(path_), what),
        path.empty() ? origin_ : path);
  }

  Value decode_node(const fb::Node& node) {
    if (path_.size() > kMaxNesting) fail(fmt::format("nested deeper than {} levels", kMaxNesting));
    budget_.charge_table();
    switch (node.kind()) {
      case fb::NodeKind::None:
        return Value();
      case fb::NodeKind::Bool:
        return Value(node.bool_value());
      case fb::NodeKind::Int:
        return Value(node.int_value());
      case fb::NodeKind::Float:
        return Value(node.float_value());
      case fb::NodeKind::String:
        if (node.string_value() == nullptr) fail("a string node has no string");
        budget_.charge_string(node.string_value());
        return Value(node.string_value()->str());
      case fb::NodeKind::Tensor:
        return Value(decode_tensor(node));
      case fb::NodeKind::Dict:
        return decode_dict(node);
      case fb::NodeKind::List:
        return decode_list(node);
    }
    fail(fmt::format("unknown node kind {} (written by a newer distckpt?)", static_cast<int>(node.kind())));
  }

  at::Tensor decode_tensor(const fb::Node& node) {
    if (node.dtype() == nullptr || node.shape() == nullptr || node.data() == nullptr) {
      fail("a tensor node lacks its dtype, shape or data");
    }
    budget_.charge_string(node.dtype());
    budget_.charge_vector(node.data());
    at::ScalarType dtype;
    try {
      dtype = dtype_from_name(node.dtype()->str());
    } catch (const CorruptionError& e) {
      fail(e.what(), e.path());
    } catch (const CheckpointError& e) {
      // A valid dtype this LibTorch lacks: not damage, but the common state cannot be read here.
      throw CheckpointError(fmt::format("a tensor of the common state: {}", e.what()),
                            e.path().empty() ? origin_ : e.path());
    }
    const std::vector<int64_t> shape = budget_.copy_vector(node.shape());
    const auto numel = checked_numel(shape.begin(), shape.end());
    const auto bytes = numel ? checked_mul(static_cast<uint64_t>(*numel), dtype_size(dtype)) : std::nullopt;
    if (!bytes || *bytes != node.data()->size()) {
      fail(fmt::format("tensor of {} and shape {} has {} data bytes, which does not match", dtype_name(dtype),
                       to_string(shape), node.data()->size()));
    }
    at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(dtype).device(at::kCPU));
    if (*bytes > 0) std::memcpy(tensor.data_ptr(), node.data()->data(), *bytes);
    return tensor;
  }

  Value decode_dict(const fb::Node& node) {
    Dict dict;
    const auto* children = node.children();
    for (flatbuffers::uoffset_t i = 0; children != nullptr && i < children->size(); ++i) {
      const fb::Node& child = *children->Get(i);
      if (child.key() == nullptr) fail(fmt::format("dict entry {} has no key", i));
      budget_.charge_string(child.key());
      std::string key = child.key()->str();
      // The encoder writes keys in std::map order; anything else would make
      // entries collapse silently.
      if (!dict.empty() && !(dict.rbegin()->first < key)) {
        fail(fmt::format("dict keys are not sorted and unique: '{}' follows '{}'", key, dict.rbegin()->first));
      }
      path_.push_back(key);
      Value value = decode_node(child);
      path_.pop_back();
      dict.emplace_hint(dict.end(), std::move(key), std::move(value));
    }
    return Value(std::move(dict));
  }

  Value decode_list(const fb::Node& node) {
    List list;
    const auto* children = node.children();
    list.reserve(children == nullptr ? 0 : children->size());
    for (flatbuffers::uoffset_t i = 0; children != nullptr && i < children->size(); ++i) {
      path_.push_back(std::to_string(i));
      list.push_back(decode_node(*children->Get(i)));
      path_.pop_back();
    }
    return Value(std::move(list));
  }

  const std::string& origin_;
  fb_support::ExpansionBudget budget_;
  std::vector<std::string> path_;
};

}  // namespace

std::string encode_common_state(const Value& common, const std::optional<Value>& content_metadata) {
  return CommonEncoder().encode(common, content_metadata);
}

namespace {

// Verifies the buffer and hands its root to `decode`.
template <typename Decode>
auto decode_verified(std::string_view bytes, const std::string& origin, const Decode& decode) {
  const auto invalid = [&] {
    return CorruptionError(
        fmt::format("{}: not a valid distckpt common state buffer (failed FlatBuffers verification)", origin), origin);
  };
  if (bytes.size() >= fb_support::kMaxBufferSize) throw invalid();
  const fb_support::AlignedBytes aligned(bytes);
  flatbuffers::Verifier verifier(aligned.data(), aligned.size(),
                                 fb_support::verifier_options(aligned.size(), kMaxVerifierDepth));
  if (!verifier.VerifyBuffer<fb::CommonState>(kCommonIdentifier)) throw invalid();
  CommonDecoder decoder(aligned.size(), origin);
  return decode(decoder, *flatbuffers::GetRoot<fb::CommonState>(aligned.data()));
}

}  // namespace

Value decode_common_state(std::string_view bytes, const std::string& origin) {
  return decode_verified(bytes, origin,
                         [](CommonDecoder& decoder, const fb::CommonState& state) { return decoder.decode(state); });
}

std::optional<Value> decode_content_metadata(std::string_view bytes, const std::string& origin) {
  return decode_verified(bytes, origin, [](CommonDecoder& decoder, const fb::CommonState& state) {
    return decoder.decode_content_metadata(state);
  });
}

}  // namespace distckpt
