#include "storage/s3/sigv4.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>

#include "distckpt/core/errors.h"
#include "storage/s3/hashing.h"

namespace distckpt::s3 {
namespace {

bool unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// SigV4's Trimall: no leading or trailing blanks, inner runs of blanks as one space.
std::string trim_all(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  bool pending_space = false;
  for (char c : value) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

struct CanonicalHeaders {
  std::string block;         // "name:value\n" per header
  std::string signed_names;  // "name;name"
};

// Lowercase names, sorted; a name given twice is one line with its values
// joined by commas, in the order given.
CanonicalHeaders canonical_headers(const std::vector<Header>& headers) {
  std::vector<std::pair<std::string, std::string>> lines;
  lines.reserve(headers.size());
  for (const auto& [name, value] : headers) lines.emplace_back(lowercase(name), trim_all(value));
  std::stable_sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  CanonicalHeaders out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const bool continues = i > 0 && lines[i].first == lines[i - 1].first;
    if (continues) {
      out.block.back() = ',';  // the previous line's '\n'
    } else {
      out.block += lines[i].first + ':';
      if (!out.signed_names.empty()) out.signed_names += ';';
      out.signed_names += lines[i].first;
    }
    out.block += lines[i].second + '\n';
  }
  return out;
}

std::string as_string(const Sha256Digest& digest) { return std::string(digest.begin(), digest.end()); }

}  // namespace

std::string uri_encode(std::string_view text, bool keep_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (unreserved(c) || (keep_slash && c == '/')) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 0xf]);
    }
  }
  return out;
}

std::string canonical_query(const std::vector<QueryParam>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query) encoded.emplace_back(uri_encode(name, false), uri_encode(value, false));
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [name, value] : encoded) {
    if (!out.empty()) out += '&';
    out += name + '=' + value;
  }
  return out;
}

std::string amz_date(std::time_t when) {
  std::tm utc{};
  if (!gmtime_r(&when, &utc)) throw Error("amz_date: time out of range");
  char text[64];  // room for any int, though a tm from gmtime_r fits 16
  std::snprintf(text, sizeof(text), "%04d%02d%02dT%02d%02d%02dZ", utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday,
                utc.tm_hour, utc.tm_min, utc.tm_sec);
  return text;
}

Signature sign_v4(const SigningInput& input, const Credentials& credentials, const SigningScope& scope) {
  if (scope.amz_date.size() != 16) throw Error("sign_v4: amz_date must be YYYYMMDDTHHMMSSZ, not " + scope.amz_date);
  Signature out;
  const CanonicalHeaders headers = canonical_headers(input.headers);
  out.signed_headers = headers.signed_names;
  const std::string path = input.path.empty() ? "/" : input.path;
  out.canonical_request = input.method + '\n' + uri_encode(path, true) + '\n' + canonical_query(input.query) + '\n' +
                          headers.block + '\n' + headers.signed_names + '\n' + input.payload_hash;

  const std::string date = scope.amz_date.substr(0, 8);
  const std::string credential_scope = date + '/' + scope.region + '/' + scope.service + "/aws4_request";
  out.string_to_sign =
      "AWS4-HMAC-SHA256\n" + scope.amz_date + '\n' + credential_scope + '\n' + sha256_hex(out.canonical_request);

  // The signing key: the secret, narrowed to the date, region and service.
  std::string key = as_string(hmac_sha256("AWS4" + credentials.secret_access_key, date));
  key = as_string(hmac_sha256(key, scope.region));
  key = as_string(hmac_sha256(key, scope.service));
  key = as_string(hmac_sha256(key, "aws4_request"));
  out.signature = hex_lower(hmac_sha256(key, out.string_to_sign));
  out.authorization = "AWS4-HMAC-SHA256 Credential=" + credentials.access_key_id + '/' + credential_scope +
                      ", SignedHeaders=" + headers.signed_names + ", Signature=" + out.signature;
  return out;
}

Signature sign_s3_request(SigningInput& input, const Credentials& credentials, const std::string& region,
                          const std::string& amz_date) {
  input.headers.emplace_back("x-amz-date", amz_date);
  input.headers.emplace_back("x-amz-content-sha256", input.payload_hash);
  if (!credentials.session_token.empty()) input.headers.emplace_back("x-amz-security-token", credentials.session_token);
  Signature signature = sign_v4(input, credentials, SigningScope{region, "s3", amz_date});
  input.headers.emplace_back("Authorization", signature.authorization);
  return signature;
}

}  // namespace distckpt::s3
