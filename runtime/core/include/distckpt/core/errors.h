// The one error family of distckpt. Messages name the key, rank, shapes and
// what to do; the class says which kind of failure it is, so callers can act
// on it (e.g. fall back to an older checkpoint on CheckpointError).
//
//   Error                      anything else (a bug, an exception from LibTorch)
//   ├─ UsageError              the caller asked for something that cannot be done
//   │  ├─ ShardingError        inconsistent ShardedTensors/Objects or global sharding
//   │  └─ KeyMismatchError     strict handling: missing or unexpected keys
//   ├─ CheckpointError         no (committed) checkpoint there, an unknown format or
//   │  │                       version, or a save that would overwrite one
//   │  └─ CorruptionError      stored bytes fail a check: damaged, incomplete or hostile
//   ├─ IoError                 a system call on a file failed (errno(), path())
//   └─ CommError               a collective failed, or a peer did
//      ├─ TimeoutError         a peer did not answer within the timeout
//      └─ ProtocolError        a peer sent malformed bytes
//
// A failure inside a collective call is agreed: every rank raises the same
// class, with the same message, and failures() lists what each failed rank
// saw (docs/RELIABILITY.md, "Errors every rank agrees on").
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace distckpt {

// One value per class above, in the order agreement picks them: when ranks
// fail differently, every rank raises the earliest kind any rank saw, since
// the earlier kinds name a cause and the later ones are usually its
// consequence elsewhere (a peer's failure, a broken connection).
enum class ErrorKind : uint8_t {
  kCorruption,
  kCheckpoint,
  kIo,
  kKeyMismatch,
  kSharding,
  kUsage,
  kOther,  // Error itself, or an exception from outside distckpt
  kProtocol,
  kTimeout,
  kComm,
};
constexpr int kErrorKindCount = 10;

// "CorruptionError" for kCorruption, ...: the class name (the Python package's too).
const char* error_class_name(ErrorKind kind);

// What one rank saw, as agreement carries it to every rank.
struct RankFailure {
  int rank = -1;
  ErrorKind kind = ErrorKind::kOther;
  std::string message;
  std::string path;      // the file or object involved, when known
  int error_number = 0;  // errno, for IoError
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message);
  // `path`: the file or object the failure is about, for programs (the
  // message names it for people).
  Error(const std::string& message, std::string path);

  virtual ErrorKind kind() const noexcept { return ErrorKind::kOther; }
  const char* class_name() const noexcept { return error_class_name(kind()); }
  const std::string& path() const noexcept;
  // errno of the failed system call (IoError); 0 otherwise.
  int error_number() const noexcept;
  // Raised by agreement: every failed rank's report, by rank (the ranks
  // whose failure is listed; a very large world shortens each message).
  // Empty for an error raised on this rank alone.
  const std::vector<RankFailure>& failures() const noexcept;
  bool agreed() const noexcept { return !failures().empty(); }

  struct Details {
    std::string path;
    int error_number = 0;
    std::vector<RankFailure> failures;
  };
  Error(const std::string& message, Details details);

 private:
  std::shared_ptr<const Details> details_;
};

class UsageError : public Error {
 public:
  using Error::Error;
  ErrorKind kind() const noexcept override { return ErrorKind::kUsage; }
};

// A ShardedTensor/ShardedObject whose metadata is inconsistent, or a global
// sharding that has gaps, overlaps or disagreeing dtypes/shapes across ranks.
class ShardingError : public UsageError {
 public:
  using UsageError::UsageError;
  ErrorKind kind() const noexcept override { return ErrorKind::kSharding; }
};

// Strict-handling failures: keys requested but absent from the checkpoint
// ("unexpected") or stored but not requested ("missing").
class KeyMismatchError : public UsageError {
 public:
  using UsageError::UsageError;
  ErrorKind kind() const noexcept override { return ErrorKind::kKeyMismatch; }
};

// The location holds no committed checkpoint (absent, or a save that never
// finished), one of an unknown format or version, or a save would overwrite one.
class CheckpointError : public Error {
 public:
  using Error::Error;
  ErrorKind kind() const noexcept override { return ErrorKind::kCheckpoint; }
};

// Bytes on disk do not match what the metadata promises: checksum mismatch,
// unverifiable FlatBuffers, a file missing or cut short, offsets outside a
// file, paths leaving the folder.
class CorruptionError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
  ErrorKind kind() const noexcept override { return ErrorKind::kCorruption; }
};

// A system call on a file failed: the message names the call and the path,
// error_number() is its errno (ENOSPC, EIO, ...).
class IoError : public Error {
 public:
  using Error::Error;
  IoError(const std::string& message, std::string path, int error_number);
  ErrorKind kind() const noexcept override { return ErrorKind::kIo; }
};

// A collective failed or another rank did (it exited, or its connection broke).
class CommError : public Error {
 public:
  using Error::Error;
  ErrorKind kind() const noexcept override { return ErrorKind::kComm; }
};

// A peer did not answer within the timeout (hung, stopped or far too slow).
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
  ErrorKind kind() const noexcept override { return ErrorKind::kTimeout; }
};

// Bytes another rank sent are malformed (short, unverifiable, out of range):
// a bug, or ranks running different versions of distckpt.
class ProtocolError : public CommError {
 public:
  using CommError::CommError;
  ErrorKind kind() const noexcept override { return ErrorKind::kProtocol; }
};

// The kind of any exception: its class's for distckpt errors, kOther for
// everything else.
ErrorKind error_kind_of(const std::exception& e) noexcept;

// Throws the class of `kind` with `message` and `details`.
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message, Error::Details details = {});
// Throws `e` again as its own class, path and errno, its message prefixed
// with `context` ("context: message"), for a caller that adds where it happened.
[[noreturn]] void rethrow_with_context(const std::exception& e, const std::string& context);

}  // namespace distckpt
