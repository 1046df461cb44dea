#include "storage/s3/hashing.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "distckpt/core/errors.h"

namespace distckpt::s3 {
namespace {

template <size_t N>
std::array<uint8_t, N> digest(const EVP_MD* type, const void* data, size_t size, const char* name) {
  std::array<uint8_t, N> out{};
  unsigned int written = 0;
  if (EVP_Digest(data, size, out.data(), &written, type, nullptr) != 1 || written != N) {
    throw Error(std::string("OpenSSL: ") + name + " failed");
  }
  return out;
}

}  // namespace

Sha256Digest sha256(const void* data, size_t size) { return digest<32>(EVP_sha256(), data, size, "SHA-256"); }

Md5Digest md5(const void* data, size_t size) { return digest<16>(EVP_md5(), data, size, "MD5"); }

Sha256Digest hmac_sha256(std::string_view key, std::string_view message) {
  Sha256Digest out{};
  unsigned int written = 0;
  // HMAC() is OpenSSL 3's one-shot form (the HMAC_CTX calls are the deprecated ones).
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const uint8_t*>(message.data()),
            message.size(), out.data(), &written) ||
      written != out.size()) {
    throw Error("OpenSSL: HMAC-SHA256 failed");
  }
  return out;
}

std::string hex_lower(const uint8_t* bytes, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(size * 2, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return out;
}

std::string base64(const uint8_t* bytes, size_t size) {
  std::string out(4 * ((size + 2) / 3), '\0');
  const int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), bytes, static_cast<int>(size));
  if (written < 0) throw Error("OpenSSL: base64 encoding failed");
  out.resize(static_cast<size_t>(written));
  return out;
}

}  // namespace distckpt::s3
