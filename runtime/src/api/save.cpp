// save(): plan -> validate -> write -> commit, each step agreed across ranks.
//
// Files are written into a hidden staging directory next to the target
// (".<name>.distckpt-staging") and renamed into place only once committed, so
// neither a failed save nor an overwrite can lose an existing checkpoint.
#include <filesystem>

#include "api/rank_writer.h"
#include "api/state_dict_split.h"
#include "distckpt/api/checkpoint.h"
#include "distckpt/comm/agreement.h"
#include "distckpt/core/errors.h"
#include "distckpt/format/commit.h"
#include "distckpt/format/common_state.h"
#include "distckpt/io/file.h"
#include "plan/local_plan.h"
#include "plan/validate.h"

namespace distckpt {
namespace {

constexpr const char* kCommonFile = "common.fb";

struct SavePaths {
  std::string target;
  std::string staging;
  std::string old;  // where a replaced checkpoint waits until the new one is in place
};

SavePaths save_paths(const std::string& dir) {
  std::filesystem::path target = std::filesystem::path(dir).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "ckpt/" -> "ckpt"
  const std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..") {
    throw CheckpointError(fmt::format("cannot save into '{}': name a checkpoint directory", dir));
  }
  const std::filesystem::path parent = target.parent_path();
  return SavePaths{target.string(), (parent / ("." + name + ".distckpt-staging")).string(),
                   (parent / ("." + name + ".distckpt-old")).string()};
}

// Coordinator only: refuses to touch a committed checkpoint unless asked to,
// never deletes a directory it did not create, starts a fresh staging area.
void prepare_directory(const SavePaths& paths, bool overwrite) {
  const bool committed = is_distributed_checkpoint(paths.target);
  if (committed && !overwrite) {
    throw CheckpointError(fmt::format(
        "'{}' already holds a committed checkpoint; pass SaveOptions::overwrite = true to replace it (the old one "
        "is removed only after the new one is committed) or save into another directory",
        paths.target));
  }
  if (!committed && io::exists(paths.target) && !io::is_empty_dir(paths.target)) {
    throw CheckpointError(fmt::format(
        "'{}' exists, is not empty and holds no committed distckpt checkpoint; remove it or choose another "
        "directory",
        paths.target));
  }
  if (io::exists(paths.old)) {
    if (!committed) {
      throw CheckpointError(fmt::format(
          "found '{}' left by an interrupted overwrite of '{}': it holds the previous checkpoint. Rename it back to "
          "'{}' (or delete it) before saving again",
          paths.old, paths.target, paths.target));
    }
    io::remove_tree(paths.old);
  }
  io::remove_tree(paths.staging);
  io::make_dirs(paths.staging + "/data");
}

CheckpointMetadata merge_fragments(const std::vector<std::string>& fragments, int world_size,
                                   const SaveOptions& options) {
  CheckpointMetadata merged;
  merged.world_size = world_size;
  merged.checksum_block_size = options.checksum_block_size;
  merged.layout_name = options.layout_name;
  merged.layout_fingerprint = options.layout_fingerprint;
  merged.layout_schema = options.layout_schema;
  std::map<std::string, TensorRecord> tensors;
  for (size_t rank = 0; rank < fragments.size(); ++rank) {
    CheckpointMetadata part = decode_metadata(fragments[rank], fmt::format("write results of rank {}", rank));
    const auto file_base = static_cast<uint32_t>(merged.files.size());
    for (FileRecord& f : part.files) merged.files.push_back(std::move(f));
    for (TensorRecord& t : part.tensors) {
      TensorRecord& into = tensors[t.key];
      if (into.key.empty()) {
        into.key = t.key;
        into.dtype = t.dtype;
        into.global_shape = t.global_shape;
      }
      for (ChunkRecord& c : t.chunks) {
        c.file += file_base;
        into.chunks.push_back(std::move(c));
      }
    }
    for (ObjectRecord& o : part.objects) {
      o.file += file_base;
      merged.objects.push_back(std::move(o));
    }
  }
  for (auto& [key, record] : tensors) {
    std::sort(record.chunks.begin(), record.chunks.end(), [](const ChunkRecord& a, const ChunkRecord& b) {
      if (a.box != b.box) return a.box < b.box;
      return (a.flat ? a.flat->start : 0) < (b.flat ? b.flat->start : 0);
    });
    merged.tensors.push_back(std::move(record));
  }
  std::sort(merged.objects.begin(), merged.objects.end(),
            [](const ObjectRecord& a, const ObjectRecord& b) { return a.unique_key() < b.unique_key(); });
  return merged;
}

// Coordinator only: metadata and common state, then the commit marker, then
// the staging directory takes the target's place.
void commit(const SavePaths& paths, CheckpointMetadata metadata, const Value& common, bool overwrite) {
  io::write_file_atomic(paths.staging + "/" + kCommonFile, encode_common_state(common));
  metadata.common_file = kCommonFile;
  io::write_file_atomic(paths.staging + "/" + kMetadataFile, encode_metadata(metadata));
  io::fsync_dir(paths.staging + "/data");
  CheckpointConfig config;
  config.format = kFormatName;
  config.version = static_cast<int>(kFormatVersion);
  config.sharded_backend = "distckpt-fb";
  config.common_backend = "distckpt-fb";
  config.world_size = metadata.world_size;
  config.created_by = std::string("distckpt ") + DISTCKPT_VERSION;
  write_commit_marker(paths.staging, config);

  const std::string parent = std::filesystem::path(paths.target).parent_path().string();
  const bool replacing = overwrite && is_distributed_checkpoint(paths.target);
  if (replacing) std::filesystem::rename(paths.target, paths.old);
  std::filesystem::rename(paths.staging, paths.target);  // also replaces an empty target directory
  io::fsync_dir(parent.empty() ? "." : parent);
  if (replacing) io::remove_tree(paths.old);
}

}  // namespace

void save(const StateDict& sharded_state_dict, const std::string& dir, Communicator& comm,
          const SaveOptions& options) {
  if (options.checksum_block_size == 0) throw Error("SaveOptions::checksum_block_size must be positive");
  const SavePaths paths = save_paths(dir);
  api::SplitStateDict split;
  std::vector<const ShardedTensor*> tensors;
  std::vector<const ShardedObject*> objects;
  std::string local_plan;
  run_agreed(comm, "prepare the state dict for saving", [&] {
    split = api::split_state_dict(api::apply_factories(sharded_state_dict));
    plan::LocalPlan plan;
    plan.rank = comm.rank();
    for (Value* leaf : api::sharded_leaves(split.sharded)) {
      if (leaf->kind() == Kind::kShardedTensor) {
        const ShardedTensor& t = leaf->as_sharded_tensor();
        t.validate_metadata_integrity();
        tensors.push_back(&t);
        plan.tensors.push_back(plan::plan_of(t));
      } else {
        const ShardedObject& o = leaf->as_sharded_object();
        o.validate_metadata_integrity();
        objects.push_back(&o);
        plan.objects.push_back(plan::plan_of(o));
      }
    }
    local_plan = plan::encode_local_plan(plan);
  });

  const std::vector<std::string> plans = comm.gather_bytes(local_plan, 0);
  bool staging_created = false;
  try {
    run_agreed(comm, "validate the global sharding", [&] {
      if (!comm.is_coordinator()) return;
      std::vector<plan::LocalPlan> decoded;
      decoded.reserve(plans.size());
      for (size_t r = 0; r < plans.size(); ++r) {
        decoded.push_back(plan::decode_local_plan(plans[r], fmt::format("rank {}", r)));
      }
      plan::validate_global_plan(decoded);
      prepare_directory(paths, options.overwrite);
      staging_created = true;
    });

    std::string fragment;
    run_agreed(comm, "write data files", [&] {
      api::RankWriter writer(paths.staging, fmt::format("data/rank_{:05d}.bin", comm.rank()), comm.rank(),
                             options.checksum_block_size);
      for (const ShardedTensor* t : tensors) {
        if (t->is_main_replica() && t->held_numel() > 0) writer.write_tensor(*t);
      }
      for (const ShardedObject* o : objects) {
        if (o->is_main_replica()) writer.write_object(*o);
      }
      fragment = encode_metadata(writer.finish());
    });

    const std::vector<std::string> fragments = comm.gather_bytes(fragment, 0);
    run_agreed(comm, "commit the checkpoint", [&] {
      if (!comm.is_coordinator()) return;
      commit(paths, merge_fragments(fragments, comm.size(), options), split.common, options.overwrite);
    });
  } catch (...) {
    if (comm.is_coordinator() && staging_created) {
      try {
        io::remove_tree(paths.staging);
      } catch (...) {
        // The original error matters more than a failed clean-up.
      }
    }
    throw;
  }
}

}  // namespace distckpt
