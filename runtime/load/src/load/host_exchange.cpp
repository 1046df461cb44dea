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
  uint32_t piece = 0;  // in the share
  uint32_t slab = 0;
  uint64_t offset = 0;  // in the reader's slot
  uint32_t seq = 0;     // among the reader's slabs: its status byte
};

// A rank's region: what it tells the peers that map it.
struct Layout {
  uint32_t slabs = 0;   // it reads
  uint64_t slot = 0;    // bytes of one slot
  uint32_t rounds = 0;  // it reads in
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
      : c_(c), me_(c.comm.rank()), timeout_(c.comm.timeout().value_or(kDefaultTimeout)) {
    place_slabs();
  }

  // Not collective: this rank's region, created when it takes part, and
  // what each peer needs to map it: region name, pid namespace, layout, and
  // for a needer the place of every slab it needs.
  std::vector<std::string> offers() {
    std::vector<std::string> parts(static_cast<size_t>(c_.comm.size()));
    if (!involved_) return parts;
    std::string head;
    try {
      region_ = io::SharedRegion::create(own_.bytes());
      head = fmt::format("{} {} {} {} {}\n", region_.name(), pid_namespace(), own_.slabs, own_.slot, own_.rounds);
    } catch (const std::exception& e) {
      refusal_ = e.what();
      head = std::string(1, kRefused);
    }
    for (const int p : peers_of()) parts[static_cast<size_t>(p)] = head;
    if (!refusal_.empty()) return parts;
    for (const HostSlab& h : slabs_) {
      if (h.reader != me_) continue;
      const plan::SharePiece& piece = c_.share.pieces[h.piece];
      const std::string line =
          fmt::format("{} {} {} {} {} {}\n", piece.tensor, piece.piece, h.slab, h.round, h.offset, h.seq);
      for (const plan::ShareNeeder& n : piece.others) parts[static_cast<size_t>(n.rank)] += line;
    }
    return parts;
  }

  // What every peer offered this rank (sent by the caller), then one
  // all-gather of whether every rank mapped its peers' regions, after which
  // the names are unlinked. A refusal anywhere makes every rank return false
  // before anything is read.
  bool set_up(const std::vector<std::string>& offers) {
    // A rank that could not make its region says why; its peers only skip mapping.
    std::string mapped = refusal_.empty() ? std::string() : std::string(1, kRefused) + refusal_;
    const bool peer_refused =
        std::any_of(offers.begin(), offers.end(), [](const std::string& o) { return !o.empty() && o[0] == kRefused; });
    if (mapped.empty() && !peer_refused) {
      try {
        if (offers.size() != static_cast<size_t>(c_.comm.size())) {
          throw ProtocolError(fmt::format("{} shared-memory offers for {} ranks", offers.size(), c_.comm.size()));
        }
        map_peers(offers);
      } catch (const std::exception& e) {
        mapped = std::string(1, kRefused) + e.what();
      }
    }
    const bool fall_back = refused(c_.comm.all_gather_bytes(mapped));
    if (peer_refused && !fall_back) {
      throw ProtocolError("a peer refused to share memory but no rank said why");
    }
    if (fall_back) {
      region_ = io::SharedRegion();  // its name goes now, not when the reads are done
      peers_.clear();
      return false;
    }
    region_.unlink();  // every peer holds its mapping now
    return true;
  }

  void run(std::exception_ptr& error) {
    if (involved_) {
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
        for (uint32_t i = 0; i < kReadThreads && own_.slabs > 0; ++i) {
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
  // This rank's slabs, in share order, a new round whenever the next slab
  // would overflow its batch (a slab larger than the batch gets a round of
  // its own); its peers.
  void place_slabs() {
    uint64_t used = 0;
    uint32_t pieces = 0;
    thread_of_.assign(c_.share.pieces.size(), 0);
    for (uint32_t k = 0; k < c_.share.pieces.size(); ++k) {
      const plan::SharePiece& p = c_.share.pieces[k];
      if (!p.same_host) continue;
      involved_ = true;
      if (p.reader != me_) {
        readers_.insert(p.reader);
        continue;
      }
      for (const plan::ShareNeeder& n : p.others) needers_.insert(n.rank);
      thread_of_[k] = pieces++ % kReadThreads;
      for (uint32_t i = 0; i < p.slabs.size(); ++i) {
        const uint64_t bytes = static_cast<uint64_t>(p.slabs[i].numel()) * p.geometry.element_size;
        if (own_.rounds == 0) own_.rounds = 1;
        if (used > 0 && used + bytes > c_.batch_bytes) {
          ++own_.rounds;
          used = 0;
        }
        slabs_.push_back(HostSlab{own_.rounds - 1, me_, k, i, used, own_.slabs++});
        used += bytes;
        own_.slot = std::max(own_.slot, used);
      }
    }
  }

  std::set<int> peers_of() const {
    std::set<int> peers = readers_;
    peers.insert(needers_.begin(), needers_.end());
    return peers;
  }

  // Checks every offer against this rank's share, places the slabs it needs
  // from its readers, and maps its peers' regions. Throws what does not fit.
  void map_peers(const std::vector<std::string>& offers) {
    const std::set<int> peers = peers_of();
    for (size_t r = 0; r < offers.size(); ++r) {
      if (offers[r].empty()) continue;
      if (peers.count(static_cast<int>(r)) == 0) {
        throw ProtocolError(fmt::format("rank {} offered shared memory, but shares no piece within the host", r));
      }
    }
    // The slabs this rank needs, by reader and (tensor, piece, slab).
    std::map<std::tuple<int, uint32_t, uint32_t, uint32_t>, uint32_t> wanted;
    for (uint32_t k = 0; k < c_.share.pieces.size(); ++k) {
      const plan::SharePiece& p = c_.share.pieces[k];
      if (!p.same_host || p.reader == me_) continue;
      for (uint32_t i = 0; i < p.slabs.size(); ++i) wanted.emplace(std::make_tuple(p.reader, p.tensor, p.piece, i), k);
    }
    const uint64_t own_namespace = pid_namespace();
    rounds_ = own_.rounds;
    for (const int p : peers) {
      std::istringstream lines(offers[static_cast<size_t>(p)]);
      std::string name;
      uint64_t peer_namespace = 0;
      Layout layout;
      if (!(lines >> name >> peer_namespace >> layout.slabs >> layout.slot >> layout.rounds)) {
        throw ProtocolError(fmt::format("rank {} sent no usable shared-memory offer", p));
      }
      // A reader has a slab in each of its rounds; its slots must fit a region
      // (the mapping then checks the region holds them).
      if (layout.rounds > layout.slabs || layout.slot > (uint64_t{1} << 48)) {
        throw ProtocolError(
            fmt::format("rank {} offered a shared-memory layout of {} rounds, {} slabs and slots of {} "
                        "bytes",
                        p, layout.rounds, layout.slabs, layout.slot));
      }
      const bool reads_for_me = readers_.count(p) > 0;
      uint32_t tensor = 0, piece = 0, slab = 0;
      HostSlab h;
      h.reader = p;
      while (lines >> tensor >> piece >> slab >> h.round >> h.offset >> h.seq) {
        const auto at = wanted.find(std::make_tuple(p, tensor, piece, slab));
        if (!reads_for_me || at == wanted.end()) {
          throw ProtocolError(fmt::format("rank {} placed a slab this rank does not need from it", p));
        }
        const plan::SharePiece& sp = c_.share.pieces[at->second];
        const uint64_t bytes = static_cast<uint64_t>(sp.slabs[slab].numel()) * sp.geometry.element_size;
        if (h.round >= layout.rounds || h.seq >= layout.slabs || h.offset > layout.slot ||
            bytes > layout.slot - h.offset) {
          throw ProtocolError(fmt::format("rank {} placed a slab outside its region's layout", p));
        }
        h.piece = at->second;
        h.slab = slab;
        slabs_.push_back(h);
        wanted.erase(at);
      }
      if (!lines.eof()) throw ProtocolError(fmt::format("rank {} sent a malformed shared-memory offer", p));
      if (reads_for_me) rounds_ = std::max(rounds_, layout.rounds);
      Peer peer{io::SharedRegion::open_read_only(name, layout.bytes()), pid_in(name), false, layout};
      // A pid from another namespace names some other process: only the timeout watches that peer.
      peer.watch_pid = own_namespace != 0 && peer_namespace == own_namespace;
      if (peer.watch_pid && ::kill(peer.pid, 0) != 0 && errno == ESRCH) {
        throw CommError(fmt::format("rank {}'s process {} is not visible from rank {}", p, peer.pid, me_));
      }
      peers_.emplace(p, std::move(peer));
    }
    if (!wanted.empty()) {
      throw ProtocolError(
          fmt::format("rank {} did not place a slab this rank needs", std::get<0>(wanted.begin()->first)));
    }
    std::stable_sort(slabs_.begin(), slabs_.end(), [](const HostSlab& a, const HostSlab& b) {
      return std::tie(a.round, a.reader, a.seq) < std::tie(b.round, b.reader, b.seq);
    });
    round_begin_.assign(static_cast<size_t>(rounds_) + 1, slabs_.size());
    for (size_t e = slabs_.size(); e-- > 0;) round_begin_[slabs_[e].round] = e;
    for (uint32_t t = rounds_; t-- > 0;) round_begin_[t] = std::min(round_begin_[t], round_begin_[t + 1]);
    threads_done_.assign(own_.rounds, 0);
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
    const Layout& l = reader == me_ ? own_ : peers_.at(reader).layout;
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
    for (uint32_t u = 0; u < own_.rounds && !stop_; ++u) {
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
        if (h.reader != me_ || thread_of_[h.piece] != which) continue;
        const plan::SharePiece& s = c_.share.pieces[h.piece];
        const TensorRecord& record = c_.reader.tensor_at(s.tensor);
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
      while (published_ < own_.rounds && threads_done_[published_] == kReadThreads) {
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
        if (h.reader == me_) continue;
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
    const plan::SharePiece& s = c_.share.pieces[h.piece];
    const at::ScalarType dtype = c_.reader.tensor_at(s.tensor).dtype;
    for (uint32_t need : s.own_needs) {
      const TensorRead& r = c_.mine[need];
      copy_slab_to_dest(data, s.slabs[h.slab], dtype, r.need.part, r.dest);
    }
  }

  struct Peer {
    io::SharedRegion region;
    pid_t pid = 0;
    bool watch_pid = false;
    Layout layout;
  };

  const ExchangeContext& c_;
  const int me_;
  const std::chrono::milliseconds timeout_;
  Layout own_;
  bool involved_ = false;        // reads or needs a same_host slab
  std::vector<HostSlab> slabs_;  // its own, then those it needs; by round once set up
  std::vector<size_t> round_begin_;
  uint32_t rounds_ = 0;              // it copies in: through the last of any reader it copies from
  std::vector<uint32_t> thread_of_;  // per piece of the share this rank reads: its reader thread
  std::set<int> readers_, needers_;  // peers this rank copies from / that copy from it
  std::string refusal_;              // why this rank could not make its region
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

std::vector<std::string> HostExchange::offers() { return rounds_->offers(); }

bool HostExchange::set_up(const std::vector<std::string>& offers) { return rounds_->set_up(offers); }

void HostExchange::run(std::exception_ptr& error) { rounds_->run(error); }

}  // namespace distckpt::loading
