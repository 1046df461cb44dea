// Fuzzes the restricted pickle reader of torch.save files
// (format/torch_pickle.h). Storages are served as zeros of the size asked
// (up to a bound). The reader must throw CheckpointError or return a tree;
// every tensor in it must lie inside its storage (reading each element).
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "distckpt/core/errors.h"
#include "format/torch_pickle.h"

namespace {

namespace tp = distckpt::torch_pickle;

// Touches every element of every tensor reachable within a few levels
// (the memo can make the tree cyclic).
void walk(const tp::Node& n, int depth) {
  if (depth > 16) return;
  if (const auto* t = std::get_if<at::Tensor>(&n.value)) {
    if (t->numel() > 0) (void)t->sum().item<double>();
  } else if (const auto* l = std::get_if<std::shared_ptr<tp::List>>(&n.value)) {
    for (const auto& item : (*l)->items) walk(*item, depth + 1);
  } else if (const auto* d = std::get_if<std::shared_ptr<tp::Dict>>(&n.value)) {
    for (const auto& [key, item] : (*d)->items) walk(*item, depth + 1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const tp::StorageLoader zeros = [](const std::string&, at::ScalarType dtype, int64_t numel) {
    if (numel > (1 << 20)) throw distckpt::CheckpointError("storage too large for the fuzzer");
    return at::zeros({numel}, at::TensorOptions().dtype(dtype));
  };
  try {
    const tp::Unpickled unpickled =
        tp::unpickle(std::string_view(reinterpret_cast<const char*>(data), size), zeros, "fuzz.pt");
    walk(*unpickled.root, 0);
  } catch (const distckpt::CheckpointError&) {
  }
  return 0;
}
