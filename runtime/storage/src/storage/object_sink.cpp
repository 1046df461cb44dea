#include "storage/object_sink.h"

namespace distckpt::storage {
namespace {

class ObjectSink final : public io::ByteSink {
 public:
  explicit ObjectSink(std::unique_ptr<ObjectWriter> writer) : writer_(std::move(writer)) {}
  void write_at(uint64_t offset, const uint8_t* data, uint64_t n) override { writer_->write(offset, data, n); }
  void finish(uint64_t size) override { writer_->finish(size); }
  void abort() noexcept override { writer_->abort(); }

 private:
  std::unique_ptr<ObjectWriter> writer_;
};

}  // namespace

std::unique_ptr<io::ByteSink> object_sink(std::unique_ptr<ObjectWriter> writer) {
  return std::make_unique<ObjectSink>(std::move(writer));
}

}  // namespace distckpt::storage
