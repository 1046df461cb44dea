// The AWS shared configuration files (~/.aws/config, ~/.aws/credentials):
// INI sections of "key = value" lines, read as botocore reads them: keys
// lowercased, values trimmed, '#' and ';' comment lines, and an empty value
// followed by indented "sub = value" lines as a nested block (stored here as
// "key.sub", e.g. "s3.addressing_style").
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace distckpt::s3 {

using ProfileSettings = std::map<std::string, std::string>;

struct ProfileFile {
  std::string path;                                 // for messages
  std::map<std::string, ProfileSettings> sections;  // by the name between the brackets, as written
};

// Throws UsageError naming `path` and the line for a line that is neither a
// section, a setting, a comment nor a nested line.
ProfileFile parse_profile_file(std::string_view text, const std::string& path);
// nullopt when there is no file at `path`; UsageError when it cannot be read.
std::optional<ProfileFile> read_profile_file(const std::string& path);

// The config file names profiles "[profile NAME]" (and the default one
// "[default]"); the credentials file names them "[NAME]".
const ProfileSettings* config_file_profile(const ProfileFile& file, const std::string& profile);
const ProfileSettings* credentials_file_profile(const ProfileFile& file, const std::string& profile);

// A value of `settings`, nullopt when absent or empty.
std::optional<std::string> setting(const ProfileSettings* settings, const std::string& key);

}  // namespace distckpt::s3
