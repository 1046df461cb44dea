// Where a save puts its bytes. save() plans first (which rank writes which
// piece of which tensor, replicas written once), then drives a StorageWriter
// through four steps, each agreed by every rank (a failure anywhere fails
// the save everywhere):
//
//   coordinator  claim()                    refuse or claim the destination
//   coordinator  prepare(contents)          lay out every tensor, before any rank writes
//   every rank   write(rank, pieces) -> result  its pieces, durable when it returns
//   coordinator  commit(results)            the checkpoint appears, all at once
//   coordinator  discard()                  after a failure: nothing of this save stays
//
// Formats that saves write are registered (distckpt/storage/format_registry.h):
// distckpt's own (the default; its metadata is the save plan, so save() makes
// its writer) and Hugging Face safetensors (distckpt/storage/safetensors.h).
// docs/STORAGE.md says what another must do; the planner does not change.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distckpt/core/box.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/storage/storage_format.h"
#include "distckpt/storage/storage_reader.h"

namespace distckpt {

// One tensor of a save: what every rank's pieces of it add up to.
struct SaveTensor {
  std::string key;
  at::ScalarType dtype = at::kFloat;
  Shape global_shape;
};

// Everything a save writes, each piece once.
struct SaveContents {
  std::vector<SaveTensor> tensors;
  std::vector<std::string> objects;   // keys of sharded objects
  const StateDict* common = nullptr;  // the values saved outside tensors
};

// One piece a rank writes: a box of a tensor, or a flat slice of a box
// (a ZeRO shard), with its elements row-major and contiguous in `data`; or
// a sharded object's bytes.
struct SavePiece {
  std::string key;
  Shape global_shape;                         // the tensor's
  Box box;                                    // in the tensor's global coordinates (an object: its place in the grid)
  std::optional<FlatRange> flat;              // the elements of `box` it holds; all when unset
  at::Tensor data;                            // contiguous; on the CPU unless takes_device_tensors()
  std::shared_ptr<const std::string> object;  // set for an object instead of data
};

class StorageWriter {
 public:
  virtual ~StorageWriter() = default;

  virtual StorageFormat format() const = 0;
  virtual const std::string& location() const = 0;
  // Whether write() takes pieces whose data is on a device (CUDA) as they
  // are. Otherwise a synchronous save first copies them to host memory.
  virtual bool takes_device_tensors() const { return false; }

  // Coordinator, first: refuses a destination this save must not replace
  // (CheckpointError saying what to do) and claims it.
  virtual void claim() = 0;
  // Coordinator, after planning and before any rank writes: what the save
  // writes. CheckpointError for what the format cannot hold.
  virtual void prepare(const SaveContents& contents) = 0;
  // Every rank, after prepare: writes its pieces and makes them durable.
  // `rank` is the writing rank's (formats with a file per rank name it by
  // this). Returns what commit() needs from this rank (empty when nothing).
  virtual std::string write(int rank, std::vector<SavePiece> pieces) = 0;
  // Coordinator, once every rank's write returned: each rank's result, in
  // rank order. The checkpoint appears at location() in one step.
  virtual void commit(const std::vector<std::string>& written) = 0;
  // Coordinator, after a failure anywhere: removes whatever this save
  // created; what was at location() before stays. Never throws.
  virtual void discard() noexcept = 0;
};

}  // namespace distckpt
