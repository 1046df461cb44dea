// transfer(): a sharded state moved between meshes without storage, checked
// against the values a save and a load of the same state give, and against
// the digests `distckpt digest` prints for that save.
#include "distckpt/transfer/transfer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>

#include "comm/exchange.h"
#include "distckpt/layout/from_global.h"
#include "gpt.shard.h"
#include "multirank/checkpoint_fixtures.h"
#include "support/ranks.h"

namespace distckpt {
namespace {

gpt::Config config() {
  gpt::Config c;
  c.hidden = 16;
  c.ffn = 32;
  c.vocab = 64;
  c.layers = 4;
  c.heads = 4;
  c.kv_groups = 4;
  return c;
}

// tp, pp, dp coordinates; no context parallelism.
gpt::Mesh mesh(layout::AxisCoord tp, layout::AxisCoord pp, layout::AxisCoord dp = {0, 1}) {
  return gpt::Mesh{tp, {0, 1}, dp, pp};
}

// A model whose tensors hold their slices of deterministic globals.
std::unique_ptr<gpt::Model> filled_model(const gpt::Mesh& m) {
  auto model = std::make_unique<gpt::Model>(config(), m);
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& [name, entry] : model->metadata_state_dict().as_dict()) {
    if (entry.kind() == Kind::kShardedObject) continue;
    params.emplace_back(name, layout::local_from_global(entry, [](const std::string& key, const Shape& shape) {
                          return testing::global_tensor(key, shape);
                        }));
  }
  model->bind(params);
  for (int64_t l = 0; l < model->decoder_layers_local_count(); ++l) {
    model->decoder_layers(l).self_attention_core_attention__extra_state("x");
  }
  return model;
}

// Every tensor of `got` (a transfer's or a load's state dict) equals `want`'s (a filled model's).
void expect_tensors_equal(const StateDict& got, const StateDict& want, int rank) {
  size_t compared = 0;
  for (const auto& [name, entry] : want.as_dict()) {
    at::Tensor expected;
    if (entry.kind() == Kind::kShardedTensor) expected = entry.as_sharded_tensor().data;
    if (entry.kind() == Kind::kFactory) expected = entry.as_factory().data;
    if (!expected.defined()) continue;
    EXPECT_TRUE(at::equal(got.at(name).as_tensor(), expected)) << "rank " << rank << ": " << name;
    ++compared;
  }
  EXPECT_GT(compared, 10u);
}

// The digests every rank verified, merged.
class VerifiedDigests {
 public:
  void add(const TransferResult& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, digest] : r.verified) EXPECT_TRUE(digests_.emplace(key, digest).second) << key;
    for (const auto& [key, why] : r.unverified) unverified_[key] = why;
  }
  // Equal to the digests of a save of the same state.
  void expect_equal_to(const std::vector<TensorDigest>& saved) const {
    EXPECT_TRUE(unverified_.empty()) << unverified_.begin()->first << ": " << unverified_.begin()->second;
    ASSERT_EQ(digests_.size(), saved.size());
    for (const TensorDigest& d : saved) {
      const auto it = digests_.find(d.key);
      ASSERT_NE(it, digests_.end()) << d.key;
      EXPECT_EQ(it->second, d.hash) << d.key;
    }
  }

 private:
  std::mutex mutex_;
  std::map<std::string, uint64_t> digests_;
  std::map<std::string, std::string> unverified_;
};

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
    transfer(source->state_dict(), gpt::Model(config(), mesh({r, 4}, {0, 1})).metadata_state_dict(), comm);
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
  std::vector<std::shared_ptr<TransferPlanCache>> caches;
  for (int r = 0; r < 4; ++r) caches.push_back(TransferPlanCache::create());
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
  });
  for (const auto& cache : caches) {
    EXPECT_EQ(cache->plans_made(), 2u);
    EXPECT_EQ(cache->plans_reused(), 2u);
  }
}

}  // namespace
}  // namespace distckpt
