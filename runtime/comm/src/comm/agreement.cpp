// Agreeing on success: each rank all-gathers its status ("" = ok, else its
// error message), so a failure on one rank fails every rank at the same
// step instead of leaving the others blocked in the next collective.
#include "comm/agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

// Bounds on what one failure report can cost every rank.
constexpr std::size_t kMaxMessageBytes = 2000;
constexpr std::size_t kMaxReportedRanks = 8;
constexpr std::size_t kMaxListedRankRuns = 32;
// A failure in an all-to-all step is sent to every rank: its excerpt shrinks
// with the world so that the report costs the failing rank at most this.
constexpr std::size_t kMaxAllToAllStatusBytes = std::size_t{4} << 20;

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception (not derived from std::exception)";
  }
}

// The status this rank sends: never empty for a failure.
std::string encode_status(const std::exception_ptr& error) {
  if (!error) return {};
  std::string message = message_of(error);
  if (message.empty()) return "exception with an empty message";
  if (message.size() > kMaxMessageBytes) {
    message.resize(kMaxMessageBytes);
    message += "... (truncated)";
  }
  return message;
}

// "1, 3, 5-9": consecutive ranks collapse so thousands of failed ranks stay short.
std::string format_rank_list(const std::vector<int>& ranks) {
  std::string text;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (runs == kMaxListedRankRuns) {
      text += fmt::format(", ... ({} ranks in all)", ranks.size());
      break;
    }
    if (runs > 0) text += ", ";
    text += i == j ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    ++runs;
    i = j + 1;
  }
  return text;
}

std::string describe_failures(const std::string& phase, const std::vector<std::string>& statuses) {
  std::vector<int> failed;
  for (std::size_t r = 0; r < statuses.size(); ++r) {
    if (!statuses[r].empty()) failed.push_back(static_cast<int>(r));
  }
  std::string text = fmt::format("{} failed on rank(s) {}: ", phase, format_rank_list(failed));
  const std::size_t shown = std::min(failed.size(), kMaxReportedRanks);
  for (std::size_t i = 0; i < shown; ++i) {
    if (i > 0) text += "; ";
    text += fmt::format("rank {}: {}", failed[i], statuses[static_cast<std::size_t>(failed[i])]);
  }
  if (failed.size() > shown) text += fmt::format("; and {} more", failed.size() - shown);
  return text;
}

// Parts that start with 'k' lose that byte; any other part is a failure
// ('e' + its message), and then every rank throws naming them all.
std::vector<std::string> unwrap_statuses(const std::string& phase, std::vector<std::string> parts) {
  std::vector<std::string> statuses(parts.size());
  bool failed = false;
  for (std::size_t r = 0; r < parts.size(); ++r) {
    if (parts[r].empty() || parts[r][0] != 'k') {
      statuses[r] = parts[r].empty() ? "malformed status" : parts[r].substr(1);
      failed = true;
    } else {
      parts[r].erase(0, 1);
    }
  }
  if (failed) throw CommError(describe_failures(phase, statuses));
  return parts;
}

}  // namespace

void agree_on_errors(Communicator& comm, const std::string& phase, std::exception_ptr local_error) {
  std::vector<std::string> statuses;
  try {
    statuses = comm.all_gather_bytes(encode_status(local_error));
  } catch (...) {
    // The local failure is the root cause; the broken exchange is a symptom.
    if (local_error) std::rethrow_exception(local_error);
    throw;
  }
  if (local_error) std::rethrow_exception(local_error);
  for (const std::string& status : statuses) {
    if (!status.empty()) throw CommError(describe_failures(phase, statuses));
  }
}

void run_agreed(Communicator& comm, const std::string& phase, const std::function<void()>& step) {
  std::exception_ptr local_error;
  try {
    step();
  } catch (...) {
    local_error = std::current_exception();
  }
  agree_on_errors(comm, phase, local_error);
}

std::vector<std::string> gather_agreed(Communicator& comm, const std::string& phase,
                                       const std::function<std::string()>& step) {
  // One byte says which it is: 'k' + the step's bytes, or 'e' + the error.
  std::exception_ptr local_error;
  std::string sent;
  try {
    sent = "k" + step();
  } catch (...) {
    local_error = std::current_exception();
    sent = "e" + encode_status(local_error);
  }
  std::vector<std::string> gathered;
  try {
    gathered = comm.all_gather_bytes(sent);
  } catch (...) {
    if (local_error) std::rethrow_exception(local_error);
    throw;
  }
  if (local_error) std::rethrow_exception(local_error);
  return unwrap_statuses(phase, std::move(gathered));
}

std::vector<std::string> all_to_all_agreed(Communicator& comm, const std::string& phase,
                                           const std::function<std::vector<std::string>()>& step) {
  const auto world = static_cast<std::size_t>(comm.size());
  std::exception_ptr local_error;
  std::vector<std::string> parts;
  try {
    parts = step();
    if (parts.size() != world) {
      throw Error(fmt::format("internal: {} gave {} parts for {} ranks", phase, parts.size(), world));
    }
    for (std::string& part : parts) part.insert(part.begin(), 'k');
  } catch (...) {
    local_error = std::current_exception();
    // Every rank must hear of it; a large world gets a shorter excerpt each.
    std::string status = encode_status(local_error);
    status.resize(std::min(status.size(), std::max<std::size_t>(64, kMaxAllToAllStatusBytes / world)));
    parts.assign(world, "e" + status);
  }
  std::vector<std::string> received;
  try {
    received = comm.all_to_all_bytes(parts);
  } catch (...) {
    if (local_error) std::rethrow_exception(local_error);
    throw;
  }
  if (local_error) std::rethrow_exception(local_error);
  return unwrap_statuses(phase, std::move(received));
}

}  // namespace distckpt
