#include "local/file_transfer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "distckpt/core/errors.h"
#include "io/file.h"

namespace distckpt::local {
namespace {

constexpr int64_t kOk = 0, kNoFile = 1;

at::Tensor on_wire(const at::Tensor& host, Communicator& comm) {
  return comm.tensor_device().is_cpu() ? host : host.to(comm.tensor_device());
}

uint64_t slab_count(uint64_t size, uint64_t slab) { return size / slab + (size % slab != 0); }

}  // namespace

std::exception_ptr send_file(Communicator& comm, const std::string& path, int dst, int tag, uint64_t slab_bytes) {
  std::exception_ptr error;
  io::File f;
  uint64_t size = 0;
  try {
    f = io::File(path, io::File::Mode::kRead);
    size = f.size();
  } catch (...) {
    error = std::current_exception();
  }
  at::Tensor header = at::tensor({error ? kNoFile : kOk, static_cast<int64_t>(size)}, at::kLong);
  comm.send_tensor(on_wire(header, comm), dst, tag);
  if (error) return error;
  at::Tensor slab = at::empty({static_cast<int64_t>(std::min(slab_bytes, size))}, at::kByte);
  for (uint64_t at = 0; at < size; at += slab_bytes) {
    const uint64_t n = std::min(slab_bytes, size - at);
    at::Tensor part = slab.narrow(0, 0, static_cast<int64_t>(n));
    try {
      if (!error) f.pread_all(part.data_ptr(), n, at);
    } catch (...) {
      error = std::current_exception();
    }
    if (error) part.zero_();  // the receiver's verification rejects the file
    comm.send_tensor(on_wire(part, comm), dst, tag);
  }
  return error;
}

bool recv_file(Communicator& comm, int src, int tag, const std::string& path, uint64_t slab_bytes, std::string& why) {
  at::Tensor header = on_wire(at::zeros({2}, at::kLong), comm);
  comm.recv_tensor(header, src, tag);
  header = header.cpu();
  const int64_t status = header[0].item<int64_t>(), size = header[1].item<int64_t>();
  if (status != kOk) {
    why = fmt::format("rank {} could not read its copy", src);
    return false;
  }
  if (size < 0) throw ProtocolError(fmt::format("rank {} announced a file of {} bytes", src, size));
  // A local write failure still drains the sender's slabs (no hang).
  io::File out;
  std::exception_ptr write_error;  // the first one; the slabs are still drained
  try {
    out = io::File(path, io::File::Mode::kCreateTruncate);
  } catch (...) {
    write_error = std::current_exception();
  }
  const auto total = static_cast<uint64_t>(size);
  at::Tensor slab = on_wire(at::empty({static_cast<int64_t>(std::min(slab_bytes, total))}, at::kByte), comm);
  for (uint64_t i = 0, at = 0; i < slab_count(total, slab_bytes); ++i, at += slab_bytes) {
    const uint64_t n = std::min(slab_bytes, total - at);
    at::Tensor part = slab.narrow(0, 0, static_cast<int64_t>(n));
    comm.recv_tensor(part, src, tag);
    if (write_error) continue;
    try {
      const at::Tensor host = part.cpu();
      out.pwrite_all(host.data_ptr(), n, at);
    } catch (...) {
      write_error = std::current_exception();
    }
  }
  try {
    if (!write_error) out.sync();
  } catch (...) {
    write_error = std::current_exception();
  }
  if (write_error) {
    try {
      std::rethrow_exception(write_error);
    } catch (const std::exception& e) {  // its own class (IoError), with where it happened
      rethrow_with_context(e, fmt::format("this rank could not write the copy from rank {}", src));
    }
  }
  return true;
}

}  // namespace distckpt::local
