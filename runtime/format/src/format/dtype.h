// Stable dtype names for the on-disk format and the CLI ("float32", "bfloat16").
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace distckpt {

std::string dtype_name(at::ScalarType t);
at::ScalarType dtype_from_name(const std::string& name);  // throws CorruptionError if unknown
size_t dtype_size(at::ScalarType t);

}  // namespace distckpt
