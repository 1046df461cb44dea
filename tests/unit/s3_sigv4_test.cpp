// SigV4 signing and its digests against published vectors:
//   tests/data/sigv4/aws_suite.txt    AWS's Signature Version 4 test suite (the generic algorithm,
//                                     service "service"), its values as AWS publishes them
//   tests/data/sigv4/botocore_s3.txt  S3 requests signed by botocore's S3SigV4Auth at a fixed time,
//                                     written by tests/data/sigv4/make_botocore_vectors.py
// and the digests against RFC test values.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "storage/s3/hashing.h"
#include "storage/s3/sigv4.h"

namespace {

using namespace distckpt::s3;

struct Vector {
  std::string name, kind, method, path, payload, payload_hash, region, service, date;
  std::string access_key, secret_key, session_token, creq, authorization, suite_normalises_to;
  std::vector<QueryParam> query;
  std::vector<Header> headers;
};

// The files escape newlines of canonical requests as "\n" (and '\' as "\\").
std::string unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      out.push_back(text[i + 1] == 'n' ? '\n' : text[i + 1]);
      ++i;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

std::pair<std::string, std::string> split_at(const std::string& text, char separator) {
  const size_t at = text.find(separator);
  if (at == std::string::npos) return {text, ""};
  return {text.substr(0, at), text.substr(at + 1)};
}

// "key: value" lines, a vector per "name:" line; '#' comments.
std::vector<Vector> load_vectors(const std::string& file) {
  std::ifstream in(std::string(DISTCKPT_SOURCE_DIR) + "/tests/data/sigv4/" + file);
  EXPECT_TRUE(in.good()) << file;
  std::vector<Vector> vectors;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    auto [key, value] = split_at(line, ':');
    if (!value.empty() && value[0] == ' ') value.erase(0, 1);
    if (key == "name") {
      vectors.emplace_back();
      vectors.back().name = value;
      continue;
    }
    if (vectors.empty()) continue;
    Vector& v = vectors.back();
    if (key == "kind") v.kind = value;
    if (key == "method") v.method = value;
    if (key == "path") v.path = value;
    if (key == "query") v.query.push_back(split_at(value, '='));
    if (key == "header") v.headers.push_back(split_at(value, ':'));
    if (key == "payload") v.payload = value;
    if (key == "payload_hash") v.payload_hash = value;
    if (key == "region") v.region = value;
    if (key == "service") v.service = value;
    if (key == "date") v.date = value;
    if (key == "access_key") v.access_key = value;
    if (key == "secret_key") v.secret_key = value;
    if (key == "session_token") v.session_token = value;
    if (key == "creq") v.creq = unescape(value);
    if (key == "authorization") v.authorization = value;
    if (key == "suite_normalises_to") v.suite_normalises_to = value;
  }
  return vectors;
}

TEST(S3Digests, MatchTheirStandardsTestValues) {
  // FIPS 180-2 "abc"; RFC 4231 test case 2; RFC 1321 ""; Content-MD5 of "hello" as S3 documents it.
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(""), kEmptyPayloadSha256);
  EXPECT_EQ(hex_lower(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex_lower(md5("", 0)), "d41d8cd98f00b204e9800998ecf8427e");
  const Md5Digest hello = md5("hello", 5);
  EXPECT_EQ(base64(hello.data(), hello.size()), "XUFAKrxLKna5cZ2REBfFkg==");
  const uint8_t three[] = {'a', 'b', 'c'};
  EXPECT_EQ(base64(three, 2), "YWI=");
  EXPECT_EQ(base64(three, 3), "YWJj");
}

TEST(S3Sigv4, EncodesPathsAndQueriesAsS3Does) {
  EXPECT_EQ(uri_encode("/dir with space/a+b~c_d.e-f", true), "/dir%20with%20space/a%2Bb~c_d.e-f");
  EXPECT_EQ(uri_encode("a/b", false), "a%2Fb");
  EXPECT_EQ(uri_encode("\xe1\x88\xb4", true), "%E1%88%B4");
  EXPECT_EQ(uri_encode(std::string("\0\x7f", 2), true), "%00%7F");
  // Sorted by encoded name, then value, in byte order (uppercase first); a name without value keeps its '='.
  EXPECT_EQ(canonical_query({{"uploads", ""}, {"Zeta", "1"}, {"prefix", "a b/"}, {"a", "2"}, {"a", "1"}}),
            "Zeta=1&a=1&a=2&prefix=a%20b%2F&uploads=");
  EXPECT_EQ(canonical_query({}), "");
  EXPECT_EQ(amz_date(0), "19700101T000000Z");
  EXPECT_EQ(amz_date(1440938160), "20150830T123600Z");
}

TEST(S3Sigv4, MatchesTheAwsTestSuite) {
  const std::vector<Vector> vectors = load_vectors("aws_suite.txt");
  ASSERT_EQ(vectors.size(), 14u);
  for (const Vector& v : vectors) {
    SCOPED_TRACE(v.name);
    ASSERT_EQ(v.kind, "generic");
    SigningInput input{v.method, v.path, v.query, v.headers, sha256_hex(v.payload)};
    if (!v.suite_normalises_to.empty()) {
      // S3 signs the path as it is: the dots stay, so its signature differs from the suite's.
      const Signature raw = sign_v4(input, {v.access_key, v.secret_key, ""}, {v.region, v.service, v.date});
      EXPECT_EQ(raw.canonical_request.substr(0, raw.canonical_request.find('\n', 4)), "GET\n" + v.path);
      EXPECT_NE(raw.authorization, v.authorization);
      input.path = v.suite_normalises_to;  // the path the suite signs
    }
    const Signature s = sign_v4(input, {v.access_key, v.secret_key, ""}, {v.region, v.service, v.date});
    if (!v.creq.empty()) {
      EXPECT_EQ(s.canonical_request, v.creq);
    }
    EXPECT_EQ(s.authorization, v.authorization);
  }
}

TEST(S3Sigv4, MatchesBotocoreForS3Requests) {
  const std::vector<Vector> vectors = load_vectors("botocore_s3.txt");
  ASSERT_EQ(vectors.size(), 11u);
  for (const Vector& v : vectors) {
    SCOPED_TRACE(v.name);
    ASSERT_EQ(v.kind, "s3");
    ASSERT_EQ(v.service, "s3");
    if (v.payload_hash != kUnsignedPayload) {
      EXPECT_EQ(sha256_hex(v.payload), v.payload_hash);
    }
    SigningInput input{v.method, v.path, v.query, v.headers, v.payload_hash};
    const Signature s = sign_s3_request(input, {v.access_key, v.secret_key, v.session_token}, v.region, v.date);
    EXPECT_EQ(s.canonical_request, v.creq);
    EXPECT_EQ(s.authorization, v.authorization);
    // The headers to send: the given ones, then the signed x-amz-* ones and Authorization.
    const auto value_of = [&](const std::string& name) {
      const auto it =
          std::find_if(input.headers.begin(), input.headers.end(), [&](const Header& h) { return h.first == name; });
      return it == input.headers.end() ? std::string("(absent)") : it->second;
    };
    EXPECT_EQ(value_of("x-amz-date"), v.date);
    EXPECT_EQ(value_of("x-amz-content-sha256"), v.payload_hash);
    EXPECT_EQ(value_of("x-amz-security-token"), v.session_token.empty() ? "(absent)" : v.session_token);
    EXPECT_EQ(value_of("Authorization"), v.authorization);
  }
}

TEST(S3Sigv4, ASessionTokenIsSignedAndAnotherSecretChangesTheSignature) {
  SigningInput a{"GET", "/b/k", {}, {{"Host", "h"}}, kEmptyPayloadSha256};
  SigningInput b = a, c = a;
  const Signature plain = sign_s3_request(a, {"AKID", "secret", ""}, "us-east-1", "20250101T000000Z");
  const Signature token = sign_s3_request(b, {"AKID", "secret", "TOKEN"}, "us-east-1", "20250101T000000Z");
  const Signature other = sign_s3_request(c, {"AKID", "secret2", ""}, "us-east-1", "20250101T000000Z");
  EXPECT_EQ(plain.signed_headers, "host;x-amz-content-sha256;x-amz-date");
  EXPECT_EQ(token.signed_headers, "host;x-amz-content-sha256;x-amz-date;x-amz-security-token");
  EXPECT_NE(plain.signature, token.signature);
  EXPECT_NE(plain.signature, other.signature);
  EXPECT_EQ(plain.canonical_request, other.canonical_request);
}

}  // namespace
