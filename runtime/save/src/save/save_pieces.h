// What a rank writes: its assigned tensors and objects as SavePieces (views
// of the caller's memory; only a non-contiguous tensor is made contiguous,
// once; a device tensor is copied into pinned host memory, see
// io/device_copies.h, unless the writer takes device tensors).
#pragma once

#include <memory>
#include <vector>

#include "distckpt/storage/storage_writer.h"
#include "io/device_copies.h"
#include "save/save_plan.h"

namespace distckpt::saving {

// This rank's assignment, in canonical order. Throws ShardingError for an
// assigned tensor without data or whose data does not match its declared shape.
// Device tensors become pinned host copies: with `pending`, the copies are
// left running and *pending says what to wait for; without, they are
// complete on return. With `keep_on_device` they stay where they are (a
// synchronous save whose writer takes device tensors).
std::vector<SavePiece> make_save_pieces(const PreparedSave& prepared,
                                        std::shared_ptr<const io::CopiesDone>* pending = nullptr,
                                        bool keep_on_device = false);

}  // namespace distckpt::saving
