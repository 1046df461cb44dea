// A multi-rank save under one (tp, pp) mesh and a load under another.
//
// Every rank builds its sharded state dict by hand from a deterministic
// global model: tensors split over tp, layers stacked over pp (a prepended
// axis), replicated tensors, an unevenly split vector, sharded objects,
// common values and a non-persistent entry. After a load every value is
// compared with the global model. Run it under distckpt-launch:
//   distckpt-launch -n 4 -- distckpt-demo --tp 2 --pp 2 --save DIR
//   distckpt-launch -n 2 -- distckpt-demo --tp 1 --pp 2 --load DIR
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "distckpt/distckpt.h"

namespace {

using namespace distckpt;

constexpr int64_t kLayers = 4, kVocab = 64, kHidden = 32, kFfn = 48, kUneven = 10;

struct Mesh {
  int64_t tp, pp, tp_rank, pp_rank;
};

// The global model: each tensor is a fixed function of its key and position.
at::Tensor global_tensor(const std::string& key, const Shape& shape) {
  const double salt = static_cast<double>(std::hash<std::string>{}(key) % 997);
  return at::arange(numel(shape), at::kFloat).reshape(shape).mul(0.001).add(salt);
}

// Rank r of n holds an uneven, possibly empty, piece of [0, total): sizes 0, 1, 2, ... wrap
// (a rank alone holds it all).
std::pair<int64_t, int64_t> uneven_piece(int64_t total, int rank, int world) {
  std::vector<int64_t> sizes(world, 0);
  int64_t left = total;
  for (int r = 0; left > 0; r = (r + 1) % world) {
    const int64_t take = std::min<int64_t>(left, world == 1 ? left : r % 3);
    sizes[r] += take;
    left -= take;
  }
  int64_t start = 0;
  for (int r = 0; r < rank; ++r) start += sizes[r];
  return {start, sizes[rank]};
}

StateDict build(const Mesh& m, int rank, int world, int saved_world) {
  StateDict sd = Value::dict();
  const auto emb = global_tensor("embedding.weight", {kVocab, kHidden});
  const int64_t rows = kVocab / m.tp;
  // Split over tp, replicated over pp: the pp rank is the replica id.
  sd["embedding"]["weight"] = ShardedTensor::from_rank_offsets(
      "embedding.weight", emb.narrow(0, m.tp_rank * rows, rows).clone(), {{0, m.tp_rank, m.tp}}, {m.pp_rank});

  // Layers stacked over pp on a prepended axis; inside a layer, fc1 is split
  // on rows and fc2 on columns over tp.
  const auto fc1 = global_tensor("decoder.fc1.weight", {kLayers, kFfn, kHidden});
  const auto fc2 = global_tensor("decoder.fc2.weight", {kLayers, kHidden, kFfn});
  const int64_t per_stage = kLayers / m.pp, f = kFfn / m.tp;
  List layers;
  for (int64_t i = 0; i < per_stage; ++i) {
    const int64_t layer = m.pp_rank * per_stage + i;
    Value l = Value::dict();
    l["fc1"] = ShardedTensor::from_rank_offsets("decoder.fc1.weight", fc1[layer].narrow(0, m.tp_rank * f, f).clone(),
                                                {{0, layer, kLayers}, {1, m.tp_rank, m.tp}}, {0}, 1);
    l["fc2"] = ShardedTensor::from_rank_offsets("decoder.fc2.weight", fc2[layer].narrow(1, m.tp_rank * f, f).clone(),
                                                {{0, layer, kLayers}, {2, m.tp_rank, m.tp}}, {0}, 1);
    layers.push_back(std::move(l));
  }
  sd["decoder"]["layers"] = Value(std::move(layers));

  // Replicated everywhere: a tuple replica id, main copy on (tp 0, pp 0).
  sd["final_norm"] = ShardedTensor::from_rank_offsets(
      "final_norm.weight", global_tensor("final_norm.weight", {kHidden}), {}, {m.tp_rank, m.pp_rank});
  // Uneven 1-D split over all ranks, some shards empty.
  const auto [start, size] = uneven_piece(kUneven, rank, world);
  sd["scale"] = ShardedTensor::from_global_offset(
      "scale", global_tensor("scale", {kUneven}).narrow(0, start, size).clone(), {kUneven}, {start});

  // One object per saving rank (a loader reads the one of rank % saved_world),
  // and one replicated object.
  const int64_t owner = rank % saved_world;
  sd["rng"] = ShardedObject{
      "rng_state", fmt::format("rng-of-rank-{}", owner), {saved_world}, {owner}, {rank < saved_world ? 0 : 1}};
  sd["data_state"] = ShardedObject{"data_iterator", "consumed=128000", {1}, {0}, {rank}};

  sd["iteration"] = 1000;
  sd["args"]["lr"] = 3e-4;
  sd["args"]["name"] = "demo";
  sd["runtime_handle"] = LocalNonPersistentObject(Value(std::string("not saved")));
  return sd;
}

// Compares every loaded value with the global model; returns the number checked.
int check(const StateDict& loaded, const Mesh& m, int rank, int world, int saved_world) {
  int checked = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) throw Error(fmt::format("rank {}: {} does not match the saved value", rank, what));
    ++checked;
  };
  const StateDict want = build(m, rank, world, saved_world);
  for (const auto& [path, leaf] : nested_items(want)) {
    const Value* got = &loaded;
    for (const std::string& p : path) got = got->is_list() ? &(*got)[std::stoul(p)] : &got->at(p);
    const std::string name = to_string(path);
    switch (leaf->kind()) {
      case Kind::kShardedTensor:
        expect(at::equal(got->as_tensor(), leaf->as_sharded_tensor().data), name);
        break;
      case Kind::kShardedObject:
        expect(got->as_string() == leaf->as_sharded_object().data, name);
        break;
      case Kind::kNonPersistent:
        expect(got->equals(leaf->as_non_persistent().unwrap()), name);
        break;
      default:
        expect(got->equals(*leaf), name);
    }
  }
  return checked;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distckpt demo: save under one (tp, pp) mesh, load under another"};
  int64_t tp = 1, pp = 1;
  std::string save_dir, load_dir;
  app.add_option("--tp", tp, "tensor-parallel size")->check(CLI::IsMember({1, 2, 4}));
  app.add_option("--pp", pp, "pipeline-parallel size")->check(CLI::IsMember({1, 2, 4}));
  app.add_option("--save", save_dir, "save a checkpoint into this directory");
  app.add_option("--load", load_dir, "load and check the checkpoint in this directory");
  CLI11_PARSE(app, argc, argv);
  if (save_dir.empty() && load_dir.empty()) {
    fmt::print(stderr, "distckpt-demo: nothing to do: pass --save DIR, --load DIR or both\n");
    return 2;
  }
  try {
    at::set_num_threads(1);
    auto comm = communicator_from_env();
    if (comm->size() != tp * pp) {
      throw Error(fmt::format("--tp {} --pp {} needs {} ranks, got {}", tp, pp, tp * pp, comm->size()));
    }
    const int rank = comm->rank(), world = comm->size();
    const Mesh mesh{tp, pp, rank % tp, rank / tp};
    if (!save_dir.empty()) {
      save(build(mesh, rank, world, world), save_dir, *comm);
      if (rank == 0) fmt::print("saved {} with {} ranks (tp={}, pp={})\n", save_dir, world, tp, pp);
    }
    if (!load_dir.empty()) {
      const std::optional<CheckpointConfig> config = maybe_load_config(load_dir);
      const int saved_world = config ? config->world_size : world;  // load() explains a missing checkpoint
      StateDict request = build(mesh, rank, world, saved_world);
      // Ask for the shapes only: the loader allocates and fills.
      map_inplace(request, [](Value& v) {
        if (v.kind() == Kind::kShardedTensor) v = Value(v.as_sharded_tensor().without_data());
      });
      const LoadResult result = load(request, load_dir, *comm, {StrictHandling::kRaiseUnexpected});
      const int checked = check(result.state_dict, mesh, rank, world, saved_world);
      comm->barrier();
      fmt::print("rank {} (tp {}/{}, pp {}/{}): loaded {} saved by {} ranks, {} values match\n", rank, mesh.tp_rank, tp,
                 mesh.pp_rank, pp, load_dir, saved_world, checked);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "distckpt-demo: " << e.what() << '\n';
    return 1;
  }
}
