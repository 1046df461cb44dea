#include "load/read_engine.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "comm/agreement.h"
#include "distckpt/core/errors.h"
#include "format/dtype.h"
#include "io/threads.h"
#include "load/exchange.h"
#include "load/host_exchange.h"
#include "load/read_planning.h"
#include "load/slab_copy.h"
#include "plan/messages.h"

namespace distckpt::loading {
namespace {

using Task = std::function<void()>;

constexpr const char* kFirstReadPhase = "plan the fully parallel load";

// A part of the reads' first agreement with a check in front (FirstAgreementCheck): its length, the check, the part.
std::string with_check(const std::string& check, const std::string& part) {
  const auto length = static_cast<uint32_t>(check.size());
  std::string out(sizeof length, '\0');
  std::memcpy(out.data(), &length, sizeof length);
  return out + check + part;
}

// Removes the check in front of each rank's part; returns the checks, by rank.
std::vector<std::string> take_checks(std::vector<std::string>& parts) {
  std::vector<std::string> checks(parts.size());
  for (size_t r = 0; r < parts.size(); ++r) {
    uint32_t length = 0;
    if (parts[r].size() >= sizeof length) std::memcpy(&length, parts[r].data(), sizeof length);
    if (parts[r].size() < sizeof length || parts[r].size() - sizeof length < length) {
      throw ProtocolError(
          fmt::format("rank {} sent a {}-byte part without the check it must carry", r, parts[r].size()));
    }
    checks[r] = parts[r].substr(sizeof length, length);
    parts[r].erase(0, sizeof length + length);
  }
  return checks;
}

// Runs tasks on a few threads; keeps the first error.
class TaskRunner {
 public:
  TaskRunner(std::vector<Task> tasks, int threads) : tasks_(std::move(tasks)) {
    const size_t n = std::min(tasks_.size(), static_cast<size_t>(std::max(threads, 1)));
    io::start_threads(
        threads_, n, [this] { run(); }, "reading the checkpoint");
  }
  ~TaskRunner() { join(); }
  std::exception_ptr join() {
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    return error_;
  }

 private:
  void run() {
    at::NoGradGuard no_grad;  // thread-local: destinations are often parameters
    for (size_t i = next_++; i < tasks_.size(); i = next_++) {
      try {
        tasks_[i]();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_ = tasks_.size();  // stop early: the load fails anyway
      }
    }
  }
  std::vector<Task> tasks_;
  std::atomic<size_t> next_{0};
  std::mutex mutex_;
  std::exception_ptr error_;
  std::vector<std::thread> threads_;
};

// Whether `part`'s elements are one contiguous run of `piece`'s row-major bytes.
bool dense_in(const Box& piece, const Box& part) {
  size_t d = 0;
  while (d < part.ndim() && part.length[d] == 1) ++d;  // leading single rows
  if (d == part.ndim()) return true;
  for (size_t e = d + 1; e < part.ndim(); ++e) {
    if (part.length[e] != piece.length[e]) return false;  // every later axis whole
  }
  return true;
}

uint64_t first_element(const Box& piece, const Box& part) {
  const Shape strides = contiguous_strides(piece.length);
  uint64_t first = 0;
  for (size_t d = 0; d < piece.ndim(); ++d)
    first += static_cast<uint64_t>((part.offset[d] - piece.offset[d]) * strides[d]);
  return first;
}

// Scattering runs shorter than this costs more than reading a slab and copying.
constexpr uint64_t kMinScatterRunBytes = 512;

// The byte runs (relative to the chunk) of reads[order[i..j)]'s parts of
// `piece`, each into its contiguous destination, by offset. False when they
// overlap (two parts of one element) or are too short to be worth it.
bool scatter_runs(const plan::StoredPiece& piece, const std::vector<TensorRead>& reads,
                  const std::vector<size_t>& order, size_t i, size_t j, uint64_t element, std::vector<ByteRun>& runs) {
  const Shape strides = contiguous_strides(piece.box.length);
  for (size_t k = i; k < j; ++k) {
    const Box& part = reads[order[k]].need.part;
    auto* out = static_cast<uint8_t*>(reads[order[k]].dest.data_ptr());
    const size_t nd = part.ndim();
    size_t axis = nd - 1;  // runs span `axis` and every axis after it, which the part covers whole
    while (axis > 0 && part.length[axis] == piece.box.length[axis]) --axis;
    uint64_t run = static_cast<uint64_t>(part.length[axis]);
    for (size_t d = axis + 1; d < nd; ++d) run *= static_cast<uint64_t>(piece.box.length[d]);
    if (run * element < kMinScatterRunBytes) return false;
    uint64_t base = 0;  // the part's first element in the piece
    for (size_t d = 0; d < nd; ++d) base += static_cast<uint64_t>((part.offset[d] - piece.box.offset[d]) * strides[d]);
    std::vector<int64_t> index(axis, 0);  // over the axes before `axis`, last fastest
    for (uint64_t n = 0, count = static_cast<uint64_t>(part.numel()) / run; n < count; ++n) {
      uint64_t at = base;
      for (size_t d = 0; d < axis; ++d) at += static_cast<uint64_t>(index[d] * strides[d]);
      runs.push_back(ByteRun{piece.byte_in_chunk + at * element, run * element, out + n * run * element});
      for (size_t d = axis; d-- > 0;) {
        if (++index[d] < part.length[d]) break;
        index[d] = 0;
      }
    }
  }
  std::sort(runs.begin(), runs.end(), [](const ByteRun& a, const ByteRun& b) { return a.offset < b.offset; });
  for (size_t k = 1; k < runs.size(); ++k) {
    if (runs[k - 1].offset + runs[k - 1].bytes > runs[k].offset) return false;
  }
  return true;
}

// Tasks reading the pieces this rank reads itself (shared_slot == -1).
std::vector<Task> private_tasks(CheckpointReader& reader, const std::vector<TensorRead>& reads,
                                const std::vector<int32_t>& shared_slot, uint64_t slab_bytes) {
  std::vector<size_t> order;
  for (size_t i = 0; i < reads.size(); ++i) {
    if (shared_slot[i] < 0) order.push_back(i);
  }
  // In the order the bytes lie in the files (a file system reads ahead;
  // a format such as DCP stores items in an order of its own), each piece's
  // reads together.
  const auto place = [&](const plan::PieceNeed& n) {
    const TensorRecord& record = reader.tensor_at(n.tensor);
    const plan::StoredPiece& piece = reader.index_for(record).pieces()[n.piece];
    const ChunkRecord& chunk = record.chunks[piece.chunk];
    return std::make_tuple(chunk.file, chunk.byte_offset + piece.byte_in_chunk, n.tensor, n.piece);
  };
  std::vector<decltype(place(plan::PieceNeed{}))> places(reads.size());
  for (const size_t i : order) places[i] = place(reads[i].need);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return places[a] < places[b]; });
  const uint64_t block = std::max<uint64_t>(reader.storage().checksum_block_size(), 1);
  const uint64_t step = std::max<uint64_t>(1, slab_bytes / block) * block;  // whole checksum blocks per task
  std::vector<Task> tasks;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    const plan::PieceNeed& first = reads[order[i]].need;
    while (j < order.size() && reads[order[j]].need.tensor == first.tensor && reads[order[j]].need.piece == first.piece)
      ++j;
    const TensorRecord& record = reader.tensor_at(first.tensor);
    const plan::StoredPiece& piece = reader.index_for(record).pieces()[first.piece];
    const uint64_t element = record.element_size();
    bool as_stored = true, dense = true;  // every destination holds the stored bytes as they are / in one run
    for (size_t k = i; k < j && as_stored; ++k) {
      const TensorRead& r = reads[order[k]];
      as_stored = r.dest.device().is_cpu() && r.dest.is_contiguous() && r.dest.scalar_type() == record.dtype;
      dense = dense && dense_in(piece.box, r.need.part);
    }
    std::vector<ByteRun> runs;
    if (as_stored && !dense && scatter_runs(piece, reads, order, i, j, element, runs)) {
      // Strided parts read straight into their destinations, in tasks of whole checksum blocks.
      for (size_t a = 0; a < runs.size();) {
        const uint64_t limit = (runs[a].offset / step + 1) * step;
        std::vector<ByteRun> task;
        for (; a < runs.size() && runs[a].offset < limit; ++a) {
          ByteRun run = runs[a];
          if (run.offset + run.bytes > limit) {  // the rest starts the next task
            run.bytes = limit - run.offset;
            runs[a] = ByteRun{limit, runs[a].bytes - run.bytes, runs[a].out + run.bytes};
            task.push_back(run);
            break;
          }
          task.push_back(run);
        }
        tasks.push_back([&reader, &record, chunk = piece.chunk, task = std::move(task)] {
          reader.read_chunk_runs(record, chunk, task);
        });
      }
    } else if (as_stored && dense) {  // the stored bytes are the destination's bytes (else copies convert the dtype)
      for (size_t k = i; k < j; ++k) {
        const TensorRead& r = reads[order[k]];
        const uint64_t begin = piece.byte_in_chunk + first_element(piece.box, r.need.part) * element;
        const uint64_t end = begin + static_cast<uint64_t>(r.need.part.numel()) * element;
        auto* out = static_cast<uint8_t*>(r.dest.data_ptr());
        for (uint64_t b = begin; b < end;) {
          const uint64_t e = std::min(end, (b / step + 1) * step);
          tasks.push_back([&reader, &record, chunk = piece.chunk, b, e, dst = out + (b - begin), keep = r.dest] {
            reader.read_chunk_bytes(record, chunk, b, e, dst);
          });
          b = e;
        }
      }
    } else {  // read the rows the parts span once, in slabs, and copy every part out
      std::vector<const TensorRead*> group;
      for (size_t k = i; k < j; ++k) group.push_back(&reads[order[k]]);
      tasks.push_back([&reader, &record, &piece, group, slab_bytes] {
        std::vector<const Box*> parts;
        for (const TensorRead* r : group) parts.push_back(&r->need.part);
        const auto rows = plan::row_span(piece.box, parts);
        thread_local std::vector<uint8_t> buffer;
        for (const Box& slab : plan::cut_slabs(piece.box, rows.first, rows.second, record.element_size(), slab_bytes)) {
          buffer.resize(static_cast<size_t>(slab.numel()) * record.element_size());
          read_slab(reader, record, piece, slab, buffer.data());
          for (const TensorRead* r : group) copy_slab_to_dest(buffer.data(), slab, record.dtype, r->need.part, r->dest);
        }
      });
    }
    i = j;
  }
  return tasks;
}

// What planning brought this rank, and what it keeps between staging rounds.
struct Planning {
  const std::vector<std::string>& plans;               // the agreement on planning's, by rank
  std::vector<std::string> decisions;                  // partitioned: every scheduler's message to this rank
  std::vector<std::vector<plan::PieceNeed>> my_needs;  // per staging round
  std::vector<plan::LoadShare> shares;                 // partitioned: per staging round
  std::vector<bool> within_host;                       // partitioned: per staging round, whether any rank shares memory
  size_t rounds = 1;                                   // staging rounds every rank runs
};

// Reads one round's pieces; with `planning`, pieces several ranks need are
// read once and exchanged, after `prepare` and an agreement on the round's
// share (an `earlier` error of any rank fails the agreement on every rank,
// which rethrows). Returns this rank's read error.
std::exception_ptr read_round(CheckpointReader& reader, const std::vector<TensorRead>& reads, Communicator& comm,
                              const ReadEngineOptions& options, Planning* planning, size_t round,
                              const std::exception_ptr& earlier, const std::function<void()>& prepare,
                              FirstAgreementCheck* check) {
  const int me = comm.rank();
  plan::LoadShare whole;  // the rounds exchange's share, or none
  const plan::LoadShare* share = &whole;
  uint64_t exchange_rounds = 0;
  const bool partitioned = partitioned_reads(options);
  std::optional<ExchangeContext> context;  // once the share is known; the host exchange holds it
  std::unique_ptr<HostExchange> host;
  std::vector<std::string> offers;  // what each peer offers this rank within the host
  if (planning) {
    // Agreed, and carrying the shared-memory offers: the exchange within the host needs one collective less.
    // A later round's agreement also reports what failed in the round before it.
    const std::string phase = round > 0 ? fmt::format("read the tensors (staging round {})", round)
                              : check   ? check->phase
                                        : std::string(kFirstReadPhase);
    const auto step = [&] {
      if (earlier) std::rethrow_exception(earlier);
      prepare();
      if (partitioned) {
        if (round == 0) {
          planning->rounds = merge_shares(catalog_of(reader), planning->decisions, planning->my_needs, me,
                                          planning->shares, planning->within_host);
        }
        share = &planning->shares.at(round);
      } else {
        if (round == 0) planning->rounds = staging_rounds(planning->plans, comm.size());
        whole = share_from_all_plans(catalog_of(reader), planning->plans, round, options, me, exchange_rounds);
      }
      if (share->slot.size() != reads.size()) {
        throw ProtocolError(fmt::format("a share of {} needs for {} reads", share->slot.size(), reads.size()));
      }
      context.emplace(ExchangeContext{reader, comm, *share, reads, options.slab_bytes});
      // Shared memory only where some rank shares a piece within its host: every rank knows it from the schedulers.
      if (!partitioned || options.exchange != LoadExchange::kAuto || !planning->within_host.at(round)) {
        return std::vector<std::string>(static_cast<size_t>(comm.size()));
      }
      host = std::make_unique<HostExchange>(*context);
      return host->offers();
    };
    offers = all_to_all_agreed(comm, phase, [&] {
      std::vector<std::string> parts = step();
      if (check) {
        for (std::string& part : parts) part = with_check(check->mine, part);
      }
      return parts;
    });
    if (check) {
      check->held = check->holds(take_checks(offers));
      if (!check->held) return nullptr;  // nothing read; the host exchange, never set up, goes
    }
  } else {
    prepare();
    whole.slot.assign(reads.size(), -1);
  }

  // From here on a failure is this rank's read error, returned: it still
  // joins the next agreement, which reports it on every rank.
  std::exception_ptr error;
  try {
    // Mapped, and the names removed, before any read: a rank killed while reading leaves none behind.
    const bool on_host = host && host->set_up(offers);
    // The pieces this rank reads itself: its own, and its parts of same_host ones when shared memory is out.
    std::vector<int32_t> own = share->slot;
    for (int32_t& slot : own) {
      if (slot < 0 || on_host || !share->pieces[static_cast<size_t>(slot)].same_host) continue;
      const std::vector<int>& holders = share->pieces[static_cast<size_t>(slot)].geometry.holders;
      if (!holders.empty() && !std::binary_search(holders.begin(), holders.end(), me)) {
        throw UsageError(
            "shared memory could not be set up on this host, and only the ranks that hold a transfer's sources can "
            "read them: transfer with LoadExchange::kBroadcast (messages) instead");
      }
      slot = -1;
    }
    TaskRunner runner(private_tasks(reader, reads, own, options.slab_bytes), options.threads);
    if (planning) {
      // Messages first: ranks on other hosts wait for them.
      // kAuto and kBroadcast: point to point between hosts (kAuto: shared memory within one).
      error = exchange_shared_pieces(
          *context, partitioned ? comm::ExchangeMode::kPointToPoint : comm::ExchangeMode::kRounds, exchange_rounds);
      std::exception_ptr host_error;
      if (on_host) host->run(host_error);
      if (!error) error = host_error;
    }
    const std::exception_ptr private_error = runner.join();
    if (private_error) error = private_error;  // this rank's own read failure names the cause
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  return error;
}

}  // namespace

std::vector<std::string> agree_on_read_plans(Communicator& comm, const std::string& phase,
                                             const ReadEngineOptions& options,
                                             const std::function<const std::vector<std::vector<TensorRead>>&()>& plan) {
  if (!shares_reads(options, comm)) {
    return gather_agreed(comm, phase, [&] {
      plan();
      return std::string();
    });
  }
  if (!partitioned_reads(options)) {
    return gather_agreed(comm, phase, [&] { return whole_read_plan(plan(), comm.rank(), options.slab_bytes); });
  }
  return all_to_all_agreed(comm, phase, [&] {
    const std::vector<std::vector<TensorRead>>& rounds = plan();
    std::string host;
    if (options.exchange == LoadExchange::kAuto) {  // pieces needed on one host only go through its memory
      char name[256] = {};
      if (gethostname(name, sizeof name - 1) == 0) host = name;
    }
    return route_read_plan(rounds, comm.rank(), comm.size(), host);
  });
}

void join_first_read_agreement(Communicator& comm, FirstAgreementCheck& check, const std::exception_ptr& error) {
  if (comm.size() == 1) {
    if (error) std::rethrow_exception(error);
    check.held = check.holds({check.mine});
  } else {
    std::vector<std::string> parts = all_to_all_agreed(comm, check.phase, [&] {
      if (error) std::rethrow_exception(error);
      return std::vector<std::string>(static_cast<size_t>(comm.size()), with_check(check.mine, ""));
    });
    check.held = check.holds(take_checks(parts));
  }
  if (check.held) throw ProtocolError("the ranks agreed to replay a plan this rank does not have: a bug");
}

std::exception_ptr execute_reads(CheckpointReader& reader, std::vector<std::vector<TensorRead>>& rounds,
                                 Communicator& comm, const ReadEngineOptions& options,
                                 const std::vector<std::string>& plans, DeviceStaging& staging,
                                 std::vector<std::string>* decisions, std::exception_ptr earlier,
                                 FirstAgreementCheck* check) {
  at::NoGradGuard no_grad;
  const bool share = shares_reads(options, comm);
  if (earlier && !share) return earlier;  // nobody waits for this rank's reads
  if (check && !share) {
    check->held = check->holds({check->mine});
    if (!check->held) return nullptr;
  }
  Planning planning{plans, {}, {}, {}, {}, 1};
  if (share) {
    for (const std::vector<TensorRead>& reads : rounds) {
      planning.my_needs.emplace_back();
      for (const TensorRead& r : reads) planning.my_needs.back().push_back(r.need);
    }
    if (partitioned_reads(options) && decisions && !decisions->empty()) {
      planning.decisions = *decisions;
    } else if (partitioned_reads(options)) {
      // The schedulers' shares, merged (and checked) in the first round's agreement.
      planning.decisions = all_to_all_agreed(comm, "schedule the reads of pieces several ranks need", [&] {
        return schedule_routed_needs(catalog_of(reader), plans, options, comm.rank());
      });
      if (decisions) *decisions = planning.decisions;
    }
  }
  std::vector<TensorRead> none;  // a round past this rank's last
  std::exception_ptr error = earlier;
  for (size_t k = 0; k < std::max<size_t>(1, share ? planning.rounds : rounds.size()); ++k) {
    std::vector<TensorRead>& reads = k < rounds.size() ? rounds[k] : none;
    try {
      error = read_round(
          reader, reads, comm, options, share ? &planning : nullptr, k, error, [&] { staging.stage(reads, k); },
          k == 0 ? check : nullptr);
      if (check && !check->held) return nullptr;
    } catch (...) {
      // Shared: the agreement threw, on every rank alike (the failed rank
      // rethrows what failed in its staging, copies or reads), so all stop.
      // With a check, ranks that joined without a plan threw already: none
      // goes on to a later agreement.
      if (check && k == 0) throw;
      return std::current_exception();
    }
    if (!error) {
      try {
        staging.deliver();
      } catch (...) {
        error = std::current_exception();  // the next round's agreement reports it
      }
    }
    if (error && !share) return error;  // no other rank waits for this one's rounds
  }
  return error;
}

std::exception_ptr fail_reads(Communicator& comm, const ReadEngineOptions& options, const std::exception_ptr& error) {
  if (!shares_reads(options, comm)) return error;
  try {
    all_to_all_agreed(comm, kFirstReadPhase, [&]() -> std::vector<std::string> { std::rethrow_exception(error); });
  } catch (...) {
    return std::current_exception();  // agreed: what every rank's execute_reads returns
  }
  return error;  // not reached: the agreement raised this rank's error
}

}  // namespace distckpt::loading
