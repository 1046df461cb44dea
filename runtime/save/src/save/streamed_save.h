// A save by one process whose tensor values are not in memory: the
// conversions to distckpt read each tensor from its source in windows and
// hand them over here, so memory stays bounded by the windows whatever the
// model size. The state dict's tensors carry shape and dtype only (meta
// tensors); the checkpoint is the one save() would write from the same
// values: same plan, data file layout, block checksums and commit.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/save/save.h"
#include "io/byte_sink.h"

namespace distckpt::saving {

struct PreparedSave;
class BlockChecksums;

class StreamedSave {
 public:
  // Plans the save and claims `dir` (which save() would refuse, this
  // refuses). Tensors of `state_dict` must be whole (no sharding) and may
  // be meta tensors.
  StreamedSave(const StateDict& state_dict, const std::string& dir, const SaveOptions& options = {});
  ~StreamedSave();  // uncommitted: the staging directory is removed
  StreamedSave(const StreamedSave&) = delete;
  StreamedSave& operator=(const StreamedSave&) = delete;

  // The tensors' keys in the order the data file holds them; write() takes
  // indices into this list.
  const std::vector<std::string>& keys() const { return keys_; }
  uint64_t bytes() const { return payload_; }  // of every tensor
  // Bytes [offset, offset + n) of tensor `index`; each tensor's bytes
  // arrive in order (offset = what was written of it so far).
  void write(size_t index, uint64_t offset, const void* data, uint64_t n);
  // Every byte must have been written. Makes the data file durable and
  // commits the checkpoint.
  SaveReport commit();

 private:
  void lay_out();           // the data file: every tensor at save()'s offset
  void discard() noexcept;  // removes the staging directory, releases the target

  std::shared_ptr<Communicator> comm_;
  std::unique_ptr<PreparedSave> prepared_;
  std::vector<std::string> keys_;
  std::vector<uint64_t> offsets_, lengths_, written_;
  std::vector<std::unique_ptr<BlockChecksums>> checksums_;  // per tensor, while it is written
  std::vector<std::vector<uint64_t>> blocks_;               // per tensor, once written
  uint64_t payload_ = 0;
  uint64_t file_size_ = 0;
  std::unique_ptr<io::ByteSink> sink_;  // the data file (or object); none without tensors
  bool committed_ = false;
};

}  // namespace distckpt::saving
