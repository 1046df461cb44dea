// End-to-end check of a transfer: every tensor's layout-independent digest
// (io/tensor_digest.h) summed over the sources' main replicas and over the
// main replicas the destinations received, compared at the tensor's owner
// (a hash of its key modulo the world), so no rank handles more than its
// own tensors' sums. A mismatch fails every rank, naming the tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"
#include "distckpt/core/sharded_tensor.h"
#include "distckpt/format/storage_index.h"
#include "io/tensor_digest.h"
#include "load/load_from.h"

namespace distckpt::transferring {

struct DigestPart {
  std::string key;
  bool source = false;
  uint64_t digest = 0;
  io::PlaceSums places;  // which elements the digest covers
  bool converted = false;
};

// The sums over the main replicas among this rank's sources.
std::vector<DigestPart> source_digests(const std::vector<const ShardedTensor*>& sources);
// The sums over the main replicas this rank received (`sources`: the
// sources' records, for their dtypes).
std::vector<DigestPart> received_digests(const std::vector<loading::FilledTensor>& filled, const StorageIndex& sources);

struct DigestReport {
  std::map<std::string, uint64_t> verified;  // the tensors this rank owns that matched, and their digest
  // The tensors this rank owns that could not be compared, each with why
  // (converted on the way, or not received whole by main replicas).
  std::map<std::string, std::string> unverified;
};

// Collective: routes the parts to their owners, compares there and agrees:
// ProtocolError on every rank naming the tensors that arrived different.
// `parts` computes this rank's parts (inside the routing's agreement).
DigestReport compare_digests(Communicator& comm, const std::function<std::vector<DigestPart>()>& parts,
                             const StorageIndex& sources);

// Wire format (schema/wire.fbs, TransferDigests); decoding verifies the buffer.
std::string encode_digest_parts(const std::vector<DigestPart>& parts);
std::vector<DigestPart> decode_digest_parts(std::string_view bytes, const std::string& origin);

}  // namespace distckpt::transferring
