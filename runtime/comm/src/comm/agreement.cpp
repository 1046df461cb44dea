// Agreeing on success: each rank all-gathers its status (empty = ok, else a
// failure report), so a failure on one rank fails every rank at the same
// step, with the same class and message, instead of leaving the others
// blocked in the next collective.
#include "comm/agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "distckpt/core/errors.h"

namespace distckpt {
namespace {

// Bounds on what one failure report can cost every rank: a report's message
// shrinks with the world so that all of them together stay near kAllReports.
constexpr std::size_t kMaxMessageBytes = 2000;
constexpr std::size_t kMinMessageBytes = 256;
constexpr std::size_t kAllReports = std::size_t{4} << 20;
constexpr std::size_t kMaxReportedRanks = 8;
constexpr std::size_t kMaxListedRankRuns = 32;

// A failure report: 'F', kind, flags, errno (4 bytes), path length (4 bytes),
// path, message; integers little endian. Peers are untrusted: decode checks.
constexpr char kReportTag = 'F';
constexpr uint8_t kFlagAgreed = 1;  // the failure was itself agreed (nested collectives)
constexpr std::size_t kHeaderBytes = 11;

struct LocalFailure {
  RankFailure report;
  bool agreed = false;
};

LocalFailure describe_local(const std::exception_ptr& error) {
  LocalFailure local;
  RankFailure& f = local.report;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    f.kind = e.kind();
    f.message = e.what();
    f.path = e.path();
    f.error_number = e.error_number();
    local.agreed = e.agreed();
  } catch (const std::exception& e) {
    f.message = e.what();
  } catch (...) {
    f.message = "unknown exception (not derived from std::exception)";
  }
  if (f.message.empty()) f.message = "exception with an empty message";
  return local;
}

std::size_t message_budget(std::size_t world) {
  return std::clamp(kAllReports / std::max<std::size_t>(world, 1), kMinMessageBytes, kMaxMessageBytes);
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t get_u32(const std::string& in, std::size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

std::string truncated(std::string text, std::size_t limit) {
  if (text.size() > limit) {
    text.resize(limit);
    text += "... (truncated)";
  }
  return text;
}

// The bytes this rank sends: empty for success, never empty for a failure.
std::string encode_report(const std::exception_ptr& error, std::size_t world) {
  if (!error) return {};
  const LocalFailure local = describe_local(error);
  const std::size_t budget = message_budget(world);
  const std::string path = truncated(local.report.path, budget);
  std::string out;
  out.push_back(kReportTag);
  out.push_back(static_cast<char>(local.report.kind));
  out.push_back(static_cast<char>(local.agreed ? kFlagAgreed : 0));
  put_u32(out, static_cast<uint32_t>(local.report.error_number));
  put_u32(out, static_cast<uint32_t>(path.size()));
  out += path;
  out += truncated(local.report.message, budget);
  return out;
}

struct Report {
  RankFailure failure;
  bool agreed = false;
};

Report decode_report(int rank, const std::string& bytes) {
  Report r;
  r.failure.rank = rank;
  const bool framed =
      bytes.size() >= kHeaderBytes && bytes[0] == kReportTag && static_cast<unsigned char>(bytes[1]) < kErrorKindCount;
  const std::size_t path_bytes = framed ? get_u32(bytes, 7) : 0;
  if (!framed || path_bytes > bytes.size() - kHeaderBytes) {
    r.failure.kind = ErrorKind::kProtocol;
    r.failure.message = fmt::format("a malformed failure report ({} bytes)", bytes.size());
    return r;
  }
  r.failure.kind = static_cast<ErrorKind>(bytes[1]);
  r.agreed = (static_cast<unsigned char>(bytes[2]) & kFlagAgreed) != 0;
  r.failure.error_number = static_cast<int>(get_u32(bytes, 3));
  r.failure.path = bytes.substr(kHeaderBytes, path_bytes);
  r.failure.message = bytes.substr(kHeaderBytes + path_bytes);
  return r;
}

// "1, 3, 5-9": consecutive ranks collapse so thousands of failed ranks stay short.
std::string format_rank_list(const std::vector<RankFailure>& failures) {
  std::string text;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < failures.size();) {
    std::size_t j = i;
    while (j + 1 < failures.size() && failures[j + 1].rank == failures[j].rank + 1) ++j;
    if (runs == kMaxListedRankRuns) {
      text += fmt::format(", ... ({} ranks in all)", failures.size());
      break;
    }
    if (runs > 0) text += ", ";
    text += i == j ? fmt::format("{}", failures[i].rank) : fmt::format("{}-{}", failures[i].rank, failures[j].rank);
    ++runs;
    i = j + 1;
  }
  return text;
}

std::string describe_failures(const std::string& phase, const std::vector<RankFailure>& failures) {
  std::string text = fmt::format("{} failed on rank(s) {}: ", phase, format_rank_list(failures));
  const std::size_t shown = std::min(failures.size(), kMaxReportedRanks);
  for (std::size_t i = 0; i < shown; ++i) {
    if (i > 0) text += "; ";
    text += fmt::format("rank {} ({}): {}", failures[i].rank, error_class_name(failures[i].kind), failures[i].message);
  }
  if (failures.size() > shown) text += fmt::format("; and {} more", failures.size() - shown);
  return text;
}

// Every rank decides from the same reports, so every rank throws the same:
// the earliest kind any rank saw (ErrorKind's order), the message naming them
// all, the reports as data. A failure that was itself agreed on every failing
// rank (a collective inside the step) is thrown again unchanged, and so is
// the error of a world of one, which has no one to agree with.
[[noreturn]] void throw_agreed(const std::string& phase, std::vector<Report> reports, std::size_t world,
                               const std::exception_ptr& local_error) {
  const bool all_agreed = std::all_of(reports.begin(), reports.end(), [](const Report& r) { return r.agreed; });
  if (local_error && (world == 1 || (all_agreed && describe_local(local_error).agreed))) {
    std::rethrow_exception(local_error);
  }
  Error::Details details;
  const RankFailure* cause = nullptr;
  for (Report& r : reports) {
    details.failures.push_back(std::move(r.failure));
  }
  for (const RankFailure& f : details.failures) {
    if (cause == nullptr || f.kind < cause->kind) cause = &f;
  }
  const ErrorKind kind = cause->kind;
  details.path = cause->path;
  details.error_number = cause->error_number;
  const std::string message = describe_failures(phase, details.failures);
  throw_error(kind, message, std::move(details));
}

// Reports of the ranks whose part is not `ok_tag` + payload; the payloads of
// the others lose their tag byte.
std::vector<std::string> unwrap_parts(const std::string& phase, std::vector<std::string> parts,
                                      const std::exception_ptr& local_error) {
  std::vector<Report> reports;
  for (std::size_t r = 0; r < parts.size(); ++r) {
    if (!parts[r].empty() && parts[r][0] == 'k') {
      parts[r].erase(0, 1);
    } else {
      reports.push_back(decode_report(static_cast<int>(r), parts[r].empty() ? parts[r] : parts[r].substr(1)));
    }
  }
  if (!reports.empty()) throw_agreed(phase, std::move(reports), parts.size(), local_error);
  return parts;
}

}  // namespace

void agree_on_errors(Communicator& comm, const std::string& phase, std::exception_ptr local_error) {
  std::vector<std::string> statuses;
  try {
    statuses = comm.all_gather_bytes(encode_report(local_error, static_cast<std::size_t>(comm.size())));
  } catch (...) {
    // The local failure is the root cause; the broken exchange is a symptom.
    if (local_error) std::rethrow_exception(local_error);
    throw;
  }
  std::vector<Report> reports;
  for (std::size_t r = 0; r < statuses.size(); ++r) {
    if (!statuses[r].empty()) reports.push_back(decode_report(static_cast<int>(r), statuses[r]));
  }
  if (!reports.empty()) throw_agreed(phase, std::move(reports), statuses.size(), local_error);
  // Every rank reported success, this one included: a local error that the
  // exchange lost would be a bug, not a reason to go on.
  if (local_error) std::rethrow_exception(local_error);
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
  // One byte says which it is: 'k' + the step's bytes, or 'e' + the report.
  std::exception_ptr local_error;
  std::string sent;
  try {
    sent = "k" + step();
  } catch (...) {
    local_error = std::current_exception();
    sent = "e" + encode_report(local_error, static_cast<std::size_t>(comm.size()));
  }
  std::vector<std::string> gathered;
  try {
    gathered = comm.all_gather_bytes(sent);
  } catch (...) {
    if (local_error) std::rethrow_exception(local_error);
    throw;
  }
  return unwrap_parts(phase, std::move(gathered), local_error);
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
    // Every rank must hear of it; the report shrinks with the world.
    parts.assign(world, "e" + encode_report(local_error, world));
  }
  std::vector<std::string> received;
  try {
    received = comm.all_to_all_bytes(parts);
  } catch (...) {
    if (local_error) std::rethrow_exception(local_error);
    throw;
  }
  return unwrap_parts(phase, std::move(received), local_error);
}

}  // namespace distckpt
