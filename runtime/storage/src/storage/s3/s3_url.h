// s3://bucket/prefix locations: bucket names checked against S3's naming
// rules, the prefix a folder of keys. "s3://b/ckpt", "s3://b/ckpt/" and
// "s3://b/ckpt//" are all the folder "ckpt" (keys "ckpt/NAME"); "s3://b" and
// "s3://b/" are the bucket's top level.
#pragma once

#include <string>
#include <string_view>

namespace distckpt::s3 {

struct S3Location {
  std::string bucket;
  std::string prefix;  // no leading or trailing '/'; empty for the bucket's top level

  // The key of `name` inside the prefix: "prefix/name", or "name" at the top level.
  std::string key(std::string_view name) const;
  // "s3://bucket/prefix" (or "s3://bucket").
  std::string url() const;
};

// Throws UsageError saying what is wrong (scheme, bucket name rule, empty or
// dot segments, control characters, key length).
S3Location parse_s3_url(std::string_view url);
// Throws UsageError naming the rule `bucket` breaks (3-63 characters of
// a-z 0-9 . -, starting and ending with a letter or digit, no "..", not an
// IPv4 address, none of the reserved prefixes and suffixes).
void check_bucket_name(std::string_view bucket);
// Whether `bucket` may be a DNS label of a virtual-hosted URL over TLS (no '.').
bool bucket_fits_virtual_host(std::string_view bucket);
// "s3://bucket/key", for messages and error paths.
std::string object_url(std::string_view bucket, std::string_view key);

}  // namespace distckpt::s3
