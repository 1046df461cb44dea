// save(): plan (or reuse the cached plan) -> the storage writer writes this
// rank's pieces -> agree -> commit. The same steps as async_save, without
// the background.
#include "distckpt/save/save.h"

#include "save/save_finalize.h"
#include "save/save_pieces.h"
#include "save/save_plan.h"

namespace distckpt {
namespace {

SaveReport save_with(const StateDict& state_dict, const std::string& dir, StorageWriter* writer, Communicator& comm,
                     const SaveOptions& options) {
  std::unique_ptr<saving::PreparedSave> prepared = saving::prepare_save(state_dict, dir, comm, options, writer);
  return saving::finalize_save(
      *prepared,
      [&] {
        std::vector<SavePiece> pieces =
            saving::make_save_pieces(*prepared, nullptr, prepared->writer->takes_device_tensors());
        saving::RankWritten written;
        written.items = pieces.size();
        for (const SavePiece& piece : pieces)
          written.bytes += piece.object ? piece.object->size() : piece.data.nbytes();
        written.result = prepared->writer->write(prepared->rank, std::move(pieces));
        prepared->direct_io = prepared->distckpt && prepared->distckpt->direct_io();
        return written;
      },
      comm);
}

}  // namespace

SaveReport save(const StateDict& sharded_state_dict, const std::string& dir, Communicator& comm,
                const SaveOptions& options) {
  return save_with(sharded_state_dict, dir, nullptr, comm, options);
}

SaveReport save(const StateDict& sharded_state_dict, StorageWriter& writer, Communicator& comm,
                const SaveOptions& options) {
  return save_with(sharded_state_dict, writer.location(), &writer, comm, options);
}

StorageIndex dry_run_save(const StateDict& sharded_state_dict, Communicator& comm, const SaveOptions& options) {
  return saving::dry_run(sharded_state_dict, comm, options);
}

}  // namespace distckpt
