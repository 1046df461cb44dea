// transfer(): a sharded state moved between meshes without storage, checked
// against the values a save and a load of the same state give, and against
// the digests `distckpt digest` prints for that save.
#include "distckpt/transfer/transfer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "comm/exchange.h"
#include "multirank/transfer_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

using testing::expect_tensors_equal;
using testing::filled_model;
using testing::VerifiedDigests;

gpt::Config config() { return testing::transfer_gpt_config(); }
gpt::Mesh mesh(layout::AxisCoord tp, layout::AxisCoord pp) { return testing::gpt_mesh(tp, pp); }

// One plan cache per rank (each rank keeps its own).
std::vector<std::shared_ptr<TransferPlanCache>> plan_caches(int ranks) {
  std::vector<std::shared_ptr<TransferPlanCache>> caches;
  for (int r = 0; r < ranks; ++r) caches.push_back(TransferPlanCache::create());
  return caches;
}

// The sources (tp 2, pp 2 on ranks 0-3) saved, for the digests to compare with.
std::vector<TensorDigest> saved_digests(const std::string& dir) {
  run_ranks(4, [&](Communicator& comm) {
    const int r = comm.rank();
    const auto m = filled_model(mesh({r % 2, 2}, {r / 2, 2}));
    save(m->state_dict(), dir, comm, m->save_options());
  });
  return digest_checkpoint(dir);
}

TEST(Transfer, GptFromTp2Pp2ToTp4OnTheSameRanks) {
  TempDir tmp("transfer");
  VerifiedDigests verified;
  run_ranks(4, [&](Communicator& comm) {
    const int r = comm.rank();
    const auto source = filled_model(mesh({r % 2, 2}, {r / 2, 2}));
    gpt::Model destination(config(), mesh({r, 4}, {0, 1}));
    const TransferResult result = transfer(source->state_dict(), destination.metadata_state_dict(), comm);
    expect_tensors_equal(result.state_dict, filled_model(mesh({r, 4}, {0, 1}))->state_dict(), r);
    EXPECT_GT(result.source_bytes_read, 0u);
    verified.add(result);
  });
  verified.expect_equal_to(saved_digests(tmp.path() + "/ckpt"));
}

TEST(Transfer, GptToTwoMoreRanksOfTheJob) {
  TempDir tmp("transfer");
  VerifiedDigests verified;
  std::atomic<uint64_t> read_by_destinations{0};
  run_ranks(6, [&](Communicator& comm) {
    const int r = comm.rank();
    const bool sends = r < 4;
    StateDict sources = Value::dict(), requests = Value::dict();
    std::unique_ptr<gpt::Model> source, destination;
    if (sends) {
      source = filled_model(mesh({r % 2, 2}, {r / 2, 2}));
      sources = source->state_dict();
    } else {
      destination = std::make_unique<gpt::Model>(config(), mesh({r - 4, 2}, {0, 1}));
      requests = destination->metadata_state_dict();
    }
    TransferOptions options;
    options.bucket_bytes = 4096;  // many buckets
    const TransferResult result = transfer(sources, requests, comm, options);
    if (!sends) {
      expect_tensors_equal(result.state_dict, filled_model(mesh({r - 4, 2}, {0, 1}))->state_dict(), r);
      read_by_destinations += result.source_bytes_read;
    }
    verified.add(result);
  });
  EXPECT_EQ(read_by_destinations, 0u);  // they hold nothing: every byte came from the sources
  verified.expect_equal_to(saved_digests(tmp.path() + "/ckpt"));
}

// Inference ranks that name their tensors as Hugging Face Llama does: each
// external tensor (split on rows over the two ranks where it divides) is
// filled from its part of a source tensor (a layer of a stack, a fused part).
TEST(Transfer, GptToTwoMoreRanksInLlamaNames) {
  const NameMapping llama = gpt::llama_mapping(config());
  VerifiedDigests verified;
  run_ranks(6, [&](Communicator& comm) {
    const int r = comm.rank();
    std::unique_ptr<gpt::Model> source;
    StateDict sources = Value::dict(), requests = Value::dict(), expected = Value::dict();
    if (r < 4) {
      source = filled_model(mesh({r % 2, 2}, {r / 2, 2}));
      sources = source->state_dict();
    } else {
      for (const MappedName& name : llama.expand()) {
        at::Tensor whole = testing::global_tensor(name.key, name.key_shape);
        for (size_t d = 0; d < name.region.ndim(); ++d) {
          whole = whole.narrow(static_cast<int64_t>(d), name.region.offset[d], name.region.length[d]);
        }
        whole = whole.reshape(name.external_shape());
        const int64_t rows = whole.size(0), parts = rows % 2 == 0 ? 2 : 1, part = parts == 2 ? r - 4 : 0;
        expected[name.external] = whole.narrow(0, part * rows / parts, rows / parts).clone();
        requests[name.external] =
            ShardedTensor::from_rank_offsets(name.external, at::zeros_like(expected.at(name.external).as_tensor()),
                                             {{0, part, parts}}, {parts == 2 ? 0 : r - 4});
      }
    }
    TransferOptions options;
    options.mapping = llama;
    const TransferResult result = transfer(sources, requests, comm, options);
    for (const auto& [external, want] : expected.as_dict()) {
      EXPECT_TRUE(at::equal(result.state_dict.at(external).as_tensor(), want.as_tensor())) << external;
    }
    if (r >= 4) {
      EXPECT_GT(expected.size(), 10u);
    }
    verified.add(result);
  });
  TempDir tmp("transfer");
  verified.expect_equal_to(saved_digests(tmp.path() + "/ckpt"));
}

// Destinations in bfloat16 from float32 sources: converted as they arrive;
// such tensors are reported unverified (their digests cannot match), the
// others still verified.
TEST(Transfer, ConvertedOnTheWayAndReportedUnverified) {
  run_ranks(2, [](Communicator& comm) {
    const int r = comm.rank();
    const at::Tensor w = testing::global_tensor("w", {8, 6}), b = testing::global_tensor("b", {6});
    StateDict sources = Value::dict(), requests = Value::dict();
    sources["w"] = ShardedTensor::from_rank_offsets("w", w.narrow(0, 4 * r, 4).clone(), {{0, r, 2}});
    sources["b"] = ShardedTensor::from_rank_offsets("b", b.clone(), {}, {r});
    requests["w"] = ShardedTensor::from_rank_offsets("w", at::zeros({8, 3}, at::kBFloat16), {{1, r, 2}});
    requests["b"] = ShardedTensor::from_rank_offsets("b", at::zeros({6}), {}, {r});
    TransferOptions options;
    EXPECT_THROW(transfer(sources, requests, comm, options), ShardingError);  // off: a dtype change is an error
    options.convert_dtype = true;
    const TransferResult result = transfer(sources, requests, comm, options);
    EXPECT_TRUE(at::equal(result.state_dict.at("w").as_tensor(), w.narrow(1, 3 * r, 3).to(at::kBFloat16)));
    EXPECT_TRUE(at::equal(result.state_dict.at("b").as_tensor(), b));
    for (const auto& [key, why] : result.unverified) {
      EXPECT_EQ(key, "w");
      EXPECT_EQ(why, "received in another dtype than its sources'");
    }
    for (const auto& [key, digest] : result.verified) EXPECT_EQ(key, "b");
  });
}

// Two destinations that both call themselves the main replica of the same
// half of a tensor (and nobody the other half): the digests could not be
// compared, so the tensor is reported unverified, not taken for corruption.
TEST(Transfer, ATensorNotReceivedOnceByMainReplicasIsUnverifiedNotAnError) {
  run_ranks(2, [](Communicator& comm) {
    const int r = comm.rank();
    const at::Tensor w = testing::global_tensor("w", {8, 6});
    StateDict sources = Value::dict(), requests = Value::dict();
    sources["w"] = ShardedTensor::from_rank_offsets("w", w.narrow(0, 4 * r, 4).clone(), {{0, r, 2}});
    requests["w"] = ShardedTensor::from_rank_offsets("w", at::zeros({4, 6}), {{0, 1, 2}});  // rows 4-7, replica 0
    const TransferResult result = transfer(sources, requests, comm);
    EXPECT_TRUE(at::equal(result.state_dict.at("w").as_tensor(), w.narrow(0, 4, 4)));
    EXPECT_TRUE(result.verified.empty());
    for (const auto& [key, why] : result.unverified) {
      EXPECT_EQ(key, "w");
      EXPECT_EQ(why,
                "the destinations' main replicas did not receive each of its 48 elements once (48 received; "
                "replica ids decide which ranks count)");
    }
  });
}

// Sources that are strided views (the right half of a wider tensor) are read
// view by view, not made contiguous first; over messages and through shared
// memory alike.
TEST(Transfer, StridedSourceViewsArriveOverMessagesAndSharedMemory) {
  const at::Tensor w = testing::global_tensor("v", {64, 48});
  for (const LoadExchange exchange : {LoadExchange::kBroadcast, LoadExchange::kAuto}) {
    run_ranks(2, [&](Communicator& comm) {
      const int r = comm.rank();
      const at::Tensor rows = w.narrow(0, 32 * r, 32).clone();
      const at::Tensor wide = at::cat({at::zeros_like(rows), rows}, 1);
      StateDict sources = Value::dict(), requests = Value::dict();
      sources["v"] = ShardedTensor::from_rank_offsets("v", wide.narrow(1, 48, 48), {{0, r, 2}});
      requests["v"] = ShardedTensor::from_rank_offsets("v", at::zeros({64, 24}), {{1, r, 2}});
      TransferOptions options;
      options.exchange = exchange;
      options.bucket_bytes = 1024;  // slabs that start and end inside rows
      const TransferResult result = transfer(sources, requests, comm, options);
      EXPECT_TRUE(at::equal(result.state_dict.at("v").as_tensor(), w.narrow(1, 24 * r, 24)));
      EXPECT_TRUE(result.unverified.empty());
    });
  }
}

// Every rank's error class and message, by rank.
std::vector<std::pair<std::string, std::string>> errors_of(int world, const std::function<void(Communicator&)>& body) {
  std::vector<std::pair<std::string, std::string>> errors(static_cast<size_t>(world));
  run_ranks(world, [&](Communicator& comm) {
    try {
      body(comm);
    } catch (const Error& e) {
      errors[static_cast<size_t>(comm.rank())] = {e.class_name(), e.what()};
    }
  });
  return errors;
}

TEST(Transfer, ATensorNoSourceHoldsFailsEveryRankNamingIt) {
  const auto errors = errors_of(4, [](Communicator& comm) {
    const int r = comm.rank();
    const auto source = filled_model(mesh({r % 2, 2}, {r / 2, 2}));
    StateDict requests = gpt::Model(config(), mesh({r, 4}, {0, 1})).metadata_state_dict();
    if (r == 3) requests["extra"] = ShardedTensor::from_rank_offsets("extra.weight", at::zeros({4}), {});
    transfer(source->state_dict(), requests, comm);
  });
  for (const auto& [kind, message] : errors) {
    EXPECT_EQ(kind, "KeyMismatchError");
    EXPECT_NE(message.find("rank 3 asks for tensor 'extra.weight', which no source rank holds"), std::string::npos)
        << message;
  }
}

TEST(Transfer, AByteChangedInFlightFailsEveryRankNamingTheTensor) {
  std::atomic<bool> flipped{false};
  comm::set_payload_tamper_for_testing([&](const comm::Transfer& t, at::Tensor& payload) {
    if (t.from == 1 && t.bytes > 64 && !flipped.exchange(true)) {
      payload.index_put_({3}, payload.index({3}).bitwise_xor(1));
    }
  });
  const auto errors = errors_of(4, [](Communicator& comm) {
    const int r = comm.rank();
    const auto source = filled_model(mesh({r % 2, 2}, {r / 2, 2}));
    TransferOptions options;
    options.exchange = LoadExchange::kBroadcast;  // as messages, as between hosts (the hook sees messages)
    transfer(source->state_dict(), gpt::Model(config(), mesh({r, 4}, {0, 1})).metadata_state_dict(), comm, options);
  });
  comm::set_payload_tamper_for_testing({});
  EXPECT_TRUE(flipped);
  for (const auto& [kind, message] : errors) {
    EXPECT_EQ(kind, "ProtocolError");
    EXPECT_NE(message.find("1 transferred tensor(s) arrived different from their sources: '"), std::string::npos)
        << message;
  }
  EXPECT_EQ(errors[0].second, errors[3].second);
}

TEST(Transfer, UnverifiedWithoutTheCheck) {
  std::atomic<bool> flipped{false};
  comm::set_payload_tamper_for_testing([&](const comm::Transfer& t, at::Tensor& payload) {
    if (t.from == 1 && t.bytes > 64 && !flipped.exchange(true)) {
      payload.index_put_({3}, payload.index({3}).bitwise_xor(1));
    }
  });
  run_ranks(4, [](Communicator& comm) {
    const int r = comm.rank();
    const auto source = filled_model(mesh({r % 2, 2}, {r / 2, 2}));
    TransferOptions options;
    options.exchange = LoadExchange::kBroadcast;
    options.verify = false;
    const TransferResult result =
        transfer(source->state_dict(), gpt::Model(config(), mesh({r, 4}, {0, 1})).metadata_state_dict(), comm, options);
    EXPECT_TRUE(result.verified.empty());
  });
  comm::set_payload_tamper_for_testing({});
  EXPECT_TRUE(flipped);
}

// The weights sent after every step: planned once, replayed while nothing
// changes, planned again when the destinations' layout does.
TEST(Transfer, ACachedPlanIsReplayedEveryStepWithTheNewValues) {
  const std::vector<std::shared_ptr<TransferPlanCache>> caches = plan_caches(4);
  run_ranks(4, [&](Communicator& comm) {
    const int r = comm.rank();
    const auto source = filled_model(mesh({r % 2, 2}, {r / 2, 2}));
    gpt::Model destination(config(), mesh({r, 4}, {0, 1}));
    TransferOptions options;
    options.plan_cache = caches[static_cast<size_t>(r)];
    for (int step = 0; step < 3; ++step) {
      // A training step changes every weight in place.
      for (auto& [name, entry] : source->state_dict().as_dict()) {
        if (entry.kind() == Kind::kShardedTensor) entry.as_sharded_tensor().data.add_(1);
        if (entry.kind() == Kind::kFactory) entry.as_factory().data.add_(1);
      }
      const TransferResult result = transfer(source->state_dict(), destination.metadata_state_dict(), comm, options);
      EXPECT_EQ(result.plan_reused, step > 0);
      EXPECT_FALSE(result.verified.empty() && r == 0 && step == 0);
      StateDict want = filled_model(mesh({r, 4}, {0, 1}))->state_dict();
      for (auto& [name, entry] : want.as_dict()) {
        if (entry.kind() == Kind::kShardedTensor) entry.as_sharded_tensor().data.add_(step + 1);
        if (entry.kind() == Kind::kFactory) entry.as_factory().data.add_(step + 1);
      }
      expect_tensors_equal(result.state_dict, want, r);
    }
    // Another destination mesh: planned again.
    gpt::Model other(config(), mesh({r % 2, 2}, {r / 2, 2}));
    EXPECT_FALSE(transfer(source->state_dict(), other.metadata_state_dict(), comm, options).plan_reused);
    // A rank without its cache: every rank plans (and none waits in a collective the others skip).
    TransferOptions without = options;
    if (r == 1) without.plan_cache = nullptr;
    EXPECT_FALSE(transfer(source->state_dict(), other.metadata_state_dict(), comm, without).plan_reused);
  });
  for (const auto& cache : caches) {
    EXPECT_EQ(cache->plans_made(), cache.get() == caches[1].get() ? 2u : 3u);
    EXPECT_EQ(cache->plans_reused(), 2u);
  }
}

TEST(Transfer, WithinAHostRanksReadTheSourcesOutOfOneAnothersMemory) {
  TempDir tmp("transfer");
  VerifiedDigests verified;
  const std::vector<std::shared_ptr<TransferPlanCache>> caches = plan_caches(4);
  run_ranks(4, [&](Communicator& comm) {
    const int r = comm.rank();
    const auto source = filled_model(mesh({r % 2, 2}, {r / 2, 2}));
    const StateDict want = filled_model(mesh({r, 4}, {0, 1}))->state_dict();
    gpt::Model destination(config(), mesh({r, 4}, {0, 1}));
    TransferOptions options;
    options.exchange = LoadExchange::kAuto;
    for (const bool direct : {true, false}) {
      options.direct_reads = direct;
      const TransferResult result = transfer(source->state_dict(), destination.metadata_state_dict(), comm, options);
      expect_tensors_equal(result.state_dict, want, r);
      if (direct) {
        // Every rank needs parts of tensors other ranks hold (tp 2 -> 4 splits each of them anew).
        EXPECT_GT(result.bytes_read_directly, 0u) << "rank " << r;
        EXPECT_LE(result.bytes_read_directly, result.source_bytes_read) << "rank " << r;
        verified.add(result);
      } else {
        EXPECT_EQ(result.bytes_read_directly, 0u) << "rank " << r;
      }
    }
    // A cached plan holds while the sources stay where they are, and is made again when one moves.
    options.direct_reads = true;
    options.plan_cache = caches[static_cast<size_t>(r)];
    EXPECT_FALSE(transfer(source->state_dict(), destination.metadata_state_dict(), comm, options).plan_reused);
    EXPECT_TRUE(transfer(source->state_dict(), destination.metadata_state_dict(), comm, options).plan_reused);
    StateDict moved = source->state_dict();
    if (r == 0) {
      for (auto& [name, entry] : moved.as_dict()) {
        if (entry.kind() != Kind::kShardedTensor) continue;
        entry.as_sharded_tensor().data = entry.as_sharded_tensor().data.clone();  // same values, elsewhere
        break;
      }
    }
    const TransferResult replanned = transfer(moved, destination.metadata_state_dict(), comm, options);
    EXPECT_FALSE(replanned.plan_reused);
    expect_tensors_equal(replanned.state_dict, want, r);
  });
  verified.expect_equal_to(saved_digests(tmp.path() + "/ckpt"));
}

TEST(Transfer, ARankFailingWhileTheOthersReplayTheirPlanFailsEveryRankAndTheNextTransferPlansAgain) {
  const std::vector<std::shared_ptr<TransferPlanCache>> caches = plan_caches(4);
  run_ranks(4, [&](Communicator& comm) {
    const int r = comm.rank();
    const auto source = filled_model(mesh({r % 2, 2}, {r / 2, 2}));
    gpt::Model destination(config(), mesh({r, 4}, {0, 1}));
    TransferOptions options;
    options.exchange = LoadExchange::kAuto;
    options.plan_cache = caches[static_cast<size_t>(r)];
    EXPECT_FALSE(transfer(source->state_dict(), destination.metadata_state_dict(), comm, options).plan_reused);
    // Rank 2 fails before it can check its plan; the others meet its error in the agreement their replay begins with.
    TransferOptions broken = options;
    if (r == 2) broken.bucket_bytes = 0;
    try {
      transfer(source->state_dict(), destination.metadata_state_dict(), comm, broken);
      ADD_FAILURE() << "rank " << r << ": the transfer succeeded";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("bucket_bytes must be positive"), std::string::npos) << e.what();
    }
    const TransferResult again = transfer(source->state_dict(), destination.metadata_state_dict(), comm, options);
    EXPECT_FALSE(again.plan_reused);  // a failed transfer leaves no plan to trust
    expect_tensors_equal(again.state_dict, filled_model(mesh({r, 4}, {0, 1}))->state_dict(), r);
    EXPECT_TRUE(transfer(source->state_dict(), destination.metadata_state_dict(), comm, options).plan_reused);
  });
  for (const auto& cache : caches) {
    EXPECT_EQ(cache->plans_made(), 2u);
    EXPECT_EQ(cache->plans_reused(), 1u);
  }
}

}  // namespace
}  // namespace distckpt
