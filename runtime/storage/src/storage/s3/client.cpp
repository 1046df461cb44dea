#include "storage/s3/client.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "distckpt/core/errors.h"
#include "storage/s3/hashing.h"
#include "storage/s3/http.h"
#include "storage/s3/retry.h"
#include "storage/s3/s3_errors.h"
#include "storage/s3/s3_url.h"
#include "storage/s3/xml.h"

namespace distckpt::s3 {

// One S3 operation, before signing (every attempt is signed afresh).
struct Client::Call {
  Call(std::string method, std::string key, std::string operation)
      : method(std::move(method)), key(std::move(key)), operation(std::move(operation)) {}

  std::string method;
  std::string key;        // empty: the bucket itself
  std::string operation;  // for messages: "GET bytes=0-99"
  std::vector<QueryParam> query;
  std::vector<Header> headers;  // beyond host and the x-amz-* ones signing adds
  const void* body = nullptr;
  size_t body_size = 0;
  // A non-2xx answer the caller handles itself: {status, S3 code ("" any)}.
  std::vector<std::pair<long, std::string>> accepted;
};

// What is wrong with a 2xx response.
struct Client::Problem {
  Problem(std::string detail, bool retryable, int error_number = EIO)
      : detail(std::move(detail)), retryable(retryable), error_number(error_number) {}

  std::string detail;
  bool retryable = false;
  int error_number = EIO;
  S3ErrorDocument error;  // an <Error> inside a 200 (CompleteMultipartUpload)
};

struct Client::Outcome {
  HttpResponse response;
  S3ErrorDocument error;  // of an accepted non-2xx answer
  int attempts = 1;
};

namespace {

constexpr size_t kMaxResultDocument = kMaxXmlBytes;
constexpr size_t kSmallResult = 64 << 10;  // CreateMultipartUpload, CompleteMultipartUpload results

bool success(long status) { return status >= 200 && status < 300; }

std::string strip_quotes(std::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') etag = etag.substr(1, etag.size() - 2);
  return std::string(etag);
}

bool is_md5_hex(std::string_view text) {
  if (text.size() != 32) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Whether S3 makes this response's ETag the MD5 of the body: plaintext and
// SSE-S3 objects, not SSE-KMS or SSE-C ones.
bool etag_is_md5(const HttpResponse& response) {
  return response.sse_customer_algorithm.empty() &&
         (response.server_side_encryption.empty() || response.server_side_encryption == "AES256");
}

std::optional<uint64_t> parse_size(std::string_view text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// ListObjectsV2 with encoding-type=url sends keys form-encoded ('+' for a space).
std::optional<std::string> url_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out.push_back(' ');
    } else if (text[i] == '%') {
      if (i + 2 >= text.size()) return std::nullopt;
      const int high = hex_value(text[i + 1]), low = hex_value(text[i + 2]);
      if (high < 0 || low < 0) return std::nullopt;
      out.push_back(static_cast<char>(high * 16 + low));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

// "bytes 100-199/1000" -> {100, 199, 1000}
struct ContentRange {
  uint64_t first = 0, last = 0, total = 0;
};
std::optional<ContentRange> parse_content_range(std::string_view text) {
  if (text.substr(0, 6) != "bytes ") return std::nullopt;
  text.remove_prefix(6);
  const size_t dash = text.find('-'), slash = text.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash) return std::nullopt;
  const auto first = parse_size(text.substr(0, dash));
  const auto last = parse_size(text.substr(dash + 1, slash - dash - 1));
  const auto total = parse_size(text.substr(slash + 1));
  if (!first || !last || !total || *last < *first) return std::nullopt;
  return ContentRange{*first, *last, *total};
}

// The multipart ETag S3 gives an object completed from `parts`: the MD5 of
// their MD5s, "-", their number; empty when a part's ETag is not an MD5.
std::string multipart_etag(const std::vector<CompletedPart>& parts) {
  std::string digests;
  digests.reserve(parts.size() * 16);
  for (const CompletedPart& part : parts) {
    const std::string hex = strip_quotes(part.etag);
    if (!is_md5_hex(hex)) return "";
    for (size_t i = 0; i < 32; i += 2) {
      digests.push_back(static_cast<char>(hex_value(hex[i]) * 16 + hex_value(hex[i + 1])));
    }
  }
  return hex_lower(md5(digests.data(), digests.size())) + "-" + std::to_string(parts.size());
}

}  // namespace

Client::Client(Config config, std::string bucket) : config_(std::move(config)), bucket_(std::move(bucket)) {
  check_bucket_name(bucket_);
  // Virtual-hosted URLs need the bucket to be one DNS label (a '.' breaks the
  // TLS certificate's wildcard) and a host name to prefix.
  virtual_hosted_ = config_.addressing == Addressing::kVirtualHosted && bucket_fits_virtual_host(bucket_) &&
                    !config_.endpoint.host_is_ip();
  http_ = std::make_unique<HttpClient>(config_.timeouts, config_.ca_bundle);
}

Client::~Client() = default;

std::string Client::object_of(const std::string& key) const {
  return key.empty() ? "s3://" + bucket_ : object_url(bucket_, key);
}

Failure Client::failure_of(const Call& call, const HttpResponse& response) const {
  Failure f;
  f.bucket = bucket_;
  f.object = object_of(call.key);
  f.operation = call.operation;
  f.status = response.status;
  f.region_header = response.bucket_region;
  f.request_id = response.request_id;
  return f;
}

Client::Outcome Client::execute(const Call& call, const BodyTarget& target, const Check& check) {
  const Endpoint& endpoint = config_.endpoint;
  const std::string host = virtual_hosted_ ? bucket_ + "." + endpoint.authority() : endpoint.authority();
  const std::string path = virtual_hosted_ ? "/" + call.key : "/" + bucket_ + (call.key.empty() ? "" : "/" + call.key);
  const std::string query = canonical_query(call.query);
  HttpRequest request;
  request.method = call.method;
  request.url = endpoint.scheme + "://" + host + uri_encode(path, true) + (query.empty() ? "" : "?" + query);
  request.body = call.body;
  request.body_size = call.body_size;

  // Over TLS with Content-MD5 the body is already protected: skip hashing it
  // again for the signature (as the AWS SDKs do); over plain HTTP sign it.
  std::string payload_hash = kEmptyPayloadSha256;
  if (call.body_size > 0) {
    const bool has_md5 =
        std::any_of(call.headers.begin(), call.headers.end(), [](const Header& h) { return h.first == "Content-MD5"; });
    payload_hash = endpoint.scheme == "https" && has_md5 ? kUnsignedPayload : sha256_hex(call.body, call.body_size);
  }

  RetryBudget budget(config_.retry);
  while (true) {
    SigningInput signing{call.method, path, call.query, call.headers, payload_hash};
    signing.headers.emplace_back("Host", host);
    sign_s3_request(signing, config_.credentials, config_.region, amz_date(std::time(nullptr)));
    request.headers = std::move(signing.headers);

    ++attempts_;
    Outcome outcome;
    outcome.attempts = budget.attempts();
    HttpResponse& response = outcome.response;
    const std::optional<TransportError> transport = http_->perform(request, target, response);
    Failure failure = failure_of(call, response);
    bool retry = false;
    if (transport) {
      failure.status = 0;
      failure.transport = transport->message;
      retry = transport->retryable;
    } else if (success(response.status)) {
      std::optional<Problem> problem = check ? check(response) : std::nullopt;
      if (!problem && response.body_overflow) problem = Problem{"the response is larger than expected", false};
      if (!problem) return outcome;
      failure.detail = problem->detail;
      failure.error_number = problem->error_number;
      failure.error = problem->error;
      retry = problem->retryable;
    } else {
      failure.error = parse_error_document(response.body);
      for (const auto& [status, code] : call.accepted) {
        if (status == response.status && (code.empty() || code == failure.error.code)) {
          outcome.error = failure.error;
          return outcome;
        }
      }
      retry = retryable_failure(response.status, failure.error.code);
    }
    if (!retry) raise_failure(failure, config_, budget.attempts() > 1 ? budget.summary() : "");
    if (!budget.wait_for_next()) raise_failure(failure, config_, budget.summary());
    ++retries_;
  }
}

ObjectInfo Client::head_object(const std::string& key) {
  Call call("HEAD", key, "HEAD");
  BodyTarget target;
  const Outcome outcome = execute(call, target, [](const HttpResponse& r) -> std::optional<Problem> {
    if (!r.content_length) return Problem{"the response has no Content-Length", false};
    return std::nullopt;
  });
  return ObjectInfo{*outcome.response.content_length, outcome.response.etag};
}

void Client::get_range(const std::string& key, uint64_t offset, uint64_t length, void* out) {
  if (length == 0) return;
  if (offset > UINT64_MAX - length) {
    throw UsageError("S3 GET of " + object_of(key) + ": the range at " + std::to_string(offset) + " of " +
                     std::to_string(length) + " bytes overflows");
  }
  const uint64_t last = offset + length - 1;
  const std::string range = "bytes=" + std::to_string(offset) + "-" + std::to_string(last);
  Call call("GET", key, "GET " + range);
  call.headers.emplace_back("Range", range);
  BodyTarget target;
  target.buffer = out;
  target.capacity = length;
  const auto check = [&](const HttpResponse& r) -> std::optional<Problem> {
    if (r.body_overflow) {
      return Problem{"the server sent more than the " + std::to_string(length) + " bytes asked for", false};
    }
    if (r.status == 206) {
      const auto answered = parse_content_range(r.content_range);
      if (!answered) return Problem{"the Content-Range \"" + r.content_range + "\" is malformed", false};
      if (answered->first != offset) {
        return Problem{"the server answered " + r.content_range + " for " + range, false};
      }
      if (answered->last < last && answered->total <= last) {
        return Problem{"the object is " + std::to_string(answered->total) + " bytes: the range ends past it", false,
                       ERANGE};
      }
    } else if (r.status == 200) {
      // The whole object instead of a range: right only when that is the range.
      if (offset != 0 || !r.content_length || *r.content_length != length) {
        return Problem{"the server ignored the Range header (HTTP 200)", false};
      }
    } else {
      return Problem{"HTTP " + std::to_string(r.status) + " is not an answer to a ranged GET", false};
    }
    if (r.body_bytes != length) {
      return Problem{"the body is " + std::to_string(r.body_bytes) + " of " + std::to_string(length) + " bytes", true};
    }
    return std::nullopt;
  };
  execute(call, target, check);
}

std::string Client::get_object(const std::string& key, size_t max_size) {
  Call call("GET", key, "GET");
  BodyTarget target;
  target.text_limit = max_size;
  const auto check = [&](const HttpResponse& r) -> std::optional<Problem> {
    if (r.body_overflow || (r.content_length && *r.content_length > max_size)) {
      return Problem{"the object is larger than the " + std::to_string(max_size) + " bytes this read accepts", false,
                     EFBIG};
    }
    if (r.content_length && r.body.size() != *r.content_length) {
      return Problem{
          "the body is " + std::to_string(r.body.size()) + " of " + std::to_string(*r.content_length) + " bytes", true};
    }
    return std::nullopt;
  };
  // The body of a small object: an empty one still needs a non-zero limit to be kept.
  if (target.text_limit == 0) target.text_limit = 1;
  Outcome outcome = execute(call, target, check);
  return std::move(outcome.response.body);
}

bool Client::put_object(const std::string& key, const void* data, size_t size, bool if_none_match) {
  const Md5Digest digest = md5(data, size);
  const std::string md5_hex = hex_lower(digest);
  Call call("PUT", key, if_none_match ? "PUT (If-None-Match)" : "PUT");
  call.headers.emplace_back("Content-MD5", base64(digest.data(), digest.size()));
  if (if_none_match) call.headers.emplace_back("If-None-Match", "*");
  call.body = data;
  call.body_size = size;
  if (if_none_match) call.accepted.emplace_back(412, "");
  const auto check = [&](const HttpResponse& r) -> std::optional<Problem> {
    const std::string etag = strip_quotes(r.etag);
    if (etag_is_md5(r) && is_md5_hex(etag) && etag != md5_hex) {
      return Problem{"the stored object's ETag " + etag + " is not the MD5 " + md5_hex + " of the bytes sent", true};
    }
    return std::nullopt;
  };
  BodyTarget target;
  const Outcome outcome = execute(call, target, check);
  if (success(outcome.response.status)) return true;
  // 412: the key exists. After a lost answer it may be this call's own write.
  if (outcome.attempts > 1) {
    const ObjectInfo stored = head_object(key);
    if (strip_quotes(stored.etag) == md5_hex && stored.size == size) return true;
  }
  return false;
}

void Client::delete_object(const std::string& key) {
  Call call("DELETE", key, "DELETE");
  BodyTarget target;
  execute(call, target, {});
}

std::string Client::create_multipart_upload(const std::string& key) {
  Call call("POST", key, "CreateMultipartUpload");
  call.query = {{"uploads", ""}};
  BodyTarget target;
  target.text_limit = kSmallResult;
  std::string upload_id;
  const auto check = [&](const HttpResponse& r) -> std::optional<Problem> {
    try {
      upload_id = xml_text(r.body, "UploadId").value_or("");
    } catch (const MalformedXml& e) {
      return Problem{std::string("the result is malformed XML: ") + e.what(), false};
    }
    if (upload_id.empty()) return Problem{"the result names no UploadId", false};
    return std::nullopt;
  };
  execute(call, target, check);
  return upload_id;
}

std::string Client::upload_part(const std::string& key, const std::string& upload_id, int part_number, const void* data,
                                size_t size) {
  if (part_number < 1 || part_number > 10000) {
    throw UsageError("S3 UploadPart of " + object_of(key) + ": part number " + std::to_string(part_number) +
                     " is outside 1 to 10000");
  }
  const Md5Digest digest = md5(data, size);
  const std::string md5_hex = hex_lower(digest);
  Call call("PUT", key, "UploadPart " + std::to_string(part_number));
  call.query = {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}};
  call.headers.emplace_back("Content-MD5", base64(digest.data(), digest.size()));
  call.body = data;
  call.body_size = size;
  const auto check = [&](const HttpResponse& r) -> std::optional<Problem> {
    if (r.etag.empty()) return Problem{"the response has no ETag", false};
    const std::string etag = strip_quotes(r.etag);
    if (etag_is_md5(r) && is_md5_hex(etag) && etag != md5_hex) {
      return Problem{"the part's ETag " + etag + " is not the MD5 " + md5_hex + " of the bytes sent", true};
    }
    return std::nullopt;
  };
  BodyTarget target;
  return execute(call, target, check).response.etag;
}

std::string Client::complete_multipart_upload(const std::string& key, const std::string& upload_id,
                                              const std::vector<CompletedPart>& parts) {
  const std::string object = object_of(key);
  if (parts.empty()) throw UsageError("S3 CompleteMultipartUpload of " + object + ": no parts");
  std::string body = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0 && parts[i].part_number <= parts[i - 1].part_number) {
      throw UsageError("S3 CompleteMultipartUpload of " + object + ": part numbers must ascend (" +
                       std::to_string(parts[i - 1].part_number) + " then " + std::to_string(parts[i].part_number) +
                       ")");
    }
    body += "<Part><PartNumber>" + std::to_string(parts[i].part_number) + "</PartNumber><ETag>" +
            xml_escape(parts[i].etag) + "</ETag></Part>";
  }
  body += "</CompleteMultipartUpload>";
  const Md5Digest digest = md5(body.data(), body.size());

  Call call("POST", key, "CompleteMultipartUpload (" + std::to_string(parts.size()) + " parts)");
  call.query = {{"uploadId", upload_id}};
  call.headers.emplace_back("Content-Type", "application/xml");
  call.headers.emplace_back("Content-MD5", base64(digest.data(), digest.size()));
  call.body = body.data();
  call.body_size = body.size();
  call.accepted.emplace_back(404, "NoSuchUpload");
  BodyTarget target;
  target.text_limit = kSmallResult;
  std::string etag;
  const auto check = [&](const HttpResponse& r) -> std::optional<Problem> {
    try {
      // S3 may answer 200 and then fail: the error is in the body.
      const S3ErrorDocument error = parse_error_document(r.body);
      if (!error.code.empty()) {
        Problem problem{"the upload failed after HTTP 200", retryable_failure(0, error.code)};
        problem.error = error;
        return problem;
      }
      etag = xml_text(r.body, "ETag").value_or("");
    } catch (const MalformedXml& e) {
      return Problem{std::string("the result is malformed XML: ") + e.what(), false};
    }
    if (etag.empty()) return Problem{"the result names no ETag", false};
    return std::nullopt;
  };
  const Outcome outcome = execute(call, target, check);
  if (success(outcome.response.status)) return etag;
  // NoSuchUpload. After a lost answer the upload may have completed: then the
  // object's ETag is the one these parts make.
  const std::string expected = multipart_etag(parts);
  if (outcome.attempts > 1 && !expected.empty()) {
    try {
      const ObjectInfo stored = head_object(key);
      if (strip_quotes(stored.etag) == expected) return stored.etag;
    } catch (const IoError& e) {
      if (e.error_number() != ENOENT) throw;
    }
  }
  Failure failure = failure_of(call, outcome.response);
  failure.error = outcome.error;
  raise_failure(failure, config_, "");
}

void Client::abort_multipart_upload(const std::string& key, const std::string& upload_id) {
  Call call("DELETE", key, "AbortMultipartUpload");
  call.query = {{"uploadId", upload_id}};
  call.accepted.emplace_back(404, "NoSuchUpload");
  BodyTarget target;
  execute(call, target, {});
}

std::vector<MultipartUpload> Client::list_multipart_uploads(const std::string& prefix) {
  std::vector<MultipartUpload> uploads;
  std::string key_marker, upload_id_marker;
  while (true) {
    Call call("GET", "", "ListMultipartUploads (prefix \"" + prefix + "\")");
    call.query = {{"uploads", ""}, {"prefix", prefix}};
    if (!key_marker.empty()) call.query.emplace_back("key-marker", key_marker);
    if (!upload_id_marker.empty()) call.query.emplace_back("upload-id-marker", upload_id_marker);
    BodyTarget target;
    target.text_limit = kMaxResultDocument;
    std::vector<MultipartUpload> page;
    bool truncated = false;
    std::string next_key, next_upload_id;
    const auto check = [&](const HttpResponse& r) -> std::optional<Problem> {
      try {
        for (std::string_view upload : xml_elements(r.body, "Upload")) {
          page.push_back({xml_text(upload, "Key").value_or(""), xml_text(upload, "UploadId").value_or("")});
        }
        truncated = xml_text(r.body, "IsTruncated").value_or("false") == "true";
        next_key = xml_text(r.body, "NextKeyMarker").value_or("");
        next_upload_id = xml_text(r.body, "NextUploadIdMarker").value_or("");
      } catch (const MalformedXml& e) {
        return Problem{std::string("the result is malformed XML: ") + e.what(), false};
      }
      return std::nullopt;
    };
    execute(call, target, check);
    uploads.insert(uploads.end(), page.begin(), page.end());
    if (!truncated) return uploads;
    if (page.empty() || (next_key == key_marker && next_upload_id == upload_id_marker)) {
      throw IoError("S3 " + call.operation + " of s3://" + bucket_ + ": a truncated page that does not advance",
                    "s3://" + bucket_, EIO);
    }
    key_marker = next_key;
    upload_id_marker = next_upload_id;
  }
}

void Client::list_objects(const std::string& prefix, const std::function<void(const ListedObject&)>& each,
                          int page_size) {
  if (page_size < 1 || page_size > 1000) {
    throw UsageError("S3 ListObjectsV2: page size " + std::to_string(page_size) + " is outside 1 to 1000");
  }
  std::string token;
  std::vector<ListedObject> page;
  while (true) {
    Call call("GET", "", "ListObjectsV2 (prefix \"" + prefix + "\")");
    call.query = {
        {"list-type", "2"}, {"prefix", prefix}, {"max-keys", std::to_string(page_size)}, {"encoding-type", "url"}};
    if (!token.empty()) call.query.emplace_back("continuation-token", token);
    BodyTarget target;
    target.text_limit = kMaxResultDocument;
    bool truncated = false;
    std::string next_token;
    const auto check = [&](const HttpResponse& r) -> std::optional<Problem> {
      page.clear();  // a retried page starts over
      try {
        for (std::string_view contents : xml_elements(r.body, "Contents")) {
          const auto key = url_decode(xml_text(contents, "Key").value_or(""));
          const auto size = parse_size(xml_text(contents, "Size").value_or(""));
          if (!key || key->empty() || !size) return Problem{"a <Contents> entry has a malformed Key or Size", false};
          page.push_back(ListedObject{*key, *size, xml_text(contents, "ETag").value_or("")});
        }
        truncated = xml_text(r.body, "IsTruncated").value_or("false") == "true";
        next_token = xml_text(r.body, "NextContinuationToken").value_or("");
      } catch (const MalformedXml& e) {
        return Problem{std::string("the result is malformed XML: ") + e.what(), false};
      }
      return std::nullopt;
    };
    execute(call, target, check);
    for (const ListedObject& object : page) each(object);
    if (!truncated) return;
    if (next_token.empty() || next_token == token) {
      throw IoError(
          "S3 " + call.operation + " of s3://" + bucket_ + ": a truncated page without a new continuation token",
          "s3://" + bucket_, EIO);
    }
    token = std::move(next_token);
  }
}

std::vector<ListedObject> Client::list_objects(const std::string& prefix, int page_size) {
  std::vector<ListedObject> objects;
  list_objects(
      prefix, [&](const ListedObject& object) { objects.push_back(object); }, page_size);
  return objects;
}

}  // namespace distckpt::s3
