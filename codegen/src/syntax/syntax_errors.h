// Syntax error messages: what each must<> of the grammar expected, in words,
// plus what was found instead ("expected ';' after the tensor declaration
// (found 'splt')"). The control class refuses to compile a must<> whose
// target has no message, so no error can ever read "parse error matching
// tao::pegtl::...".
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

#include "syntax/grammar.h"

namespace distckpt::gen::grammar {

template <typename Rule>
inline constexpr const char* kExpected = nullptr;
// For rules after which a stray word most likely is a misspelled option: the
// message when a (non-reserved) word is found there; '{}' is the word.
template <typename Rule>
inline constexpr const char* kUnknownWord = nullptr;

#define DISTCKPT_EXPECTED(rule, text) \
  template <>                         \
  inline constexpr const char* kExpected<rule> = text

DISTCKPT_EXPECTED(item,
                  "a declaration (layout, config, mesh, tensor, stack, object, common, transient, optimizer or "
                  "mapping)");
DISTCKPT_EXPECTED(dotted_part, "a name after '.'");
DISTCKPT_EXPECTED(expr, "an expression after '('");
DISTCKPT_EXPECTED(close_paren, "')' to close '('");
DISTCKPT_EXPECTED(factor, "a number, a config parameter or '(' after the operator");
DISTCKPT_EXPECTED(term, "a number, a config parameter or '(' after the operator");
DISTCKPT_EXPECTED(condition_param, "a config parameter after 'when' / 'unless'");

DISTCKPT_EXPECTED(layout_name, "the layout name after 'layout'");
DISTCKPT_EXPECTED(layout_end, "';' after the layout declaration");
DISTCKPT_EXPECTED(param, "a config parameter ('NAME: int;') or '}'");
DISTCKPT_EXPECTED(param_colon, "':' after the config parameter name");
DISTCKPT_EXPECTED(param_type, "'int' after ':' (config parameters are integers)");
DISTCKPT_EXPECTED(param_default, "a default value after '='");
DISTCKPT_EXPECTED(param_list_close, "']' after '[' (a list parameter is 'int[]')");
DISTCKPT_EXPECTED(param_end, "';' after the config parameter");
DISTCKPT_EXPECTED(config_open, "'{' after 'config'");
DISTCKPT_EXPECTED(config_close, "'}' to close the config block");
DISTCKPT_EXPECTED(mesh_axis, "a mesh axis name");
DISTCKPT_EXPECTED(mesh_end, "',' or ';' after the mesh axis");

DISTCKPT_EXPECTED(tensor_key, "the tensor key after 'tensor'");
DISTCKPT_EXPECTED(shape, "the shape '[...]' after the tensor key");
DISTCKPT_EXPECTED(shape_body, "a dimension or ']' after '['");
DISTCKPT_EXPECTED(shape_dim, "a dimension after ','");
DISTCKPT_EXPECTED(shape_close, "',' or ']' in the tensor shape");
DISTCKPT_EXPECTED(split_open, "'(' after 'split'");
DISTCKPT_EXPECTED(split_item, "a tensor dim (an integer) in split(...)");
DISTCKPT_EXPECTED(split_items, "a tensor dim (an integer) in split(...)");
DISTCKPT_EXPECTED(split_by, "'by' after the split dim, as in split(0 by tp)");
DISTCKPT_EXPECTED(split_axis, "a mesh axis in split(...)");
DISTCKPT_EXPECTED(split_close, "',' or ')' in split(...)");
DISTCKPT_EXPECTED(pad_open, "'(' after 'pad'");
DISTCKPT_EXPECTED(pad_dim, "a tensor dim (an integer) in pad(...)");
DISTCKPT_EXPECTED(pad_close, "')' after the pad dim");
DISTCKPT_EXPECTED(stage_open, "'(' after 'stage'");
DISTCKPT_EXPECTED(stage_which, "'first' or 'last' in stage(...)");
DISTCKPT_EXPECTED(stage_close, "')' after stage(first / last");
DISTCKPT_EXPECTED(fused_open, "'(' after 'fused'");
DISTCKPT_EXPECTED(fused_part, "a part 'NAME: EXTENT' in fused(...)");
DISTCKPT_EXPECTED(part_colon, "':' after the fused part name");
DISTCKPT_EXPECTED(part_extent, "the part's extent after ':'");
DISTCKPT_EXPECTED(fused_close, "',' or ')' in fused(...)");
DISTCKPT_EXPECTED(tied_open, "'(' after 'tied'");
DISTCKPT_EXPECTED(tied_key, "the key of the main copy in tied(...)");
DISTCKPT_EXPECTED(tied_close, "')' after the tied key");
DISTCKPT_EXPECTED(dtype_open, "'(' after 'dtype'");
DISTCKPT_EXPECTED(dtype_name, "a dtype name (float32, bfloat16, ...) in dtype(...)");
DISTCKPT_EXPECTED(dtype_close, "')' after the dtype name");
DISTCKPT_EXPECTED(tensor_end, "';' after the tensor declaration");

DISTCKPT_EXPECTED(object_key, "the object key after 'object'");
DISTCKPT_EXPECTED(per_open, "'(' after 'per'");
DISTCKPT_EXPECTED(per_axis, "a mesh axis in per(...)");
DISTCKPT_EXPECTED(per_close, "',' or ')' in per(...)");
DISTCKPT_EXPECTED(object_end, "';' after the object declaration");

DISTCKPT_EXPECTED(stack_key, "the stack key after 'stack'");
DISTCKPT_EXPECTED(count_open, "'[' and the number of elements after the stack key");
DISTCKPT_EXPECTED(stack_count, "the number of elements after '['");
DISTCKPT_EXPECTED(count_close, "']' after the number of elements");
DISTCKPT_EXPECTED(stack_placing, "'over' and the mesh axis the elements are spread over, or stage(first|last)");
DISTCKPT_EXPECTED(virtual_open, "'(' after 'virtual'");
DISTCKPT_EXPECTED(virtual_count, "the number of virtual stages per stage in virtual(...)");
DISTCKPT_EXPECTED(virtual_close, "')' after the number of virtual stages");
DISTCKPT_EXPECTED(stack_layout_open, "'(' after 'layout'");
DISTCKPT_EXPECTED(stack_layout_param, "a list config parameter ('NAME: int[];') in layout(...)");
DISTCKPT_EXPECTED(stack_layout_close, "')' after the layout parameter");
DISTCKPT_EXPECTED(stack_stage_which, "'first' or 'last' in stage(...)");
DISTCKPT_EXPECTED(stack_mesh, "a mesh name after 'on'");
DISTCKPT_EXPECTED(tensor_mesh, "a mesh name after 'on'");
DISTCKPT_EXPECTED(object_mesh, "a mesh name after 'on'");
DISTCKPT_EXPECTED(stack_axis, "a mesh axis after 'over'");
DISTCKPT_EXPECTED(placement_open, "'(' after 'first' / 'last'");
DISTCKPT_EXPECTED(first_count, "a number of elements in first(...)");
DISTCKPT_EXPECTED(last_count, "a number of elements in last(...)");
DISTCKPT_EXPECTED(placement_close, "')' after the number of elements");
DISTCKPT_EXPECTED(storage_kind, "'axis' or 'keys' after 'as'");
DISTCKPT_EXPECTED(stack_open, "'{' to open the stack body");
DISTCKPT_EXPECTED(stack_item, "'tensor', 'stack', 'object' or '}' in the stack body");
DISTCKPT_EXPECTED(stack_close, "'}' to close the stack body");

DISTCKPT_EXPECTED(common_key, "the key after 'common'");
DISTCKPT_EXPECTED(common_colon, "':' and a type after the common key");
DISTCKPT_EXPECTED(common_type, "a type (int, float, string or bool) after ':'");
DISTCKPT_EXPECTED(common_end, "';' after the common declaration");
DISTCKPT_EXPECTED(transient_key, "the key after 'transient'");
DISTCKPT_EXPECTED(transient_end, "';' after the transient declaration");

DISTCKPT_EXPECTED(optimizer_name, "the optimizer name after 'optimizer'");
DISTCKPT_EXPECTED(optimizer_open, "'{' after the optimizer name");
DISTCKPT_EXPECTED(optimizer_item, "'state', 'scalar', 'distributed' or '}' in the optimizer block");
DISTCKPT_EXPECTED(optimizer_close, "'}' to close the optimizer block");
DISTCKPT_EXPECTED(state_name, "a state name");
DISTCKPT_EXPECTED(state_like, "',' or 'like param' after the state name");
DISTCKPT_EXPECTED(state_param, "'param' after 'like'");
DISTCKPT_EXPECTED(state_end, "';' after 'like param'");
DISTCKPT_EXPECTED(scalar_name, "a scalar name after 'scalar'");
DISTCKPT_EXPECTED(scalar_end, "';' after the scalar name");
DISTCKPT_EXPECTED(distributed_over, "'over' after 'distributed'");
DISTCKPT_EXPECTED(distributed_axis, "a mesh axis after 'distributed over'");
DISTCKPT_EXPECTED(distributed_end, "'*', instances(...), 'on' or ';' after the distributed axis");
DISTCKPT_EXPECTED(instances_open, "'(' after 'instances'");
DISTCKPT_EXPECTED(instances_count, "the number of optimizer instances in instances(...)");
DISTCKPT_EXPECTED(instances_close, "')' after the number of instances");
DISTCKPT_EXPECTED(distributed_mesh, "a mesh name after 'on'");

DISTCKPT_EXPECTED(mapping_name, "the mapping name after 'mapping'");
DISTCKPT_EXPECTED(mapping_open, "'{' after the mapping name");
DISTCKPT_EXPECTED(map_item, "a schema key, 'skip' or '}' in the mapping");
DISTCKPT_EXPECTED(mapping_close, "'}' to close the mapping");
DISTCKPT_EXPECTED(map_index, "an index name after '[', as in decoder.layers[layer]");
DISTCKPT_EXPECTED(map_index_close, "']' after the index name");
DISTCKPT_EXPECTED(map_target, "'= \"EXTERNAL NAME\";' or '{' with the fused parts after the key");
DISTCKPT_EXPECTED(map_equals, "'=' after the fused part name");
DISTCKPT_EXPECTED(external_name, "the external tensor name as a string, \"like.this\"");
DISTCKPT_EXPECTED(string_close, "'\"' to close the string (names are printable ASCII without '\"' or backslash)");
DISTCKPT_EXPECTED(map_end, "';' after the external name");
DISTCKPT_EXPECTED(map_part_entry, "a fused part 'PART = \"NAME\";' or '}'");
DISTCKPT_EXPECTED(map_parts_close, "'}' to close the fused parts");
DISTCKPT_EXPECTED(skip_key, "the schema key after 'skip'");
DISTCKPT_EXPECTED(skip_end, "';' after the skipped key");
#undef DISTCKPT_EXPECTED

template <>
inline constexpr const char* kUnknownWord<tensor_end> =
    "unknown tensor attribute '{}' (attributes: split, pad, stage, fused, tied, dtype, on; conditions: when, unless)";
template <>
inline constexpr const char* kUnknownWord<object_end> =
    "unknown object option '{}' (options: per, on; conditions: when, unless)";
template <>
inline constexpr const char* kUnknownWord<stack_open> =
    "unknown stack option '{}' (options: virtual, layout, first, last, as axis, as keys, on; conditions: when, "
    "unless)";

inline bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// The identifier-shaped word (or number) starting at `p`; empty if none.
inline std::string word_at(const char* p, const char* end) {
  const char* q = p;
  while (q != end && is_word_char(*q)) ++q;
  return std::string(p, q);
}

inline bool is_reserved(const std::string& word) {
  tao::pegtl::memory_input<> input(word, "");
  return tao::pegtl::parse<seq<reserved, eof>>(input);
}

// The token at `p`, for "(found ...)": a word, a number, one character, or
// the end of the file.
inline std::string describe_found(const char* p, const char* end) {
  if (p == end) return "end of file";
  const auto byte = static_cast<unsigned char>(*p);
  if (byte == '\n' || byte == '\r') return "end of line";
  if (byte < 0x20 || byte >= 0x7f) return fmt::format("byte 0x{:02x}", byte);  // control or non-ASCII
  const std::string word = word_at(p, end);
  if (word.empty()) return fmt::format("'{}'", *p);
  return is_reserved(word) ? fmt::format("reserved word '{}'", word) : fmt::format("'{}'", word);
}

template <typename Rule>
std::string syntax_error_message(const char* p, const char* end) {
  if constexpr (kUnknownWord<Rule> != nullptr) {
    // A plain name where an option may stand is most likely a misspelled option.
    const std::string word = word_at(p, end);
    const bool is_name = !word.empty() && !(word[0] >= '0' && word[0] <= '9') && !is_reserved(word);
    if (is_name) return fmt::format(fmt::runtime(kUnknownWord<Rule>), word);
  }
  return fmt::format("expected {} (found {})", kExpected<Rule>, describe_found(p, end));
}

template <typename Rule>
struct control : tao::pegtl::normal<Rule> {
  template <typename ParseInput, typename... States>
  [[noreturn]] static void raise(const ParseInput& in, States&&... /*unused*/) {
    static_assert(kExpected<Rule> != nullptr, "give this must<> target a message in syntax_errors.h");
    throw tao::pegtl::parse_error(syntax_error_message<Rule>(in.current(), in.end()), in);
  }
};

}  // namespace distckpt::gen::grammar
