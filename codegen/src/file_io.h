// distckpt-gen's file system work: reading the schema, creating the output
// directory and writing the generated files. A generated file is written to
// a temporary file in its own directory and renamed over its target once
// complete, so a failed run never leaves a half-written header behind.
// Errors name the path and the operating system's reason.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace distckpt::gen {

// The file's bytes, or nullopt with `error` set ("cannot read x.shard: No
// such file or directory").
std::optional<std::string> read_file(const std::filesystem::path& path, std::string& error);

// Creates `dir` and its parents if missing. "" on success, else the error.
std::string make_output_dir(const std::filesystem::path& dir);

// Replaces each (path, content) whose file does not hold exactly that
// content already (builds stay incremental). Every content is written to
// its temporary file before any file is replaced, so an error while
// writing replaces nothing. "" on success, else the error.
std::string write_files(const std::vector<std::pair<std::filesystem::path, std::string>>& files);

}  // namespace distckpt::gen
