// PyTorch's distributed checkpoint format (torch.distributed.checkpoint,
// DCP): `.metadata` plus one `__R_0.distcp` per writing rank, which
// Megatron-Core's `torch_dist` backend, torchtitan and NeMo write. Loads
// detect it (a directory or s3:// prefix holding `.metadata`); a save
// writes it with SaveOptions::format = dcp_format(knobs), and PyTorch's own
// FileSystemReader then loads it with nothing of distckpt installed.
#pragma once

#include <memory>
#include <string>

#include "distckpt/storage/storage_format.h"
#include "distckpt/storage/storage_writer.h"

namespace distckpt {

struct DcpWriteOptions : FormatOptions {
  // The module names `.metadata` pickles DCP's classes under: PyTorch 2.x's
  // torch.distributed.checkpoint (the default), or 1.13's
  // torch.distributed._shard.checkpoint (which 2.x cannot unpickle).
  enum class Naming { kTorch2, kTorch113 };
  Naming naming = Naming::kTorch2;
  // Megatron-Core's torch_dist layout: also its metadata.json, and the
  // common state in common.pt instead of one bytes item per value.
  bool torch_dist = false;
};

// The DCP format with these knobs.
StorageFormat dcp_format(DcpWriteOptions options = {});

// Writes a DCP checkpoint at `location` (a directory that must not exist, or
// an empty s3:// prefix): each rank its pieces as one torch.save archive
// each in `__<rank>_0.distcp`, sharded objects as bytes items under their
// unique keys ("key/shard_0_2"), the common state as one bytes item per
// top-level key (torch.save of the value); the coordinator's `.metadata`
// last, the commit.
std::unique_ptr<StorageWriter> make_dcp_writer(const std::string& location, DcpWriteOptions options = {});

}  // namespace distckpt
