// An S3-protocol bucket prefix as a Backend (s3://bucket/prefix): objects
// are the keys below the prefix; reads are ranged GETs, several in flight;
// writes are multipart uploads of bounded parts; publish is a PUT, with
// If-None-Match: * when it must not replace (two writers never both win).
#pragma once

#include <memory>
#include <string>

#include "distckpt/storage/backend.h"
#include "storage/locate.h"

namespace distckpt::storage {

// UsageError for a malformed URL or missing configuration (what to set).
std::unique_ptr<Backend> make_s3_backend(const std::string& url);
// A URL naming one object (an exact key) is a single file of its prefix.
Located locate_s3(const std::string& url);

}  // namespace distckpt::storage
