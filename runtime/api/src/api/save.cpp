// save(): plan (or reuse the cached plan) -> write this rank's assignment ->
// agree -> commit. The same steps as async_save, without the background.
#include "api/save_finalize.h"
#include "api/save_items.h"
#include "api/save_plan.h"
#include "distckpt/api/checkpoint.h"

namespace distckpt {

SaveReport save(const StateDict& sharded_state_dict, const std::string& dir, Communicator& comm,
                const SaveOptions& options) {
  std::unique_ptr<api::PreparedSave> prepared = api::prepare_save(sharded_state_dict, dir, comm, options);
  std::unique_ptr<io::FileWriteJob> job;
  return api::finalize_save(
      *prepared,
      [&] {
        job = std::make_unique<io::FileWriteJob>(
            io::safe_join(prepared->paths.staging, plan::rank_file_path(comm.rank())), api::make_write_items(*prepared),
            api::sync_write_pool(), api::file_write_options(options));
        return job->wait();
      },
      comm);
}

}  // namespace distckpt
