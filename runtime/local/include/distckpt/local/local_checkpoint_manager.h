// Local (node-level) checkpoints: each rank saves its tensor-aware state dict
// to fast node-local storage, often; peers keep replicas so a lost node's
// ranks can be recovered; a global checkpoint (distckpt::save) is the fallback.
//
// On disk, under `root` (the same path on every node, e.g. /local_nvme/ckpt):
//   root/rank_<R>/iter_<ITERATION>_owner_<O>.dcl
// is rank O's state at ITERATION as stored by rank R (R == O: its own copy,
// else a replica). Files are written under a temporary name, fsync'ed and
// renamed: a file under its final name is complete. A rank's directory
// belongs to that rank only, so ranks sharing a node share no file.
//
//   LocalCheckpointManager manager(root, *comm, {.replication = CliqueReplication{8, 2}});
//   manager.save(TensorAwareStateDict::from_state_dict(sd, *comm), step);
//   ...after a restart (some nodes may be new and empty):
//   if (auto it = manager.find_latest()) {
//     LoadResult r = manager.load(*it).to_state_dict(request, *comm);
//   } else { /* load the global checkpoint */ }
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/local/tensor_aware_state_dict.h"
#include "distckpt/save/async.h"

namespace distckpt {

// nvidia-resiliency-ext's clique strategy: ranks are numbered node by node,
// `ranks_per_node` (J) on each; replicas go to the ranks with the same local
// index on `factor` - 1 (F - 1) other nodes. Nodes form groups of F; inside
// a group every rank holds the checkpoints of all ranks of its clique
// {base + i*J : i < F}. Needs world size divisible by J*F.
struct CliqueReplication {
  int ranks_per_node = 1;
  int factor = 2;
  // The ranks whose checkpoints `rank` holds (itself included), ascending.
  std::vector<int> clique_of(int rank, int world_size) const;
  void validate(int world_size) const;  // throws UsageError saying what to change
};

struct LocalCheckpointOptions {
  std::optional<CliqueReplication> replication;  // none: each rank keeps only its own
  // Or explicit groups of any sizes (nvidia-resiliency-ext's tests use
  // {{2, 6, 7}, {3, 1}, {5}, {0, 4}} on 8 ranks): every rank's checkpoint is
  // replicated on each member of its group, so a rank can be recovered while
  // one member survives. The groups must cover every rank exactly once.
  std::vector<std::vector<int>> replication_groups;
  // Bytes in flight when a file travels to a peer (save replicas, recovery).
  uint64_t transfer_slab_bytes = uint64_t{32} << 20;
};

// What load() did, for logs and tests.
struct LocalRecovery {
  int64_t iteration = -1;
  std::vector<int> recovered_ranks;  // ranks whose copy was missing or corrupt, restored from a replica
  std::vector<std::string> notes;    // one line per replica found corrupt or missing and skipped
};

class LocalCheckpointManager {
 public:
  LocalCheckpointManager(std::string root, Communicator& comm, LocalCheckpointOptions options = {});
  ~LocalCheckpointManager();
  LocalCheckpointManager(const LocalCheckpointManager&) = delete;
  LocalCheckpointManager& operator=(const LocalCheckpointManager&) = delete;

  // Collective. Writes this rank's file, sends it to its replica peers, and
  // once every rank's copies are durable removes the older iterations (never
  // before). Refuses an iteration that is not newer than the last one saved,
  // loaded or being saved asynchronously. Files of this iteration or later
  // ones, left by a run that went past the state this job resumed from, are
  // removed on every rank before any rank writes (with a warning).
  void save(const TensorAwareStateDict& state, int64_t iteration);
  // Collective. Stages the kept tensors (copies: the caller may go on
  // training), writes this rank's file on a background thread; finalize
  // (through `queue`, e.g. maybe_finalize) replicates, agrees and cleans up.
  // A request dropped unfinalized (the queue destroyed without close())
  // waits for its write and no longer counts as in flight; its file stays,
  // unreplicated, until a later save or discard_after removes it. Like
  // every call of the manager, drop the queue on the manager's thread.
  int64_t save_async(const TensorAwareStateDict& state, int64_t iteration, AsyncCallsQueue& queue);

  // Collective. The newest iteration for which every rank's checkpoint exists
  // on some rank (its own copy or a replica); nullopt if none.
  std::optional<int64_t> find_latest();
  // Collective. Every rank's state at `iteration` (default: find_latest()),
  // verified. A rank whose own copy is missing or corrupt gets a replica
  // from a peer (its own copy is restored); a corrupt replica is skipped for
  // the next. Throws CheckpointError on every rank, naming the ranks, when
  // some rank has no intact copy left: fall back to the global checkpoint.
  // Later saves must be of later iterations.
  TensorAwareStateDict load(std::optional<int64_t> iteration = std::nullopt);
  const LocalRecovery& last_recovery() const { return recovery_; }
  // Collective. For a job that resumed from another state than find_latest()
  // (its global checkpoint at `iteration`, a rollback): removes, on every
  // rank, the local checkpoints of later iterations, so that no restart
  // resumes into the run that saved them (the next save would remove them
  // too, but a crash before it would not). Saves after it must be newer than
  // `iteration`. Refused while an asynchronous save is in flight.
  void discard_after(int64_t iteration);

  const std::string& root() const { return root_; }
  std::string rank_dir(int rank) const;  // root/rank_<R>
  std::string file_path(int holder, int64_t iteration, int owner) const;
  // Iterations this rank's directory holds complete files of (any owner), ascending.
  std::vector<int64_t> local_iterations() const;

 private:
  struct Held;
  std::vector<Held> named_files() const;
  std::vector<Held> inventory() const;
  void check_save(const TensorAwareStateDict& state, int64_t iteration) const;
  void begin_save(const TensorAwareStateDict& state, int64_t iteration, const std::function<void()>& stage);
  void replicate(int64_t iteration, std::vector<std::string>& created);
  void finish_save(int64_t iteration, std::exception_ptr write_error, std::vector<std::string> created);
  void remove_older_than(int64_t iteration);
  void remove_files(const std::function<bool(int64_t)>& of_iteration);
  // load's steps: survey who holds an intact copy, then recover the others.
  std::vector<int> survey_copies(int64_t iteration, std::optional<TensorAwareStateDict>& mine,
                                 std::vector<std::vector<int>>& holders);
  void recover(int64_t iteration, std::vector<int> failed, const std::vector<std::vector<int>>& holders,
               std::optional<TensorAwareStateDict>& mine);
  std::string fetch_replica(int64_t iteration, int holder, std::optional<TensorAwareStateDict>& mine);

  std::string root_;
  Communicator& comm_;
  LocalCheckpointOptions options_;
  // peers_[owner]: the ranks holding owner's files (owner included), ascending.
  std::vector<std::vector<int>> peers_;
  int64_t last_complete_ = -1;  // the newest iteration saved or loaded by this manager
  // Iterations whose saves began and are not finalized; shared with the
  // requests of save_async, which let theirs go when dropped unfinalized.
  std::shared_ptr<std::set<int64_t>> in_flight_ = std::make_shared<std::set<int64_t>>();
  LocalRecovery recovery_;
};

}  // namespace distckpt
