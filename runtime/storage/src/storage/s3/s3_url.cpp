#include "storage/s3/s3_url.h"

#include <algorithm>
#include <cctype>

#include "distckpt/core/errors.h"

namespace distckpt::s3 {
namespace {

constexpr size_t kMaxKeyBytes = 1024;  // S3's limit on a key, in UTF-8 bytes

bool lower_or_digit(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

bool looks_like_ipv4(std::string_view name) {
  int dots = 0;
  for (char c : name) {
    if (c == '.') {
      ++dots;
    } else if (!std::isdigit(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return dots == 3;
}

bool starts_with(std::string_view text, std::string_view start) { return text.substr(0, start.size()) == start; }
bool ends_with(std::string_view text, std::string_view end) {
  return text.size() >= end.size() && text.substr(text.size() - end.size()) == end;
}

}  // namespace

void check_bucket_name(std::string_view bucket) {
  const std::string quoted = "bucket name \"" + std::string(bucket) + "\" ";
  if (bucket.size() < 3 || bucket.size() > 63) {
    throw UsageError(quoted + "must be 3 to 63 characters long (it has " + std::to_string(bucket.size()) + ")");
  }
  for (char c : bucket) {
    if (!lower_or_digit(c) && c != '.' && c != '-') {
      throw UsageError(quoted + "may hold only lowercase letters, digits, '.' and '-'");
    }
  }
  if (!lower_or_digit(bucket.front()) || !lower_or_digit(bucket.back())) {
    throw UsageError(quoted + "must start and end with a lowercase letter or a digit");
  }
  if (bucket.find("..") != std::string_view::npos) throw UsageError(quoted + "may not hold two adjacent periods");
  if (looks_like_ipv4(bucket)) throw UsageError(quoted + "may not be formatted as an IP address");
  for (std::string_view prefix : {"xn--", "sthree-", "amzn-s3-demo-"}) {
    if (starts_with(bucket, prefix)) throw UsageError(quoted + "may not start with \"" + std::string(prefix) + "\"");
  }
  for (std::string_view suffix : {"-s3alias", "--ol-s3", "--x-s3", ".mrap"}) {
    if (ends_with(bucket, suffix)) throw UsageError(quoted + "may not end with \"" + std::string(suffix) + "\"");
  }
}

bool bucket_fits_virtual_host(std::string_view bucket) { return bucket.find('.') == std::string_view::npos; }

S3Location parse_s3_url(std::string_view url) {
  const std::string quoted = "S3 URL \"" + std::string(url) + "\"";
  constexpr std::string_view kScheme = "s3://";
  if (!starts_with(url, kScheme)) throw UsageError(quoted + " must start with s3:// (s3://BUCKET/PREFIX)");
  for (char c : url) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) throw UsageError(quoted + " holds a control character");
  }
  std::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  const std::string_view bucket = rest.substr(0, slash);
  if (bucket.empty()) throw UsageError(quoted + " names no bucket (s3://BUCKET/PREFIX)");
  try {
    check_bucket_name(bucket);
  } catch (const UsageError& e) {
    throw UsageError(quoted + ": " + e.what());
  }
  std::string_view prefix = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);  // "ckpt/" is the folder "ckpt"
  // Every segment is a real name: "a//b", "./a" and "a/../b" would be keys
  // that no file system path maps to, and a reader would look elsewhere.
  size_t begin = 0;
  while (begin < prefix.size()) {
    const size_t end = std::min(prefix.find('/', begin), prefix.size());
    const std::string_view segment = prefix.substr(begin, end - begin);
    if (segment.empty() || segment == "." || segment == "..") {
      throw UsageError(quoted + ": its prefix may not hold empty, \".\" or \"..\" segments");
    }
    begin = end + 1;
  }
  if (prefix.size() > kMaxKeyBytes) {
    throw UsageError(quoted + ": its prefix is longer than an S3 key may be (1024 bytes)");
  }
  return S3Location{std::string(bucket), std::string(prefix)};
}

std::string S3Location::key(std::string_view name) const {
  if (prefix.empty()) return std::string(name);
  return prefix + "/" + std::string(name);
}

std::string S3Location::url() const { return prefix.empty() ? "s3://" + bucket : "s3://" + bucket + "/" + prefix; }

std::string object_url(std::string_view bucket, std::string_view key) {
  return "s3://" + std::string(bucket) + "/" + std::string(key);
}

}  // namespace distckpt::s3
