// An object of any backend as the sink of an io::FileWriteJob, so that a
// rank's data file is written the same way to a directory or a bucket.
#pragma once

#include <memory>

#include "distckpt/storage/backend.h"
#include "io/byte_sink.h"

namespace distckpt::storage {

// Aborting the sink aborts the object (an S3 multipart upload leaves no parts).
std::unique_ptr<io::ByteSink> object_sink(std::unique_ptr<ObjectWriter> writer);

}  // namespace distckpt::storage
