// torch.save files: the zip format Python's torch.save writes and torch.load
// reads, through LibTorch's pickler. A file is one dict: tensors (at any
// depth, named by their dotted path) and plain values (numbers, strings,
// bools, None, lists and dicts of them).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "distckpt/core/state_dict.h"

namespace distckpt::api {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct TorchFileContents {
  NamedTensors tensors;  // in the file's order
  StateDict common;      // everything else, nested as in the file
};

// A regular file that starts like a zip archive (what torch.save writes).
bool is_torch_file(const std::string& path);

// CheckpointError naming the file (and the entry) for anything but a dict
// of tensors and plain values, or a file LibTorch cannot unpickle.
TorchFileContents read_torch_file(const std::string& path);

// Writes `common` and `tensors` as one dict; `path` appears only when complete.
void write_torch_file(const std::string& path, const StateDict& common, const NamedTensors& tensors);

}  // namespace distckpt::api
