// What a rank writes: its assigned tensors and objects as SavePieces (views
// of the caller's memory; only a non-contiguous tensor is made contiguous,
// once), and those as io::WriteItems that copy slices straight out of it (a
// device tensor is copied slice by slice into the host buffer).
#pragma once

#include <memory>
#include <vector>

#include "api/save_plan.h"
#include "distckpt/storage/storage_writer.h"
#include "io/file_write_job.h"

namespace distckpt::api {

// A contiguous view of `data` (a copy only when it is not contiguous).
io::WriteItem tensor_write_item(at::Tensor data);

// The pool of synchronous writes (bounded, warm, shared by every save).
const std::shared_ptr<io::BufferPool>& sync_write_pool();

// This rank's assignment, in canonical order. Throws ShardingError for an
// assigned tensor without data or whose data does not match its declared shape.
std::vector<SavePiece> make_save_pieces(const PreparedSave& prepared);

std::vector<io::WriteItem> write_items_of(const std::vector<SavePiece>& pieces);

}  // namespace distckpt::api
