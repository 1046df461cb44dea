// Asynchronous saves: the caller gets control back as soon as its tensors are
// staged (copied into reusable host buffers), or right after planning with
// AsyncStaging::kInBackground; writing runs on background threads; the
// checkpoint is committed at finalize, once every rank's data is durable
// (agreed by a collective, so an error on any rank is raised on every rank
// there).
//
//   AsyncQueueOptions options;
//   options.staging = AsyncStaging::kInBackground;
//   AsyncCallsQueue queue(*comm, options);
//   for (step ...) {
//     forward_backward();               // reads the parameters: the copy runs meanwhile
//     queue.wait_staged();              // before the optimizer step changes them
//     optimizer_step();
//     if (step % 1000 == 0) queue.save(state_dict(), fmt::format("ckpt/iter_{:07d}", step));
//     queue.maybe_finalize();           // collective: commits the saves that finished everywhere
//   }
//   queue.close();                      // collective: waits for and commits the rest
//
// Every rank must make the same calls in the same order (they are
// collective). Saves are finalized in the order they were scheduled, and two
// saves never share a directory while in flight.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/save/options.h"
#include "distckpt/save/plan_cache.h"
#include "distckpt/save/save.h"

namespace distckpt {

namespace io {
class BufferPool;  // staging buffers (runtime-internal); an AsyncCallsQueue owns one
}  // namespace io

// When async_save returns, relative to the copy of the caller's tensors.
enum class AsyncStaging {
  // Once they are copied: the caller may change its tensors right away.
  kBeforeReturn,
  // Right after planning; the copy runs in the background (while the next
  // forward and backward pass, which only read the parameters, run). The
  // caller must call wait_staged() before it changes any saved tensor.
  kInBackground,
};

class AsyncRequest;
// Collective: plans the save (reusing options.plan_cache when it holds),
// stages this rank's data into `pool`'s buffers and starts writing it.
AsyncRequest async_save(const StateDict& sharded_state_dict, const std::string& dir, Communicator& comm,
                        const SaveOptions& options, const std::shared_ptr<io::BufferPool>& pool,
                        AsyncStaging staging = AsyncStaging::kBeforeReturn);

class AsyncRequest {
 public:
  // Other asynchronous work that an AsyncCallsQueue can order with saves
  // (local checkpoints): `locally_done` says whether this rank's background
  // part is over (not collective); `finalize` is the collective end, called
  // once. Whatever the functions capture lives as long as the request.
  static AsyncRequest from_functions(std::string directory, std::function<bool()> locally_done,
                                     std::function<SaveReport(Communicator&)> finalize);
  AsyncRequest(AsyncRequest&&) noexcept;
  AsyncRequest& operator=(AsyncRequest&&) noexcept;
  // A request never finalized is abandoned: its writes are cancelled (a
  // local checkpoint's write is waited for instead) and nothing is
  // committed (no collective; never throws).
  ~AsyncRequest();

  const std::string& directory() const;
  bool plan_reused() const;
  // This rank's writing is over, successfully or not (not collective).
  bool locally_done() const;
  // Blocks until this rank's tensors are copied (not collective; at once for
  // kBeforeReturn). A copy that failed is raised by finalize, on every rank.
  void wait_staged();
  // Collective: waits for every rank's data and commits. Rethrows, on every
  // rank, an error from any rank. A request is finalized at most once.
  SaveReport finalize(Communicator& comm);

 private:
  struct Impl;  // defined by the runtime
  friend AsyncRequest async_save(const StateDict&, const std::string&, Communicator&, const SaveOptions&,
                                 const std::shared_ptr<io::BufferPool>&, AsyncStaging);
  explicit AsyncRequest(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct AsyncQueueOptions {
  // schedule()/save() first finalize the oldest saves (blocking) while this
  // many are unfinalized, so at most this many are in flight.
  size_t max_in_flight = 1;
  // Bound of the staging buffers (0: the pool grows to what the saves in
  // flight need and keeps it for the next ones). A save larger than the
  // bound keeps the caller until enough of it is written.
  uint64_t staging_capacity_bytes = 0;
  // For the saves save() makes.
  AsyncStaging staging = AsyncStaging::kBeforeReturn;
};

class AsyncCallsQueue {
 public:
  explicit AsyncCallsQueue(Communicator& comm, AsyncQueueOptions options = {});
  // Without close(): unfinalized saves are abandoned (see ~AsyncRequest).
  ~AsyncCallsQueue();
  AsyncCallsQueue(const AsyncCallsQueue&) = delete;
  AsyncCallsQueue& operator=(const AsyncCallsQueue&) = delete;

  // Collective: async_save with the queue's buffers and plan cache (unless
  // options.plan_cache is set), then schedule(). Returns the call's index.
  int64_t save(const StateDict& sharded_state_dict, const std::string& dir, const SaveOptions& options = {});
  // Takes a request made by async_save. Collective when it has to finalize
  // older saves first (see max_in_flight).
  int64_t schedule(AsyncRequest request);
  // Collective: finalizes, oldest first, the saves whose writes are over on
  // every rank; `blocking` waits for all of them. Returns the indices of the
  // saves committed. A failed save is dropped and its error raised on every
  // rank; the saves after it stay queued.
  std::vector<int64_t> maybe_finalize(bool blocking = false);
  size_t unfinalized() const { return pending_.size(); }
  // Not collective: every unfinalized save's tensors are copied (see
  // AsyncStaging::kInBackground); call it before changing them.
  void wait_staged();
  // Collective: finalizes everything; the queue takes no more saves.
  void close();

  const std::shared_ptr<SavePlanCache>& plan_cache() const { return plan_cache_; }
  const std::shared_ptr<io::BufferPool>& pool() const { return pool_; }

 private:
  struct Pending {
    int64_t index;
    AsyncRequest request;
  };
  void check_open(const char* what) const;
  // Collective: finalizes the first `count` pending saves.
  std::vector<int64_t> finalize_front(size_t count);

  Communicator& comm_;
  AsyncQueueOptions options_;
  std::shared_ptr<io::BufferPool> pool_;
  std::shared_ptr<SavePlanCache> plan_cache_;
  std::deque<Pending> pending_;
  int64_t next_index_ = 0;
  bool closed_ = false;
};

}  // namespace distckpt
