// How schema names become C++ names. The checker stores them in the layout
// model (and checks them for clashes); the emitters only read them back.
#pragma once

#include <string>
#include <string_view>

namespace distckpt::gen {

// "self_attention.linear_qkv.weight" -> "self_attention_linear_qkv_weight".
std::string accessor_name(std::string_view key);

// "decoder.layers.mlp.experts" or "decoder_layers" -> "DecoderLayersMlpExperts",
// "DecoderLayers": '.' and '_' start a new word.
std::string class_name(std::string_view name);

// "tp" -> "kTp".
std::string axis_constant(std::string_view axis);

// "experts" -> "kExpertsMesh".
std::string mesh_constant(std::string_view mesh);

}  // namespace distckpt::gen
