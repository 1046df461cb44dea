// async_save and AsyncCallsQueue: the save pipeline cut after staging.
#include <fmt/format.h>

#include <exception>

#include "comm/agreement.h"
#include "distckpt/core/errors.h"
#include "distckpt/save/async.h"
#include "plan/messages.h"
#include "save/save_finalize.h"
#include "save/save_pieces.h"
#include "save/save_plan.h"
#include "storage/write_items.h"

namespace distckpt {

struct AsyncRequest::Impl {
  std::unique_ptr<saving::PreparedSave> prepared;
  std::unique_ptr<io::FileWriteJob> job;
  // Background staging: why this rank could not start its job (finalize
  // raises it on every rank, like a failed write).
  std::exception_ptr not_started;
  bool finalized = false;
  // Requests made by from_functions (no prepared save).
  std::string directory;
  std::function<bool()> locally_done;
  std::function<SaveReport(Communicator&)> finalize;

  ~Impl() {
    job.reset();  // cancels and joins the writer threads
    if (!finalized && prepared && prepared->claimed) prepared->writer->discard();
  }
};

AsyncRequest::AsyncRequest(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AsyncRequest::AsyncRequest(AsyncRequest&&) noexcept = default;
AsyncRequest& AsyncRequest::operator=(AsyncRequest&&) noexcept = default;
AsyncRequest::~AsyncRequest() = default;

AsyncRequest AsyncRequest::from_functions(std::string directory, std::function<bool()> locally_done,
                                          std::function<SaveReport(Communicator&)> finalize) {
  if (!locally_done || !finalize) throw UsageError("AsyncRequest::from_functions needs both functions");
  auto impl = std::make_unique<Impl>();
  impl->directory = std::move(directory);
  impl->locally_done = std::move(locally_done);
  impl->finalize = std::move(finalize);
  return AsyncRequest(std::move(impl));
}

const std::string& AsyncRequest::directory() const {
  return impl_->prepared ? impl_->prepared->target : impl_->directory;
}
bool AsyncRequest::plan_reused() const { return impl_->prepared && impl_->prepared->plan_reused; }
bool AsyncRequest::locally_done() const {
  if (!impl_->prepared) return impl_->locally_done();
  return impl_->not_started || impl_->job->finished();
}

void AsyncRequest::wait_staged() {
  if (!impl_->prepared || impl_->finalized || impl_->not_started) return;
  try {
    impl_->job->wait_staged();
  } catch (...) {
    // Left for finalize, which raises it on every rank (here only this rank would see it).
  }
}

SaveReport AsyncRequest::finalize(Communicator& comm) {
  if (impl_->finalized) throw UsageError(fmt::format("the save into '{}' was already finalized", directory()));
  impl_->finalized = true;  // whatever happens next, it is not retried
  if (!impl_->prepared) return impl_->finalize(comm);
  saving::PreparedSave& p = *impl_->prepared;
  return saving::finalize_save(
      p,
      [&] {
        if (impl_->not_started) std::rethrow_exception(impl_->not_started);
        const io::FileWritten file = impl_->job->wait();
        p.direct_io = file.direct;
        saving::RankWritten written{p.distckpt->encode_written(file), file.items.size(), 0};
        for (const io::ItemWritten& item : file.items) written.bytes += item.byte_length;
        return written;
      },
      comm);
}

AsyncRequest async_save(const StateDict& sharded_state_dict, const std::string& dir, Communicator& comm,
                        const SaveOptions& options, const std::shared_ptr<io::BufferPool>& pool, AsyncStaging staging) {
  if (!pool) throw UsageError("async_save needs a buffer pool (io::BufferPool::create)");
  if (options.format != StorageFormat::distckpt() && options.format != StorageFormat::detected()) {
    throw UsageError(
        fmt::format("asynchronous saves write the distckpt format; save {} with save()", options.format.name()));
  }
  auto impl = std::make_unique<AsyncRequest::Impl>();
  impl->prepared = saving::prepare_save(sharded_state_dict, dir, comm, options);
  saving::PreparedSave& p = *impl->prepared;
  const auto start_job = [&] {
    io::FileWriteOptions write_options = p.distckpt_save.file_options;
    write_options.background_writes = true;
    // Device tensors: the copies to pinned memory run while the call returns; the writer waits for them.
    std::shared_ptr<const io::CopiesDone> copies;
    std::vector<SavePiece> pieces = saving::make_save_pieces(p, &copies);
    impl->job = p.distckpt->start_data_file(storage::write_items_of(pieces, copies), pool, write_options);
  };
  if (staging == AsyncStaging::kBeforeReturn) {
    run_agreed(comm, "stage the data for an asynchronous save", [&] {
      start_job();
      impl->job->wait_staged();
    });
  } else {
    // No collective after planning: with 4 ranks on 2 cores each one costs
    // 5-15 ms, most of such a call (PERFORMANCE.md). A rank that cannot
    // start keeps the error; finalize raises it on every rank, as it does a
    // failed write.
    try {
      start_job();
    } catch (...) {
      impl->not_started = std::current_exception();
    }
  }
  // The write items hold what they copy from (the tensors' storage, shared);
  // the caller's state dict itself is no longer referenced.
  p.split = {};
  p.tensors.clear();
  p.objects.clear();
  return AsyncRequest(std::move(impl));
}

AsyncCallsQueue::AsyncCallsQueue(Communicator& comm, AsyncQueueOptions options)
    : comm_(comm),
      options_(options),
      // Not pinned: device shards reach it already copied into pinned host
      // tensors (io/device_copies.h), so pinning it too would only lock a
      // second copy of the state (and start CUDA in CPU-only jobs).
      pool_(io::BufferPool::create({options.staging_capacity_bytes, /*pinned=*/false})),
      plan_cache_(SavePlanCache::create()) {
  if (options_.max_in_flight < 1) throw UsageError("AsyncQueueOptions::max_in_flight must be at least 1");
}

AsyncCallsQueue::~AsyncCallsQueue() = default;  // pending requests are abandoned

void AsyncCallsQueue::check_open(const char* what) const {
  if (closed_) throw UsageError(fmt::format("AsyncCallsQueue::{}: the queue is closed", what));
}

int64_t AsyncCallsQueue::save(const StateDict& sharded_state_dict, const std::string& dir, const SaveOptions& options) {
  check_open("save");
  // Finalize first, so the new save's staging can reuse the old one's buffers.
  if (pending_.size() >= options_.max_in_flight) finalize_front(pending_.size() - options_.max_in_flight + 1);
  SaveOptions with_cache = options;
  if (!with_cache.plan_cache) with_cache.plan_cache = plan_cache_;
  return schedule(async_save(sharded_state_dict, dir, comm_, with_cache, pool_, options_.staging));
}

void AsyncCallsQueue::wait_staged() {
  for (Pending& p : pending_) p.request.wait_staged();
}

int64_t AsyncCallsQueue::schedule(AsyncRequest request) {
  check_open("schedule");
  if (pending_.size() >= options_.max_in_flight) finalize_front(pending_.size() - options_.max_in_flight + 1);
  pending_.push_back(Pending{next_index_, std::move(request)});
  return next_index_++;
}

std::vector<int64_t> AsyncCallsQueue::finalize_front(size_t count) {
  std::vector<int64_t> done;
  while (count-- > 0 && !pending_.empty()) {
    Pending front = std::move(pending_.front());
    pending_.pop_front();  // finalized or failed: either way it leaves the queue
    front.request.finalize(comm_);
    done.push_back(front.index);
  }
  return done;
}

std::vector<int64_t> AsyncCallsQueue::maybe_finalize(bool blocking) {
  if (pending_.empty()) return {};
  if (blocking) return finalize_front(pending_.size());
  // How many saves, from the oldest, are over here; the minimum over all
  // ranks is what every rank can finalize without waiting.
  uint64_t ready = 0;
  while (ready < pending_.size() && pending_[ready].request.locally_done()) ++ready;
  const std::vector<std::string> all = comm_.all_gather_bytes(plan::encode_save_progress(ready));
  uint64_t everywhere = ready;
  for (size_t r = 0; r < all.size(); ++r) {
    everywhere = std::min(everywhere, plan::decode_save_progress(all[r], fmt::format("rank {}", r)));
  }
  return finalize_front(static_cast<size_t>(everywhere));
}

void AsyncCallsQueue::close() {
  if (closed_) return;
  closed_ = true;
  maybe_finalize(/*blocking=*/true);
}

}  // namespace distckpt
