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

}  // namespace distckpt::torch_pickle
