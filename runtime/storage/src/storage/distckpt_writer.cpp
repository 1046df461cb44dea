#include "storage/distckpt_writer.h"

#include <fmt/format.h>

#include <algorithm>

#include "io/byte_sink.h"
#include "io/file.h"
#include "plan/wire.h"
#include "storage/object_commit.h"
#include "storage/object_sink.h"
#include "storage/write_items.h"

namespace distckpt::storage {
namespace {

CheckpointMetadata final_metadata(const DistckptSave& s, const std::vector<std::string>& gathered) {
  std::vector<plan::WriteResults> results;
  results.reserve(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) {
    results.push_back(plan::decode_write_results(gathered[r], fmt::format("rank {}", r)));
  }
  plan::GlobalSavePlan global = *s.plan;
  CheckpointMetadata& m = global.skeleton;
  // A plan recovered from an older checkpoint carries its version; a save
  // writes this build's layout (and its marker says so).
  m.format_version = kFormatVersion;
  m.world_size = s.world_size;
  m.checksum_block_size = s.checksum_block_size;
  m.layout_name = s.layout_name;
  m.layout_fingerprint = s.layout_fingerprint;
  m.layout_schema = s.layout_schema;
  m.name_mappings = s.name_mappings;
  m.plan_hashes = s.plan_hashes;
  m.writer_policy = s.writer_policy;
  return plan::fill_skeleton(global, results);
}

}  // namespace

DistckptWriter::DistckptWriter(const std::string& location, const DistckptSave& save) : save_(save) {
  if (is_object_store(location)) {
    paths_.target = location;  // written in place: object names carry the save's id
    object_store_ = open_backend(location);
  } else {
    paths_ = io::staging_paths(location);
  }
}

DistckptWriter::~DistckptWriter() = default;

StorageFormat DistckptWriter::format() const { return StorageFormat::distckpt(); }

std::string DistckptWriter::encode_written(const io::FileWritten& written) const {
  plan::WriteResults r;
  r.rank = save_.rank;
  r.file_size = written.file_size;
  r.items.reserve(written.items.size());
  for (const io::ItemWritten& w : written.items) r.items.push_back({w.byte_offset, w.byte_length, w.block_checksums});
  return plan::encode_write_results(r);
}

std::unique_ptr<io::FileWriteJob> DistckptWriter::start_data_file(std::vector<io::WriteItem> items,
                                                                  std::shared_ptr<io::BufferPool> pool,
                                                                  const io::FileWriteOptions& options) const {
  if (!object_store_) {
    return std::make_unique<io::FileWriteJob>(io::safe_join(paths_.staging, plan::rank_file_path(save_.rank)),
                                              std::move(items), std::move(pool), options);
  }
  const std::string name = object_data_name(save_.rank, save_.save_id);
  std::shared_ptr<Backend> backend = object_store_;
  return std::make_unique<io::FileWriteJob>(
      backend->describe(name), [backend, name](bool /*direct_ok*/) { return object_sink(backend->create(name, 0)); },
      std::move(items), std::move(pool), options);
}

std::unique_ptr<io::ByteSink> DistckptWriter::data_sink(uint64_t bytes) const {
  if (object_store_) return object_sink(object_store_->create(object_data_name(save_.rank, save_.save_id), bytes));
  return io::file_sink(io::safe_join(paths_.staging, plan::rank_file_path(save_.rank)), /*try_direct=*/false);
}

void DistckptWriter::claim() {
  // Two saves of this process (or, in a directory, of two processes) never
  // share a target while in flight; an object store keeps two jobs apart at
  // commit instead (storage/object_commit.h).
  claim_ = std::make_unique<InFlightClaim>(paths_, /*lock_directory=*/!object_store_);
  if (object_store_) {
    claim_object_prefix(*object_store_, save_.overwrite);
  } else {
    prepare_directory(paths_, save_.overwrite);
  }
}

std::string DistckptWriter::write(int /*rank*/, std::vector<SavePiece> pieces) {
  const bool from_device = std::any_of(pieces.begin(), pieces.end(),
                                       [](const SavePiece& p) { return p.data.defined() && !p.data.is_cpu(); });
  const io::FileWritten written =
      start_data_file(write_items_of(pieces), from_device ? pinned_sync_write_pool() : sync_write_pool(),
                      save_.file_options)
          ->wait();
  direct_io_ = written.direct;
  return encode_written(written);
}

void DistckptWriter::commit(const std::vector<std::string>& written) {
  CheckpointMetadata metadata = final_metadata(save_, written);
  if (!object_store_) {
    commit_checkpoint(paths_, std::move(metadata), save_.common_state, save_.overwrite);
  } else {
    for (FileRecord& f : metadata.files) f.path = object_data_name(f.writer_rank, save_.save_id);
    commit_objects(*object_store_, std::move(metadata), save_.common_state, save_.overwrite, save_.save_id);
  }
  committed_ = true;  // a failure after this (the agreement) must not remove what the marker names
  claim_.reset();
}

void DistckptWriter::discard() noexcept {
  if (!committed_ && claim_) {
    if (object_store_) {
      discard_objects(*object_store_, save_.save_id);
    } else {
      discard_staging(paths_);
    }
  }
  claim_.reset();
}

}  // namespace distckpt::storage
