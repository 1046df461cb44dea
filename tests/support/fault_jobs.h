// Test support for the fault e2e tests: 2-rank jobs of distckpt_fault_probe
// under distckpt-launch, optionally under strace, and reading their output.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "support/process.h"

// `text` single-quoted for /bin/sh.
std::string shell_quote(const std::string& text);

// The command line of a 2-rank job: every rank runs
// `rank_prefix distckpt_fault_probe DIR ACTION SEED probe_args`.
std::string probe_job(const std::string& dir, const std::string& action, int seed, const std::string& probe_args = "",
                      const std::string& rank_prefix = "");

// The command line of one node of a job of `nodes` nodes of one rank each
// (rank = node): `distckpt-launch --nnodes N --node-rank NODE -n 1 --master-port
// PORT -- rank_prefix distckpt_fault_probe DIR ACTION SEED`. Each node's
// launcher stops only its own rank, so a rank that dies leaves the other
// to find out by itself, as on two machines.
std::string probe_node(int node, int port, const std::string& dir, const std::string& action, int seed,
                       const std::string& rank_prefix = "", int nodes = 2);
// A TCP port on loopback that was free a moment ago.
int free_port();

// "strace -f" for a command line (in an environment a sanitized build's
// processes can run under ptrace in).
std::string strace_command();
// An strace prefix (followed by the command it runs) that applies `tamper`
// (e.g. "error=ENOSPC", "signal=SIGSTOP:when=1") to the `syscalls` (e.g.
// "pwrite64") that touch `path` (or a descriptor open on it), in every
// process and thread of the command; everything else runs untouched.
std::string strace_inject(const std::string& syscalls, const std::string& path, const std::string& tamper);

// A prefix for each rank of a launched job (it reads $RANK): rank `rank`
// runs under `prefix` (an strace command line), the others as they are.
std::string on_rank(int rank, const std::string& prefix);
// A prefix for each rank of a launched job (it reads $RANK): rank `rank`
// runs under strace with the `when`-th thread creation (clone3, or clone
// with an older glibc) of each of
// its threads failing with EAGAIN, as at a thread limit; the others run as
// they are.
std::string fail_thread_start_on_rank(int rank, int when);
// How many threads the main thread of rank `rank` starts before its first
// system call naming `path` (LibTorch's and Gloo's, whose failures are not
// distckpt's to handle: LibTorch 1.13 aborts or hangs in ProcessGroupGloo's
// constructor). Runs `job` (a function of the rank prefix) once, traced;
// -1 when that rank never names `path`.
int threads_started_before(const std::function<CommandResult(const std::string& rank_prefix)>& job, int rank,
                           const std::string& path);

// Why strace cannot trace on this machine (not installed, ptrace denied);
// nullopt when it can.
std::optional<std::string> strace_unavailable();

// run_command bounded by `seconds`, so a hanging job fails its test
// instead of hanging the suite: then SIGTERM, which the launcher passes on
// to its ranks (exit code 124), and SIGKILL 15 s later (137).
CommandResult run_bounded(const std::string& command, int seconds = 120);
bool ran_out(const CommandResult& result);  // stopped by run_bounded's bound

// Records one injected fault of the running test and what came of it, as
// the gtest property fault_N (N counts from 1 within the test), so that
// scripts/fault-table.sh can list every fault and its observed result.
void record_fault(const std::string& fault, const std::string& outcome);
// "IoError on both ranks": the classes failure_classes found, collapsed.
std::string describe_classes(const std::vector<std::string>& classes);

// The lines of `output` that start with `prefix`.
std::vector<std::string> lines_starting(const std::string& output, const std::string& prefix);

// The error class of the one line of `output` that starts with `prefix`
// followed by "CLASS: message" (probes print "rank R failed: IoError: ...");
// a description in parentheses when there is not exactly one such line.
std::string failure_class(const std::string& output, const std::string& prefix);
// failure_class for each of ranks 0 .. ranks - 1, whose lines start with
// `format` with the rank put in ("rank {} failed: ").
std::vector<std::string> failure_classes(const std::string& output, int ranks,
                                         const std::string& format = "rank {} failed: ");

// `distckpt digest DIR`: its output, or "exit N: OUTPUT" when it fails.
std::string digest(const std::string& dir);

// `path` with symlinks resolved (strace -P compares resolved paths).
std::string canonical_path(const std::string& path);

// The entries of a directory (names, sorted; "." and ".." left out).
std::vector<std::string> list_dir(const std::string& dir);
