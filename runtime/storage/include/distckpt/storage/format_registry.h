// Storage formats, registered by name. A format is written once against the
// backend interface (distckpt/storage/backend.h) and so works on every
// backend: it recognises its checkpoints, opens them for reading and, where
// saves write it, makes the writer. Four are built in: "dcp" (PyTorch's
// distributed checkpoint and Megatron's torch_dist, distckpt/storage/dcp.h),
// "distckpt" (the default), "safetensors" and "torch" (read only).
// docs/STORAGE.md walks through adding one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "distckpt/storage/backend.h"
#include "distckpt/storage/storage_format.h"
#include "distckpt/storage/storage_reader.h"
#include "distckpt/storage/storage_writer.h"

namespace distckpt {

class Format {
 public:
  virtual ~Format() = default;

  // Its registered name ("safetensors"); StorageFormat(name) chooses it.
  virtual std::string name() const = 0;
  // Whether the location holds a checkpoint of this format: with `file`
  // empty, the directory or prefix `backend` is rooted at; otherwise that one
  // file in it. Cheap (a name, a listing, a file's first bytes). May throw
  // CheckpointError to reject what it recognises but cannot read, saying why.
  virtual bool detect(Backend& backend, const std::string& file) const = 0;
  // Opens the checkpoint `detect` recognised (or that the caller named this
  // format for). CheckpointError when there is none; CorruptionError when its
  // metadata or files are inconsistent.
  virtual std::unique_ptr<StorageReader> open(std::shared_ptr<Backend> backend, const std::string& file,
                                              const StorageOptions& options) const = 0;
  // The writer of a save into `location`, configured by `format`'s knobs.
  // By default a UsageError: saves do not write this format.
  virtual std::unique_ptr<StorageWriter> make_writer(const std::string& location, const StorageFormat& format) const;
};

// Adds `format`; detection asks the formats in the order they were
// registered (the built-in ones first). UsageError if its name is taken.
void register_format(std::shared_ptr<const Format> format);
// The format registered as `name`; UsageError naming the registered ones otherwise.
const Format& find_format(const std::string& name);
// Every registered format's name, in registration order.
std::vector<std::string> registered_formats();

}  // namespace distckpt
