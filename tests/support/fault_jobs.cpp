#include "support/fault_jobs.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace {

const std::string kBin = DISTCKPT_BIN_DIR;

// A rank prefix of a launched job: `prefix` on rank `rank` only.
std::string on_rank(int rank, const std::string& prefix) {
  return "/bin/sh -c " +
         shell_quote("if [ \"$RANK\" = " + std::to_string(rank) + " ]; then exec " + prefix +
                     " \"$@\"; else exec \"$@\"; fi") +
         " sh";
}

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
