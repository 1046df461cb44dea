// Building communicators: from the launch environment (TCPStore hosted by
// rank 0), from a caller's store, or from a caller's process group.
#include "distckpt/comm/process_group.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "comm/c10d_compat.h"
#include "comm/group_communicator.h"
#include "comm/rendezvous.h"
#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

using c10d_compat::BackendGroup;
using comm_detail::GroupCommunicator;

std::optional<std::string> env_value(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// The option, else DISTCKPT_TIMEOUT_SECONDS, else the default.
std::chrono::milliseconds resolved_timeout(const ProcessGroupOptions& options) {
  if (options.timeout) return *options.timeout;
  return timeout_from_env().value_or(ProcessGroupOptions::kDefaultTimeout);
}

std::string describe(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

// The address this machine reaches `host` from, as the kernel routes it (a UDP
// connect sends nothing). Empty when `host` does not resolve or route.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0) return {};
  std::string address;
  for (const addrinfo* a = found; a != nullptr && address.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) address = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return address;
}

// The Gloo device of this rank; see ProcessGroupOptions::gloo_hostname for
// the order of preference. `master_addr` is where the job rendezvous.
std::shared_ptr<::gloo::transport::Device> make_gloo_device(const ProcessGroupOptions& options,
                                                            const std::optional<std::string>& master_addr) {
  using c10d::ProcessGroupGloo;
  if (!options.gloo_hostname.empty()) {
    return ProcessGroupGloo::createDeviceForHostname(options.gloo_hostname);
  }
  if (auto interface = env_value("GLOO_SOCKET_IFNAME")) {
    return ProcessGroupGloo::createDeviceForInterface(*interface);
  }
  if (!master_addr) return ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  try {
    return ProcessGroupGloo::createDeviceForHostname(*master_addr);
  } catch (const std::exception&) {
    // Ranks on other machines than MASTER_ADDR cannot bind to it. They bind
    // to the address their route to it leaves from: Gloo's default device
    // needs the host name to resolve, else takes loopback, which peers on
    // other machines cannot reach.
  }
  const std::string local = local_address_towards(*master_addr);
  if (!local.empty()) {
    try {
      return ProcessGroupGloo::createDeviceForHostname(local);
    } catch (const std::exception&) {
      // Not bindable after all: the host name, as before.
    }
  }
  return ProcessGroupGloo::createDefaultDevice();
}

c10::intrusive_ptr<BackendGroup> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                                                 const ProcessGroupOptions& options,
                                                 const std::optional<std::string>& master_addr) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(*options.timeout);
  gloo_options->devices.push_back(make_gloo_device(options, master_addr));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, gloo_options);
}

c10::intrusive_ptr<BackendGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                                                 const ProcessGroupOptions& options) {
#ifdef DISTCKPT_C10D_NCCL
  auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
  nccl_options->timeout = *options.timeout;
  // A timeout is the watchdog's: by default it ends the process (docs/GPU.md).
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, nccl_options);
#else
  // check_backend rejects "nccl" first on such builds.
  throw CommError("internal: NCCL group requested on a build without NCCL");
#endif
}

void check_backend(const ProcessGroupOptions& options) {
  if (options.backend != "gloo" && options.backend != "nccl") {
    throw UsageError(fmt::format("unknown communication backend '{}'; use \"gloo\" or \"nccl\"", options.backend));
  }
  if (options.backend == "nccl" && !c10d_compat::kHasNccl) {
    throw UsageError(
        "backend \"nccl\" is not available: distckpt was built without NCCL; use backend \"gloo\", or "
        "configure a CUDA build of LibTorch with -DDISTCKPT_WITH_NCCL=ON");
  }
}

void check_world(int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw UsageError(
        fmt::format("invalid rank {} for a world of {} ranks; ranks go from 0 to world_size - 1", rank, world_size));
  }
}

// Bytes over Gloo always; tensors over NCCL when asked. Each group gets its
// own key prefix so their rendezvous on the shared store cannot collide.
// `options.timeout` is resolved. Every rank arrives first, so a missing one
// is named instead of waited for inside the groups' own rendezvous.
std::shared_ptr<Communicator> connect(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                                      const ProcessGroupOptions& options,
                                      const std::optional<std::string>& master_addr) {
  wait_for_every_rank(store, rank, world_size, *options.timeout);
  try {
    auto gloo_store = c10::make_intrusive<c10d::PrefixStore>("distckpt/gloo", store);
    c10::intrusive_ptr<BackendGroup> byte_group = make_gloo_group(gloo_store, rank, world_size, options, master_addr);
    c10::intrusive_ptr<BackendGroup> tensor_group = byte_group;
    if (options.backend == "nccl") {
      auto nccl_store = c10::make_intrusive<c10d::PrefixStore>("distckpt/nccl", store);
      tensor_group = make_nccl_group(nccl_store, rank, world_size, options);
    }
    return std::make_shared<GroupCommunicator<BackendGroup>>(byte_group, tensor_group, options.backend,
                                                             at::Device(at::kCPU), *options.timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(
        fmt::format("could not connect rank {} of {} ({} backend, timeout {} ms): {}; check that every rank "
                    "started and can reach the others",
                    rank, world_size, options.backend, options.timeout->count(), describe(e)));
  }
}

}  // namespace

std::shared_ptr<Communicator> communicator_from_store(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                      int world_size, const ProcessGroupOptions& options) {
  check_backend(options);
  check_world(rank, world_size);
  if (!store) throw UsageError("communicator_from_store: the store is null");
  ProcessGroupOptions resolved = options;
  resolved.timeout = resolved_timeout(options);
  return connect(store, rank, world_size, resolved, env_value("MASTER_ADDR"));
}

std::shared_ptr<Communicator> communicator_from_env(const ProcessGroupOptions& given) {
  check_backend(given);
  const LaunchEnv env = read_launch_env();
  ProcessGroupOptions options = given;
  if (!options.timeout) options.timeout = env.timeout.value_or(ProcessGroupOptions::kDefaultTimeout);
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(env.world_size);
  // Arrival is checked by connect(), which names a rank that never comes.
  store_options.waitWorkers = false;
  store_options.timeout = *options.timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {} of {} could not {} the rendezvous store at {}:{}: {}; {}", env.rank,
                                env.world_size, env.rank == 0 ? "host" : "reach", env.master_addr, env.master_port,
                                describe(e),
                                env.rank == 0 ? "is MASTER_PORT already in use? pick a free one"
                                              : "check MASTER_ADDR/MASTER_PORT and that rank 0 (which hosts the "
                                                "store) started"));
  }
  return connect(store, env.rank, env.world_size, options, env.master_addr);
}

std::shared_ptr<Communicator> communicator_from_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  if (!group) throw UsageError("communicator_from_process_group: the process group is null");
  const std::string backend = group->getBackendName();
  // A NCCL-only group moves CUDA tensors only, so bytes are staged on the GPU.
  const at::Device byte_device = backend == "nccl" ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  return std::make_shared<GroupCommunicator<c10d::ProcessGroup>>(group, group, backend, byte_device);
}

}  // namespace distckpt
