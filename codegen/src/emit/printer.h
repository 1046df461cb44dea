// A small text printer for generated code, in the spirit of protobuf's
// io::Printer: templates with named substitutions ($name$) and automatic
// indentation, so the emitter reads like the code it writes. Templates are
// usually raw string literals indented along with the emitter's code:
//
//   p.emit(R"tmpl(
//     $cls$& $acc$(at::Tensor tensor);
//   )tmpl", "cls", cls, "acc", acc);
//
// (Not R"cc(: clang-format's Google style would format such a literal as C++.)
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

  // Like print(), for a template written as an indented raw string: the
  // newline right after R"tmpl( and the blank tail before )tmpl" are dropped,
  // and so is the indentation common to all non-empty lines. A variable
  // alone on its line is a block: every line of its value is indented like
  // the variable, and an empty value drops the line.
  void emit(std::string_view text, const Vars& vars = {});
  template <typename... Pairs>
  void emit(std::string_view text, const char* name, const std::string& value, const Pairs&... rest) {
    Vars vars;
    add(vars, name, value, rest...);
    emit(text, vars);
  }

  // What `print_into(p)` prints, as a string: a block for emit().
  template <typename F>
  static std::string capture(F&& print_into) {
    std::string out;
    Printer p(&out);
    print_into(p);
    return out;
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
  // Prints `block` with `prefix` before every non-empty line.
  void write_block(std::string_view prefix, std::string_view block);

  std::string* out_;
  int indent_ = 0;
  bool at_line_start_ = true;
};

}  // namespace distckpt::gen
