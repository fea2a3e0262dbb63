// Softmax, log-softmax and logsumexp over dims that may stay sharded (Megatron's
// vocab-parallel cross entropy: logits sharded over the vocabulary are never gathered). Each
// device normalizes its own tile by the log-sum-exp of the whole dim, which it finds from every
// tile's own log-sum-exp (an all-gather of one value per tile and row); the backward passes
// need one sum per row over the dim (an all-reduce). Unsharded, the op runs as it is.
//
//   _log_softmax(x, d):                    x - lse(x)          lse from the tiles' lse
//   _softmax(x, d):                        exp(x - lse(x))
//   _log_softmax_backward_data(g, y, d):   g - exp(y) * sum_d(g)
//   _softmax_backward_data(g, y, d):       y * (g - sum_d(g * y))
#include <algorithm>
#include <limits>

#include "partition/local_builder.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/local_ops.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

using ir::Arg;
using ir::ArgType;

enum class Normalizer { kSoftmax, kLogSoftmax, kSoftmaxBackward, kLogSoftmaxBackward };

// `s` with `dims` untiled.
Sharding Untiled(LocalBuilder& b, const Sharding& s, const std::vector<int64_t>& dims) {
  std::vector<AxisList> axes = s.dim_axes();
  for (int64_t d : dims) axes[d] = {};
  return Sharding::Tiled(b.program().mesh(), std::move(axes));
}

// `t` with each of `dims` of size `size(d)`.
template <typename Size>
TensorType WithDims(TensorType t, const std::vector<int64_t>& dims, Size size) {
  for (int64_t d : dims) t.shape[d] = size(d);
  return t;
}
constexpr auto kOne = [](int64_t) { return int64_t{1}; };

// torch.logsumexp(x, dims, keepdim), x's `dims` tiled over the axes of x.layout: each tile's
// own log-sum-exp (a dim of one value per tile), gathered, then theirs. A tile of padding only
// (-inf) adds nothing.
LocalValue LogSumExpOverTiles(LocalBuilder& b, const LocalValue& x,
                              const std::vector<int64_t>& dims, bool keepdim) {
  static const std::vector<ir::ArgSchema> schema = {
      {"self", ArgType::kTensor}, {"dim", ArgType::kIntList}, {"keepdim", ArgType::kBool}};
  auto tiles = [&](int64_t d) { return AxesSize(b.mesh(), x.layout.axes(d)); };
  LocalValue each = b.EmitOp("aten::logsumexp", schema, {x.value},
                             {Arg::Tensor(0), Arg::IntList(dims), Arg::Bool(true)},
                             WithDims(x.value.type(), dims, kOne), x.layout,
                             WithDims(x.global, dims, tiles));
  LocalValue all = Reshard(b.program(), each, Untiled(b, x.layout, dims));
  TensorType local = WithDims(all.value.type(), dims, kOne);
  TensorType global = WithDims(x.global, dims, kOne);
  Sharding layout = all.layout;
  if (!keepdim) {
    std::vector<AxisList> kept;
    for (int64_t d = 0, r = 0; d < x.global.rank(); ++d) {
      if (r < static_cast<int64_t>(dims.size()) && dims[r] == d) { ++r; continue; }
      kept.push_back(layout.axes(d));
    }
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
      local.shape.erase(local.shape.begin() + *it);
      global.shape.erase(global.shape.begin() + *it);
    }
    layout = Sharding::Tiled(b.program().mesh(), std::move(kept));
  }
  return b.EmitOp("aten::logsumexp", schema, {all.value},
                  {Arg::Tensor(0), Arg::IntList(dims), Arg::Bool(keepdim)}, local, layout, global);
}

// The log-sum-exp a softmax over dim d normalizes by (kept, of size 1). The kernel on the
// whole row subtracts its max first: a row holding +inf, or only -inf, gives NaN everywhere
// (inf - inf). logsumexp gives +-inf there, which would leave the finite entries finite:
// lse + (lse - lse) is NaN exactly when lse is infinite.
LocalValue SoftmaxLogSumExp(LocalBuilder& b, const LocalValue& x, int64_t d) {
  LocalValue lse = LogSumExpOverTiles(b, x, {d}, /*keepdim=*/true);
  return Binary(b, "aten::add.Tensor", lse, Binary(b, "aten::sub.Tensor", lse, lse));
}

// sum(x) over dim d (kept, of size 1), x's dim d tiled over `axes`: local sums, all-reduced.
// x's padding must be 0.
LocalValue SumOverTiles(LocalBuilder& b, const LocalValue& x, int64_t d, const AxisList& axes) {
  static const std::vector<ir::ArgSchema> schema = {{"self", ArgType::kTensor},
                                                    {"dim", ArgType::kIntList, true},
                                                    {"keepdim", ArgType::kBool},
                                                    {"dtype", ArgType::kScalarType, true}};
  LocalValue partial = b.EmitOp(
      "aten::sum.dim_IntList", schema, {x.value},
      {Arg::Tensor(0), Arg::IntList({d}), Arg::Bool(true), Arg::None()},
      WithDims(x.value.type(), {d}, kOne),
      Untiled(b, x.layout, {d}).WithPartial(axes, ReduceOp::kSum), WithDims(x.global, {d}, kOne));
  return b.Resolve(partial);
}

std::vector<LocalValue> LowerSharded(LocalBuilder& b, const std::vector<LocalValue>& ops,
                                     Normalizer kind, int64_t d, const AxisList& axes) {
  switch (kind) {
    case Normalizer::kLogSoftmax:
      return {Binary(b, "aten::sub.Tensor", ops[0], SoftmaxLogSumExp(b, ops[0], d))};
    case Normalizer::kSoftmax:
      return {Unary(b, "aten::exp",
                    Binary(b, "aten::sub.Tensor", ops[0], SoftmaxLogSumExp(b, ops[0], d)))};
    case Normalizer::kLogSoftmaxBackward: {
      const LocalValue& g = ops[0];
      LocalValue sum = SumOverTiles(b, g, d, axes);
      return {Binary(b, "aten::sub.Tensor", g, Multiply(b, Unary(b, "aten::exp", ops[1]), sum))};
    }
    case Normalizer::kSoftmaxBackward: {
      const LocalValue &g = ops[0], &y = ops[1];
      LocalValue sum = SumOverTiles(b, Multiply(b, g, y), d, axes);
      return {Multiply(b, y, Binary(b, "aten::sub.Tensor", g, sum))};
    }
  }
  return {};
}

// Every dim passes through; the normalized dim reads its whole extent. It may stay sharded
// when the op keeps its dtype (no half_to_float, no input_dtype cast), which the lowerings
// above assume.
std::optional<ShardingRule> Normalize(const ir::Node& node, Normalizer kind) {
  const TensorType& in = node.input(0).type();
  for (const ir::Value& v : node.inputs())
    if (v.type().shape != in.shape) return std::nullopt;
  if (node.output(0).shape != in.shape) return std::nullopt;
  ShardingRule rule;
  rule.executor.reads_extents = false;  // rows are independent
  TensorFactors fs = PassThroughFactors(rule, in);
  rule.operands.assign(node.inputs().size(), fs);
  rule.results = {fs};
  if (in.rank() == 0) return rule;  // (dim 0 or -1 names the scalar itself)
  const int64_t d = WrapDim(IntArg(node, ArgIndex(node, "dim")), in.rank());
  Factor& f = rule.factors[fs[d][0]];
  f.couples_tiles = true;
  bool same_dtype = true;
  for (const ir::Value& v : node.inputs()) same_dtype &= v.type().dtype == node.output(0).dtype;
  if (!same_dtype) {
    f.kind = FactorKind::kNeedReplication;
    return rule;
  }
  // A sharded vocabulary is an option, not the op's natural layout: the batch dims keep their
  // axes when both want one (rule.h).
  f.priority = -1;
  // Padding reads as -inf in the forward (exp gives 0), as 0 in the backward (adds nothing).
  f.always_mask = true;
  const bool forward = kind == Normalizer::kSoftmax || kind == Normalizer::kLogSoftmax;
  f.pad_value = forward ? -std::numeric_limits<double>::infinity() : 0.0;
  const int factor = fs[d][0];
  rule.lowering.lower = [kind, d, factor](LocalBuilder& b, const std::vector<LocalValue>& ops) {
    const AxisList& axes = b.factor_axes()[factor];
    if (axes.empty()) return b.EmitNodeOp(ops);
    return LowerSharded(b, ops, kind, d, axes);
  };
  return rule;
}

// logsumexp(x, dim[], keepdim): the kept dims pass through; the reduced ones may stay sharded
// (LogSumExpOverTiles), their padding read as -inf.
std::optional<ShardingRule> LogSumExp(const ir::Node& node) {
  const TensorType& in = node.input(0).type();
  if (in.rank() == 0) return std::nullopt;
  std::vector<int64_t> dims = IntListArg(node, ArgIndex(node, "dim"));
  if (dims.empty())  // reduces every dim, as sum does
    for (int64_t d = 0; d < in.rank(); ++d) dims.push_back(d);
  for (int64_t& d : dims) d = WrapDim(d, in.rank());
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  const bool keepdim = BoolArg(node, ArgIndex(node, "keepdim"), false);
  ShardingRule rule;
  rule.executor.reads_extents = false;  // kept dims are independent
  TensorFactors operand, result;
  std::vector<int> reduced;
  for (int64_t d = 0; d < in.rank(); ++d) {
    const bool reduces = std::binary_search(dims.begin(), dims.end(), d);
    int f = rule.AddFactor(in.shape[d],
                           reduces ? FactorKind::kReduction : FactorKind::kPassThrough);
    operand.push_back({f});
    if (!reduces) {
      result.push_back({f});
      continue;
    }
    rule.factors[f].pad_value = -std::numeric_limits<double>::infinity();
    reduced.push_back(f);
    if (keepdim) result.push_back({});
  }
  rule.operands = {operand};
  rule.results = {result};
  rule.lowering.lower = [dims, keepdim, reduced](LocalBuilder& b, const std::vector<LocalValue>& ops) {
    bool sharded = false;
    for (int f : reduced) sharded |= !b.factor_axes()[f].empty();
    if (!sharded) return b.EmitNodeOp(ops);
    return std::vector<LocalValue>{LogSumExpOverTiles(b, ops[0], dims, keepdim)};
  };
  return rule;
}

RuleBuilder With(Normalizer kind) {
  return [kind](const ir::Node& n) { return Normalize(n, kind); };
}

}  // namespace

void RegisterSoftmaxRules() {
  RegisterRule("aten::_softmax", With(Normalizer::kSoftmax));
  RegisterRule("aten::_log_softmax", With(Normalizer::kLogSoftmax));
  RegisterRule("aten::_softmax_backward_data", With(Normalizer::kSoftmaxBackward));
  RegisterRule("aten::_log_softmax_backward_data", With(Normalizer::kLogSoftmaxBackward));
  RegisterRule("aten::logsumexp", LogSumExp);
}

}  // namespace spmd::partition
