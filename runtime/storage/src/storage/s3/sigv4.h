// AWS Signature Version 4 (the AWS4-HMAC-SHA256 header form) as S3 checks it:
// canonical request, string to sign, signing key, Authorization header.
//
// S3 differs from the other services in two ways that matter here: the path
// is encoded once and never normalised ("a/../b" is a key of its own), and
// every request carries x-amz-content-sha256 (the payload's SHA-256, or
// UNSIGNED-PAYLOAD), which is signed like the other x-amz-* headers.
#pragma once

#include <ctime>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace distckpt::s3 {

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty unless the credentials are temporary (STS)
};

using Header = std::pair<std::string, std::string>;      // name, value as sent
using QueryParam = std::pair<std::string, std::string>;  // name, value, not yet encoded

inline constexpr const char* kUnsignedPayload = "UNSIGNED-PAYLOAD";
inline constexpr const char* kEmptyPayloadSha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

struct SigningInput {
  std::string method;             // "GET", "PUT", ...
  std::string path;               // not yet encoded: "/bucket/key with space"
  std::vector<QueryParam> query;  // not yet encoded
  std::vector<Header> headers;    // every header to sign, host included
  std::string payload_hash;       // hex SHA-256 of the body, or kUnsignedPayload
};

struct SigningScope {
  std::string region;    // "us-east-1"
  std::string service;   // "s3"
  std::string amz_date;  // "20150830T123600Z" (UTC)
};

struct Signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signed_headers;  // "host;x-amz-date"
  std::string signature;       // hex
  std::string authorization;   // the Authorization header's value
};

// RFC 3986 percent-encoding as SigV4 wants it: every byte except A-Z a-z 0-9
// '-' '.' '_' '~' becomes %XX (uppercase hex); '/' too unless `keep_slash`.
std::string uri_encode(std::string_view text, bool keep_slash);
// "name=value&..." with names and values encoded and sorted by name, then
// value: the canonical query, and also the query string a request sends, so
// that what is signed is what the server sees.
std::string canonical_query(const std::vector<QueryParam>& query);
// "YYYYMMDDTHHMMSSZ" of a UTC time.
std::string amz_date(std::time_t when);

// Signs exactly `input.headers` (the generic algorithm, as AWS's test suite
// exercises it).
Signature sign_v4(const SigningInput& input, const Credentials& credentials, const SigningScope& scope);

// Signs an S3 request: adds x-amz-date, x-amz-content-sha256 (from
// input.payload_hash) and, with a session token, x-amz-security-token to
// `input.headers`, signs every header there and adds the Authorization one.
Signature sign_s3_request(SigningInput& input, const Credentials& credentials, const std::string& region,
                          const std::string& amz_date);

}  // namespace distckpt::s3
