// A rank's SavePieces as io::WriteItems for a data file's writer threads:
// each copies its slices straight out of the piece (host memory as it is, a
// device tensor slice by slice into the writer's buffers, an object's bytes),
// so a save holds no second copy of what it writes.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "distckpt/storage/storage_writer.h"
#include "io/buffer_pool.h"
#include "io/device_copies.h"
#include "io/file_write_job.h"

namespace distckpt::storage {

// A contiguous view of host `data` (a copy only when it is not contiguous);
// reads wait for `pending` device copies first.
io::WriteItem tensor_write_item(at::Tensor data, std::shared_ptr<const io::CopiesDone> pending = nullptr);

// The pool of synchronous writes (bounded, warm, shared by every save), and
// its pinned twin for saves that copy device shards straight into it.
const std::shared_ptr<io::BufferPool>& sync_write_pool();
const std::shared_ptr<io::BufferPool>& pinned_sync_write_pool();

// Host data is read as it is (after `pending`). Device data is copied into
// the writer's buffers slice by slice as they are filled, after the work the
// caller's current stream had queued when this was called: a synchronous
// save then holds no host copy of a device shard, only the writer's bounded
// buffers (pinned_sync_write_pool).
std::vector<io::WriteItem> write_items_of(const std::vector<SavePiece>& pieces,
                                          const std::shared_ptr<const io::CopiesDone>& pending = nullptr);

}  // namespace distckpt::storage
