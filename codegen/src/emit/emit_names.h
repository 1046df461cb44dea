// Naming helpers shared by the header and source emitters.
#pragma once

#include <string>

#include "ir/ir.h"

namespace distckpt::gen {

std::string camel_case(const std::string& dotted);   // "decoder.layers" -> "DecoderLayers"
std::string axis_constant(const std::string& axis);  // "tp" -> "kTp"
std::string quoted(const std::string& s);            // a C++ string literal
std::string common_type(CommonDecl::Type type);      // the C++ type of a common value

}  // namespace distckpt::gen
