#include "io/byte_sink.h"

#include "io/file.h"

namespace distckpt::io {
namespace {

class FileSink final : public ByteSink {
 public:
  FileSink(const std::string& path, bool try_direct) : file_(path, File::Mode::kCreateTruncate) {
    if (try_direct) file_.try_enable_direct();
  }
  void write_at(uint64_t offset, const uint8_t* data, uint64_t n) override { file_.pwrite_all(data, n, offset); }
  void finish(uint64_t /*size*/) override {
    file_.sync();
    direct_ = file_.is_direct();
    file_.close();
  }
  void abort() noexcept override {}
  bool direct() const override { return direct_ || file_.is_direct(); }

 private:
  File file_;
  bool direct_ = false;
};

}  // namespace

std::unique_ptr<ByteSink> file_sink(const std::string& path, bool try_direct) {
  return std::make_unique<FileSink>(path, try_direct);
}

}  // namespace distckpt::io
