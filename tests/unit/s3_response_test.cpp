// What the S3 client makes of responses without a server: the XML extractor
// (entities, bounds, malformed bodies), error documents, which failures are
// retried and which distckpt error each raises, and the backoff's bounds.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <typeinfo>

#include "distckpt/core/errors.h"
#include "storage/s3/config.h"
#include "storage/s3/retry.h"
#include "storage/s3/s3_errors.h"
#include "storage/s3/xml.h"
#include "support/throws_with.h"

namespace {

using namespace distckpt::s3;
using distckpt::IoError;
using distckpt::UsageError;

constexpr const char* kListPage = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>p/</Prefix>
<KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>
<Contents><Key>p/a&amp;b&lt;c&gt;&quot;&apos;</Key><Size>10</Size><ETag>&quot;abc&quot;</ETag></Contents>
<Contents ><Key>p/&#x1F600;&#233;</Key><Size>0</Size></Contents>
<NextContinuationToken>tok/en=</NextContinuationToken><KeyCountX>9</KeyCountX><EmptyTag/></ListBucketResult>)";

TEST(S3Xml, FindsElementsAndDecodesEntities) {
  const auto contents = xml_elements(kListPage, "Contents");
  ASSERT_EQ(contents.size(), 2u);
  EXPECT_EQ(xml_text(contents[0], "Key"), "p/a&b<c>\"'");
  EXPECT_EQ(xml_text(contents[0], "ETag"), "\"abc\"");
  EXPECT_EQ(xml_text(contents[1], "Key"), "p/\xF0\x9F\x98\x80\xC3\xA9");
  EXPECT_EQ(xml_text(contents[1], "ETag"), std::nullopt);
  EXPECT_EQ(xml_text(kListPage, "KeyCount"), "2");  // not <KeyCountX>
  EXPECT_EQ(xml_text(kListPage, "IsTruncated"), "true");
  EXPECT_EQ(xml_text(kListPage, "NextContinuationToken"), "tok/en=");
  EXPECT_EQ(xml_text(kListPage, "EmptyTag"), "");
  EXPECT_EQ(xml_text(kListPage, "Missing"), std::nullopt);
  EXPECT_EQ(xml_escape("\"a\"&<>'"), "&quot;a&quot;&amp;&lt;&gt;&apos;");
  EXPECT_EQ(xml_unescape(xml_escape("x&\"y\"")), "x&\"y\"");
}

TEST(S3Xml, RejectsMalformedAndOversizedBodies) {
  EXPECT_THROW(xml_elements("<a><Key>x</a>", "Key"), MalformedXml);  // never closed
  EXPECT_THROW(xml_text("<Key", "Key"), MalformedXml);
  EXPECT_THROW(xml_unescape("a &bogus; b"), MalformedXml);
  EXPECT_THROW(xml_unescape("a &amp b"), MalformedXml);
  EXPECT_THROW(xml_unescape("&#xD800;"), MalformedXml);
  EXPECT_THROW(xml_unescape("&#1114112;"), MalformedXml);
  EXPECT_THROW(xml_unescape("&#;"), MalformedXml);
  const std::string huge = "<Key>" + std::string(kMaxXmlBytes, 'x') + "</Key>";
  EXPECT_THROW(xml_text(huge, "Key"), MalformedXml);
}

TEST(S3Errors, ParsesErrorDocuments) {
  const S3ErrorDocument doc = parse_error_document(
      "<?xml version=\"1.0\"?><Error><Code>AuthorizationHeaderMalformed</Code><Message>the region 'us-east-1' is "
      "wrong; expecting 'eu-west-1'</Message><Region>eu-west-1</Region><RequestId>R1</RequestId></Error>");
  EXPECT_EQ(doc.code, "AuthorizationHeaderMalformed");
  EXPECT_EQ(doc.region, "eu-west-1");
  EXPECT_EQ(doc.request_id, "R1");
  EXPECT_EQ(parse_error_document("<html>Bad gateway</html>").code, "");
  EXPECT_EQ(parse_error_document("<Error><Code>x&bogus;</Code></Error>").code, "");  // malformed: no code
  EXPECT_EQ(parse_error_document("").code, "");
}

TEST(S3Errors, RetriesTransientFailuresOnly) {
  EXPECT_TRUE(retryable_failure(503, "SlowDown"));
  EXPECT_TRUE(retryable_failure(500, ""));
  EXPECT_TRUE(retryable_failure(502, ""));
  EXPECT_TRUE(retryable_failure(429, ""));
  EXPECT_TRUE(retryable_failure(400, "RequestTimeout"));
  EXPECT_TRUE(retryable_failure(400, "BadDigest"));
  EXPECT_TRUE(retryable_failure(409, "ConditionalRequestConflict"));
  EXPECT_TRUE(retryable_failure(200, "InternalError"));  // an error inside a 200 (CompleteMultipartUpload)
  EXPECT_FALSE(retryable_failure(403, "SignatureDoesNotMatch"));
  EXPECT_FALSE(retryable_failure(403, "RequestTimeTooSkewed"));
  EXPECT_FALSE(retryable_failure(404, "NoSuchKey"));
  EXPECT_FALSE(retryable_failure(400, "EntityTooSmall"));
  EXPECT_FALSE(retryable_failure(412, "PreconditionFailed"));
}

Config test_config() {
  Config c;
  c.endpoint = parse_endpoint_url("http://127.0.0.1:9000");
  c.region = "us-east-1";
  c.region_source = "AWS_REGION";
  c.credentials = {"AKIDTEST", "secret", ""};
  c.credentials_source = "the environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY";
  c.profile = "default";
  c.endpoint_source = "AWS_ENDPOINT_URL";
  return c;
}

Failure failure(long status, const std::string& code, const std::string& message = "m") {
  Failure f;
  f.bucket = "bkt";
  f.object = "s3://bkt/ckpt/x.bin";
  f.operation = "GET bytes=0-9";
  f.status = status;
  f.error.code = code;
  f.error.message = message;
  return f;
}

template <typename E>
testing::AssertionResult raises(const Failure& f, const std::string& part, int error_number = 0,
                                const std::string& tries = "") {
  try {
    raise_failure(f, test_config(), tries);
  } catch (const distckpt::Error& e) {
    if (typeid(e) != typeid(E)) return testing::AssertionFailure() << "raised " << e.class_name() << ": " << e.what();
    if (std::string(e.what()).find(part) == std::string::npos) {
      return testing::AssertionFailure() << "\"" << e.what() << "\" lacks \"" << part << "\"";
    }
    if (e.path() != f.object) return testing::AssertionFailure() << "path " << e.path();
    if (error_number && e.error_number() != error_number) {
      return testing::AssertionFailure() << "errno " << e.error_number() << " instead of " << error_number;
    }
    return testing::AssertionSuccess();
  }
  return testing::AssertionFailure() << "nothing raised";
}

TEST(S3Errors, EachFailureRaisesItsClassWithWhatToDo) {
  EXPECT_TRUE(raises<UsageError>(failure(403, "SignatureDoesNotMatch"),
                                 "S3 GET bytes=0-9 of s3://bkt/ckpt/x.bin failed: HTTP 403 SignatureDoesNotMatch: m. "
                                 "The secret key does not match access key ID AKIDTEST"));
  EXPECT_TRUE(raises<UsageError>(failure(403, "SignatureDoesNotMatch"), "check AWS_SECRET_ACCESS_KEY"));
  EXPECT_TRUE(raises<UsageError>(failure(403, "InvalidAccessKeyId"), "check AWS_ACCESS_KEY_ID"));
  EXPECT_TRUE(raises<UsageError>(failure(403, "AccessDenied"), "grant it in the IAM or bucket policy"));
  EXPECT_TRUE(raises<UsageError>(failure(403, ""), "may not do GET bytes=0-9"));  // a HEAD's bare 403
  EXPECT_TRUE(raises<UsageError>(failure(403, "ExpiredToken"), "renew the temporary credentials"));
  EXPECT_TRUE(raises<UsageError>(failure(403, "RequestTimeTooSkewed"), "clock"));
  EXPECT_TRUE(raises<UsageError>(failure(404, "NoSuchBucket"), "There is no bucket bkt at http://127.0.0.1:9000"));

  Failure moved = failure(400, "AuthorizationHeaderMalformed");
  moved.error.region = "eu-west-1";
  EXPECT_TRUE(
      raises<UsageError>(moved, "is in region eu-west-1, not us-east-1 (from AWS_REGION): set AWS_REGION=eu-west-1"));
  Failure redirect = failure(301, "PermanentRedirect");
  redirect.region_header = "ap-northeast-1";
  EXPECT_TRUE(raises<UsageError>(redirect, "set AWS_REGION=ap-northeast-1"));
  Failure head_redirect = failure(301, "");
  EXPECT_TRUE(raises<UsageError>(head_redirect, "set AWS_REGION to the bucket's region"));

  EXPECT_TRUE(raises<IoError>(failure(404, "NoSuchKey"), "HTTP 404 NoSuchKey", ENOENT));
  EXPECT_TRUE(raises<IoError>(failure(404, ""), "HTTP 404", ENOENT));
  EXPECT_TRUE(raises<IoError>(failure(404, "NoSuchUpload"), "NoSuchUpload", ENOENT));
  EXPECT_TRUE(raises<IoError>(failure(416, "InvalidRange"), "InvalidRange", ERANGE));
  EXPECT_TRUE(raises<IoError>(failure(400, "EntityTooSmall"), "EntityTooSmall", EIO));

  Failure slow = failure(503, "SlowDown", "Please reduce your request rate.");
  slow.request_id = "REQ9";
  EXPECT_TRUE(raises<IoError>(slow,
                              "S3 GET bytes=0-9 of s3://bkt/ckpt/x.bin failed: HTTP 503 SlowDown: Please reduce your "
                              "request rate. (request id REQ9; gave up after 8 attempts over 1.0 s)",
                              EIO, "8 attempts over 1.0 s"));
  Failure reset = failure(0, "");
  reset.transport = "Recv failure: Connection reset by peer";
  EXPECT_TRUE(raises<IoError>(reset, "no HTTP response: Recv failure: Connection reset by peer", EIO));
  Failure short_body = failure(206, "", "");
  short_body.detail = "the body is 5 of 10 bytes";
  EXPECT_TRUE(raises<IoError>(short_body, "HTTP 206: the body is 5 of 10 bytes", EIO));
}

TEST(S3Retry, BackoffCeilingsDoubleUpToTheCapAndJitterStaysBelow) {
  RetryPolicy policy;
  policy.base_delay = std::chrono::milliseconds(100);
  policy.max_delay = std::chrono::milliseconds(1000);
  EXPECT_EQ(backoff_ceiling(policy, 1).count(), 100);
  EXPECT_EQ(backoff_ceiling(policy, 2).count(), 200);
  EXPECT_EQ(backoff_ceiling(policy, 4).count(), 800);
  EXPECT_EQ(backoff_ceiling(policy, 5).count(), 1000);
  EXPECT_EQ(backoff_ceiling(policy, 1000).count(), 1000);
  EXPECT_EQ(full_jitter(std::chrono::milliseconds(100), 0).count(), 0);
  EXPECT_EQ(full_jitter(std::chrono::milliseconds(100), 100).count(), 100);
  EXPECT_EQ(full_jitter(std::chrono::milliseconds(100), 101).count(), 0);
  EXPECT_EQ(full_jitter(std::chrono::milliseconds(0), 12345).count(), 0);

  policy.max_attempts = 3;
  policy.base_delay = policy.max_delay = std::chrono::milliseconds(0);
  RetryBudget budget(policy);
  EXPECT_EQ(budget.attempts(), 1);
  EXPECT_TRUE(budget.wait_for_next());
  EXPECT_TRUE(budget.wait_for_next());
  EXPECT_FALSE(budget.wait_for_next());  // three attempts made
  EXPECT_EQ(budget.attempts(), 3);
  EXPECT_EQ(budget.summary().substr(0, 14), "3 attempts ove");

  policy.max_attempts = 100;
  policy.max_elapsed = std::chrono::milliseconds(-1);  // spent before it starts
  RetryBudget no_time(policy);
  EXPECT_FALSE(no_time.wait_for_next());
  EXPECT_EQ(no_time.attempts(), 1);
}

}  // namespace
