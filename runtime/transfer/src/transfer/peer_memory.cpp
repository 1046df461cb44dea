#include "transfer/peer_memory.h"

#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <system_error>

#include "distckpt/core/errors.h"
#include "distckpt/fb/wire_generated.h"
#include "plan/wire.h"

namespace distckpt::transferring {
namespace {

constexpr std::string_view kWhat = "transfer source";
constexpr size_t kMaxIovecs = 1024;  // UIO_MAXIOV: the kernel takes no more per call
// Above every user-space address (x86-64 and arm64 stay below 2^57): an offset added to one cannot wrap.
constexpr uint64_t kAddressLimit = uint64_t{1} << 57;

// 8 random bytes a peer reads to prove it reads this process (not another
// one that has the same pid in another namespace).
const uint64_t& process_token() {
  static const uint64_t token = [] {
    std::random_device device;
    return (uint64_t{device()} << 32 | device()) | 1;
  }();
  return token;
}

std::string this_host() {
  char name[256] = {};
  return gethostname(name, sizeof name - 1) == 0 ? std::string(name) : std::string();
}

[[noreturn]] void read_failed(int error, int64_t pid, const std::string& what) {
  const std::string cause = std::system_category().message(error);
  if (error == ESRCH) {
    throw CommError(fmt::format("process {} holding {} is gone ({}): its rank exited or was killed during the transfer",
                                pid, what, cause));
  }
  if (error == EFAULT) {
    throw UsageError(
        fmt::format("{} is no longer where process {} offered it ({}): a source tensor was freed, resized "
                    "or replaced during the transfer; keep the sources in place until transfer() returns",
                    what, pid, cause));
  }
  throw IoError(fmt::format("could not read {} out of process {} ({}); transfer with "
                            "TransferOptions::direct_reads = false to send it instead",
                            what, pid, cause),
                what, error);
}

}  // namespace

Reach reach_of(const std::vector<const ShardedTensor*>& mine, const std::vector<const void*>& owned) {
  Reach reach;
  reach.host = this_host();
  reach.pid = getpid();
  reach.token_address = reinterpret_cast<uint64_t>(&process_token());
  reach.token = process_token();
  reach.addresses.reserve(mine.size());
  for (const ShardedTensor* t : mine) {
    const at::Tensor& d = t->data;
    const bool offered = d.defined() && d.device().is_cpu() && d.is_contiguous() && d.numel() > 0 &&
                         std::binary_search(owned.begin(), owned.end(), d.storage().data());
    reach.addresses.push_back(offered ? reinterpret_cast<uint64_t>(d.data_ptr()) : 0);
  }
  return reach;
}

std::string encode_source(const std::string& plan, const Reach& reach) {
  flatbuffers::FlatBufferBuilder b(plan.size() + 128 + 8 * reach.addresses.size());
  const auto plan_bytes = b.CreateVector(reinterpret_cast<const uint8_t*>(plan.data()), plan.size());
  const auto host = b.CreateString(reach.host);
  const auto addresses = b.CreateVector(reach.addresses);
  b.Finish(fb::CreateTransferSource(b, plan_bytes, host, reach.pid, reach.token_address, reach.token, addresses));
  return plan::message_bytes(b);
}

std::pair<std::string, Reach> decode_source(std::string_view bytes, const std::string& origin) {
  const auto& root = plan::verified_message<fb::TransferSource>(bytes, kWhat, origin);
  std::string plan = root.plan() ? std::string(reinterpret_cast<const char*>(root.plan()->data()), root.plan()->size())
                                 : std::string();
  Reach reach;
  reach.host = plan::string_or_empty(root.host());
  reach.pid = root.pid();
  reach.token_address = root.token_address();
  reach.token = root.token();
  reach.addresses = plan::scalars(root.addresses(), kWhat, origin);
  if (reach.pid < 0 || reach.pid > std::numeric_limits<pid_t>::max()) {
    plan::malformed(kWhat, origin, fmt::format("process id {}", reach.pid));
  }
  for (const uint64_t a : reach.addresses) {
    if (a >= kAddressLimit) plan::malformed(kWhat, origin, fmt::format("address {:#x} is not a process's", a));
  }
  if (reach.pid == 0 && !reach.addresses.empty()) plan::malformed(kWhat, origin, "addresses without a process");
  return {std::move(plan), std::move(reach)};
}

bool can_read_host_peers(const std::vector<Reach>& reaches, int me) {
  const Reach& mine = reaches.at(static_cast<size_t>(me));
  if (mine.pid == 0) return false;
  for (size_t r = 0; r < reaches.size(); ++r) {
    const Reach& peer = reaches[r];
    if (static_cast<int>(r) == me || peer.host != mine.host) continue;
    if (peer.pid == 0) return false;
    uint64_t token = 0;
    try {
      read_peer(peer.pid, peer.token_address, {ByteRun{0, sizeof token, reinterpret_cast<uint8_t*>(&token)}},
                [] { return std::string("a token"); });
    } catch (const Error&) {
      return false;
    }
    if (token != peer.token) return false;  // another process with that pid: not on this host after all
  }
  return true;
}

std::vector<int> direct_groups(const std::vector<Reach>& reaches, const std::vector<bool>& can_read) {
  std::map<std::string, int> group_of_host;
  std::vector<bool> usable;
  std::vector<int> groups(reaches.size(), -1);
  for (size_t r = 0; r < reaches.size(); ++r) {
    const auto [at, added] = group_of_host.emplace(reaches[r].host, static_cast<int>(usable.size()));
    if (added) usable.push_back(true);
    groups[r] = at->second;
    usable[static_cast<size_t>(at->second)] = usable[static_cast<size_t>(at->second)] && can_read.at(r);
  }
  for (int& g : groups) {
    if (!usable[static_cast<size_t>(g)]) g = -1;
  }
  return groups;
}

// The setting is the process's: transfers running at once (threads of one
// process) share it, set by the first to begin and cleared by the last to end.
std::mutex allowed_mutex;
int allowed_count = 0;

PeerReadsAllowed::PeerReadsAllowed(bool allow) : allowed_(allow) {
  if (!allowed_) return;
  const std::lock_guard<std::mutex> lock(allowed_mutex);
  // Without Yama (EINVAL) the same user's processes may read this one anyway.
  if (allowed_count++ == 0) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

PeerReadsAllowed::~PeerReadsAllowed() {
  if (!allowed_) return;
  const std::lock_guard<std::mutex> lock(allowed_mutex);
  if (--allowed_count == 0) prctl(PR_SET_PTRACER, 0, 0, 0, 0);
}

void read_peer(int64_t pid, uint64_t address, const std::vector<ByteRun>& runs,
               const std::function<std::string()>& what) {
  std::vector<ByteRun> left;
  left.reserve(runs.size());
  for (const ByteRun& r : runs) {
    if (r.bytes > 0) left.push_back(r);
  }
  std::vector<iovec> local, remote;
  for (size_t i = 0; i < left.size();) {
    const size_t n = std::min(left.size() - i, kMaxIovecs);
    local.resize(n);
    remote.resize(n);
    for (size_t k = 0; k < n; ++k) {
      local[k] = iovec{left[i + k].out, left[i + k].bytes};
      remote[k] = iovec{reinterpret_cast<void*>(address + left[i + k].offset), left[i + k].bytes};
    }
    const ssize_t got = process_vm_readv(static_cast<pid_t>(pid), local.data(), n, remote.data(), n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      read_failed(errno, pid, what());
    }
    if (got == 0) read_failed(EFAULT, pid, what());  // no progress: the next run's memory is not there
    // A short read stops at a run's end (or, to be safe, inside one: the rest of it is read next).
    auto done = static_cast<uint64_t>(got);
    for (; i < left.size() && done >= left[i].bytes; ++i) done -= left[i].bytes;
    if (done > 0) left[i] = ByteRun{left[i].offset + done, left[i].bytes - done, left[i].out + done};
  }
}

}  // namespace distckpt::transferring
