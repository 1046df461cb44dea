// distckpt-gen: compiles a layout schema (*.shard) into a typed C++ API.
//   distckpt-gen SCHEMA.shard --out-dir DIR   ->  DIR/SCHEMA.shard.h, DIR/SCHEMA.shard.cpp
// Exit status: 0 done, 1 errors in the schema, 2 usage errors and files that
// could not be read or written.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
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
  app.set_version_flag("--version", "distckpt-gen " DISTCKPT_GEN_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help and --version exit 0
  }
  if (out_dir.empty()) {
    std::cerr << "distckpt-gen: --out-dir is empty; name a directory (. for the current one)\n";
    return 2;
  }

  std::string error;
  std::optional<std::string> text = gen::read_file(schema_path, error);
  if (!text) {
    std::cerr << "distckpt-gen: " << error << '\n';
    return 2;
  }
  if (text->rfind("\xEF\xBB\xBF", 0) == 0) text->erase(0, 3);  // a UTF-8 byte order mark, as some editors save
  const std::string file_name = std::filesystem::path(schema_path).filename().string();
  // The name becomes an #include and a string in the generated code.
  const bool plain_name = std::all_of(file_name.begin(), file_name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == '+';
  });
  if (!plain_name) {
    std::cerr << "distckpt-gen: the schema's file name '" << file_name
              << "' would appear in a C++ #include; rename it with letters, digits, '.', '-', '_' and '+' only\n";
    return 2;
  }
  gen::Diagnostics diagnostics(schema_path, *text);  // the path as given, for editors to jump to
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
