// What a failed S3 exchange means: whether another attempt may succeed, and
// which distckpt error to raise, with a message that names the object, the
// HTTP status, S3's error code and message, and what the user can change.
//
//   403 SignatureDoesNotMatch, InvalidAccessKeyId, AccessDenied, tokens, clock -> UsageError (which credentials)
//   404 NoSuchBucket                                     -> UsageError (the bucket, the endpoint)
//   301/307/400 with a region (PermanentRedirect, AuthorizationHeaderMalformed) -> UsageError (set AWS_REGION)
//   404 NoSuchKey (a HEAD's bare 404 too), NoSuchUpload  -> IoError ENOENT
//   416 InvalidRange                                     -> IoError ERANGE
//   anything else, and retries run out                   -> IoError EIO
#pragma once

#include <string>
#include <string_view>

#include "storage/s3/config.h"

namespace distckpt::s3 {

// S3's <Error> document; fields empty when absent (a HEAD response has none).
struct S3ErrorDocument {
  std::string code;
  std::string message;
  std::string region;    // AuthorizationHeaderMalformed, IllegalLocationConstraintException
  std::string endpoint;  // PermanentRedirect
  std::string request_id;
};

// Parses `body` when it is an <Error> document; an empty document otherwise
// (including bodies that are not XML: a proxy's HTML page).
S3ErrorDocument parse_error_document(std::string_view body);

// Whether another attempt may succeed: 5xx, 429, throttling and timeout
// codes, and bodies damaged in transit (BadDigest, XAmzContentSHA256Mismatch).
bool retryable_failure(long status, const std::string& code);

// One failed exchange, as the client saw it.
struct Failure {
  std::string bucket;
  std::string object;     // "s3://bucket/key", or "s3://bucket" for bucket requests
  std::string operation;  // "GET bytes=0-99", "UploadPart 3", ...
  long status = 0;        // 0: no HTTP response (see transport)
  S3ErrorDocument error;
  std::string transport;      // curl's words for a transport failure
  std::string detail;         // what else was wrong with a response (a short body)
  int error_number = 0;       // the errno to raise when detail is set (0: EIO)
  std::string region_header;  // x-amz-bucket-region
  std::string request_id;     // x-amz-request-id
};

// Raises the error `failure` means. `tries`, when not empty, says how hard the
// client tried ("8 attempts over 2.3 s") and is part of the message.
[[noreturn]] void raise_failure(const Failure& failure, const Config& config, const std::string& tries);

}  // namespace distckpt::s3
