// distckpt's own format as a StorageWriter: one data file per writing rank
// (io::FileWriteJob: staged, checksummed, made durable), the metadata filled
// in from the save plan with every rank's offsets and checksums, the commit
// marker last. In a directory, the writer claims the target (a lock against
// other saves), stages into a hidden directory and renames it into place
// (storage/directory_commit.h); on an object store, where nothing renames,
// the objects carry the save's id and the marker is published conditionally
// (storage/object_commit.h). Synchronous and asynchronous saves both write
// through it: write() is start_data_file() waited for.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distckpt/format/name_mapping.h"
#include "distckpt/storage/backend.h"
#include "distckpt/storage/storage_writer.h"
#include "io/file_write_job.h"
#include "io/staging.h"
#include "plan/global_plan.h"
#include "storage/directory_commit.h"

namespace distckpt::storage {

// What the writer takes from the save that drives it; the save's planner
// fills it in as it plans (the plan is this format's metadata).
struct DistckptSave {
  int rank = 0;
  int world_size = 1;
  bool overwrite = false;
  io::FileWriteOptions file_options;  // of this rank's data file
  uint64_t save_id = 0;               // the coordinator's, announced to every rank
  // Recorded in the metadata (SaveOptions' fields of the same names).
  uint64_t checksum_block_size = 0;
  std::string layout_name;
  std::string layout_fingerprint;
  std::string layout_schema;
  std::vector<NameMapping> name_mappings;
  std::string writer_policy;
  std::vector<uint64_t> plan_hashes;  // every rank's structure hash
  // Coordinator only:
  std::shared_ptr<const plan::GlobalSavePlan> plan;  // the metadata skeleton
  std::string common_state;                          // encoded when planned
};

class DistckptWriter final : public StorageWriter {
 public:
  // `save` is owned by the caller and outlives the writer.
  DistckptWriter(const std::string& location, const DistckptSave& save);
  ~DistckptWriter() override;

  StorageFormat format() const override;
  const std::string& location() const override { return paths_.target; }
  // Device shards are copied into the write buffers slice by slice (storage/write_items.h).
  bool takes_device_tensors() const override { return true; }
  void claim() override;
  void prepare(const SaveContents&) override {}  // the plan's metadata skeleton is the layout
  std::string write(int rank, std::vector<SavePiece> pieces) override;
  void commit(const std::vector<std::string>& written) override;
  void discard() noexcept override;

  // Starts writing this rank's data file (a file in the staging directory,
  // or an object): write() waits for it, asynchronous saves later.
  std::unique_ptr<io::FileWriteJob> start_data_file(std::vector<io::WriteItem> items,
                                                    std::shared_ptr<io::BufferPool> pool,
                                                    const io::FileWriteOptions& options) const;
  // A sink for this rank's data file of `bytes` bytes (streamed saves).
  std::unique_ptr<io::ByteSink> data_sink(uint64_t bytes) const;
  // What this rank's data file tells the coordinator's commit (the offsets
  // and checksums of every item it holds).
  std::string encode_written(const io::FileWritten& written) const;
  // Whether this rank's last write() used O_DIRECT.
  bool direct_io() const { return direct_io_; }

 private:
  const DistckptSave& save_;
  io::StagingPaths paths_;
  std::shared_ptr<Backend> object_store_;  // set for an s3:// location
  std::unique_ptr<InFlightClaim> claim_;
  bool direct_io_ = false;
  bool committed_ = false;
};

}  // namespace distckpt::storage
