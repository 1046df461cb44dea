// A small text printer for generated code, in the spirit of protobuf's
// io::Printer: templates with named substitutions ($name$) and automatic
// indentation, so the emitter reads like the code it writes.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace distckpt::gen {

class Printer {
 public:
  using Vars = std::map<std::string, std::string>;

  explicit Printer(std::string* out) : out_(out) {}

  // Prints `text`, replacing each $name$ by vars[name] ("$$" prints "$").
  // The current indentation is added at the start of every non-empty line.
  // An unknown name throws std::logic_error: it is a bug in the emitter.
  void print(std::string_view text, const Vars& vars = {});
  // Shorthand: print("$a$ + $b$", "a", x, "b", y).
  template <typename... Pairs>
  void print(std::string_view text, const char* name, const std::string& value, const Pairs&... rest) {
    Vars vars;
    add(vars, name, value, rest...);
    print(text, vars);
  }

  void indent() { indent_ += 2; }
  void outdent();

  // Indents until the end of the scope.
  class Indent {
   public:
    explicit Indent(Printer& p) : p_(p) { p_.indent(); }
    ~Indent() { p_.outdent(); }
    Indent(const Indent&) = delete;
    Indent& operator=(const Indent&) = delete;

   private:
    Printer& p_;
  };

 private:
  static void add(Vars&) {}
  template <typename... Pairs>
  static void add(Vars& vars, const char* name, const std::string& value, const Pairs&... rest) {
    vars[name] = value;
    add(vars, rest...);
  }
  void write(std::string_view piece);

  std::string* out_;
  int indent_ = 0;
  bool at_line_start_ = true;
};

}  // namespace distckpt::gen
