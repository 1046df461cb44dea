// The S3 client against moto_server with signature checking on
// (tests/support/s3_server.h): objects whole and by range, listing across
// pages, conditional writes, multipart uploads, and the errors a wrong secret,
// a missing bucket or a missing object raise. Skipped without moto.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "distckpt/core/errors.h"
#include "storage/s3/client.h"
#include "storage/s3/hashing.h"
#include "support/s3_server.h"
#include "support/throws_with.h"

namespace {

using namespace distckpt::s3;
using distckpt::IoError;
using distckpt::UsageError;

constexpr size_t kMiB = 1 << 20;

std::string unique_prefix() { return s3_test_keys("client-"); }

// The errno of the IoError `f` raises (-1 for anything else).
template <typename F>
int io_errno(F&& f) {
  try {
    f();
  } catch (const IoError& e) {
    return e.error_number();
  } catch (...) {
    return -1;
  }
  return 0;
}

TEST(S3Moto, PutGetRangeHeadDelete) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  Client client(server->config(), MotoServer::kBucket);
  const std::string key = prefix + "hello.txt";
  const std::string text = "hello, object storage";
  EXPECT_TRUE(client.put_object(key, text.data(), text.size()));

  const ObjectInfo info = client.head_object(key);
  EXPECT_EQ(info.size, text.size());
  const Md5Digest digest = md5(text.data(), text.size());
  EXPECT_EQ(info.etag, "\"" + hex_lower(digest) + "\"");
  EXPECT_EQ(client.get_object(key, 1024), text);

  std::string part(6, '\0');
  client.get_range(key, 7, 6, part.data());
  EXPECT_EQ(part, "object");
  std::string whole(text.size(), '\0');
  client.get_range(key, 0, text.size(), whole.data());
  EXPECT_EQ(whole, text);
  client.get_range(key, 5, 0, nullptr);  // nothing asked, nothing sent

  std::string past(10, '\0');
  EXPECT_EQ(io_errno([&] { client.get_range(key, text.size() - 3, 10, past.data()); }), ERANGE);
  EXPECT_EQ(io_errno([&] { client.get_range(key, text.size() + 5, 10, past.data()); }), ERANGE);
  EXPECT_TRUE(throws_with<IoError>([&] { client.get_object(key, 4); }, "larger than the 4 bytes this read accepts"));
  EXPECT_EQ(io_errno([&] { client.get_object(key, 4); }), EFBIG);

  const std::string empty_key = prefix + "empty";
  EXPECT_TRUE(client.put_object(empty_key, "", 0));
  EXPECT_EQ(client.head_object(empty_key).size, 0u);
  EXPECT_EQ(client.get_object(empty_key, 10), "");

  client.delete_object(key);
  client.delete_object(key);  // already gone: still fine
  EXPECT_EQ(io_errno([&] { client.head_object(key); }), ENOENT);
  EXPECT_TRUE(throws_with<IoError>([&] { client.get_object(key, 10); }, "HTTP 404 NoSuchKey"));
  EXPECT_EQ(io_errno([&] { client.get_range(key, 0, 4, past.data()); }), ENOENT);
}

TEST(S3Moto, KeysWithSpacesAndUnicodeAreStoredAndListed) {
  // moto cannot check signatures of these keys (s3_server.h); botocore's vectors check them.
  DISTCKPT_REQUIRE_MOTO_WITHOUT_SIGNATURE_CHECKS(server);
  Client client(server->config(), MotoServer::kBucket);
  const std::string prefix = "unicode/" + unique_prefix() + "/dir with space/";
  const std::vector<std::string> names = {"na\xc3\xafve \xe2\x98\x83.bin", "plus+equals=semi;amp&.bin",
                                          "tilde~paren(1)!*'.bin", "percent%41.bin"};
  for (const std::string& name : names) {
    const std::string key = prefix + name;
    ASSERT_TRUE(client.put_object(key, name.data(), name.size())) << name;
    EXPECT_EQ(client.get_object(key, 100), name) << name;
    EXPECT_EQ(client.head_object(key).size, name.size()) << name;
  }
  std::vector<std::string> listed;
  for (const ListedObject& object : client.list_objects(prefix, 2)) listed.push_back(object.key);
  std::vector<std::string> expected;
  for (const std::string& name : names) expected.push_back(prefix + name);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(listed, expected);
}

TEST(S3Moto, SignedKeysWithSlashesAndSpaces) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  Client client(server->config(), MotoServer::kBucket);
  const std::string key = prefix + "dir with space/iter_0000100/shard 0.bin";
  EXPECT_TRUE(client.put_object(key, "bytes", 5));
  EXPECT_EQ(client.get_object(key, 10), "bytes");
  ASSERT_EQ(client.list_objects(prefix).size(), 1u);
  EXPECT_EQ(client.list_objects(prefix)[0].key, key);
}

TEST(S3Moto, ListsEveryPage) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  Client client(server->config(), MotoServer::kBucket);
  std::vector<std::string> keys;
  for (int i = 0; i < 23; ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "obj-%03d", i);
    keys.push_back(prefix + name);
    const std::string body(static_cast<size_t>(i), 'x');
    client.put_object(keys.back(), body.data(), body.size());
  }
  const std::string other = prefix + "zz-other/1";  // under the prefix too, in a "folder"
  client.put_object(other, "1", 1);
  keys.push_back(other);

  const uint64_t before = client.stats().attempts;
  const std::vector<ListedObject> listed = client.list_objects(prefix, 5);
  EXPECT_EQ(client.stats().attempts - before, 5u);  // 24 keys, 5 a page
  ASSERT_EQ(listed.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(listed[i].key, keys[i]);
  EXPECT_EQ(listed[7].size, 7u);
  EXPECT_TRUE(client.list_objects(prefix + "nothing-here").empty());
  EXPECT_EQ(client.list_objects(prefix + "zz-").size(), 1u);
  EXPECT_TRUE(throws_with<UsageError>([&] { client.list_objects("", 0); }, "page size 0 is outside 1 to 1000"));
}

TEST(S3Moto, IfNoneMatchWritesOnlyOnce) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  Client client(server->config(), MotoServer::kBucket);
  const std::string key = prefix + "marker";
  EXPECT_TRUE(client.put_object(key, "first", 5, true));
  EXPECT_FALSE(client.put_object(key, "second", 6, true));
  EXPECT_EQ(client.get_object(key, 100), "first");
  EXPECT_TRUE(client.put_object(key, "third", 5, false));  // unconditional writes still replace it
  EXPECT_EQ(client.get_object(key, 100), "third");
}

TEST(S3Moto, MultipartRoundTrip) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  Client client(server->config(), MotoServer::kBucket);
  const std::string key = prefix + "big.bin";
  const std::string data = random_bytes(12 * kMiB, 7);
  const std::string upload_id = client.create_multipart_upload(key);
  ASSERT_FALSE(upload_id.empty());

  std::vector<CompletedPart> parts;
  std::string digests;
  for (size_t offset = 0, number = 1; offset < data.size(); offset += 5 * kMiB, ++number) {
    const size_t size = std::min(5 * kMiB, data.size() - offset);
    const std::string etag = client.upload_part(key, upload_id, static_cast<int>(number), data.data() + offset, size);
    const Md5Digest digest = md5(data.data() + offset, size);
    EXPECT_EQ(etag, "\"" + hex_lower(digest) + "\"");  // checked by the client too
    digests.append(reinterpret_cast<const char*>(digest.data()), digest.size());
    parts.push_back({static_cast<int>(number), etag});
  }
  ASSERT_EQ(parts.size(), 3u);
  const std::vector<MultipartUpload> in_progress = client.list_multipart_uploads(prefix);
  ASSERT_EQ(in_progress.size(), 1u);
  EXPECT_EQ(in_progress[0].key, key);
  EXPECT_EQ(in_progress[0].upload_id, upload_id);

  const std::string etag = client.complete_multipart_upload(key, upload_id, parts);
  EXPECT_EQ(etag, "\"" + hex_lower(md5(digests.data(), digests.size())) + "-3\"");
  EXPECT_TRUE(client.list_multipart_uploads(prefix).empty());
  EXPECT_EQ(client.head_object(key).size, data.size());

  // A range across the first part boundary, and the last bytes.
  std::string across(2 * kMiB, '\0');
  client.get_range(key, 4 * kMiB, across.size(), across.data());
  EXPECT_EQ(across, data.substr(4 * kMiB, 2 * kMiB));
  std::string tail(100, '\0');
  client.get_range(key, data.size() - 100, 100, tail.data());
  EXPECT_EQ(tail, data.substr(data.size() - 100));

  EXPECT_TRUE(throws_with<UsageError>(
      [&] {
        client.complete_multipart_upload(key, upload_id, {parts[1], parts[0]});
      },
      "part numbers must ascend"));
  EXPECT_TRUE(throws_with<UsageError>([&] { client.upload_part(key, upload_id, 0, "x", 1); },
                                      "part number 0 is outside 1 to 10000"));
}

TEST(S3Moto, AbortLeavesNoUploads) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  Client client(server->config(), MotoServer::kBucket);
  const std::string key = prefix + "aborted.bin";
  const std::string upload_id = client.create_multipart_upload(key);
  const std::string part = random_bytes(5 * kMiB, 3);
  client.upload_part(key, upload_id, 1, part.data(), part.size());
  ASSERT_EQ(client.list_multipart_uploads(prefix).size(), 1u);
  client.abort_multipart_upload(key, upload_id);
  EXPECT_TRUE(client.list_multipart_uploads(prefix).empty());
  client.abort_multipart_upload(key, upload_id);  // gone already: fine
  // (moto answers a part or completion of an aborted upload with 500, where S3 says 404 NoSuchUpload.)
  EXPECT_EQ(io_errno([&] { client.head_object(key); }), ENOENT);
}

TEST(S3Moto, AWrongSecretSaysWhatToCheck) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  Config config = server->config();
  config.credentials.secret_access_key = "not-the-secret";
  Client client(config, MotoServer::kBucket);
  const std::string key = prefix + "x";
  EXPECT_TRUE(throws_with<UsageError>([&] { client.put_object(key, "x", 1); }, "HTTP 403 SignatureDoesNotMatch"));
  EXPECT_TRUE(throws_with<UsageError>([&] { client.get_object(key, 10); },
                                      "The secret key does not match access key ID " + server->access_key_id() +
                                          " (from the environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
                                          ": check AWS_SECRET_ACCESS_KEY"));
  EXPECT_EQ(client.stats().retries, 0u);  // not retried

  Config unknown = server->config();
  unknown.credentials.access_key_id = "AKIAUNKNOWNKEY000000";
  Client stranger(unknown, MotoServer::kBucket);
  EXPECT_TRUE(throws_with<UsageError>([&] { stranger.get_object(key, 10); }, "check AWS_ACCESS_KEY_ID"));
}

TEST(S3Moto, AMissingBucketNamesIt) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  Client client(server->config(), "distckpt-no-such-bucket");
  EXPECT_TRUE(throws_with<UsageError>([&] { client.list_objects(""); },
                                      "There is no bucket distckpt-no-such-bucket at " + server->endpoint()));
  EXPECT_TRUE(throws_with<UsageError>([&] { client.put_object("k", "x", 1); }, "HTTP 404 NoSuchBucket"));
  EXPECT_THROW(Client(server->config(), "Bad_Bucket"), UsageError);
}

TEST(S3Moto, OneClientServesManyThreads) {
  DISTCKPT_REQUIRE_MOTO(server);
  const std::string prefix = unique_prefix();
  Client client(server->config(), MotoServer::kBucket);
  constexpr int kThreads = 8;
  std::vector<std::string> bodies;
  for (int t = 0; t < kThreads; ++t) bodies.push_back(random_bytes(64 << 10, 100 + static_cast<uint32_t>(t)));
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string key = prefix + std::to_string(t);
      for (int round = 0; round < 4; ++round) {
        client.put_object(key, bodies[t].data(), bodies[t].size());
        std::string back(bodies[t].size() / 2, '\0');
        client.get_range(key, bodies[t].size() / 4, back.size(), back.data());
        if (back != bodies[t].substr(bodies[t].size() / 4, back.size())) ++mismatches[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(kThreads, 0));
  EXPECT_EQ(client.stats().attempts, 8u * kThreads);
  EXPECT_EQ(client.list_objects(prefix).size(), static_cast<size_t>(kThreads));
}

}  // namespace
