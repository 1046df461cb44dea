// Converting whole checkpoints between formats, on one process: a distckpt
// checkpoint to Hugging Face safetensors or to a torch.save file
// (consolidated, unsharded tensors), and safetensors, a torch.save file (or
// any readable checkpoint) to distckpt. To reshard at the same time, load
// the source under the target layout on N ranks and save (README).
//
// SRC may be a torch.save file (Python's zip format, e.g. pytorch_model.bin)
// everywhere: its tensors at any depth of nested dicts, named by their
// dotted path; everything else becomes common values. Its pickle is read
// by a restricted reader that imports and runs nothing (only the classes
// state dicts use are known); every record is checked against its CRC-32.
// Every conversion streams its tensors through windows of bounded size
// (ConvertOptions::window_bytes), so memory does not grow with the model.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "distckpt/format/name_mapping.h"
#include "distckpt/storage/dcp.h"

namespace distckpt {

struct ConvertOptions {
  // safetensors: the most tensor bytes per file (0: one file); a larger
  // tensor gets a file of its own. Shards come with model.safetensors.index.json.
  uint64_t max_shard_bytes = 0;
  // Floating-point tensors are stored in this dtype (integer and bool
  // tensors keep theirs). Unset: every tensor keeps its dtype.
  std::optional<at::ScalarType> dtype;
  // safetensors: export under this name mapping recorded in SRC (the
  // layout schema's `mapping NAME`, e.g. "llama") instead of checkpoint keys.
  std::string mapping;
  // safetensors: export under this mapping instead, for a SRC that records
  // none (PyTorch DCP, Megatron torch_dist): the generated code's
  // `llama_mapping(config)`, or NameMapping::from_json of a file.
  std::optional<NameMapping> name_mapping;
  // Called as tensor bytes are written (done, total), a few times a second.
  std::function<void(uint64_t done, uint64_t total)> progress{};
  // Tensors stream through windows of this many bytes, read
  // while the previous one is written; at most four are held at once,
  // whatever the model size (plus, from a torch.save file, the storage of a
  // strided view, read whole).
  uint64_t window_bytes = uint64_t{32} << 20;
};

struct ConvertReport {
  size_t tensors = 0;
  size_t files = 0;          // tensor data files written
  uint64_t bytes = 0;        // tensor bytes written
  uint64_t peak_buffer = 0;  // largest buffer of tensor values held at once
};

// SRC: any checkpoint load() reads (or a torch.save file). DST must not exist; it appears only
// when complete (written beside it, then renamed). Tensors stream through
// windows of bounded size (ConvertOptions::window_bytes), so memory does not
// grow with the model.
// "__metadata__" is {"format": "pt"}, as PyTorch's loaders expect.
ConvertReport convert_to_safetensors(const std::string& src, const std::string& dst,
                                     const ConvertOptions& options = {});

// One file that Python's torch.load opens: a dict of SRC's consolidated
// tensors and its common values, in torch.save's zip format (pickle
// protocol 2, records aligned to 64 bytes, zip64 past 4 GiB). Tensors stream
// through windows as for safetensors. DST (a file) must not exist; it
// appears only when complete.
ConvertReport convert_to_torch(const std::string& src, const std::string& dst, const ConvertOptions& options = {});

// A distckpt checkpoint of SRC's tensors (whole, as saved by one rank) and
// its common values: the checkpoint save() writes from the same values
// (plan, one data file, block checksums), its tensors streamed through
// windows as for safetensors. DST must not exist; it appears only when
// committed. SRC: any checkpoint load() reads, or a torch.save file.
ConvertReport convert_to_distckpt(const std::string& src, const std::string& dst, const ConvertOptions& options = {});

// A PyTorch DCP checkpoint (or, with DcpWriteOptions::torch_dist, a
// Megatron-Core torch_dist one) of SRC's tensors and common values, which
// PyTorch's own FileSystemReader loads under any sharding. Each tensor is
// written in items of whole rows of at most a window; the common values are
// bytes items (torch.save of each). DST must not exist; `.metadata`, written
// last, commits it.
ConvertReport convert_to_dcp(const std::string& src, const std::string& dst, const DcpWriteOptions& dcp = {},
                             const ConvertOptions& options = {});

}  // namespace distckpt
