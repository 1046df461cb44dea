// How a distckpt checkpoint is committed where nothing can be renamed (an
// object store). Every object a save writes carries the save's id in its
// name (data/<id>/rank_00000.bin, metadata.<id>.fb, common.<id>.fb), so two
// saves of one prefix never write the same object; the commit marker
// (metadata.json) names the metadata object and is written last:
//
//   every rank   its data object (a multipart upload)
//   coordinator  common.<id>.fb, metadata.<id>.fb (naming the data objects)
//   coordinator  metadata.json: If-None-Match: * for a new checkpoint (of
//                two saves racing for one prefix, exactly one commits);
//                replaced when overwriting, once the new one is complete
//   coordinator  after an overwrite: the previous checkpoint's objects removed
//
// A prefix without a marker holds no checkpoint (readers refuse it); a
// failed save removes its own objects and aborts its multipart uploads.
#pragma once

#include <cstdint>
#include <string>

#include "distckpt/storage/backend.h"
#include "format/metadata.h"

namespace distckpt::storage {

// A random, non-zero id for one save.
uint64_t new_save_id();
// This rank's data object of save `save_id`.
std::string object_data_name(int rank, uint64_t save_id);

// Coordinator, first: CheckpointError when the prefix holds a committed
// checkpoint and `overwrite` is false (saying what to do).
void claim_object_prefix(Backend& backend, bool overwrite);

// Coordinator, once every rank's data object is complete. `metadata` names
// the data objects already (object_data_name). CheckpointError when another
// save committed the prefix first (this save's objects are then removed by
// discard_objects).
void commit_objects(Backend& backend, CheckpointMetadata metadata, const std::string& common_state, bool overwrite,
                    uint64_t save_id);

// Coordinator, after a failure anywhere: removes every object of save
// `save_id` and aborts its multipart uploads, unless the marker names the
// save (it committed; the failure came after). Never throws.
void discard_objects(Backend& backend, uint64_t save_id) noexcept;

}  // namespace distckpt::storage
