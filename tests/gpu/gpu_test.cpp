// CUDA tensors in save and load. Every case skips where no GPU is visible or
// LibTorch has no CUDA (this project's own machines); scripts/gpu-check.sh
// runs them on a GPU machine. The processes of a job share its one GPU and
// talk over Gloo (NCCL refuses two ranks on one GPU).
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <tuple>

#include "core/device_event.h"
#include "distckpt/distckpt.h"
#include "io/buffer_pool.h"
#include "storage/write_items.h"
#include "support/process.h"
#include "support/ranks.h"

namespace {

using namespace distckpt;
const std::string kBin = DISTCKPT_BIN_DIR;
const std::string kGpt =
    "--model gpt --layers 4 --hidden 32 --heads 4 --kv-groups 2 --ffn 64 --vocab 64 --optimizer adam";

#define SKIP_WITHOUT_GPU()                                                                              \
  if (!torch::cuda::is_available()) {                                                                   \
    GTEST_SKIP() << "no GPU visible, or LibTorch without CUDA (scripts/gpu-check.sh runs this on one)"; \
  }

CommandResult trainer(int ranks, const std::string& flags) {
  return run_command(
      fmt::format("OMP_NUM_THREADS=1 {0}/distckpt-launch -n {1} -- {0}/distckpt-gpt-trainer {2} {3} 2>&1", kBin, ranks,
                  kGpt, flags));
}

std::string digest(const std::string& dir) {
  const CommandResult r = run_command(kBin + "/distckpt digest " + dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.output;
}

TEST(GpuSaveLoad, FourProcessesOnOneGpuSaveAndReshardCudaTensors) {
  SKIP_WITHOUT_GPU();
  TempDir tmp("gpu-reshard");
  const std::string cpu = tmp.file("cpu"), gpu = tmp.file("gpu"), wide = tmp.file("wide"), one = tmp.file("one");
  // The values: trained on the CPU under (tp=2, pp=2), optimizer state included.
  CommandResult r = trainer(4, "--tp 2 --pp 2 --steps 2 --save " + cpu);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string want = digest(cpu);
  // Loaded into CUDA tensors and saved from them under the same layout,
  // then under (tp=4, pp=1), then by one process: the same bytes each time.
  for (const auto& [ranks, flags, from, to] :
       {std::tuple{4, "--tp 2 --pp 2", cpu, gpu}, std::tuple{4, "--tp 4", gpu, wide}, std::tuple{1, "", wide, one}}) {
    r = trainer(ranks, fmt::format("{} --device cuda --load {} --save {}", flags, from, to));
    ASSERT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    EXPECT_EQ(digest(to), want) << flags;
    EXPECT_TRUE(verify_checkpoint(to).intact());
  }
}

TEST(GpuAsyncSave, ReturnsWhileAKernelRunsAndSavesTheValuesOfTheCall) {
  SKIP_WITHOUT_GPU();
  const at::Device device(at::kCUDA, 0);
  auto comm = make_single_process_communicator();
  const at::Tensor values = at::rand({4096, 4096}, at::kFloat);  // 64 MiB
  at::Tensor weights = values.to(device);
  StateDict sd;
  sd["w"] = Value(ShardedTensor::from_rank_offsets("w", weights, {}));
  TempDir dir("gpu-async");
  AsyncQueueOptions queue_options;
  queue_options.staging = AsyncStaging::kInBackground;
  AsyncCallsQueue queue(*comm, queue_options);
  queue.save(sd, dir.file("warm"));  // plans once; the timed call reuses the plan
  queue.close();

  // The trainer's step: seconds of kernels queued on the current stream.
  at::Tensor a = at::rand({8192, 8192}, at::TensorOptions().device(device)) / 8192;
  const auto queued_at = std::chrono::steady_clock::now();
  for (int i = 0; i < 40; ++i) a = at::tanh(a.matmul(a));
  DeviceEvent step_done(device);
  step_done.record(current_stream(device));

  AsyncCallsQueue timed(*comm, queue_options);
  const auto call = std::chrono::steady_clock::now();
  timed.save(sd, dir.file("ckpt"));
  const auto returned = std::chrono::steady_clock::now();
  const bool step_still_running = !step_done.query();
  weights.add_(1);  // queued after the call: runs after the copy, never reaches the checkpoint
  timed.wait_staged();
  step_done.synchronize();
  const auto step_end = std::chrono::steady_clock::now();
  timed.close();

  const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf("gpu async save of 64 MiB: the call blocked the trainer %.2f ms while its %.0f ms of kernels ran\n",
              ms(returned - call), ms(step_end - queued_at));
  EXPECT_TRUE(step_still_running) << "the kernels ended before the call returned: the call waited for the GPU";
  StateDict request;
  request["w"] = Value(ShardedTensor::from_rank_offsets("w", at::zeros({4096, 4096}, at::kFloat), {}));
  const LoadResult loaded = load(request, dir.file("ckpt"), *comm);
  EXPECT_TRUE(at::equal(loaded.state_dict.at("w").as_tensor(), values));
  EXPECT_TRUE(at::equal(weights.cpu(), values + 1));
}

// A shard that must be made contiguous is copied after that copy, not
// before: the side stream once waited for the current stream only when the
// first shard was copied, so a later transpose could be read unwritten.
TEST(GpuAsyncSave, ShardsMadeContiguousDuringTheCallHoldTheirValues) {
  SKIP_WITHOUT_GPU();
  const at::Device device(at::kCUDA, 0);
  auto comm = make_single_process_communicator();
  at::Tensor a = at::rand({4096, 4096}, at::TensorOptions().device(device)) / 4096;
  for (int i = 0; i < 20; ++i) a = at::tanh(a.matmul(a));  // still running when the call starts
  const at::Tensor bias = at::ones({16}, at::TensorOptions().device(device));
  StateDict sd;
  sd["a_bias"] = Value(ShardedTensor::from_rank_offsets("a_bias", bias, {}));       // copied first
  sd["b_weight"] = Value(ShardedTensor::from_rank_offsets("b_weight", a.t(), {}));  // transposed: made contiguous
  TempDir dir("gpu-async-views");
  AsyncRequest request = async_save(sd, dir.file("ckpt"), *comm, SaveOptions{},
                                    io::BufferPool::create({64 << 20, false}), AsyncStaging::kInBackground);
  request.finalize(*comm);
  StateDict want;
  want["b_weight"] = Value(ShardedTensor::from_rank_offsets("b_weight", at::zeros({4096, 4096}), {}));
  const LoadResult loaded = load(want, dir.file("ckpt"), *comm);
  EXPECT_TRUE(at::equal(loaded.state_dict.at("b_weight").as_tensor(), a.t().contiguous().cpu()));
}

TEST(GpuSaveLoad, RequestsWithoutDataLandOnTheirDevice) {
  SKIP_WITHOUT_GPU();
  auto comm = make_single_process_communicator();
  const at::Tensor values = at::arange(0, 4096, at::kDouble).view({64, 64});
  StateDict sd;
  sd["w"] = Value(ShardedTensor::from_rank_offsets("w", values.cuda(), {}));
  TempDir dir("gpu-device-request");
  save(sd, dir.file("ckpt"), *comm);
  StateDict request;
  ShardedTensor wanted = ShardedTensor::from_rank_offsets("w", values, {});
  wanted.data = at::Tensor();
  wanted.device = at::Device(at::kCUDA, 0);
  request["w"] = Value(std::move(wanted));
  const at::Tensor back = load(request, dir.file("ckpt"), *comm).state_dict.at("w").as_tensor();
  EXPECT_TRUE(back.is_cuda());
  EXPECT_TRUE(at::equal(back.cpu(), values));
}

// transfer() from CUDA sources (one of them a strided view) to CUDA and CPU
// destinations of another layout: chunks are copied out of device memory as
// they are read, and the digests are taken of device tensors.
TEST(GpuTransfer, CudaSourcesReachCudaAndCpuDestinationsOfAnotherLayout) {
  SKIP_WITHOUT_GPU();
  const at::Tensor w = at::arange(0, 64 * 48, at::kFloat).view({64, 48});
  run_ranks(2, [&](Communicator& comm) {
    const int r = comm.rank();
    StateDict sources, requests;
    const at::Tensor rows = w.narrow(0, 32 * r, 32).cuda();
    sources["w"] = Value(ShardedTensor::from_rank_offsets("w", rows, {{0, r, 2}}));
    const at::Tensor wide = at::cat({rows, rows}, 1);  // the right half is a strided view
    sources["v"] = Value(ShardedTensor::from_rank_offsets("v", wide.narrow(1, 48, 48), {{0, r, 2}}));
    requests["w"] = Value(ShardedTensor::from_rank_offsets("w", at::zeros({64, 24}).cuda(), {{1, r, 2}}));
    requests["v"] = Value(ShardedTensor::from_rank_offsets("v", at::zeros({64, 24}), {{1, r, 2}}));
    const TransferResult result = transfer(sources, requests, comm);
    const at::Tensor got_w = result.state_dict.at("w").as_tensor(), got_v = result.state_dict.at("v").as_tensor();
    EXPECT_TRUE(got_w.is_cuda());
    EXPECT_TRUE(at::equal(got_w.cpu(), w.narrow(1, 24 * r, 24)));
    EXPECT_TRUE(at::equal(got_v, w.narrow(1, 24 * r, 24)));
    EXPECT_TRUE(result.unverified.empty());
  });
}

TEST(GpuTransfer, TrainerOnTheGpuSendsItsWeightsToInferenceRanks) {
  SKIP_WITHOUT_GPU();
  const CommandResult r = run_command(fmt::format(
      "OMP_NUM_THREADS=1 {0}/distckpt-launch -n 4 -- {0}/distckpt-gpt-trainer --tp 2 --steps 2 --send-every 1 "
      "--inference-ranks 2 --device cuda 2>&1",
      kBin));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("inference rank 1 received step 2"), std::string::npos) << r.output;
}

TEST(GpuSaveLoad, LoadsMoreThanItsStagingInRoundsOfOneWindow) {
  SKIP_WITHOUT_GPU();
  auto comm = make_single_process_communicator();
  const at::Tensor values = at::rand({4096, 4096}, at::kFloat);  // 64 MiB: 32 rounds of 2 MiB windows
  const at::Tensor bias = at::arange(0, 1 << 20, at::kDouble);   // 8 MiB, requested without data
  StateDict sd;
  sd["w"] = Value(ShardedTensor::from_rank_offsets("w", values, {}));
  sd["b"] = Value(ShardedTensor::from_rank_offsets("b", bias, {}));
  TempDir dir("gpu-staging-rounds");
  save(sd, dir.file("ckpt"), *comm);
  StateDict request;
  request["w"] = Value(ShardedTensor::from_rank_offsets("w", at::zeros({4096, 4096}, at::kCUDA), {}));
  ShardedTensor b = ShardedTensor::from_rank_offsets("b", bias, {});
  b.data = at::Tensor();
  b.device = at::Device(at::kCUDA, 0);
  request["b"] = Value(std::move(b));
  LoadOptions options;
  options.device_staging_bytes = 4 << 20;
  const LoadResult loaded = load(request, dir.file("ckpt"), *comm, options);
  EXPECT_TRUE(at::equal(loaded.state_dict.at("w").as_tensor().cpu(), values));
  const at::Tensor back = loaded.state_dict.at("b").as_tensor();
  EXPECT_TRUE(back.is_cuda());
  EXPECT_TRUE(at::equal(back.cpu(), bias));
}

TEST(GpuSaveLoad, SynchronousSaveCopiesDeviceShardsThroughTheWriteBuffersOnly) {
  SKIP_WITHOUT_GPU();
  auto comm = make_single_process_communicator();
  const at::Tensor values = at::rand({8192, 8192}, at::kFloat);  // 256 MiB, four times the write buffers
  at::Tensor weights = values.cuda();
  weights.mul_(2);  // queued on the current stream: the save must see it done
  StateDict sd;
  sd["w"] = Value(ShardedTensor::from_rank_offsets("w", weights, {}));
  TempDir dir("gpu-sync-save");
  save(sd, dir.file("ckpt"), *comm);
  // The device path wrote through the pinned buffers, within their bound.
  const std::shared_ptr<io::BufferPool>& pool = storage::pinned_sync_write_pool();
  EXPECT_GT(pool->peak_allocated_bytes(), 0u);
  EXPECT_LE(pool->peak_allocated_bytes(), pool->capacity_bytes());
  StateDict request;
  request["w"] = Value(ShardedTensor::from_rank_offsets("w", at::zeros({8192, 8192}, at::kFloat), {}));
  EXPECT_TRUE(at::equal(load(request, dir.file("ckpt"), *comm).state_dict.at("w").as_tensor(), values * 2));
}

}  // namespace
