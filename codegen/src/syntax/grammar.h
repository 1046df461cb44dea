// The PEGTL grammar of the layout schema language (docs/SCHEMA.md, section
// "Grammar"). Only the shape of the language lives here: the syntax tree is
// built by the actions in parser_actions.h, the "expected ..." messages in
// syntax_errors.h.
//
// Conventions that make error positions exact:
//  - every token swallows the whitespace and comments after it, so when a
//    token fails the input stands on the offending token itself;
//  - a token only consumes input when it matches as a whole (token<>), so a
//    failing must<> reports the token's first column, not a half-read word;
//  - each place a token appears has its own rule type, so its error message
//    and its action can name the context ("';' after the tensor declaration").
#pragma once

#include <tao/pegtl.hpp>

#include "syntax/syntax_recovery.h"

namespace distckpt::gen::grammar {

namespace pegtl = tao::pegtl;
using pegtl::eof;
using pegtl::must;
using pegtl::not_at;
using pegtl::one;
using pegtl::opt;
using pegtl::seq;
using pegtl::sor;
using pegtl::star;

// ---- lexical rules --------------------------------------------------------

struct comment : seq<one<'#'>, pegtl::until<pegtl::eolf>> {};
struct skip : star<sor<pegtl::space, comment>> {};

template <typename Rule>
struct token : seq<pegtl::at<Rule>, Rule, skip> {};

// Reserved words; TAO_PEGTL_KEYWORD checks the word boundary, so `stackx`
// is an identifier and not the keyword `stack` followed by `x`.
#define DISTCKPT_KW(name, text) using name = TAO_PEGTL_KEYWORD(text)
DISTCKPT_KW(kw_layout, "layout");
DISTCKPT_KW(kw_config, "config");
DISTCKPT_KW(kw_mesh, "mesh");
DISTCKPT_KW(kw_tensor, "tensor");
DISTCKPT_KW(kw_stack, "stack");
DISTCKPT_KW(kw_over, "over");
DISTCKPT_KW(kw_as, "as");
DISTCKPT_KW(kw_axis, "axis");
DISTCKPT_KW(kw_keys, "keys");
DISTCKPT_KW(kw_first, "first");
DISTCKPT_KW(kw_last, "last");
DISTCKPT_KW(kw_object, "object");
DISTCKPT_KW(kw_per, "per");
DISTCKPT_KW(kw_common, "common");
DISTCKPT_KW(kw_transient, "transient");
DISTCKPT_KW(kw_optimizer, "optimizer");
DISTCKPT_KW(kw_state, "state");
DISTCKPT_KW(kw_like, "like");
DISTCKPT_KW(kw_param, "param");
DISTCKPT_KW(kw_scalar, "scalar");
DISTCKPT_KW(kw_distributed, "distributed");
DISTCKPT_KW(kw_split, "split");
DISTCKPT_KW(kw_by, "by");
DISTCKPT_KW(kw_pad, "pad");
DISTCKPT_KW(kw_stage, "stage");
DISTCKPT_KW(kw_fused, "fused");
DISTCKPT_KW(kw_tied, "tied");
DISTCKPT_KW(kw_when, "when");
DISTCKPT_KW(kw_unless, "unless");
DISTCKPT_KW(kw_dtype, "dtype");
DISTCKPT_KW(kw_int, "int");
DISTCKPT_KW(kw_float, "float");
DISTCKPT_KW(kw_string, "string");
DISTCKPT_KW(kw_bool, "bool");
DISTCKPT_KW(kw_mapping, "mapping");
DISTCKPT_KW(kw_skip, "skip");
DISTCKPT_KW(kw_on, "on");
DISTCKPT_KW(kw_virtual, "virtual");
DISTCKPT_KW(kw_instances, "instances");
#undef DISTCKPT_KW

struct reserved
    : sor<kw_layout, kw_config, kw_mesh, kw_tensor, kw_stack, kw_over, kw_as, kw_axis, kw_keys, kw_first, kw_last,
          kw_object, kw_per, kw_common, kw_transient, kw_optimizer, kw_state, kw_like, kw_param, kw_scalar,
          kw_distributed, kw_split, kw_by, kw_pad, kw_stage, kw_fused, kw_tied, kw_when, kw_unless, kw_dtype, kw_int,
          kw_float, kw_string, kw_bool, kw_mapping, kw_skip, kw_on, kw_virtual, kw_instances> {};

struct ident : seq<not_at<reserved>, pegtl::identifier> {};

// Words that start a statement. A block meeting one of the top-level-only
// words has lost its '}'; recovery resumes at any of them (syntax_recovery.h).
struct top_level_word : sor<kw_layout, kw_config, kw_mesh, kw_common, kw_transient, kw_optimizer, kw_mapping> {};
struct item_word : sor<top_level_word, kw_tensor, kw_stack, kw_object> {};
struct optimizer_word_or_item : sor<item_word, kw_state, kw_scalar, kw_distributed> {};
// After a '.', a word cannot start anything else: reserved words are names
// there (`vision.stage.weight`, `mlp.per.x`), as model keys use them.
struct dotted_part : pegtl::identifier {};
struct dotted : seq<ident, star<one<'.'>, must<dotted_part>>> {};
struct integer : pegtl::plus<pegtl::digit> {};

template <char C>
struct punct : token<one<C>> {};

// ---- expressions ----------------------------------------------------------

struct expr;
struct int_literal : token<integer> {};
struct param_ref : token<ident> {};
struct open_paren : punct<'('> {};
struct close_paren : punct<')'> {};
struct paren_expr : seq<open_paren, must<expr>, must<close_paren>> {};
struct factor : sor<int_literal, param_ref, paren_expr> {};
struct mul_op : token<one<'*', '/'>> {};
struct mul_tail : seq<mul_op, must<factor>> {};
struct term : seq<factor, star<mul_tail>> {};
struct add_op : token<one<'+', '-'>> {};
struct add_tail : seq<add_op, must<term>> {};
struct expr : seq<term, star<add_tail>> {};

// ---- shared pieces --------------------------------------------------------

struct when_word : token<kw_when> {};
struct unless_word : token<kw_unless> {};
struct condition_param : token<ident> {};
struct condition : seq<sor<when_word, unless_word>, must<condition_param>> {};

// ---- layout, config, mesh -------------------------------------------------

struct layout_word : token<kw_layout> {};
struct layout_name : token<ident> {};
struct layout_end : punct<';'> {};
struct layout_decl : seq<layout_word, must<layout_name>, must<layout_end>> {};

struct param_name : token<ident> {};
struct param_colon : punct<':'> {};
struct param_type : token<kw_int> {};
struct param_list_close : punct<']'> {};
struct param_list : seq<punct<'['>, must<param_list_close>> {};  // `int[]`
struct param_default : expr {};
struct param_end : punct<';'> {};
struct param : seq<param_name, must<param_colon>, must<param_type>, opt<param_list>,
                   opt<punct<'='>, must<param_default>>, must<param_end>> {};

struct config_word : token<kw_config> {};
struct config_open : punct<'{'> {};
struct config_close : punct<'}'> {};
// Block bodies stop at '}' or at a word that cannot start a member, which
// means the '}' is missing: must<..._close> then reports it there.
struct config_params : star<not_at<one<'}'>>, not_at<item_word>, not_at<eof>, recover<must<param>, item_word>> {};
struct config : seq<config_word, must<config_open>, config_params, must<config_close>> {};

struct mesh_word : token<kw_mesh> {};
struct mesh_name : token<ident> {};
// `mesh experts: etp, ep, edp, pp;` names a mesh; the colon tells it from an axis.
struct mesh_named : seq<pegtl::at<token<ident>, one<':'>>, mesh_name, punct<':'>> {};
struct mesh_axis : token<ident> {};
struct mesh_end : punct<';'> {};
struct mesh : seq<mesh_word, opt<mesh_named>, must<mesh_axis>, star<punct<','>, must<mesh_axis>>, must<mesh_end>> {};

// ---- tensor ---------------------------------------------------------------

struct tensor_word : token<kw_tensor> {};
struct tensor_key : token<dotted> {};

struct shape_dim : expr {};
struct shape_close : punct<']'> {};
struct shape_dims : seq<shape_dim, star<punct<','>, must<shape_dim>>, must<shape_close>> {};
struct shape_body : sor<shape_close, shape_dims> {};
struct shape : seq<punct<'['>, must<shape_body>> {};

struct split_open : punct<'('> {};
struct split_dim : token<integer> {};
struct split_by : token<kw_by> {};
struct split_axis : token<ident> {};
struct split_item : seq<split_dim, must<split_by>, must<split_axis>, star<punct<'*'>, must<split_axis>>> {};
struct split_close : punct<')'> {};
struct split_items : seq<split_item, star<punct<','>, must<split_item>>> {};
struct split_attr : seq<token<kw_split>, must<split_open>, must<split_items>, must<split_close>> {};

struct pad_open : punct<'('> {};
struct pad_dim : token<integer> {};
struct pad_close : punct<')'> {};
struct pad_attr : seq<token<kw_pad>, must<pad_open>, must<pad_dim>, must<pad_close>> {};

struct stage_word : token<kw_stage> {};
struct stage_open : punct<'('> {};
struct stage_first : token<kw_first> {};
struct stage_last : token<kw_last> {};
struct stage_which : sor<stage_first, stage_last> {};
struct stage_close : punct<')'> {};
struct stage_attr : seq<stage_word, must<stage_open>, must<stage_which>, must<stage_close>> {};

struct fused_word : token<kw_fused> {};
struct fused_open : punct<'('> {};
struct part_name : token<ident> {};
struct part_colon : punct<':'> {};
struct part_extent : expr {};
struct fused_part : seq<part_name, must<part_colon>, must<part_extent>> {};
struct fused_close : punct<')'> {};
struct fused_attr
    : seq<fused_word, must<fused_open>, must<fused_part>, star<punct<','>, must<fused_part>>, must<fused_close>> {};

struct tied_open : punct<'('> {};
struct tied_key : token<dotted> {};
struct tied_close : punct<')'> {};
struct tied_attr : seq<token<kw_tied>, must<tied_open>, must<tied_key>, must<tied_close>> {};

// Any word, reserved or not: `bool` is a dtype as well as a keyword.
struct dtype_open : punct<'('> {};
struct dtype_name : token<pegtl::identifier> {};
struct dtype_close : punct<')'> {};
struct dtype_attr : seq<token<kw_dtype>, must<dtype_open>, must<dtype_name>, must<dtype_close>> {};

struct tensor_mesh : token<ident> {};
struct on_attr : seq<token<kw_on>, must<tensor_mesh>> {};

struct attr : sor<split_attr, pad_attr, stage_attr, fused_attr, tied_attr, dtype_attr, on_attr> {};
struct tensor_end : punct<';'> {};
struct tensor : seq<tensor_word, must<tensor_key>, must<shape>, star<attr>, opt<condition>, must<tensor_end>> {};

// ---- object ---------------------------------------------------------------

struct object_word : token<kw_object> {};
struct object_key : token<dotted> {};
struct per_open : punct<'('> {};
struct per_axis : token<ident> {};
struct per_close : punct<')'> {};
struct per : seq<token<kw_per>, must<per_open>, must<per_axis>, star<punct<','>, must<per_axis>>, must<per_close>> {};
struct object_mesh : token<ident> {};
struct object_on : seq<token<kw_on>, must<object_mesh>> {};
struct object_end : punct<';'> {};
struct object : seq<object_word, must<object_key>, opt<per>, opt<object_on>, opt<condition>, must<object_end>> {};

// ---- stack ----------------------------------------------------------------

struct stack;
struct stack_word : token<kw_stack> {};
struct stack_key : token<dotted> {};
struct count_open : punct<'['> {};
struct stack_count : expr {};
struct count_close : punct<']'> {};
struct stack_over : token<kw_over> {};
struct stack_axis : token<ident> {};
struct placement_open : punct<'('> {};
struct first_count : expr {};
struct last_count : expr {};
struct placement_close : punct<')'> {};
struct placement_first : seq<token<kw_first>, must<placement_open>, must<first_count>, must<placement_close>> {};
struct placement_last : seq<token<kw_last>, must<placement_open>, must<last_count>, must<placement_close>> {};
struct placement : sor<seq<placement_first, opt<placement_last>>, placement_last> {};
struct storage_axis : token<kw_axis> {};
struct storage_keys : token<kw_keys> {};
struct storage_kind : sor<storage_axis, storage_keys> {};
struct storage : seq<token<kw_as>, must<storage_kind>> {};
struct virtual_open : punct<'('> {};
struct virtual_count : expr {};
struct virtual_close : punct<')'> {};
struct virtual_word : token<kw_virtual> {};
struct stack_virtual : seq<virtual_word, must<virtual_open>, must<virtual_count>, must<virtual_close>> {};
struct stack_layout_open : punct<'('> {};
struct stack_layout_param : token<ident> {};
struct stack_layout_close : punct<')'> {};
struct stack_layout
    : seq<token<kw_layout>, must<stack_layout_open>, must<stack_layout_param>, must<stack_layout_close>> {};
struct stack_stage_word : token<kw_stage> {};
struct stack_stage_first : token<kw_first> {};
struct stack_stage_last : token<kw_last> {};
struct stack_stage_which : sor<stack_stage_first, stack_stage_last> {};
struct stack_stage : seq<stack_stage_word, must<stage_open>, must<stack_stage_which>, must<stage_close>> {};
// `over AXIS` spreads the elements; `stage(first|last)` puts them all on one stage.
struct stack_spread : seq<stack_over, must<stack_axis>, opt<stack_virtual>, opt<stack_layout>, opt<placement>> {};
struct stack_placing : sor<stack_spread, stack_stage> {};
struct stack_mesh : token<ident> {};
struct stack_on : seq<token<kw_on>, must<stack_mesh>> {};
struct stack_open : punct<'{'> {};
struct stack_item : sor<tensor, stack, object> {};
struct stack_close : punct<'}'> {};
struct stack_body : star<not_at<one<'}'>>, not_at<top_level_word>, not_at<eof>, recover<must<stack_item>, item_word>> {
};
struct stack
    : seq<stack_word, must<stack_key>, must<count_open>, must<stack_count>, must<count_close>, must<stack_placing>,
          opt<storage>, opt<stack_on>, opt<condition>, must<stack_open>, stack_body, must<stack_close>> {};

// ---- common, transient ----------------------------------------------------

struct common_word : token<kw_common> {};
struct common_key : token<dotted> {};
struct common_colon : punct<':'> {};
struct common_int : token<kw_int> {};
struct common_float : token<kw_float> {};
struct common_string : token<kw_string> {};
struct common_bool : token<kw_bool> {};
struct common_type : sor<common_int, common_float, common_string, common_bool> {};
struct common_end : punct<';'> {};
struct common : seq<common_word, must<common_key>, must<common_colon>, must<common_type>, must<common_end>> {};

struct transient_word : token<kw_transient> {};
struct transient_key : token<dotted> {};
struct transient_end : punct<';'> {};
struct transient : seq<transient_word, must<transient_key>, must<transient_end>> {};

// ---- optimizer ------------------------------------------------------------

struct state_name : token<ident> {};
struct state_like : token<kw_like> {};
struct state_param : token<kw_param> {};
struct state_end : punct<';'> {};
struct state_decl : seq<token<kw_state>, must<state_name>, star<punct<','>, must<state_name>>, must<state_like>,
                        must<state_param>, must<state_end>> {};
struct scalar_name : token<ident> {};
struct scalar_end : punct<';'> {};
struct scalar_decl : seq<token<kw_scalar>, must<scalar_name>, must<scalar_end>> {};
struct distributed_word : token<kw_distributed> {};
struct distributed_over : token<kw_over> {};
struct distributed_axis : token<ident> {};
struct instances_open : punct<'('> {};
struct instances_count : expr {};
struct instances_close : punct<')'> {};
struct distributed_instances
    : seq<token<kw_instances>, must<instances_open>, must<instances_count>, must<instances_close>> {};
struct distributed_mesh : token<ident> {};
struct distributed_on : seq<token<kw_on>, must<distributed_mesh>> {};
struct distributed_end : punct<';'> {};
struct distributed_decl
    : seq<distributed_word, must<distributed_over>, must<distributed_axis>, star<punct<'*'>, must<distributed_axis>>,
          opt<distributed_instances>, opt<distributed_on>, must<distributed_end>> {};
struct optimizer_item : sor<state_decl, scalar_decl, distributed_decl> {};

struct optimizer_word : token<kw_optimizer> {};
struct optimizer_name : token<ident> {};
struct optimizer_open : punct<'{'> {};
struct optimizer_close : punct<'}'> {};
struct optimizer_items
    : star<not_at<one<'}'>>, not_at<item_word>, not_at<eof>, recover<must<optimizer_item>, optimizer_word_or_item>> {};
struct optimizer
    : seq<optimizer_word, must<optimizer_name>, must<optimizer_open>, optimizer_items, must<optimizer_close>> {};

// ---- mapping --------------------------------------------------------------

// `decoder.layers[layer].mlp.linear_fc1.weight`: a key whose stacks bind index names.
struct map_index_open : one<'['> {};
struct map_index : ident {};
struct map_index_close : one<']'> {};
struct map_key_tail
    : sor<seq<one<'.'>, must<dotted_part>>, seq<map_index_open, must<map_index>, must<map_index_close>>> {};
struct map_key_text : seq<ident, star<map_key_tail>> {};
struct map_key : token<map_key_text> {};

// An external tensor name: printable ASCII without '"' or backslash.
struct string_char : pegtl::ranges<' ', '!', '#', '[', ']', '~'> {};
struct string_close : one<'"'> {};
struct external_text : seq<one<'"'>, star<string_char>, must<string_close>> {};
struct external_name : token<external_text> {};

struct map_equals : punct<'='> {};
struct map_end : punct<';'> {};
struct map_part : token<ident> {};
struct map_part_entry : seq<map_part, must<map_equals>, must<external_name>, must<map_end>> {};
struct map_parts_close : punct<'}'> {};
// A bad part recovers at its ';' inside the braces, so the block still closes.
struct map_part_entries
    : star<not_at<one<'}'>>, not_at<item_word>, not_at<eof>, recover<must<map_part_entry>, item_word>> {};
struct map_parts : seq<punct<'{'>, map_part_entries, must<map_parts_close>> {};
struct map_whole : seq<map_equals, must<external_name>, must<map_end>> {};
struct map_target : sor<map_whole, map_parts> {};
struct map_entry : seq<map_key, must<map_target>> {};
struct skip_key : token<dotted> {};
struct skip_end : punct<';'> {};
struct map_skip : seq<token<kw_skip>, must<skip_key>, must<skip_end>> {};
struct map_item : sor<map_skip, map_entry> {};

struct mapping_word : token<kw_mapping> {};
struct mapping_name : token<ident> {};
struct mapping_open : punct<'{'> {};
struct mapping_close : punct<'}'> {};
struct mapping_items : star<not_at<one<'}'>>, not_at<top_level_word>, not_at<item_word>, not_at<eof>,
                            recover<must<map_item>, item_word>> {};
struct mapping : seq<mapping_word, must<mapping_name>, must<mapping_open>, mapping_items, must<mapping_close>> {};

// ---- schema ---------------------------------------------------------------

// `layout` is an ordinary item here so that a misplaced or repeated one is
// reported by the checker with a useful message instead of a syntax error.
struct item : sor<layout_decl, config, mesh, tensor, stack, object, common, transient, optimizer, mapping> {};
struct schema : seq<skip, star<not_at<eof>, recover<must<item>, item_word, Level::kTop>>, eof> {};

}  // namespace distckpt::gen::grammar
