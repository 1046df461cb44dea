// The bytes a rank writes: its assigned tensors and objects as io::WriteItems
// that copy slices straight out of the caller's memory (a device tensor is
// copied slice by slice into the host buffer; only a non-contiguous tensor
// is made contiguous first, once).
#pragma once

#include <vector>

#include "api/save_plan.h"
#include "distckpt/io/file_write_job.h"

namespace distckpt::api {

// Throws ShardingError for an assigned tensor without data or whose data
// does not match its declared shape.
std::vector<io::WriteItem> make_write_items(const PreparedSave& prepared);

}  // namespace distckpt::api
