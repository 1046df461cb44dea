// distckpt's own format as a StorageWriter: one data file per writing rank
// (io::FileWriteJob: staged, checksummed, fsync'ed), the metadata filled in
// from the save plan with every rank's offsets and checksums, the commit
// marker last, then the staging directory renamed into place. It lives in
// the save pipeline because its metadata is the plan.
#pragma once

#include <string>
#include <vector>

#include "api/save_plan.h"
#include "distckpt/storage/storage_writer.h"
#include "io/file_write_job.h"

namespace distckpt::api {

class DistckptWriter final : public StorageWriter {
 public:
  // `save` owns this writer and outlives it.
  explicit DistckptWriter(PreparedSave& save) : save_(save) {}

  StorageFormat format() const override { return StorageFormat::kDistckpt; }
  const std::string& location() const override { return save_.paths.target; }
  // Device shards are copied into the write buffers slice by slice (api/save_items.h).
  bool takes_device_tensors() const override { return true; }
  void claim() override;
  void prepare(const SaveContents&) override {}  // the plan's metadata skeleton is the layout
  std::string write(std::vector<SavePiece> pieces) override;
  void commit(const std::vector<std::string>& written) override;
  void discard() noexcept override;

 private:
  PreparedSave& save_;
};

// What a rank's data file tells the coordinator (offsets and checksums of
// every item it wrote); asynchronous saves write their file themselves.
std::string encode_file_written(int rank, const io::FileWritten& written);

// The write options a save's data file uses.
io::FileWriteOptions file_write_options(const SaveOptions& options);

}  // namespace distckpt::api
