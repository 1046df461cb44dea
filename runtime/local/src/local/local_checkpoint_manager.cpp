#include "distckpt/local/local_checkpoint_manager.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <system_error>
#include <thread>

#include "comm/agreement.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "io/file.h"
#include "io/threads.h"
#include "local/file_transfer.h"
#include "local/local_file.h"
#include "local/messages.h"

namespace distckpt {
namespace fs = std::filesystem;

struct LocalCheckpointManager::Held {
  int64_t iteration;
  int owner;
};

namespace {

// "iter_<I>_owner_<O>.dcl" (complete) and the same + ".tmp" (being written).
const std::regex& file_pattern() {
  static const std::regex pattern(R"(iter_(\d{1,18})_owner_(\d{1,9})\.dcl(\.tmp)?)");
  return pattern;
}

std::string list_ranks(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ", ")); }

// Who holds each rank's files, from the clique strategy or explicit groups.
std::vector<std::vector<int>> replication_peers(const LocalCheckpointOptions& options, int world_size) {
  std::vector<std::vector<int>> peers(static_cast<size_t>(world_size));
  if (options.replication && !options.replication_groups.empty()) {
    throw UsageError("LocalCheckpointOptions: set either replication (cliques) or replication_groups, not both");
  }
  if (options.replication) {
    for (int r = 0; r < world_size; ++r) peers[static_cast<size_t>(r)] = options.replication->clique_of(r, world_size);
    return peers;
  }
  if (options.replication_groups.empty()) {
    for (int r = 0; r < world_size; ++r) peers[static_cast<size_t>(r)] = {r};
    return peers;
  }
  std::vector<int> group_of(static_cast<size_t>(world_size), -1);
  for (size_t g = 0; g < options.replication_groups.size(); ++g) {
    std::vector<int> members = options.replication_groups[g];
    std::sort(members.begin(), members.end());
    const auto twice = std::adjacent_find(members.begin(), members.end());
    if (twice != members.end()) {
      throw UsageError(fmt::format("LocalCheckpointOptions::replication_groups: group [{}] lists rank {} twice",
                                   list_ranks(options.replication_groups[g]), *twice));
    }
    for (int r : members) {
      if (r < 0 || r >= world_size) {
        throw UsageError(
            fmt::format("LocalCheckpointOptions::replication_groups: group [{}] names rank {}, outside a "
                        "world of {} ranks",
                        list_ranks(options.replication_groups[g]), r, world_size));
      }
      if (group_of[static_cast<size_t>(r)] >= 0) {
        throw UsageError(
            fmt::format("LocalCheckpointOptions::replication_groups: rank {} is in group [{}] and in group "
                        "[{}]; each rank belongs to one group",
                        r, list_ranks(options.replication_groups[static_cast<size_t>(group_of[r])]),
                        list_ranks(options.replication_groups[g])));
      }
      group_of[static_cast<size_t>(r)] = static_cast<int>(g);
      peers[static_cast<size_t>(r)] = members;
    }
  }
  for (int r = 0; r < world_size; ++r) {
    if (group_of[static_cast<size_t>(r)] < 0) {
      throw UsageError(
          fmt::format("LocalCheckpointOptions::replication_groups: rank {} is in no group; list every rank "
                      "(a group of one keeps no replica)",
                      r));
    }
  }
  return peers;
}

// An asynchronous local save: its background write and the iteration it
// holds in flight. Its request owns it and, finalized or dropped, waits for
// the write, so the thread never outlives it. Dropped unfinalized (its queue
// destroyed without close()), it lets the iteration go, so the manager is
// not held back by a save that will never finalize; the file stays, as a
// killed process's would (complete files are what a restart looks at).
struct AsyncLocalSave {
  std::thread thread;
  std::atomic<bool> done{false};
  std::exception_ptr error;
  uint64_t bytes = 0;
  std::weak_ptr<std::set<int64_t>> in_flight;  // the manager's, while it lives
  int64_t iteration = 0;
  bool finalized = false;
  void join() {
    if (thread.joinable()) thread.join();
  }
  ~AsyncLocalSave() {
    join();
    if (finalized) return;
    if (const std::shared_ptr<std::set<int64_t>> iterations = in_flight.lock()) iterations->erase(iteration);
  }
};

}  // namespace

LocalCheckpointManager::LocalCheckpointManager(std::string root, Communicator& comm, LocalCheckpointOptions options)
    : root_(std::move(root)), comm_(comm), options_(std::move(options)) {
  if (root_.empty()) throw UsageError("LocalCheckpointManager: the root directory is empty");
  if (options_.transfer_slab_bytes == 0)
    throw UsageError("LocalCheckpointOptions::transfer_slab_bytes must be positive");
  peers_ = replication_peers(options_, comm_.size());
}

LocalCheckpointManager::~LocalCheckpointManager() = default;

std::string LocalCheckpointManager::rank_dir(int rank) const { return fmt::format("{}/rank_{}", root_, rank); }

std::string LocalCheckpointManager::file_path(int holder, int64_t iteration, int owner) const {
  return fmt::format("{}/iter_{}_owner_{}.dcl", rank_dir(holder), iteration, owner);
}

namespace {

// A file of a rank's directory named as a local checkpoint.
struct NamedFile {
  fs::path path;
  int64_t iteration;
  int owner;
  bool temporary;  // still being written (".tmp")
};

std::vector<NamedFile> named_files_in(const std::string& dir) {
  std::vector<NamedFile> files;
  if (!io::is_dir(dir)) return files;
  for (const std::string& name : io::list_dir(dir)) {
    std::smatch m;
    if (!std::regex_match(name, m, file_pattern())) continue;
    files.push_back(NamedFile{fs::path(dir) / name, std::stoll(m[1].str()), std::stoi(m[2].str()), m[3].matched});
  }
  return files;
}

}  // namespace

// Files of this rank's directory named as complete local checkpoints (not
// their temporary names), whatever their headers say.
std::vector<LocalCheckpointManager::Held> LocalCheckpointManager::named_files() const {
  std::vector<Held> named;
  for (const NamedFile& f : named_files_in(rank_dir(comm_.rank()))) {
    if (!f.temporary) named.push_back(Held{f.iteration, f.owner});
  }
  return named;
}

// Complete files of this rank's directory whose header matches their name
// and this job's world size.
std::vector<LocalCheckpointManager::Held> LocalCheckpointManager::inventory() const {
  std::vector<Held> held;
  for (const Held& h : named_files()) {
    const auto header = local::probe_local_file(file_path(comm_.rank(), h.iteration, h.owner));
    if (!header || header->iteration != h.iteration || header->owner_rank != h.owner ||
        header->world_size != comm_.size()) {
      continue;  // incomplete, foreign or from another world size: never loadable here
    }
    held.push_back(h);
  }
  return held;
}

std::vector<int64_t> LocalCheckpointManager::local_iterations() const {
  std::set<int64_t> its;
  for (const Held& h : inventory()) its.insert(h.iteration);
  return {its.begin(), its.end()};
}

void LocalCheckpointManager::check_save(const TensorAwareStateDict& state, int64_t iteration) const {
  if (state.state().owner_rank != comm_.rank() || state.state().world_size != comm_.size()) {
    throw UsageError(
        fmt::format("rank {} of {} was given the tensor-aware state dict of rank {} of {}; build it with "
                    "TensorAwareStateDict::from_state_dict on this rank's communicator",
                    comm_.rank(), comm_.size(), state.state().owner_rank, state.state().world_size));
  }
  if (iteration <= last_complete_) {
    throw CheckpointError(
        fmt::format("local checkpoint iteration {} is not newer than the last one saved or loaded ({})", iteration,
                    last_complete_));
  }
  if (!in_flight_->empty() && iteration <= *in_flight_->rbegin()) {
    throw CheckpointError(
        fmt::format("local checkpoint iteration {} is not newer than iteration {}, whose asynchronous save is not "
                    "finalized yet",
                    iteration, *in_flight_->rbegin()));
  }
}

void LocalCheckpointManager::save(const TensorAwareStateDict& state, int64_t iteration) {
  begin_save(state, iteration, nullptr);
  std::exception_ptr error;
  std::vector<std::string> created;
  try {
    const std::string path = file_path(comm_.rank(), iteration, comm_.rank());
    local::write_local_file(state, iteration, path);
    created.push_back(path);
  } catch (...) {
    error = std::current_exception();
  }
  finish_save(iteration, error, created);
}

int64_t LocalCheckpointManager::save_async(const TensorAwareStateDict& state, int64_t iteration,
                                           AsyncCallsQueue& queue) {
  std::shared_ptr<TensorAwareStateDict> staged;
  begin_save(state, iteration, [&] {
    // Host copies of the kept tensors: the caller's may change right away.
    std::vector<at::Tensor> copies;
    copies.reserve(state.tensors().size());
    for (const at::Tensor& t : state.tensors()) {
      copies.push_back(t.defined() ? t.to(t.options().device(at::kCPU), /*non_blocking=*/false, /*copy=*/true) : t);
    }
    staged = std::make_shared<TensorAwareStateDict>(state.state(), std::move(copies));
  });
  const std::string path = file_path(comm_.rank(), iteration, comm_.rank());
  auto save = std::make_shared<AsyncLocalSave>();
  save->in_flight = in_flight_;
  save->iteration = iteration;
  // The thread may use `save` bare: whoever releases it joins the thread first.
  const auto write = [s = save.get(), staged, path] {
    try {
      s->bytes = local::write_local_file(*staged, s->iteration, path);
    } catch (...) {
      s->error = std::current_exception();
    }
    s->done = true;
  };
  try {
    save->thread = std::thread(write);
  } catch (const std::system_error& e) {
    // Raised here alone, it would leave the other ranks waiting in the
    // finalize; written now, the save goes on like any other.
    write();
    log_message(
        LogLevel::kWarning,
        fmt::format("local checkpoint: rank {}: {}; it was written on the calling thread", comm_.rank(),
                    io::thread_start_failure(fmt::format("the local checkpoint of iteration {}", iteration), e)));
  }
  try {
    return queue.schedule(AsyncRequest::from_functions(
        rank_dir(comm_.rank()), [save] { return save->done.load(); },
        [this, save, path](Communicator&) {
          save->join();
          save->finalized = true;
          std::vector<std::string> created;
          if (!save->error) created.push_back(path);
          finish_save(save->iteration, save->error, created);
          SaveReport report;
          report.bytes_written = save->bytes;
          report.items_written = 1;
          return report;
        }));
  } catch (...) {
    // Never queued (the queue is closed, or finalizing an older save failed,
    // on every rank alike): this save will never be finalized, so its file goes.
    save->join();
    std::error_code ignored;
    fs::remove(path, ignored);
    throw;  // `save` lets the iteration go
  }
}

// One collective before any rank writes (two when files must go): the save
// is checked (and staged) everywhere, and every rank lists the complete
// files it holds of this iteration or a later one. Such files were left by
// a run this job abandoned when it resumed from an older state. They go first, on every rank, before
// anyone writes: kept, they would be the latest after a restart and the job
// would resume into the abandoned run, and a file of this very iteration
// could load beside this run's files of it.
void LocalCheckpointManager::begin_save(const TensorAwareStateDict& state, int64_t iteration,
                                        const std::function<void()>& stage) {
  const std::vector<std::string> gathered = gather_agreed(comm_, "start the local checkpoint", [&] {
    check_save(state, iteration);
    io::make_dirs(rank_dir(comm_.rank()));
    if (stage) stage();
    // By name, as they are removed: a file of another world size or with a
    // damaged header would be in the way of this save all the same.
    std::vector<local::HeldCopy> abandoned;
    for (const Held& h : named_files()) {
      if (h.iteration >= iteration) abandoned.push_back(local::HeldCopy{h.iteration, h.owner});
    }
    return local::encode_inventory(abandoned);
  });
  std::set<int64_t> abandoned;
  for (size_t r = 0; r < gathered.size(); ++r) {
    for (const local::HeldCopy& c : local::decode_inventory(gathered[r], fmt::format("rank {}", r))) {
      abandoned.insert(c.iteration);
    }
  }
  // (Temporary files of a crashed save need no agreement: they never load,
  // and write_local_file replaces its own.)
  if (!abandoned.empty()) {
    if (comm_.rank() == 0) {
      log_message(LogLevel::kWarning,
                  fmt::format("local checkpoint: saving iteration {} removes iteration(s) {} under '{}', left by a "
                              "run that went past the state this job resumed from",
                              iteration, fmt::join(abandoned, ", "), root_));
    }
    run_agreed(comm_, "remove the local checkpoints of an abandoned run", [&] {
      remove_files([&](int64_t it) { return it >= iteration; });
      io::fsync_dir(rank_dir(comm_.rank()));
    });
  }
  in_flight_->insert(iteration);  // until finish_save
}

void LocalCheckpointManager::discard_after(int64_t iteration) {
  run_agreed(comm_, fmt::format("discard the local checkpoints after iteration {}", iteration), [&] {
    if (!in_flight_->empty()) {
      throw CheckpointError(fmt::format("discard_after({}): the asynchronous save of iteration {} is not finalized",
                                        iteration, *in_flight_->rbegin()));
    }
    remove_files([&](int64_t it) { return it > iteration; });
    if (io::is_dir(rank_dir(comm_.rank()))) io::fsync_dir(rank_dir(comm_.rank()));
  });
  last_complete_ = iteration;
}

// Every rank has tried to write its own file: agree, replicate, agree, then
// clean up. A failure removes the files this save created (never a complete
// file of an earlier save), so no half state lingers.
void LocalCheckpointManager::finish_save(int64_t iteration, std::exception_ptr write_error,
                                         std::vector<std::string> created) {
  in_flight_->erase(iteration);
  try {
    agree_on_errors(comm_, "write the local checkpoint", write_error);
    replicate(iteration, created);
  } catch (...) {
    for (const std::string& path : created) {
      std::error_code ignored;
      fs::remove(path, ignored);
    }
    throw;
  }
  last_complete_ = std::max(last_complete_, iteration);
  try {
    remove_older_than(iteration);
  } catch (const std::exception& e) {
    // The new iteration is complete; an old file left behind is harmless.
    log_message(LogLevel::kWarning, fmt::format("local checkpoint: {}", e.what()));
  }
}

void LocalCheckpointManager::replicate(int64_t iteration, std::vector<std::string>& created) {
  const int me = comm_.rank();
  std::exception_ptr error;
  int tag = 0;
  // Global order: owner ascending, then its peers ascending; each rank takes
  // part in its own transfers only, in that order.
  for (int owner = 0; owner < comm_.size(); ++owner) {
    for (int holder : peers_[static_cast<size_t>(owner)]) {
      if (holder == owner) continue;
      ++tag;
      if (me == owner) {
        const std::exception_ptr e =
            local::send_file(comm_, file_path(owner, iteration, owner), holder, tag, options_.transfer_slab_bytes);
        if (e && !error) error = e;
      } else if (me == holder) {
        const std::string path = file_path(holder, iteration, owner);
        std::string why;
        try {
          bool received = false;
          try {
            received = local::recv_file(comm_, owner, tag, path + ".tmp", options_.transfer_slab_bytes, why);
          } catch (const Error& e) {
            rethrow_with_context(e, fmt::format("replica of rank {}", owner));
          }
          if (!received) throw CheckpointError(fmt::format("replica of rank {}: {}", owner, why));
          if (!local::probe_local_file(path + ".tmp")) {
            throw CorruptionError(fmt::format("the replica of rank {} arrived incomplete", owner), path + ".tmp");
          }
          if (io::exists(path)) {
            throw CheckpointError(fmt::format("{} already holds a complete replica; it is never overwritten", path),
                                  path);
          }
          io::rename_path(path + ".tmp", path);
          created.push_back(path);
          io::fsync_dir(rank_dir(holder));
        } catch (...) {
          std::error_code ignored;
          fs::remove(path + ".tmp", ignored);
          if (!error) error = std::current_exception();
        }
      }
    }
  }
  agree_on_errors(comm_, "replicate the local checkpoint to peers", error);
}

// Not those of an asynchronous save still in flight (a synchronous save of
// a later iteration can finish first): its finalize needs them.
void LocalCheckpointManager::remove_older_than(int64_t iteration) {
  remove_files([&](int64_t it) { return it < iteration && in_flight_->count(it) == 0; });
}

// Removes every file (temporary ones too) of the iterations chosen, then
// throws IoError naming those it could not remove (the callers decide whether that matters).
void LocalCheckpointManager::remove_files(const std::function<bool(int64_t)>& of_iteration) {
  std::vector<std::string> failed;
  std::string first_path;  // the first file that could not be removed, and why (an errno)
  int first_error = 0;
  for (const NamedFile& f : named_files_in(rank_dir(comm_.rank()))) {
    if (!of_iteration(f.iteration)) continue;
    std::error_code error;
    fs::remove(f.path, error);
    if (!error) continue;
    if (failed.empty()) {
      first_path = f.path.string();
      first_error = error.value();
    }
    failed.push_back(fmt::format("'{}': {}", f.path.string(), error.message()));
  }
  if (!failed.empty()) {
    throw IoError(fmt::format("could not remove {}", fmt::join(failed, ", ")), first_path, first_error);
  }
}

std::optional<int64_t> LocalCheckpointManager::find_latest() {
  std::vector<std::string> gathered = gather_agreed(comm_, "list the local checkpoints", [&] {
    std::vector<local::HeldCopy> held;
    for (const Held& h : inventory()) held.push_back(local::HeldCopy{h.iteration, h.owner});
    return local::encode_inventory(held);
  });
  std::map<int64_t, std::set<int>> owners_of;
  for (size_t r = 0; r < gathered.size(); ++r) {
    for (const local::HeldCopy& c : local::decode_inventory(gathered[r], fmt::format("rank {}", r))) {
      owners_of[c.iteration].insert(c.owner);
    }
  }
  for (auto it = owners_of.rbegin(); it != owners_of.rend(); ++it) {
    if (static_cast<int>(it->second.size()) == comm_.size()) return it->first;
  }
  return std::nullopt;
}

TensorAwareStateDict LocalCheckpointManager::load(std::optional<int64_t> iteration) {
  if (!iteration) iteration = find_latest();
  if (!iteration) {
    throw CheckpointError(
        fmt::format("no local checkpoint under '{}' is complete on all {} ranks; load the global "
                    "checkpoint instead",
                    root_, comm_.size()));
  }
  recovery_ = LocalRecovery{*iteration, {}, {}};
  std::optional<TensorAwareStateDict> mine;
  std::vector<std::vector<int>> holders;
  std::vector<int> failed = survey_copies(*iteration, mine, holders);
  recovery_.recovered_ranks = failed;
  recover(*iteration, std::move(failed), holders, mine);
  // The job goes on from here: saving this iteration again would replace
  // the checkpoint it resumed from (a crash meanwhile would leave none).
  last_complete_ = std::max(last_complete_, *iteration);
  return std::move(*mine);
}

// Every rank tries its own copy and says whether it worked and which
// owners' copies of `it` it holds. Returns the ranks whose own copy failed;
// holders[owner]: the ranks holding a copy of owner's file, ascending.
std::vector<int> LocalCheckpointManager::survey_copies(int64_t it, std::optional<TensorAwareStateDict>& mine,
                                                       std::vector<std::vector<int>>& holders) {
  const int me = comm_.rank();
  local::CopyStatus status;
  try {
    mine = local::read_local_file(file_path(me, it, me));
    status.ok = true;
  } catch (const std::exception& e) {
    status.problem = e.what();
  }
  for (const Held& h : inventory()) {
    if (h.iteration == it && h.owner != me) status.held_owners.push_back(h.owner);
  }
  const std::vector<std::string> gathered = comm_.all_gather_bytes(local::encode_copy_status(status));

  std::vector<int> failed;
  holders.assign(static_cast<size_t>(comm_.size()), {});
  for (size_t r = 0; r < gathered.size(); ++r) {
    const local::CopyStatus theirs = local::decode_copy_status(gathered[r], fmt::format("rank {}", r));
    if (!theirs.ok) {
      failed.push_back(static_cast<int>(r));
      recovery_.notes.push_back(fmt::format("rank {}'s own copy: {}", r, theirs.problem));
    }
    for (int owner : theirs.held_owners) {
      if (owner >= 0 && owner < comm_.size()) holders[static_cast<size_t>(owner)].push_back(static_cast<int>(r));
    }
  }
  return failed;
}

// Rounds: each failed owner gets the copy of its next holder, checks it, and
// keeps it (restoring its own copy) or tries the next one.
void LocalCheckpointManager::recover(int64_t it, std::vector<int> failed, const std::vector<std::vector<int>>& holders,
                                     std::optional<TensorAwareStateDict>& mine) {
  const int me = comm_.rank();
  for (size_t round = 0; !failed.empty(); ++round) {
    std::vector<int> exhausted;
    for (int owner : failed) {
      if (round >= holders[static_cast<size_t>(owner)].size()) exhausted.push_back(owner);
    }
    if (!exhausted.empty()) {
      std::vector<std::string> groups;
      for (int owner : exhausted) {
        groups.push_back(
            fmt::format("rank {} replicates within [{}]", owner, list_ranks(peers_[static_cast<size_t>(owner)])));
      }
      throw CheckpointError(fmt::format(
          "no intact copy of the local checkpoint of rank(s) {} at iteration {} under '{}' ({}{}{}); fall back to "
          "the global checkpoint",
          list_ranks(exhausted), it, root_, fmt::join(groups, ", "), recovery_.notes.empty() ? "" : "; ",
          fmt::join(recovery_.notes, "; ")));
    }
    std::string problem;
    for (int owner : failed) {
      const int holder = holders[static_cast<size_t>(owner)][round];
      if (me == holder) {
        local::send_file(comm_, file_path(holder, it, owner), owner, owner + 1, options_.transfer_slab_bytes);
      } else if (me == owner) {
        problem = fetch_replica(it, holder, mine);
      }
    }
    // Who is still without an intact copy, and why.
    const std::vector<std::string> statuses = comm_.all_gather_bytes(local::encode_recovery_status(problem));
    std::vector<int> still;
    for (int owner : failed) {
      const std::string p =
          local::decode_recovery_status(statuses[static_cast<size_t>(owner)], fmt::format("rank {}", owner));
      if (p.empty()) continue;
      still.push_back(owner);
      recovery_.notes.push_back(fmt::format("rank {}: {}", owner, p));
    }
    failed = std::move(still);
  }
}

// This rank's file of `it`, received from `holder`, checked and put in
// place; "" on success, else what went wrong.
std::string LocalCheckpointManager::fetch_replica(int64_t it, int holder, std::optional<TensorAwareStateDict>& mine) {
  const int me = comm_.rank();
  const std::string final_path = file_path(me, it, me);
  const std::string tmp = final_path + ".tmp";
  std::string why;
  try {
    io::make_dirs(rank_dir(me));
    if (!local::recv_file(comm_, holder, me + 1, tmp, options_.transfer_slab_bytes, why)) throw CheckpointError(why);
    mine = local::read_local_file(tmp);
    io::rename_path(tmp, final_path);
    io::fsync_dir(rank_dir(me));
    log_message(
        LogLevel::kWarning,
        fmt::format("local checkpoint: rank {} recovered iteration {} from the replica on rank {}", me, it, holder));
    return {};
  } catch (const std::exception& e) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    return fmt::format("the replica on rank {}: {}", holder, e.what());
  }
}

}  // namespace distckpt
