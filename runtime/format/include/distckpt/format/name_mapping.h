// A name mapping: which external tensor (another framework's naming, such
// as Hugging Face Llama) holds which part of which checkpoint tensor. The
// layout schema declares mappings (`mapping llama { ... }`, docs/SCHEMA.md)
// and distckpt-gen emits a function building each one for a config; a save
// through the generated API records them in the checkpoint's metadata.
//
// Each MappedTensor names one external tensor per combination of its indices
// ("model.layers.{layer}.mlp.gate_proj.weight" for every layer): the element
// of the key's tensor at those indices (a leading axis of a stacked tensor,
// or a key per element), or one fused part of it along `part_dim`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/core/box.h"

namespace distckpt {

struct MappedTensor {
  struct Index {
    std::string name;          // "layer": the placeholder "{layer}"
    int64_t count = 0;         // elements of the stack
    bool leading_axis = true;  // a leading axis of the key's tensor; false: "{name}" in the key
  };
  std::string key;             // checkpoint key, with "{name}" where a stack stores one key per element
  std::string external;        // external name template
  std::vector<Index> indices;  // outermost first
  Shape shape;                 // one element's global shape (without leading axes)
  int part_dim = -1;           // dim of `shape` a fused part is cut along; -1: the whole element
  int64_t part_offset = 0;
  int64_t part_extent = 0;
  int pad_dim = -1;  // dim of `shape` that may differ between the two sides (padded vocabularies)

  // Builder calls of the generated code.
  MappedTensor& over(std::string name, int64_t count);       // a stack stored as a leading axis
  MappedTensor& over_keys(std::string name, int64_t count);  // a stack stored as one key per element
  MappedTensor& part(int dim, int64_t offset, int64_t extent);
  MappedTensor& with_pad(int dim);
};

// One external tensor of a mapping with every index substituted.
struct MappedName {
  std::string external;
  std::string key;
  Shape key_shape;               // the key's global shape: leading axes, then the element's
  Box region;                    // the external tensor's place in it
  int leading_axes = 0;          // stacked axes before the element's dims (each of length 1 in region)
  int key_pad_dim = -1;          // pad dim of key_shape, -1 when none
  Shape external_shape() const;  // region's lengths without the leading axes
  // A padded dim (vocabulary rows) takes the extent the other side stores:
  // in key_shape and region both. No-op without a pad dim.
  void take_pad_extent(int64_t extent);
};

class NameMapping {
 public:
  NameMapping() = default;
  explicit NameMapping(std::string name) : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  MappedTensor& map(std::string key, std::string external, Shape shape);
  const std::vector<MappedTensor>& tensors() const { return tensors_; }
  std::vector<MappedTensor>& tensors() { return tensors_; }

  // Every external tensor, in mapping order. Throws UsageError naming the
  // mapping when an entry is inconsistent (a part outside its element, an
  // unknown placeholder) or two entries produce one external name.
  std::vector<MappedName> expand() const;

  // The mapping as JSON, for a checkpoint that records none (PyTorch DCP,
  // Megatron torch_dist: `distckpt convert --map FILE.json`):
  //   {"name": "llama", "tensors": [{"key": K, "external": E, "shape": [..],
  //     "indices": [{"name": "layer", "count": 4, "leading_axis": true}],
  //     "part": {"dim": 0, "offset": 0, "extent": 64},  (absent: the whole element)
  //     "pad_dim": 0}]}                                 (absent: none)
  std::string to_json() const;
  // UsageError starting with `where` (the file) when `text` is not such
  // JSON or its entries are inconsistent (expand()'s checks).
  static NameMapping from_json(const std::string& text, const std::string& where);

 private:
  std::string name_;
  std::vector<MappedTensor> tensors_;
};

// The mapping called `name` among `mappings`; Error listing the names when absent.
const NameMapping& find_mapping(const std::vector<NameMapping>& mappings, const std::string& name,
                                const std::string& where);

}  // namespace distckpt
