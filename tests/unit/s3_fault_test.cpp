// The S3 client through tests/support/fault_proxy.py in front of moto: 503
// SlowDown answers, connection resets and cut bodies are retried within the
// budget and the data arrives intact; a spent budget fails naming the object,
// the status and the code; answers lost after the request took effect are
// recognised on the retry. Every assertion is on values (bytes, counts,
// messages), none on timing. Skipped without moto.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "distckpt/core/errors.h"
#include "storage/s3/client.h"
#include "support/s3_server.h"
#include "support/throws_with.h"

namespace {

using namespace distckpt::s3;
using distckpt::IoError;
using distckpt::UsageError;

constexpr size_t kMiB = 1 << 20;

std::string unique_prefix() { return s3_test_keys("faults-"); }

// How many of the proxy's fault lines start with `action`.
size_t count_of(const std::vector<std::string>& faults, const std::string& action) {
  return static_cast<size_t>(std::count_if(faults.begin(), faults.end(), [&](const std::string& line) {
    return line.compare(0, action.size() + 1, action + " ") == 0;
  }));
}

TEST(S3Faults, SlowDownsAndResetsOnPartsAreRetried) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  FaultProxy proxy(*server);
  Client client(proxy.config(), MotoServer::kBucket);
  const std::string key = prefix + "big.bin";
  const std::string data = random_bytes(12 * kMiB, 11);
  const std::string upload_id = client.create_multipart_upload(key);

  // Part requests 1 and 3 get 503 SlowDown; 2 and 5 a reset (the reset rule
  // counts only the requests the first rule let through: its 1st and 3rd).
  proxy.set_rules(R"([{"method": "PUT", "query": "partNumber=", "action": "slowdown", "nth": [1, 3]},
                      {"method": "PUT", "query": "partNumber=", "action": "reset", "nth": [1, 3]}])");
  std::vector<CompletedPart> parts;
  for (size_t offset = 0, number = 1; offset < data.size(); offset += 5 * kMiB, ++number) {
    const size_t size = std::min(5 * kMiB, data.size() - offset);
    parts.push_back({static_cast<int>(number),
                     client.upload_part(key, upload_id, static_cast<int>(number), data.data() + offset, size)});
  }
  const std::vector<std::string> faults = proxy.faults();
  proxy.set_rules("[]");
  client.complete_multipart_upload(key, upload_id, parts);

  EXPECT_EQ(count_of(faults, "slowdown"), 2u);
  EXPECT_EQ(count_of(faults, "reset"), 2u);
  EXPECT_EQ(client.stats().retries, 4u);
  std::string back(data.size(), '\0');
  client.get_range(key, 0, back.size(), back.data());
  EXPECT_TRUE(back == data);
}

TEST(S3Faults, ASpentBudgetNamesTheObjectStatusAndCode) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  FaultProxy proxy(*server);
  Config config = proxy.config();
  config.retry.max_attempts = 3;
  Client client(config, MotoServer::kBucket);
  const std::string key = prefix + "slow.bin";
  client.put_object(key, "0123456789", 10);

  proxy.set_rules(R"([{"method": "GET", "action": "slowdown"}])");
  std::string out(4, '\0');
  EXPECT_TRUE(throws_with<IoError>([&] { client.get_range(key, 2, 4, out.data()); },
                                   "S3 GET bytes=2-5 of s3://distckpt-tests/" + key +
                                       " failed: HTTP 503 SlowDown: Please reduce your request rate. (request id "
                                       "FAULTPROXY; gave up after 3 attempts over"));
  EXPECT_EQ(count_of(proxy.faults(), "slowdown"), 3u);
  EXPECT_EQ(client.stats().retries, 2u);

  // Resets until the budget is spent: a transport failure, named as such.
  proxy.set_rules(R"([{"method": "GET", "action": "reset"}])");
  try {
    client.get_range(key, 2, 4, out.data());
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_number(), EIO);
    EXPECT_EQ(e.path(), "s3://distckpt-tests/" + key);
    EXPECT_NE(std::string(e.what()).find("failed: no HTTP response: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("gave up after 3 attempts"), std::string::npos) << e.what();
  }

  // A failure that retrying cannot mend is not retried.
  proxy.set_rules(R"([{"method": "GET", "action": "status", "status": 403, "code": "AccessDenied"}])");
  const uint64_t retries = client.stats().retries;
  EXPECT_TRUE(throws_with<UsageError>([&] { client.get_range(key, 2, 4, out.data()); }, "HTTP 403 AccessDenied"));
  EXPECT_EQ(client.stats().retries, retries);
}

TEST(S3Faults, ACutBodyIsRetriedOrFailsNamingTheObject) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  FaultProxy proxy(*server);
  Config config = proxy.config();
  config.retry.max_attempts = 4;
  Client client(config, MotoServer::kBucket);
  const std::string key = prefix + "cut.bin";
  const std::string data = random_bytes(3 * kMiB, 5);
  client.put_object(key, data.data(), data.size());

  proxy.set_rules(R"([{"method": "GET", "action": "truncate", "fraction": 0.4, "first": 2}])");
  std::string back(2 * kMiB, '\0');
  client.get_range(key, kMiB / 2, back.size(), back.data());
  EXPECT_TRUE(back == data.substr(kMiB / 2, 2 * kMiB));
  EXPECT_EQ(count_of(proxy.faults(), "truncate"), 2u);
  EXPECT_EQ(client.stats().retries, 2u);
  EXPECT_EQ(client.get_object(key, 4 * kMiB), data);  // the rule is spent
  EXPECT_EQ(count_of(proxy.faults(), "truncate"), 2u);

  proxy.set_rules(R"([{"method": "GET", "action": "truncate"}])");
  EXPECT_TRUE(
      throws_with<IoError>([&] { client.get_range(key, 0, back.size(), back.data()); },
                           "S3 GET bytes=0-2097151 of s3://distckpt-tests/" + key + " failed: no HTTP response"));
  EXPECT_TRUE(throws_with<IoError>([&] { client.get_object(key, 4 * kMiB); }, "gave up after 4 attempts"));
}

TEST(S3Faults, AnAnswerLostAfterTheWriteIsRecognisedOnTheRetry) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  FaultProxy proxy(*server);
  Client client(proxy.config(), MotoServer::kBucket);

  // The conditional PUT takes effect, its answer is lost; the retry meets
  // 412 and finds its own bytes there.
  const std::string marker = prefix + "marker";
  proxy.set_rules(R"([{"method": "PUT", "action": "reset", "after": true, "first": 1}])");
  EXPECT_TRUE(client.put_object(marker, "mine", 4, true));
  EXPECT_EQ(count_of(proxy.faults(), "reset"), 1u);
  EXPECT_EQ(client.stats().retries, 1u);
  EXPECT_FALSE(client.put_object(marker, "theirs", 6, true));  // someone else's bytes are not
  EXPECT_EQ(client.get_object(marker, 10), "mine");

  // CompleteMultipartUpload completes, its answer is lost; the retry finds the
  // upload gone (moto would answer 200 again, as S3 may for a while: the
  // proxy answers 404 NoSuchUpload, as S3 does later) and the object's ETag
  // that of these parts.
  const std::string key = prefix + "completed.bin";
  const std::string data = random_bytes(6 * kMiB, 9);
  const std::string upload_id = client.create_multipart_upload(key);
  const std::vector<CompletedPart> parts = {{1, client.upload_part(key, upload_id, 1, data.data(), 5 * kMiB)},
                                            {2, client.upload_part(key, upload_id, 2, data.data() + 5 * kMiB, kMiB)}};
  proxy.set_rules(R"([{"method": "POST", "query": "uploadId=", "action": "reset", "after": true, "nth": [1]},
                      {"method": "POST", "query": "uploadId=", "action": "status", "status": 404,
                       "code": "NoSuchUpload", "nth": [1]}])");
  const uint64_t retries = client.stats().retries;
  const std::string etag = client.complete_multipart_upload(key, upload_id, parts);
  EXPECT_EQ(etag.substr(etag.size() - 3), "-2\"");
  EXPECT_EQ(client.stats().retries - retries, 1u);
  const std::vector<std::string> faults = proxy.faults();
  EXPECT_EQ(count_of(faults, "reset"), 1u);
  EXPECT_EQ(count_of(faults, "status"), 1u);
  EXPECT_EQ(client.get_object(key, 8 * kMiB), data);

  // Without the answer lost first, NoSuchUpload is the caller's to hear.
  proxy.set_rules(R"([{"method": "POST", "query": "uploadId=", "action": "status", "status": 404,
                       "code": "NoSuchUpload"}])");
  try {
    client.complete_multipart_upload(key, upload_id, parts);
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_number(), ENOENT);
    EXPECT_NE(std::string(e.what()).find("HTTP 404 NoSuchUpload"), std::string::npos) << e.what();
  }
}

TEST(S3Faults, SlowAnswersToManyThreadsArriveIntact) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  FaultProxy proxy(*server);
  Client client(proxy.config(), MotoServer::kBucket);
  const std::string key = prefix + "shared.bin";
  const std::string data = random_bytes(kMiB, 21);
  client.put_object(key, data.data(), data.size());
  // Every third GET is slowed down, the others delayed (the first rule that fires wins).
  proxy.set_rules(R"([{"method": "GET", "action": "slowdown", "every": 3},
                      {"method": "GET", "action": "delay", "seconds": 0.05}])");
  constexpr int kThreads = 6;
  std::vector<int> wrong(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const size_t offset = static_cast<size_t>(t) * 100000;
      std::string back(100000, '\0');
      client.get_range(key, offset, back.size(), back.data());
      if (back != data.substr(offset, back.size())) ++wrong[t];
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong, std::vector<int>(kThreads, 0));
  // 6 answers and 3 SlowDowns: attempts 1, 4 and 7 of the 9.
  const std::vector<std::string> faults = proxy.faults();
  EXPECT_EQ(count_of(faults, "delay"), static_cast<size_t>(kThreads));
  EXPECT_EQ(count_of(faults, "slowdown"), 3u);
  EXPECT_EQ(client.stats().retries, 3u);
}

}  // namespace
