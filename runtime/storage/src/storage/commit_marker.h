// The commit marker's text, read through a backend.
#pragma once

#include <optional>
#include <string>

#include "distckpt/storage/backend.h"

namespace distckpt::storage {

// metadata.json at the backend's root; nullopt when there is none.
std::optional<std::string> read_commit_marker(Backend& backend);

}  // namespace distckpt::storage
