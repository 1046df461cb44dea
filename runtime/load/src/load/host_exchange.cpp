#include "load/host_exchange.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "distckpt/comm/process_group.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "io/checksum.h"
#include "io/shared_memory.h"
#include "io/threads.h"
#include "load/slab_copy.h"

namespace distckpt::loading {
namespace {

// Status bytes; an unwritten one reads 0, which is neither.
constexpr uint8_t kFailed = 1, kOk = 2;
constexpr char kRefused = '!';  // starts a setup answer that refuses
// Reader threads per reading rank, each taking its share of the pieces this
// rank reads (a piece's slabs stay on one thread, which then reads a
// checksum block two slabs share once). One: on this project's benchmark
// disk, two streams per rank read at about half the speed of one
// (docs/PERFORMANCE.md).
constexpr uint32_t kReadThreads = 1;
// Slots per reading rank: a reader may run this many rounds ahead of the
// slowest needer of its slabs.
constexpr uint32_t kSlots = 4;
// A region: three counters on cache lines of their own, one status byte per
// slab the rank reads, then its slots on a page boundary.
constexpr uint64_t kProducedAt = 0, kCopiedAt = 64, kAbandonedAt = 128, kStatusAt = 192, kPage = 4096;
// How often a waiting rank checks that its peer still exists.
constexpr std::chrono::milliseconds kLivenessSlice{100};
constexpr std::chrono::minutes kDefaultTimeout{5};  // ProcessGroupOptions' default

// One slab of a same_host piece, placed in its reader's region.
struct HostSlab {
  uint32_t round = 0;
  int reader = 0;
  size_t shared = 0, slab = 0;
  uint64_t offset = 0;  // in the reader's slot
  uint32_t seq = 0;     // among the reader's slabs: its status byte
};

// A rank's region layout, which every rank derives from the schedule.
struct Layout {
  uint32_t slabs = 0;     // it reads
  uint32_t pieces = 0;    // it reads
  uint64_t slot = 0;      // bytes of one slot
  bool involved = false;  // reads or needs a same_host slab
  uint64_t slots_at() const { return (kStatusAt + slabs + kPage - 1) / kPage * kPage; }
  uint64_t bytes() const { return slots_at() + kSlots * slot; }
};

// This process's pid namespace: pids in region names mean something here
// only if the peer shares it.
uint64_t pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// A peer's text, fit for a log line.
std::string printable(std::string text) {
  if (text.size() > 500) text = text.substr(0, 500) + "...";
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return text;
}

}  // namespace

class HostExchange::Rounds {
 public:
  explicit Rounds(const ExchangeContext& c)
      : c_(c),
        me_(c.comm.rank()),
        layout_(static_cast<size_t>(c.comm.size())),
        timeout_(c.comm.timeout().value_or(kDefaultTimeout)) {
    place_slabs();
  }

  // Not collective: this rank's region, created when it takes part, and
  // what its peers need to map it (empty when it takes no part).
  std::string offer() {
    const Layout& own = layout_[static_cast<size_t>(me_)];
    if (rounds_ == 0 || !own.involved) return {};
    try {
      region_ = io::SharedRegion::create(own.bytes());
      return fmt::format("{} {} {}", region_.name(), pid_namespace(), layout_digest());
    } catch (const std::exception& e) {
      return std::string(1, kRefused) + e.what();
    }
  }

  // Every rank's offer (all-gathered by the caller): region name, pid
  // namespace and layout digest; then one all-gather of whether every rank
  // mapped its peers' regions, after which the names are unlinked. A refusal
  // anywhere makes every rank return false before anything is read.
  bool set_up(const std::vector<std::string>& offers) {
    if (rounds_ == 0) return true;
    if (offers.size() != layout_.size()) {
      throw ProtocolError(fmt::format("{} shared-memory offers for {} ranks", offers.size(), layout_.size()));
    }
    const std::string digest = layout_digest();
    const auto fall_back = [this] {
      region_ = io::SharedRegion();  // its name goes now, not when the reads are done
      return false;
    };
    if (refused(offers)) return fall_back();
    std::vector<std::string> names(offers.size());
    std::vector<uint64_t> namespaces(offers.size(), 0);
    for (size_t r = 0; r < offers.size(); ++r) {
      if (offers[r].empty()) continue;
      std::istringstream fields(offers[r]);
      std::string peer_digest;
      fields >> names[r] >> namespaces[r] >> peer_digest;
      if (peer_digest != digest) {  // every rank sees every offer: all throw
        throw UsageError(
            fmt::format("rank {} planned the load's exchange within the host differently from rank {}: pass the same "
                        "LoadOptions (exchange_batch_bytes) and the same request structure on every rank",
                        r, me_));
      }
    }
    std::string mapped;
    try {
      std::set<int> peers = readers_;
      peers.insert(needers_.begin(), needers_.end());
      const uint64_t own_namespace = pid_namespace();
      for (int p : peers) {
        const std::string& name = names[static_cast<size_t>(p)];
        Peer peer{io::SharedRegion::open_read_only(name, layout_[static_cast<size_t>(p)].bytes()), pid_in(name)};
        // A pid from another namespace names some other process: only the timeout watches that peer.
        peer.watch_pid = own_namespace != 0 && namespaces[static_cast<size_t>(p)] == own_namespace;
        if (peer.watch_pid && ::kill(peer.pid, 0) != 0 && errno == ESRCH) {
          throw CommError(fmt::format("rank {}'s process {} is not visible from rank {}", p, peer.pid, me_));
        }
        peers_.emplace(p, std::move(peer));
      }
    } catch (const std::exception& e) {
      mapped = std::string(1, kRefused) + e.what();
    }
    if (refused(c_.comm.all_gather_bytes(mapped))) return fall_back();
    region_.unlink();  // every peer holds its mapping now
    return true;
  }

  void run(std::exception_ptr& error) {
    if (rounds_ == 0) return;
    if (layout_[static_cast<size_t>(me_)].involved) {
      std::vector<std::exception_ptr> reader_errors(kReadThreads);
      {
        std::vector<std::thread> readers;
        struct Join {  // on every path; a failure also tells the threads and the peers to stop waiting
          Rounds& x;
          std::vector<std::thread>& threads;
          bool ok = false;
          ~Join() {
            if (!ok) x.abandon();
            for (std::thread& t : threads) t.join();
          }
        } join{*this, readers};
        readers.reserve(kReadThreads);  // a thread made never waits for room in the vector
        for (uint32_t i = 0; i < kReadThreads && layout_[static_cast<size_t>(me_)].slabs > 0; ++i) {
          readers.push_back(io::start_thread(
              [this, i, &reader_errors] {
                try {
                  read_rounds(i);
                } catch (...) {
                  reader_errors[i] = std::current_exception();
                  abandon();  // this rank's rounds will not all be published
                }
              },
              "reading the pieces this rank shares within its host"));
        }
        copy_rounds();
        join.ok = true;
      }
      for (const std::exception_ptr& e : reader_errors) {
        if (e) std::rethrow_exception(e);
      }
    }
    error = error_;
  }

 private:
  // Rounds: each reader's slabs in schedule order, a new round whenever the
  // next slab would overflow its batch (a slab larger than the batch gets a
  // round of its own).
  void place_slabs() {
    struct Cursor {
      uint32_t round = 0;
      uint64_t used = 0;
    };
    std::vector<Cursor> cursor(layout_.size());
    thread_of_.assign(c_.schedule.shared.size(), 0);
    for (size_t k = 0; k < c_.schedule.shared.size(); ++k) {
      const plan::SharedPiece& s = c_.schedule.shared[k];
      if (!s.same_host) continue;
      for (const plan::SharedPiece::Needer& n : s.needers) layout_[static_cast<size_t>(n.rank)].involved = true;
      Layout& reader = layout_[static_cast<size_t>(s.reader)];
      thread_of_[k] = reader.pieces++ % kReadThreads;
      for (size_t i = 0; i < s.slabs.size(); ++i) {
        const uint64_t bytes = static_cast<uint64_t>(s.slabs[i].numel()) * s.geometry.element_size;
        Cursor& at = cursor[static_cast<size_t>(s.reader)];
        if (at.used > 0 && at.used + bytes > c_.batch_bytes) at = Cursor{at.round + 1, 0};
        slabs_.push_back(HostSlab{at.round, s.reader, k, i, at.used, reader.slabs++});
        at.used += bytes;
        reader.slot = std::max(reader.slot, at.used);
        rounds_ = std::max(rounds_, at.round + 1);
      }
    }
    std::stable_sort(slabs_.begin(), slabs_.end(),
                     [](const HostSlab& a, const HostSlab& b) { return a.round < b.round; });
    round_begin_.assign(rounds_ + 1, slabs_.size());
    threads_done_.assign(rounds_, 0);
    for (size_t e = slabs_.size(); e-- > 0;) round_begin_[slabs_[e].round] = e;
    mine_.assign(c_.schedule.shared.size(), nullptr);
    for (size_t k = 0; k < c_.schedule.shared.size(); ++k) {
      const plan::SharedPiece& s = c_.schedule.shared[k];
      for (const plan::SharedPiece::Needer& n : s.needers) {
        if (!s.same_host) continue;
        if (n.rank == me_) mine_[k] = &n;
        if (s.reader == me_ && n.rank != me_) needers_.insert(n.rank);
        if (n.rank == me_ && s.reader != me_) readers_.insert(s.reader);
      }
    }
  }

  // What every rank must agree on to read each other's regions: the rounds
  // and every rank's layout (they follow from the schedule and the batch).
  std::string layout_digest() const {
    io::StreamingHash hash;
    const uint64_t head[] = {rounds_, kSlots, c_.batch_bytes};
    hash.update(head, sizeof head);
    for (const Layout& l : layout_) {
      const uint64_t fields[] = {l.slabs, l.pieces, l.slot, l.involved ? 1u : 0u};
      hash.update(fields, sizeof fields);
    }
    return io::hex64(hash.digest());
  }

  bool refused(const std::vector<std::string>& answers) const {
    for (size_t r = 0; r < answers.size(); ++r) {
      if (answers[r].empty() || answers[r][0] != kRefused) continue;
      log_message(LogLevel::kWarning, fmt::format("ranks on one host will each read the pieces they share instead of "
                                                  "reading them once into shared memory: rank {}: {}",
                                                  r, printable(answers[r].substr(1))));
      return true;
    }
    return false;
  }

  // The process id in a region name ("/distckpt-<pid>-<hex>", checked by open_read_only).
  static pid_t pid_in(const std::string& name) {
    const unsigned long long pid = std::stoull(name.substr(name.find('-') + 1));
    if (pid == 0 || pid > INT_MAX) throw ProtocolError(fmt::format("shared memory name {} holds no process id", name));
    return static_cast<pid_t>(pid);
  }

  uint8_t* slot_of(uint8_t* base, int reader, uint32_t round) const {
    const Layout& l = layout_[static_cast<size_t>(reader)];
    return base + l.slots_at() + (round % kSlots) * l.slot;
  }

  // Tells this rank's threads and its peers to stop waiting for it.
  void abandon() {
    {
      std::lock_guard<std::mutex> lock(mutex_);  // a reader thread between its check and its wait sees it
      stop_ = true;
    }
    published_changed_.notify_all();
    if (region_.data() != nullptr) io::raise_counter(region_.data() + kAbandonedAt, 1);
  }

  // Until the counter at `offset` of rank `peer`'s region reaches `target`;
  // false when this rank stops. Throws CommError when the peer gave up, its
  // process is gone, or the counter stood still for the communicator's timeout.
  bool wait_for(int peer, uint64_t offset, uint32_t target, const char* what) {
    const Peer& p = peers_.at(peer);
    const uint8_t* counter = p.region.data() + offset;
    uint32_t seen = io::read_counter(counter);
    auto last_change = std::chrono::steady_clock::now();
    while (seen < target) {
      if (stop_) return false;
      if (io::read_counter(p.region.data() + kAbandonedAt) != 0) {
        throw CommError(fmt::format(
            "rank {} gave up the load's exchange within the host while rank {} waited for it to {}; its own error "
            "says why",
            peer, me_, what));
      }
      const uint32_t now = io::wait_counter_change(counter, seen, kLivenessSlice);
      if (now != seen) {
        seen = now;
        last_change = std::chrono::steady_clock::now();
        continue;
      }
      if (p.watch_pid && ::kill(p.pid, 0) != 0 && errno == ESRCH) {
        throw CommError(fmt::format(
            "rank {} (process {}) is gone: it exited while rank {} waited for it to {} in the load's exchange within "
            "the host",
            peer, p.pid, me_, what));
      }
      if (std::chrono::steady_clock::now() - last_change > timeout_) {
        throw CommError(fmt::format(
            "the load's exchange within the host timed out after {:g} s on rank {} of {}: rank {} did not {} in "
            "time; a peer rank is probably hung (stopped, deadlocked, stuck in I/O) or dead. Check the other ranks' "
            "output; if they are only slow, raise the timeout ({} or ProcessGroupOptions::timeout)",
            std::chrono::duration<double>(timeout_).count(), me_, c_.comm.size(), peer, what, kTimeoutVariable));
      }
    }
    return true;
  }

  // Reader thread `which`: this rank's slabs of its pieces of that thread,
  // round by round, into their slot once the round that slot held is done
  // here and every needer copied it; its own parts copied out; status bytes
  // written. The thread that completes a round raises the round count over
  // every round completed in order.
  void read_rounds(uint32_t which) {
    at::NoGradGuard no_grad;  // thread-local: destinations are often parameters
    uint8_t* base = region_.data();
    for (uint32_t u = 0; u < rounds_ && !stop_; ++u) {
      if (u >= kSlots) {
        {
          std::unique_lock<std::mutex> lock(mutex_);
          published_changed_.wait(lock, [&] { return stop_ || published_ >= u - kSlots + 1; });
        }
        for (int n : needers_) {
          if (!wait_for(n, kCopiedAt, u - kSlots + 1, "copy its parts out of this rank's shared memory")) return;
        }
      }
      for (size_t e = round_begin_[u]; e < round_begin_[u + 1]; ++e) {
        const HostSlab& h = slabs_[e];
        if (h.reader != me_ || thread_of_[h.shared] != which) continue;
        const plan::SharedPiece& s = c_.schedule.shared[h.shared];
        const TensorRecord& record = c_.reader.index().tensors.at(s.tensor);
        uint8_t* data = slot_of(base, me_, u) + h.offset;
        uint8_t status = kOk;
        try {
          read_slab(c_.reader, record, c_.reader.index_for(record).pieces().at(s.piece), s.slabs[h.slab], data);
          copy_parts(h, data);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mutex_);
          if (!error_) error_ = std::current_exception();
          status = kFailed;
        }
        base[kStatusAt + h.seq] = status;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      ++threads_done_[u];
      while (published_ < rounds_ && threads_done_[published_] == kReadThreads) {
        io::raise_counter(base + kProducedAt, ++published_);
      }
      published_changed_.notify_all();
    }
  }

  // The main thread: this rank's parts of the other readers' slabs, round by
  // round, then the round count published. A failed slab is skipped: its
  // reader raises the cause when the ranks agree on errors.
  void copy_rounds() {
    for (uint32_t t = 0; t < rounds_; ++t) {
      for (size_t e = round_begin_[t]; e < round_begin_[t + 1]; ++e) {
        const HostSlab& h = slabs_[e];
        if (h.reader == me_ || mine_[h.shared] == nullptr) continue;
        if (!wait_for(h.reader, kProducedAt, t + 1, "read its slabs into shared memory")) return;
        const uint8_t* base = peers_.at(h.reader).region.data();
        const uint8_t status = base[kStatusAt + h.seq];
        if (status == kOk) {
          copy_parts(h, slot_of(const_cast<uint8_t*>(base), h.reader, t) + h.offset);
        } else if (status != kFailed) {
          throw ProtocolError(fmt::format("rank {} published a slab with status byte {} (neither ok nor failed)",
                                          h.reader, int{status}));
        }
      }
      io::raise_counter(region_.data() + kCopiedAt, t + 1);
    }
  }

  void copy_parts(const HostSlab& h, const uint8_t* data) const {
    const plan::SharedPiece& s = c_.schedule.shared[h.shared];
    const at::ScalarType dtype = c_.reader.index().tensors.at(s.tensor).dtype;
    for (uint32_t need : mine_[h.shared]->needs) {
      const TensorRead& r = c_.mine[need];
      copy_slab_to_dest(data, s.slabs[h.slab], dtype, r.need.part, r.dest);
    }
  }

  struct Peer {
    io::SharedRegion region;
    pid_t pid = 0;
    bool watch_pid = false;
  };

  const ExchangeContext& c_;
  const int me_;
  std::vector<Layout> layout_;  // by rank
  const std::chrono::milliseconds timeout_;
  std::vector<HostSlab> slabs_;  // by round
  std::vector<size_t> round_begin_;
  uint32_t rounds_ = 0;
  std::vector<uint32_t> thread_of_;                     // per shared piece this rank reads: its reader thread
  std::vector<const plan::SharedPiece::Needer*> mine_;  // per shared piece: this rank as its needer, if same_host
  std::set<int> readers_, needers_;                     // peers this rank copies from / that copy from it
  io::SharedRegion region_;
  std::map<int, Peer> peers_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;  // the reader threads': error_, threads_done_, published_
  std::condition_variable published_changed_;
  std::exception_ptr error_;
  std::vector<uint32_t> threads_done_;  // per round: reader threads through it
  uint32_t published_ = 0;              // rounds whose count is raised
};

HostExchange::HostExchange(const ExchangeContext& context) : rounds_(std::make_unique<Rounds>(context)) {}
HostExchange::~HostExchange() = default;

std::string HostExchange::offer() { return rounds_->offer(); }

bool HostExchange::set_up(const std::vector<std::string>& offers) { return rounds_->set_up(offers); }

void HostExchange::run(std::exception_ptr& error) { rounds_->run(error); }

}  // namespace distckpt::loading
