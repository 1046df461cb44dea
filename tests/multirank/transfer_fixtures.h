// Shared helpers of the transfer tests: a small GPT whose every tensor is a
// slice of deterministic globals, comparisons of what arrived, and the
// digests every rank verified.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "distckpt/layout/from_global.h"
#include "distckpt/transfer/transfer.h"
#include "gpt.shard.h"
#include "multirank/checkpoint_fixtures.h"

namespace distckpt::testing {

// heads = kv_groups = 4, so tp 4 divides every split and fused part.
inline gpt::Config transfer_gpt_config() {
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
inline gpt::Mesh gpt_mesh(layout::AxisCoord tp, layout::AxisCoord pp, layout::AxisCoord dp = {0, 1}) {
  return gpt::Mesh{tp, {0, 1}, dp, pp};
}

// The whole tensor of every key: its slices are what each mesh binds.
inline at::Tensor deterministic_global(const std::string& key, const Shape& shape) { return global_tensor(key, shape); }

// A model whose tensors hold their slices of the deterministic globals.
inline std::unique_ptr<gpt::Model> filled_model(const gpt::Mesh& m) {
  auto model = std::make_unique<gpt::Model>(transfer_gpt_config(), m);
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& [name, entry] : model->metadata_state_dict().as_dict()) {
    if (entry.kind() == Kind::kShardedObject) continue;
    params.emplace_back(name, layout::local_from_global(entry, deterministic_global));
  }
  model->bind(params);
  for (int64_t l = 0; l < model->decoder_layers_local_count(); ++l) {
    model->decoder_layers(l).self_attention_core_attention__extra_state("x");
  }
  return model;
}

inline at::Tensor data_of(const Value& entry) {
  return entry.kind() == Kind::kFactory ? entry.as_factory().data : entry.as_sharded_tensor().data;
}

// Every tensor of `got` (a transfer's state dict) equals `want`'s (a reference model's).
inline void expect_tensors_equal(const StateDict& got, const StateDict& want, int rank) {
  size_t compared = 0;
  for (const auto& [name, entry] : want.as_dict()) {
    if (entry.kind() != Kind::kShardedTensor && entry.kind() != Kind::kFactory) continue;
    EXPECT_TRUE(at::equal(got.at(name).as_tensor(), data_of(entry))) << "rank " << rank << ": " << name;
    ++compared;
  }
  EXPECT_GT(compared, 10u);
}

// The checkpoint keys of the tensors in `v` (a fused factory's parts).
inline void collect_tensor_keys(const Value& v, std::set<std::string>& keys) {
  if (v.is_dict()) {
    for (const auto& [name, child] : v.as_dict()) collect_tensor_keys(child, keys);
  } else if (v.kind() == Kind::kShardedTensor) {
    keys.insert(v.as_sharded_tensor().key);
  } else if (v.kind() == Kind::kFactory) {
    collect_tensor_keys(v.as_factory().build_subtree(), keys);
  }
}

// The digests every rank verified, merged, and the tensors that should be among them.
class VerifiedDigests {
 public:
  void add(const TransferResult& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, digest] : r.verified) EXPECT_TRUE(digests_.emplace(key, digest).second) << key;
    for (const auto& [key, why] : r.unverified) unverified_[key] = why;
  }
  // Every tensor of `want` (what a destination received, as a reference holds it) must be verified.
  void expect_verified(const StateDict& want) {
    std::lock_guard<std::mutex> lock(mutex_);
    collect_tensor_keys(want, expected_);
  }
  // Exactly the tensors expected were verified, none left unverified.
  void check() const {
    EXPECT_TRUE(unverified_.empty()) << unverified_.begin()->first << ": " << unverified_.begin()->second;
    EXPECT_EQ(digests_.size(), expected_.size());
    for (const std::string& key : expected_) EXPECT_EQ(digests_.count(key), 1u) << key;
  }
  // Equal to the digests of a save of the same sources: one per saved tensor
  // (extra_state objects are saved but not transferred, and not digested).
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
  std::set<std::string> expected_;
};

}  // namespace distckpt::testing
