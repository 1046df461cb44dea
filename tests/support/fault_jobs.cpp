#include "support/fault_jobs.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace {

const std::string kBin = DISTCKPT_BIN_DIR;

}  // namespace

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string probe_job(const std::string& dir, const std::string& action, int seed, const std::string& probe_args,
                      const std::string& rank_prefix) {
  return kBin + "/distckpt-launch -n 2 -- " + rank_prefix + (rank_prefix.empty() ? "" : " ") + kBin +
         "/distckpt_fault_probe " + shell_quote(dir) + " " + action + " " + std::to_string(seed) +
         (probe_args.empty() ? "" : " " + probe_args);
}

std::string probe_node(int node, int port, const std::string& dir, const std::string& action, int seed,
                       const std::string& rank_prefix, int nodes) {
  return kBin + "/distckpt-launch --nnodes " + std::to_string(nodes) + " --node-rank " + std::to_string(node) +
         " -n 1 --master-addr 127.0.0.1 " + "--master-port " + std::to_string(port) + " -- " + rank_prefix +
         (rank_prefix.empty() ? "" : " ") + kBin + "/distckpt_fault_probe " + shell_quote(dir) + " " + action + " " +
         std::to_string(seed);
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

std::string on_rank(int rank, const std::string& prefix) {
  return "/bin/sh -c " +
         shell_quote("if [ \"$RANK\" = " + std::to_string(rank) + " ]; then exec " + prefix +
                     " \"$@\"; else exec \"$@\"; fi") +
         " sh";
}

std::string fail_thread_start_on_rank(int rank, int when) {
  const std::string strace =
      // clone3 since glibc 2.34, clone before; each is counted on its own.
      strace_command() +
      " -qq -o /dev/null -e trace=clone,clone3 -e inject=clone,clone3:error=EAGAIN:when=" + std::to_string(when);
  return on_rank(rank, strace);
}

int threads_started_before(const std::function<CommandResult(const std::string& rank_prefix)>& job, int rank,
                           const std::string& path) {
  char trace_template[] = "/tmp/distckpt-thread-trace-XXXXXX";
  const int fd = ::mkstemp(trace_template);
  if (fd < 0) return -1;
  ::close(fd);
  const std::string trace = trace_template;
  const std::string strace = strace_command() + " -qq -o " + shell_quote(trace) + " -e trace=clone,clone3,%file";
  job(on_rank(rank, strace));
  // Lines are "PID syscall(...": the first is the main thread's execve
  // (which names `path` among its arguments).
  std::ifstream in(trace);
  std::string line, main_pid;
  int started = 0, found = -1;
  while (found < 0 && std::getline(in, line)) {
    const std::string pid = line.substr(0, line.find(' '));
    if (main_pid.empty()) main_pid = pid;
    if (pid != main_pid) continue;
    const std::string call = line.substr(std::min(line.size(), line.find_first_not_of(' ', pid.size())));
    if (call.rfind("clone3(", 0) == 0 || call.rfind("clone(", 0) == 0) {
      ++started;
    } else if (call.rfind("execve(", 0) != 0 && line.find(path) != std::string::npos) {
      found = started;
    }
  }
  std::remove(trace.c_str());
  return found;
}

std::string strace_command() {
  // LeakSanitizer cannot run under ptrace: a sanitized build
  // (scripts/sanitize.sh) checks leaks everywhere but in traced processes.
  return "env ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" strace -f";
}

std::string strace_inject(const std::string& syscalls, const std::string& path, const std::string& tamper) {
  // --seccomp-bpf stops only the named syscalls, so the job runs at nearly
  // full speed; -P narrows those to the ones on `path`. A signal is injected
  // at the syscall's exit, which strace 6.1 misses under --seccomp-bpf.
  const bool fast = tamper.find("signal=") == std::string::npos;
  return strace_command() + (fast ? " --seccomp-bpf " : " ") + "-qq -o /dev/null -e trace=" + syscalls + " -P " +
         shell_quote(path) + " -e inject=" + syscalls + ":" + tamper;
}

std::optional<std::string> strace_unavailable() {
  const CommandResult r = run_command("strace -f -qq -o /dev/null true");
  if (r.exit_code == 0) return std::nullopt;
  return "strace cannot trace here (exit " + std::to_string(r.exit_code) + "): " + r.output;
}

CommandResult run_bounded(const std::string& command, int seconds) {
  return run_command("timeout -k 15 " + std::to_string(seconds) + " " + command);
}

bool ran_out(const CommandResult& result) { return result.exit_code == 124 || result.exit_code == 137; }

std::vector<std::string> lines_starting(const std::string& output, const std::string& prefix) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, prefix.size(), prefix) == 0) lines.push_back(line);
  }
  return lines;
}

void record_fault(const std::string& fault, const std::string& outcome) {
  static std::string test;
  static int n = 0;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  n = name == test ? n + 1 : 1;
  test = name;
  ::testing::Test::RecordProperty("fault_" + std::to_string(n), fault + " => " + outcome);
}

std::string describe_classes(const std::vector<std::string>& classes) {
  bool same = !classes.empty();
  for (const std::string& c : classes) same = same && c == classes[0];
  if (same)
    return classes.size() == 1 ? classes[0] : classes[0] + " on all " + std::to_string(classes.size()) + " ranks";
  std::string out;
  for (size_t r = 0; r < classes.size(); ++r) out += (r ? ", " : "") + ("rank " + std::to_string(r) + " " + classes[r]);
  return out;
}

std::string failure_class(const std::string& output, const std::string& prefix) {
  const std::vector<std::string> lines = lines_starting(output, prefix);
  if (lines.size() != 1) return "(" + std::to_string(lines.size()) + " lines start with '" + prefix + "')";
  const std::string rest = lines[0].substr(prefix.size());
  const size_t colon = rest.find(':');
  return colon == std::string::npos ? "(no class in '" + lines[0] + "')" : rest.substr(0, colon);
}

std::vector<std::string> failure_classes(const std::string& output, int ranks, const std::string& format) {
  std::vector<std::string> classes;
  for (int r = 0; r < ranks; ++r) classes.push_back(failure_class(output, fmt::format(fmt::runtime(format), r)));
  return classes;
}

std::string digest(const std::string& dir) {
  const CommandResult r = run_bounded(kBin + "/distckpt digest " + shell_quote(dir));
  return r.exit_code == 0 ? r.output : "exit " + std::to_string(r.exit_code) + ": " + r.output;
}

std::string canonical_path(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  const std::string result = resolved != nullptr ? resolved : path;
  std::free(resolved);
  return result;
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}
