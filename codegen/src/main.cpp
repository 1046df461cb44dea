// distckpt-gen: compiles a layout schema (*.shard) into a typed C++ API.
//   distckpt-gen SCHEMA.shard --out-dir DIR   ->  DIR/SCHEMA.shard.h, DIR/SCHEMA.shard.cpp
// Files are rewritten only when their content changes, so builds stay incremental.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "emit/emit_cpp.h"
#include "frontend.h"

namespace {

bool write_if_changed(const std::filesystem::path& path, const std::string& content) {
  std::ifstream in(path, std::ios::binary);
  if (in) {
    std::stringstream old;
    old << in.rdbuf();
    if (old.str() == content) return true;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distckpt-gen: layout schema (*.shard) -> typed C++ builders"};
  std::string schema_path, out_dir = ".";
  app.add_option("schema", schema_path, "the layout schema")->required();
  app.add_option("--out-dir,-o", out_dir, "where to write NAME.shard.h and NAME.shard.cpp");
  CLI11_PARSE(app, argc, argv);

  std::ifstream in(schema_path, std::ios::binary);
  if (!in) {
    std::cerr << "distckpt-gen: cannot read " << schema_path << '\n';
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  const std::string file_name = std::filesystem::path(schema_path).filename().string();
  distckpt::gen::Diagnostics diagnostics(file_name, text.str());
  const std::optional<distckpt::gen::Layout> layout = distckpt::gen::compile_schema(file_name, text.str(), diagnostics);
  std::cerr << diagnostics.render();
  if (!layout) return 1;

  const std::string header_name = file_name + ".h";
  const distckpt::gen::GeneratedFiles files = distckpt::gen::emit_cpp(*layout, header_name);
  std::filesystem::create_directories(out_dir);
  const std::filesystem::path dir(out_dir);
  if (!write_if_changed(dir / header_name, files.header) ||
      !write_if_changed(dir / (file_name + ".cpp"), files.source)) {
    std::cerr << "distckpt-gen: cannot write into " << out_dir << '\n';
    return 2;
  }
  return 0;
}
