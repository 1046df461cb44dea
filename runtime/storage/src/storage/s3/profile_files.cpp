#include "storage/s3/profile_files.h"

#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "distckpt/core/errors.h"

namespace distckpt::s3 {
namespace {

constexpr size_t kMaxFileBytes = 1 << 20;  // these files are a few lines; anything larger is not one

std::string_view trim(std::string_view text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// "key = value" or "key: value" (configparser's two delimiters, whichever comes first).
bool split_setting(std::string_view line, std::string& key, std::string& value) {
  const size_t at = line.find_first_of("=:");
  if (at == std::string_view::npos || at == 0) return false;
  key = lowercase(trim(line.substr(0, at)));
  value = std::string(trim(line.substr(at + 1)));
  return !key.empty();
}

}  // namespace

ProfileFile parse_profile_file(std::string_view text, const std::string& path) {
  ProfileFile file;
  file.path = path;
  ProfileSettings* section = nullptr;
  std::string last_key;        // the setting an indented line continues
  bool last_is_block = false;  // its value was empty: indented lines are nested settings
  size_t line_number = 0;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view raw = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    ++line_number;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    const std::string_view line = trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    const auto fail = [&](const std::string& why) {
      throw UsageError(path + ":" + std::to_string(line_number) + ": " + why + ": \"" + std::string(line) + "\"", path);
    };
    const bool indented = std::isspace(static_cast<unsigned char>(raw[0]));
    if (indented && section && !last_key.empty()) {
      if (last_is_block) {
        std::string key, value;
        if (!split_setting(line, key, value)) fail("a nested setting must be \"name = value\"");
        (*section)[last_key + "." + key] = value;
      } else {
        (*section)[last_key] += "\n" + std::string(line);  // configparser's continuation line
      }
      continue;
    }
    if (line.front() == '[') {
      if (line.back() != ']' || line.size() < 3) fail("a section header must be \"[name]\"");
      section = &file.sections[std::string(trim(line.substr(1, line.size() - 2)))];
      last_key.clear();
      continue;
    }
    if (!section) fail("a setting before the first [section]");
    std::string key, value;
    if (!split_setting(line, key, value)) fail("a line must be \"[section]\", \"name = value\" or a comment");
    (*section)[key] = value;
    last_key = key;
    last_is_block = value.empty();
  }
  return file;
}

std::optional<ProfileFile> read_profile_file(const std::string& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    throw UsageError("cannot read the AWS configuration file " + path + ": " + std::strerror(errno), path);
  }
  if (!S_ISREG(info.st_mode)) throw UsageError("the AWS configuration file " + path + " is not a regular file", path);
  if (static_cast<uint64_t>(info.st_size) > kMaxFileBytes) {
    throw UsageError("the AWS configuration file " + path + " is " + std::to_string(info.st_size) +
                         " bytes, more than such a file ever holds (1 MiB)",
                     path);
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) throw UsageError("cannot read the AWS configuration file " + path, path);
  return parse_profile_file(text.str(), path);
}

const ProfileSettings* config_file_profile(const ProfileFile& file, const std::string& profile) {
  // "[profile NAME]" with any blanks between the two words; the default
  // profile may also be "[default]" (the form botocore documents).
  const ProfileSettings* found = nullptr;
  for (const auto& [name, settings] : file.sections) {
    std::string_view rest(name);
    if (rest.substr(0, 7) == "profile" && rest.size() > 7 && std::isspace(static_cast<unsigned char>(rest[7]))) {
      if (trim(rest.substr(7)) == profile) return &settings;
    } else if (name == "default" && profile == "default") {
      found = &settings;
    }
  }
  return found;
}

const ProfileSettings* credentials_file_profile(const ProfileFile& file, const std::string& profile) {
  const auto it = file.sections.find(profile);
  return it == file.sections.end() ? nullptr : &it->second;
}

std::optional<std::string> setting(const ProfileSettings* settings, const std::string& key) {
  if (!settings) return std::nullopt;
  const auto it = settings->find(key);
  if (it == settings->end() || it->second.empty()) return std::nullopt;
  return it->second;
}

}  // namespace distckpt::s3
