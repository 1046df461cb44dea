// distckpt-gen: compiles a layout schema (*.shard) into a typed C++ API.
//   distckpt-gen SCHEMA.shard --out-dir DIR   ->  DIR/SCHEMA.shard.h, DIR/SCHEMA.shard.cpp
// Exit status: 0 done, 1 errors in the schema, 2 a file could not be read or written.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "emit/emit_cpp.h"
#include "file_io.h"
#include "frontend.h"

int main(int argc, char** argv) {
  namespace gen = distckpt::gen;
  CLI::App app{"distckpt-gen: layout schema (*.shard) -> typed C++ builders"};
  std::string schema_path, out_dir = ".";
  app.add_option("schema", schema_path, "the layout schema")->required();
  app.add_option("--out-dir,-o", out_dir, "where to write NAME.shard.h and NAME.shard.cpp");
  CLI11_PARSE(app, argc, argv);

  std::string error;
  const std::optional<std::string> text = gen::read_file(schema_path, error);
  if (!text) {
    std::cerr << "distckpt-gen: " << error << '\n';
    return 2;
  }
  const std::string file_name = std::filesystem::path(schema_path).filename().string();
  gen::Diagnostics diagnostics(file_name, *text);
  const std::optional<gen::Layout> layout = gen::compile_schema(file_name, *text, diagnostics);
  std::cerr << diagnostics.render();
  if (!layout) return 1;

  const std::string header_name = file_name + ".h";
  const gen::GeneratedFiles files = gen::emit_cpp(*layout, header_name);
  const std::filesystem::path dir(out_dir);
  error = gen::make_output_dir(dir);
  if (error.empty())
    error = gen::write_files({{dir / header_name, files.header}, {dir / (file_name + ".cpp"), files.source}});
  if (!error.empty()) {
    std::cerr << "distckpt-gen: " << error << '\n';
    return 2;
  }
  return 0;
}
