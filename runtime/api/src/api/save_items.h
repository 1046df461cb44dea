// What a rank writes: its assigned tensors and objects as SavePieces (views
// of the caller's memory; only a non-contiguous tensor is made contiguous,
// once; a device tensor is copied into pinned host memory, see
// api/device_copies.h, unless the writer takes device tensors), and those as
// io::WriteItems that copy slices straight out of it.
#pragma once

#include <memory>
#include <vector>

#include "api/device_copies.h"
#include "api/save_plan.h"
#include "distckpt/storage/storage_writer.h"
#include "io/file_write_job.h"

namespace distckpt::api {

// A contiguous view of host `data` (a copy only when it is not contiguous);
// reads wait for `pending` device copies first.
io::WriteItem tensor_write_item(at::Tensor data, std::shared_ptr<const CopiesDone> pending = nullptr);

// The pool of synchronous writes (bounded, warm, shared by every save), and
// its pinned twin for saves that copy device shards straight into it.
const std::shared_ptr<io::BufferPool>& sync_write_pool();
const std::shared_ptr<io::BufferPool>& pinned_sync_write_pool();

// This rank's assignment, in canonical order. Throws ShardingError for an
// assigned tensor without data or whose data does not match its declared shape.
// Device tensors become pinned host copies: with `pending`, the copies are
// left running and *pending says what to wait for; without, they are
// complete on return. With `keep_on_device` they stay where they are (a
// synchronous save whose writer takes device tensors).
std::vector<SavePiece> make_save_pieces(const PreparedSave& prepared,
                                        std::shared_ptr<const CopiesDone>* pending = nullptr,
                                        bool keep_on_device = false);

// Host data is read as it is (after `pending`). Device data is copied into
// the writer's buffers slice by slice as they are filled, after the work the
// caller's current stream had queued when this was called: a synchronous
// save then holds no host copy of a device shard, only the writer's bounded
// buffers (pinned_sync_write_pool).
std::vector<io::WriteItem> write_items_of(const std::vector<SavePiece>& pieces,
                                          const std::shared_ptr<const CopiesDone>& pending = nullptr);

}  // namespace distckpt::api
