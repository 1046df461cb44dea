// Stable dtype names for the on-disk format and the CLI ("float32", "bfloat16").
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "distckpt/format/storage_index.h"

namespace distckpt {

// Throws UsageError for a dtype no checkpoint can store (see is_storable_dtype).
std::string dtype_name(at::ScalarType t);
bool is_storable_dtype(at::ScalarType t);
// The type of a stored name; throws CorruptionError for a name this build
// does not know and CheckpointError for a known one this LibTorch lacks.
at::ScalarType dtype_from_name(const std::string& name);
size_t dtype_size(at::ScalarType t);

// A stored name resolved: the type when this LibTorch has one, otherwise what
// the record needs to describe it (see TensorRecord::unrepresentable).
// `recorded_size`: the element size the metadata recorded (0: none, as in
// checkpoints written before sizes were recorded). Throws CorruptionError for
// an unknown name without a plausible recorded size, or a known name whose
// recorded size is wrong.
struct ResolvedDtype {
  at::ScalarType type = at::ScalarType::Undefined;
  std::optional<UnrepresentableDtype> unrepresentable;
};
ResolvedDtype resolve_stored_dtype(const std::string& name, uint32_t recorded_size);

// The stored name of a record's dtype, representable or not.
std::string stored_dtype_name(const TensorRecord& record);
// Why a record's dtype cannot be loaded here, as a clause ("this LibTorch
// has no float8_e4m3fn type"); empty when it can.
std::string unrepresentable_reason(const TensorRecord& record);
std::string unrepresentable_reason(const std::string& stored_name);
// The type a record's elements are moved as: its dtype, or for an
// unrepresentable one an integer type of the same size (bytes copied
// unchanged; nothing may compute with the values).
at::ScalarType carrier_dtype(const TensorRecord& record);

}  // namespace distckpt
