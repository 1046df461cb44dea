#include "storage/s3/config.h"

#include <cctype>
#include <cstdlib>
#include <string>
#include <string_view>

#include "distckpt/core/errors.h"
#include "storage/s3/profile_files.h"

namespace distckpt::s3 {
namespace {

constexpr const char* kVariables[] = {
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_MAX_ATTEMPTS",
    "AWS_CA_BUNDLE",
    "DISTCKPT_S3_ADDRESSING",
    "HOME",
};

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool ends_with(std::string_view text, std::string_view end) {
  return text.size() >= end.size() && text.substr(text.size() - end.size()) == end;
}

// "~/x" under HOME, as botocore expands these paths; empty when it cannot be.
std::string expand_home(const std::string& path, const Environment& env) {
  if (path.size() < 2 || path.compare(0, 2, "~/") != 0) return path;
  const auto home = env.get("HOME");
  return home ? *home + path.substr(1) : std::string();
}

std::optional<ProfileFile> read_file_at(const std::string& path) {
  if (path.empty()) return std::nullopt;
  return read_profile_file(path);
}

struct Profiles {
  std::string name;
  bool named_explicitly = false;
  std::string config_path, credentials_path;
  std::optional<ProfileFile> config_file, credentials_file;
  const ProfileSettings* config = nullptr;       // [profile NAME] of the config file
  const ProfileSettings* credentials = nullptr;  // [NAME] of the credentials file

  std::string config_where() const { return "profile \"" + name + "\" of " + config_path; }
};

Profiles read_profiles(const Environment& env) {
  Profiles p;
  if (auto name = env.get("AWS_PROFILE")) {
    p.name = *name;
    p.named_explicitly = true;
  } else if (auto legacy = env.get("AWS_DEFAULT_PROFILE")) {
    p.name = *legacy;
    p.named_explicitly = true;
  } else {
    p.name = "default";
  }
  p.config_path = expand_home(env.get("AWS_CONFIG_FILE").value_or("~/.aws/config"), env);
  p.credentials_path = expand_home(env.get("AWS_SHARED_CREDENTIALS_FILE").value_or("~/.aws/credentials"), env);
  p.config_file = read_file_at(p.config_path);
  p.credentials_file = read_file_at(p.credentials_path);
  if (p.config_file) p.config = config_file_profile(*p.config_file, p.name);
  if (p.credentials_file) p.credentials = credentials_file_profile(*p.credentials_file, p.name);
  if (p.named_explicitly && !p.config && !p.credentials) {
    throw UsageError("the AWS profile \"" + p.name + "\" (AWS_PROFILE) is in neither " +
                     (p.config_path.empty() ? "~/.aws/config" : p.config_path) + " ([profile " + p.name + "]) nor " +
                     (p.credentials_path.empty() ? "~/.aws/credentials" : p.credentials_path) + " ([" + p.name +
                     "]): add it, or set AWS_PROFILE to one that exists");
  }
  return p;
}

// Key id and secret from one section, or nothing; one without the other is an error.
std::optional<Credentials> credentials_of(const ProfileSettings* section, const std::string& where) {
  const auto id = setting(section, "aws_access_key_id");
  const auto secret = setting(section, "aws_secret_access_key");
  if (!id && !secret) return std::nullopt;
  if (!id || !secret) {
    throw UsageError(
        where + " sets " +
        (id ? "aws_access_key_id but not aws_secret_access_key" : "aws_secret_access_key but not aws_access_key_id") +
        ": set both");
  }
  Credentials c{*id, *secret, setting(section, "aws_session_token").value_or("")};
  if (c.session_token.empty()) c.session_token = setting(section, "aws_security_token").value_or("");  // older name
  return c;
}

void resolve_credentials(const Environment& env, const Profiles& profiles, Config& config) {
  const auto id = env.get("AWS_ACCESS_KEY_ID");
  const auto secret = env.get("AWS_SECRET_ACCESS_KEY");
  if (id || secret) {
    if (!id || !secret) {
      throw UsageError(std::string(id ? "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not"
                                      : "AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not") +
                       ": set both (and AWS_SESSION_TOKEN for temporary credentials)");
    }
    config.credentials = Credentials{*id, *secret, env.get("AWS_SESSION_TOKEN").value_or("")};
    config.credentials_source = "the environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY";
    if (!config.credentials.session_token.empty()) config.credentials_source += "/AWS_SESSION_TOKEN";
    return;
  }
  const std::string credentials_where = "[" + profiles.name + "] of " + profiles.credentials_path;
  if (auto c = credentials_of(profiles.credentials, credentials_where)) {
    config.credentials = *c;
    config.credentials_source = credentials_where;
    return;
  }
  if (auto c = credentials_of(profiles.config, profiles.config_where())) {
    config.credentials = *c;
    config.credentials_source = profiles.config_where();
    return;
  }
  std::string message =
      "no AWS credentials found for S3: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
      "temporary credentials), or put aws_access_key_id and aws_secret_access_key in the [" +
      profiles.name + "] section of " +
      (profiles.credentials_path.empty() ? "~/.aws/credentials" : profiles.credentials_path) +
      " (AWS_SHARED_CREDENTIALS_FILE) or the [profile " + profiles.name + "] section of " +
      (profiles.config_path.empty() ? "~/.aws/config" : profiles.config_path) +
      " (AWS_CONFIG_FILE); the profile is AWS_PROFILE's, \"default\" without it";
  for (const char* key :
       {"role_arn", "sso_session", "sso_start_url", "credential_process", "web_identity_token_file"}) {
    if (setting(profiles.config, key)) {
      message += ". The profile \"" + profiles.name + "\" gets credentials through " + key +
                 ", which distckpt does not follow: export them first (eval \"$(aws configure export-credentials "
                 "--profile " +
                 profiles.name + " --format env)\")";
      break;
    }
  }
  throw UsageError(message);
}

void check_region(const std::string& region, const std::string& source) {
  bool ok = !region.empty() && region.size() <= 64;
  for (char c : region) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  if (!ok) throw UsageError("AWS region \"" + region + "\" (from " + source + ") is not a region name like us-east-1");
}

std::string default_endpoint(const std::string& region) {
  const std::string domain = region.compare(0, 3, "cn-") == 0 ? "amazonaws.com.cn" : "amazonaws.com";
  return "https://s3." + region + "." + domain;
}

bool truthy(const std::optional<std::string>& value) { return value && lowercase(*value) == "true"; }

void resolve_endpoint(const Environment& env, const Profiles& profiles, Config& config) {
  std::optional<std::string> url;
  std::string source;
  const bool ignore_configured = truthy(env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")) ||
                                 truthy(setting(profiles.config, "ignore_configured_endpoint_urls"));
  if (!ignore_configured) {
    if ((url = env.get("AWS_ENDPOINT_URL_S3"))) {
      source = "AWS_ENDPOINT_URL_S3";
    } else if ((url = env.get("AWS_ENDPOINT_URL"))) {
      source = "AWS_ENDPOINT_URL";
    } else if (auto services = setting(profiles.config, "services"); services && profiles.config_file) {
      const auto it = profiles.config_file->sections.find("services " + *services);
      if (it != profiles.config_file->sections.end() && (url = setting(&it->second, "s3.endpoint_url"))) {
        source = "[services " + *services + "] s3.endpoint_url of " + profiles.config_path;
      }
    }
    if (!url && (url = setting(profiles.config, "endpoint_url"))) source = "endpoint_url of " + profiles.config_where();
  }
  if (!url) {
    url = default_endpoint(config.region);
    source = "the default for region " + config.region;
  }
  try {
    config.endpoint = parse_endpoint_url(*url);
  } catch (const UsageError& e) {
    throw UsageError(std::string(e.what()) + " (from " + source + ")");
  }
  config.endpoint_source = source;
}

Addressing parse_addressing(const std::string& value, const std::string& source, Addressing fallback) {
  const std::string v = lowercase(value);
  if (v == "path") return Addressing::kPath;
  if (v == "virtual") return Addressing::kVirtualHosted;
  if (v == "auto") return fallback;
  throw UsageError(source + " is \"" + value + "\": use path or virtual");
}

int parse_max_attempts(const std::string& value, const std::string& source) {
  char* end = nullptr;
  const long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || n < 1 || n > 100) {
    throw UsageError(source + " is \"" + value + "\": give the number of attempts, 1 to 100");
  }
  return static_cast<int>(n);
}

bool is_port(std::string_view text) {
  if (text.empty() || text.size() > 5) return false;
  for (char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  const int port = std::stoi(std::string(text));
  return port >= 1 && port <= 65535;
}

}  // namespace

std::string Endpoint::authority() const { return port == 0 ? host : host + ":" + std::to_string(port); }

std::string Endpoint::url() const { return scheme + "://" + authority(); }

bool Endpoint::is_aws() const { return ends_with(host, ".amazonaws.com") || ends_with(host, ".amazonaws.com.cn"); }

bool Endpoint::host_is_ip() const {
  if (!host.empty() && host.front() == '[') return true;
  for (char c : host) {
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.') return false;
  }
  return true;
}

Endpoint parse_endpoint_url(const std::string& url) {
  const std::string quoted = "S3 endpoint URL \"" + url + "\"";
  const size_t scheme_end = url.find("://");
  Endpoint e;
  e.scheme = scheme_end == std::string::npos ? std::string() : lowercase(url.substr(0, scheme_end));
  if (e.scheme != "https" && e.scheme != "http") {
    throw UsageError(quoted + " must start with https:// (or http:// for a server without TLS)");
  }
  std::string_view rest = std::string_view(url).substr(scheme_end + 3);
  const size_t path_start = rest.find_first_of("/?#");
  if (path_start != std::string_view::npos) {
    if (rest.substr(path_start) != "/") {
      throw UsageError(quoted + " may not have a path, query or fragment: give only scheme://host[:port]");
    }
    rest = rest.substr(0, path_start);
  }
  if (rest.find('@') != std::string_view::npos) {
    throw UsageError(quoted + " may not hold user information: credentials come from AWS_ACCESS_KEY_ID etc.");
  }
  std::string_view port;
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) throw UsageError(quoted + " has an unclosed IPv6 address");
    e.host = std::string(rest.substr(0, close + 1));
    const std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') throw UsageError(quoted + " has characters after its IPv6 address");
      port = after.substr(1);
      if (!is_port(port)) throw UsageError(quoted + " has a port that is not a number from 1 to 65535");
    }
  } else {
    const size_t colon = rest.rfind(':');
    e.host = lowercase(rest.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = rest.substr(colon + 1);
      if (!is_port(port)) throw UsageError(quoted + " has a port that is not a number from 1 to 65535");
    }
    for (char c : e.host) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') {
        throw UsageError(quoted + " has a host name with '" + std::string(1, c) + "' in it");
      }
    }
  }
  if (e.host.empty() || e.host == "[]") throw UsageError(quoted + " names no host");
  if (!port.empty()) {
    e.port = std::stoi(std::string(port));
    if ((e.scheme == "https" && e.port == 443) || (e.scheme == "http" && e.port == 80)) e.port = 0;
  }
  return e;
}

Environment Environment::current() {
  Environment env;
  for (const char* name : kVariables) {
    if (const char* value = std::getenv(name)) env.variables[name] = value;
  }
  return env;
}

std::optional<std::string> Environment::get(const std::string& name) const {
  const auto it = variables.find(name);
  if (it == variables.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

Config resolve_config(const Environment& env) {
  const Profiles profiles = read_profiles(env);
  Config config;
  config.profile = profiles.name;

  if (auto region = env.get("AWS_REGION")) {
    config.region = *region;
    config.region_source = "AWS_REGION";
  } else if (auto default_region = env.get("AWS_DEFAULT_REGION")) {
    config.region = *default_region;
    config.region_source = "AWS_DEFAULT_REGION";
  } else if (auto profile_region = setting(profiles.config, "region")) {
    config.region = *profile_region;
    config.region_source = "region of " + profiles.config_where();
  } else {
    config.region = "us-east-1";
    config.region_source = "the default (no AWS_REGION, AWS_DEFAULT_REGION or profile region)";
  }
  check_region(config.region, config.region_source);

  resolve_endpoint(env, profiles, config);
  resolve_credentials(env, profiles, config);

  const Addressing by_endpoint = config.endpoint.is_aws() ? Addressing::kVirtualHosted : Addressing::kPath;
  if (auto forced = env.get("DISTCKPT_S3_ADDRESSING")) {
    config.addressing = parse_addressing(*forced, "DISTCKPT_S3_ADDRESSING", by_endpoint);
  } else if (auto style = setting(profiles.config, "s3.addressing_style")) {
    config.addressing = parse_addressing(*style, "s3.addressing_style of " + profiles.config_where(), by_endpoint);
  } else {
    config.addressing = by_endpoint;
  }

  if (auto attempts = env.get("AWS_MAX_ATTEMPTS")) {
    config.retry.max_attempts = parse_max_attempts(*attempts, "AWS_MAX_ATTEMPTS");
  } else if (auto profile_attempts = setting(profiles.config, "max_attempts")) {
    config.retry.max_attempts = parse_max_attempts(*profile_attempts, "max_attempts of " + profiles.config_where());
  }
  if (auto bundle = env.get("AWS_CA_BUNDLE")) {
    config.ca_bundle = expand_home(*bundle, env);
  } else if (auto profile_bundle = setting(profiles.config, "ca_bundle")) {
    config.ca_bundle = expand_home(*profile_bundle, env);
  }
  return config;
}

}  // namespace distckpt::s3
