// The one error family of distckpt. Messages name the key, rank, shapes and
// what to do; the subclass says which kind of failure it is so callers can
// react (e.g. fall back to another checkpoint on CorruptionError).
#pragma once

#include <stdexcept>
#include <string>

namespace distckpt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A ShardedTensor/ShardedObject whose metadata is inconsistent, or a global
// sharding that has gaps, overlaps or disagreeing dtypes/shapes across ranks.
class ShardingError : public Error {
 public:
  using Error::Error;
};

// Strict-handling failures: keys requested but absent from the checkpoint
// ("unexpected") or stored but not requested ("missing").
class KeyMismatchError : public Error {
 public:
  using Error::Error;
};

// The directory is not a (committed) checkpoint, is of an unknown version, or
// a save would overwrite one.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// Bytes on disk do not match what the metadata promises: checksum mismatch,
// unverifiable FlatBuffers, offsets outside a file, paths leaving the folder.
class CorruptionError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// A collective failed or another rank reported an error.
class CommError : public Error {
 public:
  using Error::Error;
};

// Bytes another rank sent are malformed (short, unverifiable, out of range):
// a bug, or ranks running different versions of distckpt.
class ProtocolError : public CommError {
 public:
  using CommError::CommError;
};

}  // namespace distckpt
