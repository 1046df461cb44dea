#include "emit/printer.h"

#include <stdexcept>

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

}  // namespace distckpt::gen
