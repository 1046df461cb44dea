// Where a checkpoint's bytes live. A storage *format* (distckpt, safetensors,
// torch.save: what the bytes mean) reads and writes through a *backend*
// (where they are: a POSIX directory, an S3-protocol bucket prefix), so every
// format works on every backend. A backend moves bytes only:
//
//   list(prefix)            the objects under the root whose name starts with prefix
//   open(name)              ranged reads of one object
//   create(name)            one object written at offsets, from several threads,
//                           made durable and visible at once by finish()
//   publish(name, bytes)    a small object written atomically (create-only or replace)
//   remove(name)            one object gone
//
// Names are relative to the backend's root, '/'-separated, checked by
// check_object_name (no "..", no absolute path): a checkpoint is untrusted
// input, and nothing it names may reach outside its root.
//
// Adding one (GCS's or Azure's native API, say) is one file: implement these
// classes and add its URL scheme to open_backend (storage/backends.cpp).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace distckpt {

// One stored object, read in ranges from several threads at once.
class ObjectReader {
 public:
  virtual ~ObjectReader() = default;
  virtual uint64_t size() const = 0;
  // Exactly `length` bytes at `offset` into `out`; CorruptionError naming
  // the object when it ends before, IoError when the read fails.
  virtual void read(uint64_t offset, uint64_t length, uint8_t* out) const = 0;
  // Consecutive bytes from `offset` into the buffers of `iov`, in order.
  virtual void readv(const std::vector<struct iovec>& iov, uint64_t offset) const;
  // Reads of at least this many bytes cost little more per byte than longer
  // ones (an object store's request overhead); readers of long ranges ask
  // for this much at once. 0: any size is as cheap (a local file).
  virtual uint64_t preferred_read_bytes() const { return 0; }
};

// One object being written: every byte of [0, size) once, at any offset, in
// any order, from several threads; it appears, whole, when finish() returns.
class ObjectWriter {
 public:
  virtual ~ObjectWriter() = default;
  virtual void write(uint64_t offset, const uint8_t* data, uint64_t length) = 0;
  // Every byte of [0, size) was written: the object is durable and visible
  // under its name (POSIX: fsync'ed; S3: the multipart upload completed).
  virtual void finish(uint64_t size) = 0;
  // Drops what was written (an S3 multipart upload is aborted). Never throws.
  virtual void abort() noexcept = 0;
  // Writes whose offset and length are multiples of this are the cheapest
  // (O_DIRECT's alignment on POSIX, the part size on S3); 1 when any will do.
  virtual uint64_t preferred_alignment() const { return 1; }
};

struct StoredObject {
  std::string name;  // relative to the backend's root
  uint64_t size = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // The root, as the user names it: "/runs/ckpt", "s3://bucket/runs/ckpt".
  virtual const std::string& location() const = 0;
  // `name` under the root, for messages and error paths.
  std::string describe(const std::string& name) const;
  // Whether the root holds anything (POSIX: the directory exists).
  virtual bool root_exists() = 0;
  // The objects whose name starts with `prefix` (all: ""), with their sizes,
  // sorted by name, at most `limit` of them (0: all; which ones, then, is
  // not fixed); with `below`, those in subdirectories too (names with a
  // '/' after the prefix). POSIX lists regular files (and links to them;
  // open() decides whether a link may be followed).
  virtual std::vector<StoredObject> list(const std::string& prefix, size_t limit = 0, bool below = true) = 0;
  // The size of `name`; nullopt when there is no such object. CorruptionError
  // when it is no regular object (a FIFO, a link leaving the root).
  virtual std::optional<uint64_t> size_of(const std::string& name) = 0;
  // size_of for many names at once (an object store lists instead of asking
  // for each); the default asks for each.
  virtual std::vector<std::optional<uint64_t>> sizes_of(const std::vector<std::string>& names);
  // For ranged reads. IoError with errno ENOENT when there is no such object
  // (a format that lists it reports a CorruptionError: the checkpoint is
  // incomplete); CorruptionError when it is no regular object (a FIFO, a link
  // leaving the root).
  virtual std::unique_ptr<ObjectReader> open(const std::string& name) = 0;
  // All of a small object, refused past `max_bytes` (CorruptionError).
  std::string read_small(const std::string& name, uint64_t max_bytes);
  // A new object (replacing any of that name when finished), `size_hint`
  // bytes when known (0: unknown).
  virtual std::unique_ptr<ObjectWriter> create(const std::string& name, uint64_t size_hint) = 0;
  // `bytes` as object `name`, atomically and durably. With `if_absent`,
  // nothing is written and false returned when the object exists (two
  // writers never both succeed); else it replaces any.
  virtual bool publish(const std::string& name, std::string_view bytes, bool if_absent) = 0;
  // Removes `name`; no error when it is absent.
  virtual void remove(const std::string& name) = 0;
  // Drops the unfinished writes of objects whose name starts with `prefix`
  // (S3: their multipart uploads, parts included), whoever started them.
  // POSIX has nothing to do: an unfinished file is an ordinary one.
  virtual void abort_unfinished(const std::string& /*prefix*/) {}
};

// The backend of `location`: "s3://bucket/prefix" (configured as the AWS
// tools are: AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_PROFILE, ...;
// docs/STORAGE.md), else a POSIX directory path.
std::unique_ptr<Backend> open_backend(const std::string& location);
// Whether `location` names an object store rather than a local path.
bool is_object_store(const std::string& location);
// Whether anything is there: a file or directory; an object, or objects
// below the prefix.
bool location_exists(const std::string& location);

// UsageError/CorruptionError unless `name` is a relative '/'-separated name
// without empty, "." or ".." components (`what` says whose name it is).
void check_object_name(std::string_view name, const std::string& what);

}  // namespace distckpt
