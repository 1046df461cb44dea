// The formats distckpt ships (distckpt, safetensors, torch) as registry
// entries, and the registry's list for detection.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distckpt/storage/format_registry.h"

namespace distckpt::storage {

// distckpt, safetensors, torch: the order detection asks them in.
std::vector<std::shared_ptr<const Format>> builtin_formats();

// Every registered format, in registration order (a snapshot).
std::vector<std::shared_ptr<const Format>> formats_in_order();
// The format registered as `name`; UsageError naming the registered ones otherwise.
std::shared_ptr<const Format> registered_format(const std::string& name);
// "distckpt, safetensors, torch": the names of `formats`, for messages.
std::string format_names(const std::vector<std::shared_ptr<const Format>>& formats);

}  // namespace distckpt::storage
