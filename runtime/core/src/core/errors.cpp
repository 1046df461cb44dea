// Error classes: their kinds and names, and raising a class chosen at run
// time (agreement raises on every rank the class some rank saw).
#include "distckpt/core/errors.h"

#include <utility>

namespace distckpt {
namespace {

const Error::Details& no_details() {
  static const Error::Details empty;
  return empty;
}

}  // namespace

const char* error_class_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kCorruption:
      return "CorruptionError";
    case ErrorKind::kCheckpoint:
      return "CheckpointError";
    case ErrorKind::kIo:
      return "IoError";
    case ErrorKind::kKeyMismatch:
      return "KeyMismatchError";
    case ErrorKind::kSharding:
      return "ShardingError";
    case ErrorKind::kUsage:
      return "UsageError";
    case ErrorKind::kOther:
      return "Error";
    case ErrorKind::kProtocol:
      return "ProtocolError";
    case ErrorKind::kTimeout:
      return "TimeoutError";
    case ErrorKind::kComm:
      return "CommError";
  }
  return "Error";
}

Error::Error(const std::string& message) : std::runtime_error(message) {}

Error::Error(const std::string& message, std::string path) : std::runtime_error(message) {
  if (!path.empty()) details_ = std::make_shared<const Details>(Details{std::move(path), 0, {}});
}

Error::Error(const std::string& message, Details details)
    : std::runtime_error(message), details_(std::make_shared<const Details>(std::move(details))) {}

const std::string& Error::path() const noexcept { return (details_ ? *details_ : no_details()).path; }

int Error::error_number() const noexcept { return details_ ? details_->error_number : 0; }

const std::vector<RankFailure>& Error::failures() const noexcept {
  return (details_ ? *details_ : no_details()).failures;
}

IoError::IoError(const std::string& message, std::string path, int error_number)
    : Error(message, Details{std::move(path), error_number, {}}) {}

ErrorKind error_kind_of(const std::exception& e) noexcept {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return error->kind();
  return ErrorKind::kOther;
}

void throw_error(ErrorKind kind, const std::string& message, Error::Details details) {
  switch (kind) {
    case ErrorKind::kCorruption:
      throw CorruptionError(message, std::move(details));
    case ErrorKind::kCheckpoint:
      throw CheckpointError(message, std::move(details));
    case ErrorKind::kIo:
      throw IoError(message, std::move(details));
    case ErrorKind::kKeyMismatch:
      throw KeyMismatchError(message, std::move(details));
    case ErrorKind::kSharding:
      throw ShardingError(message, std::move(details));
    case ErrorKind::kUsage:
      throw UsageError(message, std::move(details));
    case ErrorKind::kOther:
      break;
    case ErrorKind::kProtocol:
      throw ProtocolError(message, std::move(details));
    case ErrorKind::kTimeout:
      throw TimeoutError(message, std::move(details));
    case ErrorKind::kComm:
      throw CommError(message, std::move(details));
  }
  throw Error(message, std::move(details));
}

void rethrow_with_context(const std::exception& e, const std::string& context) {
  const auto* error = dynamic_cast<const Error*>(&e);
  Error::Details details;
  if (error != nullptr) {
    details.path = error->path();
    details.error_number = error->error_number();
    details.failures = error->failures();
  }
  throw_error(error_kind_of(e), context + ": " + e.what(), std::move(details));
}

}  // namespace distckpt
