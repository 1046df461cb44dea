#include "distckpt/storage/storage_format.h"

#include "distckpt/core/errors.h"

namespace distckpt {

StorageFormat::StorageFormat(std::string name, std::shared_ptr<const FormatOptions> options)
    : name_(std::move(name)), options_(std::move(options)) {
  if (name_.empty()) throw UsageError("a storage format needs a name (\"distckpt\", \"safetensors\", ...)");
}

}  // namespace distckpt
