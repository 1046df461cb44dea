#include "emit/printer.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace distckpt::gen {

void Printer::outdent() {
  if (indent_ < 2) throw std::logic_error("Printer::outdent without a matching indent");
  indent_ -= 2;
}

void Printer::write(std::string_view piece) {
  for (char c : piece) {
    if (at_line_start_ && c != '\n') out_->append(static_cast<size_t>(indent_), ' ');
    out_->push_back(c);
    at_line_start_ = c == '\n';
  }
}

void Printer::print(std::string_view text, const Vars& vars) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t open = text.find('$', pos);
    if (open == std::string_view::npos) {
      write(text.substr(pos));
      return;
    }
    write(text.substr(pos, open - pos));
    const size_t close = text.find('$', open + 1);
    if (close == std::string_view::npos) throw std::logic_error("unterminated $variable$ in template");
    const std::string name(text.substr(open + 1, close - open - 1));
    if (name.empty()) {
      write("$");
    } else {
      auto it = vars.find(name);
      if (it == vars.end()) throw std::logic_error("template variable $" + name + "$ has no value");
      write(it->second);
    }
    pos = close + 1;
  }
}

namespace {

// "  $name$" -> {"  ", "name"}; nullopt for any other line.
std::optional<std::pair<std::string_view, std::string_view>> lone_variable(std::string_view line) {
  const size_t open = line.find_first_not_of(' ');
  if (open == std::string_view::npos || line[open] != '$' || line.size() < open + 3 || line.back() != '$') {
    return std::nullopt;
  }
  const std::string_view name = line.substr(open + 1, line.size() - open - 2);
  if (name.find('$') != std::string_view::npos) return std::nullopt;
  return std::make_pair(line.substr(0, open), name);
}

// The template without its first newline, blank tail and common indentation.
std::string dedent(std::string_view text) {
  if (!text.empty() && text.front() == '\n') text.remove_prefix(1);
  const size_t tail = text.find_last_of('\n');
  if (tail != std::string_view::npos && text.find_first_not_of(' ', tail + 1) == std::string_view::npos) {
    text = text.substr(0, tail + 1);
  }
  size_t common = std::string_view::npos;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    const size_t first = text.find_first_not_of(' ', begin);
    if (first < end) common = std::min(common, first - begin);  // blank lines do not count
    begin = end + 1;
  }
  if (common == std::string_view::npos) common = 0;
  std::string out;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    const std::string_view line = text.substr(begin, end - begin);
    if (line.size() > common) out += line.substr(common);
    if (end < text.size()) out += '\n';
    begin = end + 1;
  }
  return out;
}

}  // namespace

void Printer::write_block(std::string_view prefix, std::string_view block) {
  for (size_t begin = 0; begin < block.size();) {
    const size_t end = std::min(block.find('\n', begin), block.size());
    const std::string_view line = block.substr(begin, end - begin);
    if (!line.empty()) {
      write(prefix);
      write(line);
    }
    write("\n");
    begin = end + 1;
  }
}

void Printer::emit(std::string_view text, const Vars& vars) {
  const std::string dedented = dedent(text);
  const std::string_view all(dedented);
  for (size_t begin = 0; begin < all.size();) {
    const size_t newline = all.find('\n', begin);
    const size_t end = newline == std::string_view::npos ? all.size() : newline + 1;
    const std::string_view line = all.substr(begin, end - begin);
    begin = end;
    const auto block = lone_variable(line.substr(0, line.size() - (newline == std::string_view::npos ? 0 : 1)));
    const auto value = block ? vars.find(std::string(block->second)) : vars.end();
    if (value == vars.end()) {
      print(line, vars);
    } else if (!value->second.empty()) {
      write_block(block->first, value->second);
    }
  }
}

}  // namespace distckpt::gen
