// The Hugging Face safetensors format: its writer's knobs and how to ask for
// it. A save writes it with SaveOptions::format = safetensors_format(knobs);
// loads detect it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "distckpt/format/name_mapping.h"
#include "distckpt/storage/storage_format.h"
#include "distckpt/storage/storage_writer.h"

namespace distckpt {

struct SafetensorsWriteOptions : FormatOptions {
  // The most tensor bytes per file (0: one model.safetensors); a larger
  // tensor gets a file of its own. Shards come with model.safetensors.index.json.
  uint64_t max_shard_bytes = 0;
  // Write under this mapping's external names (the layout schema's
  // `mapping llama`); each key's pieces land in the external tensors its
  // regions cover. Keys the mapping does not name (optimizer state),
  // sharded objects and common values are not written (warned).
  std::optional<NameMapping> mapping;
};

// The safetensors format with these knobs.
StorageFormat safetensors_format(SafetensorsWriteOptions options = {});

// Writes a Hugging Face safetensors directory at `dir`, which must not exist.
// The bytes are those convert_to_safetensors writes for the same tensors.
// Without a mapping, common values must be strings (they become
// "__metadata__"); sharded objects cannot be stored (an error at prepare).
std::unique_ptr<StorageWriter> make_safetensors_writer(const std::string& dir, SafetensorsWriteOptions options = {});

}  // namespace distckpt
