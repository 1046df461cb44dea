// distckpt's own format as a StorageWriter: one data file per writing rank
// (io::FileWriteJob: staged, checksummed, made durable), the metadata filled
// in from the save plan with every rank's offsets and checksums, the commit
// marker last. In a directory, the staging directory is then renamed into
// place (api/save_commit.h); on an object store, where nothing renames, the
// objects carry the save's id and the marker is published conditionally
// (storage/object_commit.h). It lives in the save pipeline because its
// metadata is the plan.
#pragma once

#include <memory>
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
  bool committed_ = false;
};

// Starts writing this rank's data file of `save` (a file in the staging
// directory, or an object of the object store): save() and async_save()
// write it alike.
std::unique_ptr<io::FileWriteJob> start_data_file(const PreparedSave& save, std::vector<io::WriteItem> items,
                                                  std::shared_ptr<io::BufferPool> pool, io::FileWriteOptions options);

// What a rank's data file tells the coordinator (offsets and checksums of
// every item it wrote); asynchronous saves write their file themselves.
std::string encode_file_written(int rank, const io::FileWritten& written);

// The write options a save's data file uses.
io::FileWriteOptions file_write_options(const SaveOptions& options);

}  // namespace distckpt::api
