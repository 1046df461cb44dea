// Pickle opcodes written one at a time (protocol 2, Python's pickletools
// names): the torch.save pickle (format/torch_pickler.h) and DCP's
// `.metadata` (format/dcp_metadata.h) are made of these.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace distckpt::torch_pickle {

// Protocol 2 opcodes (Python's pickletools names).
class PickleWriter {
 public:
  std::string take() && { return std::move(out_); }
  void op(char c) { out_.push_back(c); }
  void proto() { out_ += "\x80\x02"; }
  void stop() { op('.'); }
  void mark() { op('('); }
  void global(const std::string& module, const std::string& name) { out_ += "c" + module + "\n" + name + "\n"; }
  void none() { op('N'); }
  void boolean(bool v) { op(v ? '\x88' : '\x89'); }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');  // BININT1
      out_.push_back(static_cast<char>(v));
    } else if (v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()) {
      op('J');  // BININT, 4 bytes little-endian, signed
      le(static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      out_ += "\x8a\x08";  // LONG1 of 8 bytes, two's complement little-endian
      le(static_cast<uint64_t>(v), 8);
    }
  }
  void real(double v) {
    op('G');  // BINFLOAT: big-endian IEEE 754
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  }
  void string(const std::string& s) {
    op('X');  // BINUNICODE: Python decodes it as UTF-8
    le(s.size(), 4);
    out_ += s;
  }
  void tuple(size_t n) {
    static const char kTuple[] = {')', '\x85', '\x86', '\x87'};
    if (n < 4) op(kTuple[n]);  // the items are on the stack
  }
  void ints(const std::vector<int64_t>& v) {
    if (v.size() > 3) mark();
    for (int64_t i : v) integer(i);
    if (v.size() > 3)
      op('t');
    else
      tuple(v.size());
  }

 private:
  void le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  std::string out_;
};

}  // namespace distckpt::torch_pickle
