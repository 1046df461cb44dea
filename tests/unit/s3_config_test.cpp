// S3 configuration as the AWS tools resolve it (environment variables, then
// the profile's sections of ~/.aws/credentials and ~/.aws/config in a
// temporary HOME), addressing, endpoints, and s3:// URLs with bucket rules.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "distckpt/core/errors.h"
#include "storage/s3/config.h"
#include "storage/s3/profile_files.h"
#include "storage/s3/s3_url.h"
#include "support/ranks.h"
#include "support/throws_with.h"

namespace {

using namespace distckpt::s3;
using distckpt::UsageError;

void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

// A HOME of its own, so that the machine's ~/.aws never leaks in.
struct Home {
  TempDir dir{"s3-home"};
  std::string credentials() const { return dir.path() + "/.aws/credentials"; }
  std::string config() const { return dir.path() + "/.aws/config"; }
  Environment env(std::map<std::string, std::string> variables) const {
    variables["HOME"] = dir.path();
    return Environment{variables};
  }
};

TEST(S3Config, EnvironmentCredentialsAndACustomEndpoint) {
  Home home;
  const Config c = resolve_config(home.env({{"AWS_ACCESS_KEY_ID", "AKID"},
                                            {"AWS_SECRET_ACCESS_KEY", "SECRET"},
                                            {"AWS_SESSION_TOKEN", "TOKEN"},
                                            {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000"}}));
  EXPECT_EQ(c.credentials.access_key_id, "AKID");
  EXPECT_EQ(c.credentials.secret_access_key, "SECRET");
  EXPECT_EQ(c.credentials.session_token, "TOKEN");
  EXPECT_EQ(c.endpoint.scheme, "http");
  EXPECT_EQ(c.endpoint.host, "127.0.0.1");
  EXPECT_EQ(c.endpoint.port, 9000);
  EXPECT_EQ(c.endpoint.url(), "http://127.0.0.1:9000");
  EXPECT_EQ(c.endpoint_source, "AWS_ENDPOINT_URL");
  EXPECT_EQ(c.addressing, Addressing::kPath);  // a custom endpoint: path-style
  EXPECT_EQ(c.region, "us-east-1");
  EXPECT_EQ(c.profile, "default");
  EXPECT_EQ(c.retry.max_attempts, 8);
}

TEST(S3Config, EndpointPrecedence) {
  Home home;
  write_text(home.config(),
             "[default]\nendpoint_url = http://profile:1\nservices = local\n"
             "[services local]\ns3 =\n  endpoint_url = http://services:2\n"
             "[profile plain]\nendpoint_url = http://plain:3\n");
  std::map<std::string, std::string> keys = {{"AWS_ACCESS_KEY_ID", "A"}, {"AWS_SECRET_ACCESS_KEY", "S"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(keys.begin(), keys.end());
    return resolve_config(home.env(extra)).endpoint.url();
  };
  EXPECT_EQ(with({{"AWS_ENDPOINT_URL_S3", "http://s3only:4"}, {"AWS_ENDPOINT_URL", "http://all:5"}}),
            "http://s3only:4");
  EXPECT_EQ(with({{"AWS_ENDPOINT_URL", "http://all:5"}}), "http://all:5");
  EXPECT_EQ(with({}), "http://services:2");
  EXPECT_EQ(with({{"AWS_PROFILE", "plain"}}), "http://plain:3");
  EXPECT_EQ(with({{"AWS_ENDPOINT_URL", "http://all:5"}, {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"}}),
            "https://s3.us-east-1.amazonaws.com");
  // AWS's own endpoints: the region's, virtual-hosted.
  const Config aws = resolve_config(home.env({{"AWS_ACCESS_KEY_ID", "A"},
                                              {"AWS_SECRET_ACCESS_KEY", "S"},
                                              {"AWS_PROFILE", "plain"},
                                              {"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "TRUE"},
                                              {"AWS_REGION", "eu-west-1"}}));
  EXPECT_EQ(aws.endpoint.url(), "https://s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(aws.addressing, Addressing::kVirtualHosted);
  EXPECT_EQ(with({{"AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true"}, {"AWS_REGION", "cn-north-1"}}),
            "https://s3.cn-north-1.amazonaws.com.cn");
}

TEST(S3Config, RegionPrecedence) {
  Home home;
  write_text(home.config(), "[default]\nregion = ap-south-1\n");
  std::map<std::string, std::string> env = {{"AWS_ACCESS_KEY_ID", "A"}, {"AWS_SECRET_ACCESS_KEY", "S"}};
  EXPECT_EQ(resolve_config(home.env(env)).region, "ap-south-1");
  env["AWS_DEFAULT_REGION"] = "eu-north-1";
  EXPECT_EQ(resolve_config(home.env(env)).region, "eu-north-1");
  env["AWS_REGION"] = "us-west-2";
  const Config c = resolve_config(home.env(env));
  EXPECT_EQ(c.region, "us-west-2");
  EXPECT_EQ(c.region_source, "AWS_REGION");
  env["AWS_REGION"] = "";  // empty counts as unset
  EXPECT_EQ(resolve_config(home.env(env)).region, "eu-north-1");
  env["AWS_REGION"] = "us-west-2.evil.com/";
  EXPECT_TRUE(throws_with<UsageError>([&] { resolve_config(home.env(env)); }, "is not a region name"));
}

TEST(S3Config, ProfilesFromTheSharedFiles) {
  Home home;
  write_text(home.credentials(),
             "# comment\n[default]\naws_access_key_id = DEFAULTKEY\naws_secret_access_key = DEFAULTSECRET\n\n"
             "[work]\r\naws_access_key_id=WORKKEY\r\naws_secret_access_key: WORK/SECRET+=\r\n"
             "aws_session_token = WORKTOKEN\r\n");
  write_text(home.config(),
             "[default]\nregion = us-east-2\n"
             "; another comment\n[profile   work]\nregion = eu-central-1\nendpoint_url = https://minio.example:9000\n"
             "s3 =\n    addressing_style = virtual\nmax_attempts = 3\n"
             "[profile configonly]\naws_access_key_id = CFGKEY\naws_secret_access_key = CFGSECRET\n");
  const Config d = resolve_config(home.env({}));
  EXPECT_EQ(d.credentials.access_key_id, "DEFAULTKEY");
  EXPECT_EQ(d.credentials_source, "[default] of " + home.credentials());
  EXPECT_EQ(d.region, "us-east-2");
  EXPECT_EQ(d.endpoint.url(), "https://s3.us-east-2.amazonaws.com");

  const Config w = resolve_config(home.env({{"AWS_PROFILE", "work"}}));
  EXPECT_EQ(w.profile, "work");
  EXPECT_EQ(w.credentials.access_key_id, "WORKKEY");
  EXPECT_EQ(w.credentials.secret_access_key, "WORK/SECRET+=");
  EXPECT_EQ(w.credentials.session_token, "WORKTOKEN");
  EXPECT_EQ(w.region, "eu-central-1");
  EXPECT_EQ(w.endpoint.url(), "https://minio.example:9000");
  EXPECT_EQ(w.addressing, Addressing::kVirtualHosted);  // configured, though the endpoint is not AWS's
  EXPECT_EQ(w.retry.max_attempts, 3);

  const Config c = resolve_config(home.env({{"AWS_PROFILE", "configonly"}}));
  EXPECT_EQ(c.credentials.access_key_id, "CFGKEY");
  EXPECT_EQ(c.credentials_source, "profile \"configonly\" of " + home.config());

  // The environment's keys come first; the profile still gives the region.
  const Config e = resolve_config(
      home.env({{"AWS_PROFILE", "work"}, {"AWS_ACCESS_KEY_ID", "ENVKEY"}, {"AWS_SECRET_ACCESS_KEY", "ENVSECRET"}}));
  EXPECT_EQ(e.credentials.access_key_id, "ENVKEY");
  EXPECT_EQ(e.credentials.session_token, "");
  EXPECT_EQ(e.region, "eu-central-1");

  // Files elsewhere, named by variables.
  TempDir other("s3-files");
  write_text(other.file("creds"), "[default]\naws_access_key_id = MOVED\naws_secret_access_key = X\n");
  write_text(other.file("conf"), "[default]\nregion = sa-east-1\n");
  const Config m = resolve_config(
      home.env({{"AWS_SHARED_CREDENTIALS_FILE", other.file("creds")}, {"AWS_CONFIG_FILE", other.file("conf")}}));
  EXPECT_EQ(m.credentials.access_key_id, "MOVED");
  EXPECT_EQ(m.region, "sa-east-1");
}

TEST(S3Config, MissingCredentialsSayWhatToSet) {
  Home home;
  EXPECT_TRUE(throws_with<UsageError>([&] { resolve_config(home.env({})); },
                                      "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"));
  EXPECT_TRUE(throws_with<UsageError>([&] { resolve_config(home.env({})); }, home.credentials()));
  EXPECT_TRUE(throws_with<UsageError>(
      [&] {
        resolve_config(home.env({{"AWS_ACCESS_KEY_ID", "A"}}));
      },
      "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"));
  write_text(home.credentials(), "[default]\naws_access_key_id = A\n");
  EXPECT_TRUE(throws_with<UsageError>([&] { resolve_config(home.env({})); },
                                      "sets aws_access_key_id but not aws_secret_access_key"));
  write_text(home.config(), "[profile role]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = default\n");
  EXPECT_TRUE(throws_with<UsageError>(
      [&] {
        resolve_config(home.env({{"AWS_PROFILE", "role"}}));
      },
      "aws configure export-credentials --profile role"));
  EXPECT_TRUE(throws_with<UsageError>(
      [&] {
        resolve_config(home.env({{"AWS_PROFILE", "nosuch"}}));
      },
      "the AWS profile \"nosuch\" (AWS_PROFILE) is in neither"));
}

TEST(S3Config, Addressing) {
  Home home;
  std::map<std::string, std::string> env = {{"AWS_ACCESS_KEY_ID", "A"}, {"AWS_SECRET_ACCESS_KEY", "S"}};
  EXPECT_EQ(resolve_config(home.env(env)).addressing, Addressing::kVirtualHosted);
  env["DISTCKPT_S3_ADDRESSING"] = "path";
  EXPECT_EQ(resolve_config(home.env(env)).addressing, Addressing::kPath);
  env["AWS_ENDPOINT_URL"] = "http://localhost:9000";
  env["DISTCKPT_S3_ADDRESSING"] = "virtual";
  EXPECT_EQ(resolve_config(home.env(env)).addressing, Addressing::kVirtualHosted);
  env["DISTCKPT_S3_ADDRESSING"] = "sideways";
  EXPECT_TRUE(throws_with<UsageError>([&] { resolve_config(home.env(env)); },
                                      "DISTCKPT_S3_ADDRESSING is \"sideways\": use path or virtual"));
  env.erase("DISTCKPT_S3_ADDRESSING");
  write_text(home.config(), "[default]\ns3 =\n  addressing_style = auto\n");
  EXPECT_EQ(resolve_config(home.env(env)).addressing, Addressing::kPath);
  env["AWS_MAX_ATTEMPTS"] = "0";
  EXPECT_TRUE(throws_with<UsageError>([&] { resolve_config(home.env(env)); }, "AWS_MAX_ATTEMPTS is \"0\""));
}

TEST(S3Config, EndpointUrls) {
  const Endpoint ipv6 = parse_endpoint_url("http://[::1]:9000/");
  EXPECT_EQ(ipv6.host, "[::1]");
  EXPECT_EQ(ipv6.port, 9000);
  EXPECT_TRUE(ipv6.host_is_ip());
  const Endpoint named = parse_endpoint_url("HTTPS://S3.Example.COM:443");
  EXPECT_EQ(named.scheme, "https");
  EXPECT_EQ(named.authority(), "s3.example.com");  // the default port is not sent
  EXPECT_FALSE(named.is_aws());
  EXPECT_TRUE(parse_endpoint_url("https://s3.us-east-1.amazonaws.com").is_aws());
  for (const auto& [url, why] :
       std::map<std::string, std::string>{{"s3.amazonaws.com", "must start with https://"},
                                          {"ftp://host", "must start with https://"},
                                          {"http://host:99999", "port that is not a number"},
                                          {"http://host:", "port that is not a number"},
                                          {"http://host/bucket", "may not have a path"},
                                          {"http://host?x=1", "may not have a path"},
                                          {"http://key:secret@host", "may not hold user information"},
                                          {"http://", "names no host"},
                                          {"http://ho st", "has a host name with ' '"},
                                          {"http://[::1", "unclosed IPv6"}}) {
    EXPECT_TRUE(throws_with<UsageError>([&] { parse_endpoint_url(url); }, why)) << url;
  }
}

TEST(S3Config, S3Urls) {
  for (const auto& [url, bucket, prefix] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"s3://bucket", "bucket", ""},
           {"s3://bucket/", "bucket", ""},
           {"s3://my.bucket-1/ckpt", "my.bucket-1", "ckpt"},
           {"s3://bucket/runs/a b/iter_0000100/", "bucket", "runs/a b/iter_0000100"},
           {"s3://bucket/ckpt//", "bucket", "ckpt"}}) {
    const S3Location location = parse_s3_url(url);
    EXPECT_EQ(location.bucket, bucket) << url;
    EXPECT_EQ(location.prefix, prefix) << url;
  }
  EXPECT_EQ(parse_s3_url("s3://bucket/ckpt/").key("metadata.json"), "ckpt/metadata.json");
  EXPECT_EQ(parse_s3_url("s3://bucket").key("metadata.json"), "metadata.json");
  EXPECT_EQ(parse_s3_url("s3://bucket/a/b/").url(), "s3://bucket/a/b");
  EXPECT_EQ(object_url("b", "k/x"), "s3://b/k/x");

  for (const auto& [url, why] :
       std::map<std::string, std::string>{{"http://bucket/x", "must start with s3://"},
                                          {"S3://bucket/x", "must start with s3://"},
                                          {"s3://", "names no bucket"},
                                          {"s3:///x", "names no bucket"},
                                          {"s3://Bucket/x", "may hold only lowercase letters"},
                                          {"s3://my_bucket", "may hold only lowercase letters"},
                                          {"s3://ab", "must be 3 to 63 characters long (it has 2)"},
                                          {"s3://a..b", "two adjacent periods"},
                                          {"s3://-bucket", "must start and end with a lowercase letter or a digit"},
                                          {"s3://192.168.1.1/x", "formatted as an IP address"},
                                          {"s3://xn--bucket", "may not start with \"xn--\""},
                                          {"s3://bucket-s3alias", "may not end with \"-s3alias\""},
                                          {"s3://bucket//x", "empty, \".\" or \"..\" segments"},
                                          {"s3://bucket/a/../b", "empty, \".\" or \"..\" segments"},
                                          {"s3://bucket/./b", "empty, \".\" or \"..\" segments"},
                                          {"s3://bucket/a\nb", "control character"}}) {
    EXPECT_TRUE(throws_with<UsageError>([&] { parse_s3_url(url); }, why)) << url;
  }
  EXPECT_TRUE(throws_with<UsageError>([&] { parse_s3_url("s3://bucket/" + std::string(1100, 'k')); },
                                      "longer than an S3 key may be"));
  EXPECT_NO_THROW(check_bucket_name(std::string(63, 'a')));
  EXPECT_THROW(check_bucket_name(std::string(64, 'a')), UsageError);
}

TEST(S3Config, ProfileFileSyntax) {
  const ProfileFile file = parse_profile_file(
      "[default]\nRegion = us-east-1\ns3 =\n  addressing_style = path\n  max_concurrent_requests = 20\n"
      "note = first\n  continued\n\n[profile x]\n",
      "/cfg");
  const ProfileSettings& d = file.sections.at("default");
  EXPECT_EQ(d.at("region"), "us-east-1");  // keys are lowercased, as configparser does
  EXPECT_EQ(d.at("s3.addressing_style"), "path");
  EXPECT_EQ(d.at("s3.max_concurrent_requests"), "20");
  EXPECT_EQ(d.at("note"), "first\ncontinued");
  EXPECT_NE(config_file_profile(file, "x"), nullptr);
  EXPECT_EQ(config_file_profile(file, "y"), nullptr);
  EXPECT_TRUE(throws_with<UsageError>([] { parse_profile_file("region = x\n", "/cfg"); },
                                      "/cfg:1: a setting before the first [section]"));
  EXPECT_TRUE(throws_with<UsageError>([] { parse_profile_file("[default]\nnot a setting\n", "/cfg"); },
                                      "/cfg:2: a line must be"));
  EXPECT_TRUE(throws_with<UsageError>([] { parse_profile_file("[default\n", "/cfg"); }, "/cfg:1: a section header"));
  EXPECT_FALSE(read_profile_file("/nonexistent/aws/config").has_value());
}

}  // namespace
