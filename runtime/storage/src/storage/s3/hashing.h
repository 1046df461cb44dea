// The digests S3 requests carry, over OpenSSL's libcrypto: SHA-256 (payload
// hashes), HMAC-SHA256 (SigV4 signing keys) and MD5 (Content-MD5, ETags),
// with the encodings S3 wants of them (lowercase hex, base64).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace distckpt::s3 {

using Sha256Digest = std::array<uint8_t, 32>;
using Md5Digest = std::array<uint8_t, 16>;

Sha256Digest sha256(const void* data, size_t size);
// `key` and `message` are bytes (a std::string_view may hold any).
Sha256Digest hmac_sha256(std::string_view key, std::string_view message);
Md5Digest md5(const void* data, size_t size);

std::string hex_lower(const uint8_t* bytes, size_t size);
template <size_t N>
std::string hex_lower(const std::array<uint8_t, N>& digest) {
  return hex_lower(digest.data(), N);
}
std::string base64(const uint8_t* bytes, size_t size);

inline std::string sha256_hex(const void* data, size_t size) { return hex_lower(sha256(data, size)); }
inline std::string sha256_hex(std::string_view text) { return sha256_hex(text.data(), text.size()); }

}  // namespace distckpt::s3
