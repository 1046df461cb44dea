// The pickle of a torch.save file (`data.pkl`), written for a flat dict of
// plain values and tensors: protocol 2 with the globals and persistent ids
// torch.save itself writes, so torch.load (any PyTorch from 1.6 on) and
// format/torch_pickle.h read it. Tensors are described, not written: each
// names the archive record ("data/<storage>") its row-major bytes go to.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "distckpt/core/state_dict.h"

namespace distckpt::torch_pickle {

struct TensorEntry {
  std::string key;  // in the dict
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
  std::string storage;  // the record's name under data/
};

// `common`'s entries (None, bools, ints, floats, strings, lists and dicts
// of them), then the tensors, as one dict. Error for a key given twice or a
// value or dtype torch.save has no form for.
std::string pickle_dict(const StateDict& common, const std::vector<TensorEntry>& tensors);

// torch.save(tensor): one row-major tensor over record "data/<storage>".
std::string pickle_tensor(at::ScalarType dtype, const std::vector<int64_t>& sizes, const std::string& storage);
// torch.save(value) of a plain value, list or dict (a PyTorch DCP bytes
// item), tensors at any depth included: each is appended to `tensors`
// (contiguous, on the CPU) and its values named "data/<its index>".
// `where` names the value in errors.
std::string pickle_value(const Value& value, const std::string& where, std::vector<at::Tensor>& tensors);

}  // namespace distckpt::torch_pickle
