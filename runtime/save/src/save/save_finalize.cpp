#include "save/save_finalize.h"

#include "comm/agreement.h"

namespace distckpt::saving {

SaveReport finalize_save(PreparedSave& p, const std::function<RankWritten()>& write, Communicator& comm) {
  SaveReport report;
  report.plan_reused = p.plan_reused;
  try {
    RankWritten written;
    run_agreed(comm, "write data files", [&] { written = write(); });
    report.items_written = written.items;
    report.bytes_written = written.bytes;
    report.direct_io = p.direct_io;
    const std::vector<std::string> gathered = comm.gather_bytes(written.result, p.coordinator);
    run_agreed(comm, "commit the checkpoint", [&] {
      if (p.is_coordinator()) p.writer->commit(gathered);
    });
  } catch (...) {
    if (p.is_coordinator() && p.claimed) p.writer->discard();
    p.claimed = false;
    throw;
  }
  p.claimed = false;
  return report;
}

}  // namespace distckpt::saving
