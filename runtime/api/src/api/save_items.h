// The bytes a rank writes: its assigned tensors and objects as io::WriteItems
// that copy slices straight out of the caller's memory (a device tensor is
// copied slice by slice into the host buffer; only a non-contiguous tensor
// is made contiguous first, once).
#pragma once

#include <memory>
#include <vector>

#include "api/save_plan.h"
#include "io/file_write_job.h"

namespace distckpt::api {

// A contiguous view of `data` (a copy only when it is not contiguous).
io::WriteItem tensor_write_item(at::Tensor data);

// The pool of synchronous writes (bounded, warm, shared by every save).
const std::shared_ptr<io::BufferPool>& sync_write_pool();

// Throws ShardingError for an assigned tensor without data or whose data
// does not match its declared shape.
std::vector<io::WriteItem> make_write_items(const PreparedSave& prepared);

}  // namespace distckpt::api
