#include "api/distckpt_writer.h"

#include <fmt/format.h>

#include <algorithm>

#include "api/save_commit.h"
#include "api/save_items.h"
#include "storage/object_commit.h"
#include "storage/object_sink.h"

namespace distckpt::api {
namespace {

CheckpointMetadata final_metadata(const PreparedSave& p, const std::vector<std::string>& gathered) {
  std::vector<plan::WriteResults> results;
  results.reserve(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) {
    results.push_back(plan::decode_write_results(gathered[r], fmt::format("rank {}", r)));
  }
  plan::GlobalSavePlan global = *p.global;
  CheckpointMetadata& m = global.skeleton;
  m.world_size = p.world_size;
  m.checksum_block_size = p.options.checksum_block_size;
  m.layout_name = p.options.layout_name;
  m.layout_fingerprint = p.options.layout_fingerprint;
  m.layout_schema = p.options.layout_schema;
  m.name_mappings = p.options.name_mappings;
  m.plan_hashes = p.plan_hashes;
  m.writer_policy = writer_policy_name(p.options.writers);
  return plan::fill_skeleton(global, results);
}

}  // namespace

std::string encode_file_written(int rank, const io::FileWritten& written) {
  plan::WriteResults r;
  r.rank = rank;
  r.file_size = written.file_size;
  r.items.reserve(written.items.size());
  for (const io::ItemWritten& w : written.items) r.items.push_back({w.byte_offset, w.byte_length, w.block_checksums});
  return plan::encode_write_results(r);
}

io::FileWriteOptions file_write_options(const SaveOptions& options) {
  io::FileWriteOptions o;
  o.threads = resolve_io_threads(options.io_threads);
  o.direct_io = options.direct_io;
  o.checksum_block = options.checksum_block_size;
  return o;
}

std::unique_ptr<io::FileWriteJob> start_data_file(const PreparedSave& save, std::vector<io::WriteItem> items,
                                                  std::shared_ptr<io::BufferPool> pool, io::FileWriteOptions options) {
  if (!save.object_store) {
    return std::make_unique<io::FileWriteJob>(io::safe_join(save.paths.staging, plan::rank_file_path(save.rank)),
                                              std::move(items), std::move(pool), options);
  }
  const std::string name = storage::object_data_name(save.rank, save.save_id);
  std::shared_ptr<Backend> backend = save.object_store;
  return std::make_unique<io::FileWriteJob>(
      backend->describe(name),
      [backend, name](bool /*direct_ok*/) { return storage::object_sink(backend->create(name, 0)); }, std::move(items),
      std::move(pool), options);
}

void DistckptWriter::claim() {
  if (save_.object_store) {
    storage::claim_object_prefix(*save_.object_store, save_.options.overwrite);
  } else {
    prepare_directory(save_.paths, save_.options.overwrite);
  }
}

std::string DistckptWriter::write(std::vector<SavePiece> pieces) {
  const bool from_device = std::any_of(pieces.begin(), pieces.end(),
                                       [](const SavePiece& p) { return p.data.defined() && !p.data.is_cpu(); });
  const io::FileWritten written =
      start_data_file(save_, write_items_of(pieces), from_device ? pinned_sync_write_pool() : sync_write_pool(),
                      file_write_options(save_.options))
          ->wait();
  save_.direct_io = written.direct;
  return encode_file_written(save_.rank, written);
}

void DistckptWriter::commit(const std::vector<std::string>& written) {
  CheckpointMetadata metadata = final_metadata(save_, written);
  if (!save_.object_store) {
    commit_checkpoint(save_.paths, std::move(metadata), save_.common_state, save_.options.overwrite);
    return;
  }
  for (FileRecord& f : metadata.files) f.path = storage::object_data_name(f.writer_rank, save_.save_id);
  storage::commit_objects(*save_.object_store, std::move(metadata), save_.common_state, save_.options.overwrite,
                          save_.save_id);
  committed_ = true;  // a failure after this (the agreement) must not remove what the marker names
}

void DistckptWriter::discard() noexcept {
  if (committed_) return;
  if (save_.object_store) {
    storage::discard_objects(*save_.object_store, save_.save_id);
  } else {
    discard_staging(save_.paths);
  }
}

}  // namespace distckpt::api
