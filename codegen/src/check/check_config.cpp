// Config parameters: declaration, name resolution in expressions and
// conditions, default cycles, and evaluation with what is known before the
// trainer runs (literals and defaults that reduce to constants).
#include <fmt/format.h>

#include <memory>

#include "check/checker_context.h"
#include "check/cpp_identifiers.h"
#include "check/names.h"
#include "ir/expr.h"

namespace distckpt::gen {
namespace {

void collect_params(const Expr& e, std::vector<int>& out) {
  if (e.op == Expr::Op::kParam) out.push_back(e.param);
  if (e.lhs) collect_params(*e.lhs, out);
  if (e.rhs) collect_params(*e.rhs, out);
}

Expr::Op op_of(char c) {
  switch (c) {
    case '+':
      return Expr::Op::kAdd;
    case '-':
      return Expr::Op::kSub;
    case '*':
      return Expr::Op::kMul;
    default:
      return Expr::Op::kDiv;
  }
}

// Depth-first over "default refers to" edges: finds cycles, and evaluates
// each default after the defaults it refers to (post-order).
class DefaultOrder {
 public:
  DefaultOrder(CheckContext& ctx, std::vector<std::optional<int64_t>>& values)
      : ctx_(ctx), values_(values), state_(ctx.layout.params.size(), State::kNew) {}

  void visit(int param) {
    state_[param] = State::kOnPath;
    path_.push_back(param);
    const ExprPtr& default_value = ctx_.layout.params[param].default_value;
    std::vector<int> refs;
    if (default_value) collect_params(*default_value, refs);
    for (const int ref : refs) {
      if (state_[ref] == State::kOnPath) {
        report_cycle(ref);
      } else if (state_[ref] == State::kNew) {
        visit(ref);
      }
    }
    path_.pop_back();
    state_[param] = State::kDone;
    // A parameter on a cycle stays unknown: its dependency is still on the path.
    if (default_value) values_[param] = ctx_.evaluate(*default_value);
  }

  bool done(int param) const { return state_[param] == State::kDone; }

 private:
  enum class State { kNew, kOnPath, kDone };

  void report_cycle(int start) {
    std::string cycle;
    bool on_cycle = false;
    for (const int p : path_) {
      on_cycle = on_cycle || p == start;
      if (on_cycle) cycle += ctx_.layout.params[p].name + " -> ";
    }
    cycle += ctx_.layout.params[start].name;
    ctx_.diag.error(ctx_.layout.params[start].loc, fmt::format("config default cycle: {}", cycle));
  }

  CheckContext& ctx_;
  std::vector<std::optional<int64_t>>& values_;
  std::vector<State> state_;
  std::vector<int> path_;
};

// A parameter names a member of Config and of ResolvedConfig.
void check_param_name(Diagnostics& diag, const ast::Name& name) {
  const std::string problem = identifier_problem(name.text);
  if (!problem.empty()) {
    diag.error(name.loc, fmt::format("config parameter '{}' becomes the C++ name '{}'{}; rename it", name.text,
                                     name.text, problem));
    return;
  }
  if (name.text == "Config" || name.text == "ResolvedConfig" || name.text == "int64_t") {
    const std::string what = name.text == "int64_t" ? "the type int64_t" : "the struct name '" + name.text + "'";
    diag.error(name.loc, fmt::format("config parameter '{}' would generate the member 'Config::{}', which clashes with "
                                     "{}; rename it",
                                     name.text, name.text, what));
  }
}

}  // namespace

void CheckContext::declare_params(const std::vector<const ast::Param*>& params) {
  std::vector<const ast::Param*> declared;
  for (const ast::Param* p : params) {
    const auto [it, fresh] = params_by_name_.emplace(p->name.text, static_cast<int>(layout.params.size()));
    if (!fresh) {
      diag.error(p->name.loc, fmt::format("duplicate config parameter '{}'", p->name.text))
          .note(layout.params[it->second].loc, "first declared here");
      continue;
    }
    layout.params.push_back(ConfigParam{p->name.text, nullptr, p->name.loc, p->list});
    declared.push_back(p);
    if (p->list && p->default_value) {
      diag.error(p->default_value->loc, fmt::format("list parameter '{}' cannot have a default; it is empty unless "
                                                    "the trainer sets it",
                                                    p->name.text));
    }
    check_param_name(diag, p->name);
  }
  param_values_.assign(layout.params.size(), std::nullopt);
  param_used_.assign(layout.params.size(), false);
  // Defaults may refer to parameters declared after them: resolve once all exist.
  for (size_t i = 0; i < declared.size(); ++i) {
    if (declared[i]->default_value && !declared[i]->list) {
      layout.params[i].default_value = resolve(*declared[i]->default_value);
    }
  }
  DefaultOrder order(*this, param_values_);
  for (size_t i = 0; i < layout.params.size(); ++i) {
    if (!order.done(static_cast<int>(i))) order.visit(static_cast<int>(i));
  }
}

ExprPtr CheckContext::resolve(const ast::Expr& expr) {
  auto e = std::make_shared<Expr>();
  e->loc = expr.loc;
  switch (expr.kind) {
    case ast::Expr::Kind::kInt:
      e->op = Expr::Op::kConst;
      e->value = expr.value;
      return e;
    case ast::Expr::Kind::kName: {
      const auto it = params_by_name_.find(expr.name);
      if (it == params_by_name_.end()) {
        std::vector<std::string> names;
        for (const ConfigParam& p : layout.params) names.push_back(p.name);
        const std::string hint = did_you_mean(expr.name, names);
        diag.error(expr.loc, fmt::format("unknown config parameter '{}'{}", expr.name,
                                         hint.empty() ? "; declare it in the config block" : hint));
        return nullptr;
      }
      param_used_[it->second] = true;
      if (layout.params[it->second].list) {
        diag.error(expr.loc, fmt::format("config parameter '{}' is a list (int[]); only a stack's layout(...) takes "
                                         "it, not an expression",
                                         expr.name));
        return nullptr;
      }
      e->op = Expr::Op::kParam;
      e->param = it->second;
      return e;
    }
    case ast::Expr::Kind::kBinary:
      break;
  }
  // Resolve both sides even when one fails, so every unknown name is reported.
  ExprPtr lhs = resolve(*expr.lhs);
  ExprPtr rhs = resolve(*expr.rhs);
  if (!lhs || !rhs) return nullptr;
  e->op = op_of(expr.op);
  e->lhs = std::move(lhs);
  e->rhs = std::move(rhs);
  return e;
}

std::optional<int> CheckContext::resolve_list_param(const ast::Name& name) {
  const auto it = params_by_name_.find(name.text);
  if (it == params_by_name_.end()) {
    diag.error(name.loc, fmt::format("unknown config parameter '{}'; declare it in the config block as '{}: int[];'",
                                     name.text, name.text));
    return std::nullopt;
  }
  param_used_[it->second] = true;
  if (!layout.params[it->second].list) {
    diag.error(name.loc, fmt::format("layout({}) needs a list parameter ('{}: int[];'), but '{}' is an integer",
                                     name.text, name.text, name.text));
    return std::nullopt;
  }
  return it->second;
}

Condition CheckContext::resolve_condition(const std::optional<ast::Condition>& condition) {
  if (!condition) return Condition{};
  ast::Expr name;
  name.kind = ast::Expr::Kind::kName;
  name.name = condition->param.text;
  name.loc = condition->param.loc;
  const ExprPtr param = resolve(name);
  return param ? Condition{param->param, condition->negate} : Condition{};
}

std::optional<int64_t> CheckContext::evaluate(const Expr& expr) {
  const Evaluation result = evaluate_traced(expr, param_values_);
  if (result.failure == Evaluation::Failure::kNone) return result.value;
  const Expr& at = *result.failed;
  const std::string text = to_source(at, layout.params);
  const auto with_defaults = [&](const Expr& part, const std::string& numbers) {
    return uses_params(part) ? fmt::format(" ({} with the config defaults)", numbers) : std::string();
  };
  const auto numbers = [&](const char* op) { return fmt::format("{} {} {}", *result.lhs, op, *result.rhs); };
  switch (result.failure) {
    case Evaluation::Failure::kInexactDivision:
      diag.error(at.loc, fmt::format("'{}' is not an exact division{}", text, with_defaults(at, numbers("/"))));
      break;
    case Evaluation::Failure::kDivisionByZero:
      diag.error(at.loc, fmt::format("division by zero in '{}'{}", text,
                                     with_defaults(*at.rhs, to_source(*at.rhs, layout.params) + " = 0")));
      break;
    default:
      diag.error(at.loc,
                 fmt::format("'{}' overflows a 64-bit integer{}", text, with_defaults(at, numbers(op_symbol(at.op)))));
      break;
  }
  return std::nullopt;
}

std::optional<int64_t> CheckContext::check_extent(const Expr& expr, const std::string& what) {
  const std::optional<int64_t> value = evaluate(expr);
  if (value && *value <= 0) {
    diag.error(expr.loc, fmt::format("{} is {}; it must be positive", what, describe_value(expr, *value)));
  }
  return value;
}

std::optional<int64_t> CheckContext::known_value(const Expr& expr) const {
  return evaluate_traced(expr, param_values_).value;
}

std::string CheckContext::describe_value(const Expr& expr, int64_t value) const {
  if (expr.op == Expr::Op::kConst) return std::to_string(value);
  return fmt::format("{} ('{}'{})", value, to_source(expr, layout.params),
                     uses_params(expr) ? " with the config defaults" : "");
}

void CheckContext::warn_unused_params() {
  for (size_t i = 0; i < layout.params.size(); ++i) {
    if (!param_used_[i]) {
      diag.warning(layout.params[i].loc, fmt::format("config parameter '{}' is never used", layout.params[i].name));
    }
  }
}

}  // namespace distckpt::gen
