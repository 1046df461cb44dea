#include "api/save_finalize.h"

#include <fmt/format.h>

#include "comm/agreement.h"
#include "distckpt/core/errors.h"

namespace distckpt::api {
namespace {

plan::WriteResults to_results(int rank, const io::FileWritten& written) {
  plan::WriteResults r;
  r.rank = rank;
  r.file_size = written.file_size;
  r.items.reserve(written.items.size());
  for (const io::ItemWritten& w : written.items) r.items.push_back({w.byte_offset, w.byte_length, w.block_checksums});
  return r;
}

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

io::FileWriteOptions file_write_options(const SaveOptions& options) {
  io::FileWriteOptions o;
  o.threads = resolve_io_threads(options.io_threads);
  o.direct_io = options.direct_io;
  o.checksum_block = options.checksum_block_size;
  return o;
}

SaveReport finalize_save(PreparedSave& p, const std::function<io::FileWritten()>& written, Communicator& comm) {
  SaveReport report;
  report.plan_reused = p.plan_reused;
  try {
    io::FileWritten file;
    run_agreed(comm, "write data files", [&] { file = written(); });
    report.items_written = file.items.size();
    for (const io::ItemWritten& w : file.items) report.bytes_written += w.byte_length;
    report.direct_io = file.direct;
    const std::vector<std::string> gathered =
        comm.gather_bytes(plan::encode_write_results(to_results(p.rank, file)), 0);
    run_agreed(comm, "commit the checkpoint", [&] {
      if (!comm.is_coordinator()) return;
      commit_checkpoint(p.paths, final_metadata(p, gathered), p.common_state, p.options.overwrite);
    });
  } catch (...) {
    if (comm.is_coordinator() && p.claim) discard_staging(p.paths);
    p.claim.reset();
    throw;
  }
  p.claim.reset();
  return report;
}

}  // namespace distckpt::api
