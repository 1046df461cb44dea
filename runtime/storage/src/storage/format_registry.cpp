// The registry of storage formats: the built-in ones first, then whatever a
// program registers, under one lock (registration may happen on any thread).
#include "distckpt/storage/format_registry.h"

#include <fmt/format.h>

#include <mutex>

#include "distckpt/core/errors.h"
#include "storage/builtin_formats.h"

namespace distckpt {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<const Format>> formats;  // in registration order; never removed
};

Registry& registry() {
  static Registry* r = [] {
    auto* made = new Registry;  // never destroyed: formats may be looked up during static destruction
    made->formats = storage::builtin_formats();
    return made;
  }();
  return *r;
}

}  // namespace

std::unique_ptr<StorageWriter> Format::make_writer(const std::string& location, const StorageFormat&) const {
  throw UsageError(
      fmt::format("saves do not write the {} format (into '{}'); save in the distckpt or safetensors "
                  "format and convert from there",
                  name(), location));
}

void register_format(std::shared_ptr<const Format> format) {
  if (!format) throw UsageError("register_format needs a format");
  const std::string name = format->name();
  if (name.empty() || name == "auto") {
    throw UsageError(fmt::format("a storage format cannot be registered as '{}'", name));
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& f : r.formats) {
    if (f->name() == name) throw UsageError(fmt::format("a storage format named '{}' is already registered", name));
  }
  r.formats.push_back(std::move(format));
}

const Format& find_format(const std::string& name) { return *storage::registered_format(name); }

std::vector<std::string> registered_formats() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> out;
  for (const auto& f : r.formats) out.push_back(f->name());
  return out;
}

namespace storage {

std::vector<std::shared_ptr<const Format>> formats_in_order() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.formats;
}

std::shared_ptr<const Format> registered_format(const std::string& name) {
  const std::vector<std::shared_ptr<const Format>> formats = formats_in_order();
  for (const auto& f : formats) {
    if (f->name() == name) return f;
  }
  throw UsageError(
      fmt::format("no storage format is registered as '{}'; the registered ones: {}", name, format_names(formats)));
}

std::string format_names(const std::vector<std::shared_ptr<const Format>>& formats) {
  std::string out;
  for (const auto& f : formats) out += (out.empty() ? "" : ", ") + f->name();
  return out;
}

}  // namespace storage
}  // namespace distckpt
