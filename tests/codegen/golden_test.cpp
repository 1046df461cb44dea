// generated/ holds distckpt-gen's output for schema/models/*.shard, checked
// in for review. This test regenerates it and fails on any difference.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "emit/emit_cpp.h"
#include "emit/wrap.h"
#include "frontend.h"

namespace distckpt::gen {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void expect_golden(const std::string& name) {
  const std::string file_name = name + ".shard";
  const std::string source = read(std::string(DISTCKPT_SOURCE_DIR) + "/schema/models/" + file_name);
  ASSERT_FALSE(source.empty()) << file_name;
  Diagnostics diagnostics(file_name, source);
  const std::optional<Layout> layout = compile_schema(file_name, source, diagnostics);
  ASSERT_TRUE(layout) << diagnostics.render();
  EXPECT_TRUE(diagnostics.all().empty()) << diagnostics.render();
  const GeneratedFiles files = emit_cpp(*layout, file_name + ".h");
  const std::string dir = std::string(DISTCKPT_SOURCE_DIR) + "/generated/";
  EXPECT_EQ(files.header, read(dir + file_name + ".h")) << "generated/ is stale: run scripts/regenerate.sh";
  EXPECT_EQ(files.source, read(dir + file_name + ".cpp")) << "generated/ is stale: run scripts/regenerate.sh";
}

TEST(Golden, GptLayoutMatchesCheckedInCode) { expect_golden("gpt"); }
TEST(Golden, MoeLayoutMatchesCheckedInCode) { expect_golden("moe"); }

// .clang-format's column limit holds for the generated code too.
TEST(Golden, NoLineIsLongerThanTheColumnLimit) {
  const std::filesystem::path dir = std::filesystem::path(DISTCKPT_SOURCE_DIR) / "generated";
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++files;
    std::istringstream lines(read(entry.path().string()));
    int number = 0;
    for (std::string line; std::getline(lines, line);) {
      ++number;
      EXPECT_LE(line.size(), kColumnLimit) << entry.path().filename().string() << ":" << number << ": " << line;
    }
  }
  EXPECT_EQ(files, 4u);
}

TEST(Golden, OutputIsDeterministic) {
  const std::string source = read(std::string(DISTCKPT_SOURCE_DIR) + "/schema/models/moe.shard");
  Diagnostics d1("moe.shard", source), d2("moe.shard", source);
  const auto a = emit_cpp(*compile_schema("moe.shard", source, d1), "moe.shard.h");
  const auto b = emit_cpp(*compile_schema("moe.shard", source, d2), "moe.shard.h");
  EXPECT_EQ(a.header, b.header);
  EXPECT_EQ(a.source, b.source);
}

}  // namespace
}  // namespace distckpt::gen
