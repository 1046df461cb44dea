// What every backend shares: names, small reads, scattered reads, and
// choosing the backend of a location by its scheme.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "distckpt/core/errors.h"
#include "distckpt/storage/backend.h"
#include "io/file.h"
#include "storage/locate.h"
#include "storage/posix_backend.h"
#include "storage/s3_backend.h"

namespace distckpt {

void ObjectReader::readv(const std::vector<struct iovec>& iov, uint64_t offset) const {
  for (const struct iovec& v : iov) {
    read(offset, v.iov_len, static_cast<uint8_t*>(v.iov_base));
    offset += v.iov_len;
  }
}

std::string Backend::describe(const std::string& name) const {
  if (name.empty()) return location();
  if (location() == ".") return name;
  return location().empty() || location().back() == '/' ? location() + name : location() + "/" + name;
}

std::vector<std::optional<uint64_t>> Backend::sizes_of(const std::vector<std::string>& names) {
  std::vector<std::optional<uint64_t>> sizes;
  sizes.reserve(names.size());
  for (const std::string& name : names) sizes.push_back(size_of(name));
  return sizes;
}

std::string Backend::read_small(const std::string& name, uint64_t max_bytes) {
  const std::unique_ptr<ObjectReader> reader = open(name);
  const uint64_t size = reader->size();
  if (size > max_bytes) {
    throw CorruptionError(
        fmt::format("{} has {} bytes, more than the {} bytes such a file may have", describe(name), size, max_bytes),
        describe(name));
  }
  std::string bytes(size, '\0');
  reader->read(0, size, reinterpret_cast<uint8_t*>(bytes.data()));
  return bytes;
}

void check_object_name(std::string_view name, const std::string& what) {
  try {
    io::validate_relative_path(name);
  } catch (const CorruptionError& e) {
    throw CorruptionError(fmt::format("{}: {}", what, e.what()), e.path());
  }
}

bool is_object_store(const std::string& location) { return location.rfind("s3://", 0) == 0; }

bool location_exists(const std::string& location) {
  if (!is_object_store(location)) return io::exists(location);
  const storage::Located at = storage::locate(location);
  return !at.file.empty() || at.backend->root_exists();
}

std::unique_ptr<Backend> open_backend(const std::string& location) {
  if (is_object_store(location)) return storage::make_s3_backend(location);
  const std::string::size_type scheme = location.find("://");
  if (scheme != std::string::npos && location.find('/') > scheme) {
    throw UsageError(
        fmt::format("'{}' names storage of the scheme '{}', which distckpt does not know; give a local "
                    "path or an s3://BUCKET/PREFIX URL",
                    location, location.substr(0, scheme)));
  }
  return std::make_unique<storage::PosixBackend>(location);
}

namespace storage {

Located locate(const std::string& location) {
  if (is_object_store(location)) return locate_s3(location);
  if (!io::is_dir(location) && io::is_regular_file(location)) {
    const size_t slash = location.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : location.substr(0, std::max<size_t>(slash, 1));
    const std::string name = slash == std::string::npos ? location : location.substr(slash + 1);
    return {std::make_shared<PosixBackend>(dir, PosixBackend::Links::kAnywhere), name};
  }
  return {std::shared_ptr<Backend>(open_backend(location)), ""};
}

}  // namespace storage
}  // namespace distckpt
