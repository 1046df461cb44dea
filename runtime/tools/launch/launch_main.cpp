// distckpt-launch: runs N local ranks of a program with the environment that
// torchrun would give them (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT). With --nnodes M --node-rank K, one launcher on
// each of M machines starts ranks K*N .. K*N+N-1 of a world of M*N. If one
// rank fails, the others on this machine are stopped (SIGTERM, then SIGKILL
// after a grace period) so a job never hangs on a dead peer. Plain POSIX: no LibTorch, so it starts instantly.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kUsageExitCode = 2;
constexpr auto kGracePeriod = std::chrono::seconds(5);
// After the last rank exits, how long a grandchild may keep its output open.
constexpr auto kDrainPeriod = std::chrono::seconds(2);
// A line longer than this is passed on in pieces, each tagged.
constexpr size_t kMaxLineBytes = 64 * 1024;

constexpr const char* kUsage =
    "usage: distckpt-launch -n N [--nnodes M --node-rank K] [--master-addr ADDR] [--master-port PORT] "
    "[--tag-output] -- PROGRAM [ARGS...]\n"
    "  -n, --nprocs N     number of ranks to start on this machine\n"
    "  --nnodes M         machines in the job, each running one launcher with the same -n (default 1)\n"
    "  --node-rank K      this machine's index in [0, M): its ranks are K*N .. K*N+N-1\n"
    "  --master-addr ADDR rendezvous address (default 127.0.0.1; with M > 1, node 0's address)\n"
    "  --master-port PORT rendezvous port (default: a free port; required with M > 1)\n"
    "  --tag-output       prefix every output line with [rank R]\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LaunchOptions {
  int nprocs = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free one
  bool tag_output = false;
  std::vector<std::string> command;
};

int parse_number(const std::string& flag, const std::string& text, int min, int max) {
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < min || value > max) {
    throw UsageError(flag + " expects an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got '" +
                     text + "'");
  }
  return static_cast<int>(value);
}

LaunchOptions parse_args(int argc, char** argv) {
  LaunchOptions options;
  int i = 1;
  // "--flag value" and "--flag=value" both work.
  auto value_of = [&](const std::string& arg, const std::string& flag) -> std::optional<std::string> {
    if (arg == flag) {
      if (i + 1 >= argc) throw UsageError(flag + " needs a value");
      return std::string(argv[++i]);
    }
    if (arg.rfind(flag + "=", 0) == 0) return arg.substr(flag.size() + 1);
    return std::nullopt;
  };
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (arg == "--tag-output") {
      options.tag_output = true;
    } else if (auto n = value_of(arg, "-n")) {
      options.nprocs = parse_number("-n", *n, 1, 1 << 20);
    } else if (auto n = value_of(arg, "--nprocs")) {
      options.nprocs = parse_number("--nprocs", *n, 1, 1 << 20);
    } else if (auto n = value_of(arg, "--nnodes")) {
      options.nnodes = parse_number("--nnodes", *n, 1, 1 << 20);
    } else if (auto k = value_of(arg, "--node-rank")) {
      options.node_rank = parse_number("--node-rank", *k, 0, (1 << 20) - 1);
    } else if (auto addr = value_of(arg, "--master-addr")) {
      if (addr->empty()) throw UsageError("--master-addr must not be empty");
      options.master_addr = *addr;
    } else if (auto port = value_of(arg, "--master-port")) {
      options.master_port = parse_number("--master-port", *port, 1, 65535);
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw UsageError("unknown option '" + arg + "'");
    } else {
      break;  // the program starts here
    }
  }
  for (; i < argc; ++i) options.command.emplace_back(argv[i]);
  if (options.nprocs == 0) throw UsageError("the number of ranks is missing: pass -n N");
  if (options.command.empty()) throw UsageError("the program to run is missing: add -- PROGRAM");
  if (options.node_rank >= options.nnodes) {
    throw UsageError("--node-rank " + std::to_string(options.node_rank) + " must be below --nnodes " +
                     std::to_string(options.nnodes));
  }
  // Every node must agree on the port; a free one picked here is free only here.
  if (options.nnodes > 1 && options.master_port == 0) {
    throw UsageError("--nnodes " + std::to_string(options.nnodes) + " needs --master-port (the same on every node)");
  }
  if (static_cast<long long>(options.nnodes) * options.nprocs > (1LL << 30)) {
    throw UsageError("--nnodes times -n is too large");
  }
  return options;
}

[[noreturn]] void fail_system(const std::string& what) {
  std::cerr << "distckpt-launch: " << what << ": " << std::strerror(errno) << "\n";
  std::exit(1);
}

// Binds port 0 on loopback and returns what the kernel chose. Another process
// could take it before rank 0 binds it; rare, and the job then fails loudly.
int pick_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail_system("cannot create a socket to find a free port");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    fail_system("cannot find a free port (pass --master-port)");
  }
  close(fd);
  return ntohs(address.sin_port);
}

// Signals become bytes on a pipe, so the main loop handles them with poll.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  [[maybe_unused]] ssize_t ignored = write(g_signal_pipe[1], &byte, 1);
  errno = saved_errno;
}

void install_signal_handlers() {
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) fail_system("cannot create a pipe");
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal_number : {SIGCHLD, SIGINT, SIGTERM}) sigaction(signal_number, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor
}

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t written = write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;  // nowhere left to write; keep supervising
    data += written;
    size -= static_cast<size_t>(written);
  }
}

// One rank's stdout or stderr, passed on line by line with a "[rank R] " tag.
struct TaggedStream {
  int rank;
  int read_fd;
  int target_fd;
  std::string pending;  // the unfinished last line

  // Returns false at end of file.
  bool pump() {
    char buffer[8192];
    const ssize_t n = read(read_fd, buffer, sizeof(buffer));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      if (!pending.empty()) emit(pending + "\n");
      pending.clear();
      return false;
    }
    pending.append(buffer, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t newline; (newline = pending.find('\n', start)) != std::string::npos; start = newline + 1) {
      emit(pending.substr(start, newline + 1 - start));
    }
    pending.erase(0, start);
    if (pending.size() > kMaxLineBytes) {
      emit(pending + "\n");
      pending.clear();
    }
    return true;
  }

  void emit(const std::string& line) const {
    const std::string tagged = "[rank " + std::to_string(rank) + "] " + line;
    write_all(target_fd, tagged.data(), tagged.size());
  }
};

struct Rank {
  int rank;
  pid_t pid;
  bool running = true;
};

// In the child: death with the launcher, the rank's environment, its own
// process group (so stopping a rank also stops what it started), default
// signals, then exec.
// Runs with all signals blocked (see Supervisor::start): until the handlers
// are reset, a signal here would run the launcher's handler and write to its
// signal pipe, as if the launcher itself had been signalled.
[[noreturn]] void exec_rank(const LaunchOptions& options, int local_rank, int port, int out_fd, int err_fd,
                            const sigset_t& original_mask, pid_t launcher) {
  // A launcher killed outright (kill -9 by a scheduler) cannot stop its
  // ranks, so the kernel does: SIGKILL when the launcher dies (kept across
  // exec). If it died before this line, no signal will come: leave now.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(128 + SIGKILL);
  setpgid(0, 0);
  for (int signal_number : {SIGCHLD, SIGINT, SIGTERM, SIGPIPE}) signal(signal_number, SIG_DFL);
  close(g_signal_pipe[0]);
  close(g_signal_pipe[1]);
  sigprocmask(SIG_SETMASK, &original_mask, nullptr);
  if (out_fd >= 0) dup2(out_fd, STDOUT_FILENO);
  if (err_fd >= 0) dup2(err_fd, STDERR_FILENO);
  const int rank = options.node_rank * options.nprocs + local_rank;
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(options.nnodes * options.nprocs).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(options.nprocs).c_str(), 1);
  setenv("MASTER_ADDR", options.master_addr.c_str(), 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  std::vector<char*> argv;
  for (const std::string& arg : options.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::fprintf(stderr, "distckpt-launch: rank %d: cannot run '%s': %s\n", rank, argv[0], std::strerror(errno));
  _exit(127);
}

class Supervisor {
 public:
  explicit Supervisor(LaunchOptions options) : options_(std::move(options)) {}

  int run() {
    const int port = options_.master_port != 0 ? options_.master_port : pick_free_port();
    for (int local = 0; local < options_.nprocs && !stop_requested_; ++local) start(local, port);
    while (has_running_ranks() || (!streams_.empty() && !drain_expired())) {
      wait_for_events();
      if (stop_requested_ && !killed_ && Clock::now() >= kill_deadline_) kill_all(SIGKILL);
    }
    if (interrupt_signal_ != 0) return 128 + interrupt_signal_;
    return first_failure_code_;
  }

 private:
  // Ranks are tagged and reported by their global number.
  void start(int local_rank, int port) {
    const int rank = options_.node_rank * options_.nprocs + local_rank;
    int out[2] = {-1, -1};
    int err[2] = {-1, -1};
    if (options_.tag_output && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)) {
      fail_system("cannot create output pipes");
    }
    sigset_t all_signals, original_mask;
    sigfillset(&all_signals);
    sigprocmask(SIG_BLOCK, &all_signals, &original_mask);
    const pid_t launcher = getpid();
    const pid_t pid = fork();
    const int fork_errno = errno;
    if (pid == 0) exec_rank(options_, local_rank, port, out[1], err[1], original_mask, launcher);
    sigprocmask(SIG_SETMASK, &original_mask, nullptr);
    if (pid < 0) {
      // Stop the ranks already started rather than leave them waiting for this one.
      std::cerr << "distckpt-launch: cannot start rank " << rank << ": " << std::strerror(fork_errno) << "\n";
      for (int fd : {out[0], out[1], err[0], err[1]}) {
        if (fd >= 0) close(fd);
      }
      first_failure_code_ = 1;
      signal_all(SIGTERM);
      begin_stop();
      return;
    }
    setpgid(pid, pid);  // also here: the child may not have run yet when we signal it
    ranks_.push_back(Rank{rank, pid});
    if (options_.tag_output) {
      close(out[1]);
      close(err[1]);
      streams_.push_back(TaggedStream{rank, out[0], STDOUT_FILENO, {}});
      streams_.push_back(TaggedStream{rank, err[0], STDERR_FILENO, {}});
    }
  }

  bool has_running_ranks() const {
    for (const Rank& rank : ranks_) {
      if (rank.running) return true;
    }
    return false;
  }

  bool drain_expired() const { return last_exit_time_ && Clock::now() >= *last_exit_time_ + kDrainPeriod; }

  void wait_for_events() {
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    for (const TaggedStream& stream : streams_) fds.push_back({stream.read_fd, POLLIN, 0});
    int timeout_ms = -1;
    if (stop_requested_ && !killed_) timeout_ms = milliseconds_until(kill_deadline_);
    if (!has_running_ranks()) timeout_ms = milliseconds_until(*last_exit_time_ + kDrainPeriod);
    if (poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) fail_system("poll");

    if (fds[0].revents != 0) handle_signals();
    for (size_t i = fds.size() - 1; i >= 1; --i) {
      if (fds[i].revents != 0 && !streams_[i - 1].pump()) {
        close(streams_[i - 1].read_fd);
        streams_.erase(streams_.begin() + static_cast<std::ptrdiff_t>(i - 1));
      }
    }
    reap();  // also catches exits whose SIGCHLD raced with poll
  }

  static int milliseconds_until(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return static_cast<int>(std::max<long long>(0, left.count()));
  }

  void handle_signals() {
    unsigned char bytes[64];
    ssize_t n;
    while ((n = read(g_signal_pipe[0], bytes, sizeof(bytes))) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        if (bytes[i] == SIGINT || bytes[i] == SIGTERM) on_interrupt(bytes[i]);
      }
    }
  }

  // First SIGINT/SIGTERM: pass it on and start the grace period. Second: kill.
  void on_interrupt(int signal_number) {
    if (interrupt_signal_ != 0) {
      kill_all(SIGKILL);
      return;
    }
    interrupt_signal_ = signal_number;
    std::cerr << "distckpt-launch: received signal " << signal_number << ", stopping all ranks\n";
    signal_all(signal_number);
    begin_stop();
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (Rank& rank : ranks_) {
        if (rank.pid == pid && rank.running) {
          rank.running = false;
          on_rank_exit(rank, status);
        }
      }
    }
    if (!has_running_ranks() && !last_exit_time_) last_exit_time_ = Clock::now();
  }

  void on_rank_exit(const Rank& rank, int status) {
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    // Exits after we began stopping the job are consequences, not causes.
    if (ok || stop_requested_) return;
    if (WIFEXITED(status)) {
      std::cerr << "distckpt-launch: rank " << rank.rank << " exited with code " << WEXITSTATUS(status) << "\n";
      first_failure_code_ = WEXITSTATUS(status);
    } else {
      std::cerr << "distckpt-launch: rank " << rank.rank << " was killed by signal " << WTERMSIG(status) << " ("
                << strsignal(WTERMSIG(status)) << ")\n";
      first_failure_code_ = 1;
    }
    if (has_running_ranks()) {
      std::cerr << "distckpt-launch: stopping the other ranks\n";
      signal_all(SIGTERM);
    }
    begin_stop();
  }

  void begin_stop() {
    if (stop_requested_) return;
    stop_requested_ = true;
    kill_deadline_ = Clock::now() + kGracePeriod;
  }

  void kill_all(int signal_number) {
    killed_ = true;
    signal_all(signal_number);
  }

  void signal_all(int signal_number) {
    for (const Rank& rank : ranks_) {
      if (!rank.running) continue;
      kill(-rank.pid, signal_number);  // the rank's whole process group
      // A stopped (SIGSTOP) rank acts on the signal only once continued;
      // otherwise it would sit out the grace period until SIGKILL.
      if (signal_number != SIGKILL) kill(-rank.pid, SIGCONT);
    }
  }

  LaunchOptions options_;
  std::vector<Rank> ranks_;
  std::vector<TaggedStream> streams_;
  bool stop_requested_ = false;
  bool killed_ = false;
  int interrupt_signal_ = 0;
  int first_failure_code_ = 0;
  Clock::time_point kill_deadline_;
  std::optional<Clock::time_point> last_exit_time_;
};

}  // namespace

int main(int argc, char** argv) {
  LaunchOptions options;
  try {
    options = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "distckpt-launch: " << e.what() << "\n" << kUsage;
    return kUsageExitCode;
  }
  install_signal_handlers();
  return Supervisor(std::move(options)).run();
}
