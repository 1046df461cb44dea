#include "storage/s3/s3_errors.h"

#include <cerrno>
#include <string>

#include "distckpt/core/errors.h"
#include "storage/s3/xml.h"

namespace distckpt::s3 {
namespace {

constexpr size_t kMaxQuotedMessage = 512;  // of S3's message in ours

std::string shortened(const std::string& text) {
  return text.size() <= kMaxQuotedMessage ? text : text.substr(0, kMaxQuotedMessage) + "...";
}

// "HTTP 403 SignatureDoesNotMatch: The request signature ... (request id X; 8 attempts over 2.3 s)"
std::string what_happened(const Failure& f, const std::string& tries) {
  std::string text;
  if (f.status == 0) {
    text = "no HTTP response: " + f.transport;
  } else {
    text = "HTTP " + std::to_string(f.status);
    if (!f.error.code.empty()) text += " " + f.error.code;
    if (!f.error.message.empty()) text += ": " + shortened(f.error.message);
    if (!f.detail.empty()) text += ": " + f.detail;
  }
  std::string notes;
  const std::string& request_id = f.error.request_id.empty() ? f.request_id : f.error.request_id;
  if (!request_id.empty()) notes = "request id " + request_id;
  if (!tries.empty()) notes += (notes.empty() ? "" : "; ") + std::string("gave up after ") + tries;
  if (!notes.empty()) text += " (" + notes + ")";
  return text;
}

std::string region_named(const Failure& f) {
  if (!f.error.region.empty()) return f.error.region;
  return f.region_header;
}

bool is_region_error(const Failure& f, const Config& config) {
  const std::string& code = f.error.code;
  if (code == "PermanentRedirect" || code == "AuthorizationHeaderMalformed" || code == "TemporaryRedirect" ||
      code == "IllegalLocationConstraintException") {
    return true;
  }
  if (f.status == 301 || f.status == 307) return true;
  // A HEAD has no error document: its region header is the only hint.
  return (f.status == 400 || f.status == 403) && code.empty() && !f.region_header.empty() &&
         f.region_header != config.region;
}

}  // namespace

S3ErrorDocument parse_error_document(std::string_view body) {
  S3ErrorDocument doc;
  try {
    const auto error = xml_element(body, "Error");
    if (!error) return doc;
    doc.code = xml_text(*error, "Code").value_or("");
    doc.message = xml_text(*error, "Message").value_or("");
    doc.region = xml_text(*error, "Region").value_or("");
    doc.endpoint = xml_text(*error, "Endpoint").value_or("");
    doc.request_id = xml_text(*error, "RequestId").value_or("");
  } catch (const MalformedXml&) {
    return S3ErrorDocument{};  // the status alone then says what happened
  }
  return doc;
}

bool retryable_failure(long status, const std::string& code) {
  // Not RequestTimeTooSkewed: the clock stays wrong however often the request is sent.
  static const char* const kRetryableCodes[] = {
      "SlowDown",
      "RequestTimeout",
      "InternalError",
      "ServiceUnavailable",
      "Throttling",
      "ThrottlingException",
      "RequestThrottled",
      "RequestLimitExceeded",
      "BadDigest",
      "XAmzContentSHA256Mismatch",
      "ConditionalRequestConflict",
      "OperationAborted",
      "IncompleteBody",
  };
  if (status >= 500 || status == 429) return true;
  for (const char* retryable : kRetryableCodes) {
    if (code == retryable) return true;
  }
  return false;
}

void raise_failure(const Failure& f, const Config& config, const std::string& tries) {
  const std::string head = "S3 " + f.operation + " of " + f.object + " failed: " + what_happened(f, tries);
  const std::string& code = f.error.code;
  const std::string key_id = config.credentials.access_key_id;
  const std::string who = "access key ID " + key_id + " (from " + config.credentials_source + ")";

  if (f.status == 0) throw IoError(head, f.object, EIO);
  if (!f.detail.empty()) throw IoError(head, f.object, f.error_number ? f.error_number : EIO);

  if (is_region_error(f, config)) {
    const std::string region = region_named(f);
    if (!region.empty() && region != config.region) {
      throw UsageError(head + ". The bucket " + f.bucket + " is in region " + region + ", not " + config.region +
                           " (from " + config.region_source + "): set AWS_REGION=" + region,
                       f.object);
    }
    throw UsageError(head + ". The bucket " + f.bucket + " is not in region " + config.region + " (from " +
                         config.region_source + "): set AWS_REGION to the bucket's region" +
                         (f.error.endpoint.empty() ? "" : " (S3 points to " + f.error.endpoint + ")"),
                     f.object);
  }
  if (code == "SignatureDoesNotMatch") {
    throw UsageError(head + ". The secret key does not match " + who +
                         ": check AWS_SECRET_ACCESS_KEY, or aws_secret_access_key in the profile \"" + config.profile +
                         "\" (AWS_PROFILE) of the credentials file (AWS_SHARED_CREDENTIALS_FILE, ~/.aws/credentials)",
                     f.object);
  }
  if (code == "InvalidAccessKeyId") {
    throw UsageError(head + ". " + config.endpoint.url() + " does not know " + who +
                         ": check AWS_ACCESS_KEY_ID (or aws_access_key_id of the profile \"" + config.profile +
                         "\"), and that the endpoint (from " + config.endpoint_source + ") is the right one",
                     f.object);
  }
  if (code == "InvalidToken" || code == "ExpiredToken" || code == "TokenRefreshRequired") {
    throw UsageError(head + ". The session token of " + who +
                         " is invalid or expired: renew the temporary credentials (AWS_SESSION_TOKEN, or "
                         "aws_session_token of the profile)",
                     f.object);
  }
  if (code == "RequestTimeTooSkewed") {
    throw UsageError(head + ". This machine's clock differs from S3's by more than 15 minutes: set it right (NTP)",
                     f.object);
  }
  if (code == "AccessDenied" || code == "AllAccessDisabled" || f.status == 403) {
    throw UsageError(head + ". " + who + " may not do " + f.operation + " on " + f.object +
                         ": grant it in the IAM or bucket policy, or use other credentials (AWS_PROFILE, "
                         "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
                     f.object);
  }
  if (code == "NoSuchBucket") {
    throw UsageError(head + ". There is no bucket " + f.bucket + " at " + config.endpoint.url() + " (from " +
                         config.endpoint_source + "), region " + config.region +
                         ": create it, or check the s3:// URL and AWS_ENDPOINT_URL",
                     f.object);
  }
  if (code == "InvalidBucketName") throw UsageError(head, f.object);
  if (code == "NoSuchKey" || code == "NoSuchUpload" || (f.status == 404 && code.empty())) {
    throw IoError(head, f.object, ENOENT);
  }
  if (code == "InvalidRange" || f.status == 416) throw IoError(head, f.object, ERANGE);
  throw IoError(head, f.object, EIO);
}

}  // namespace distckpt::s3
