// Reductions. The reduced dims are reduction factors when partial results combine exactly
// (sum, amax, amin, mean after rescaling); otherwise (var, std, norms, argmax, max with
// indices, prod, any/all, cumulative ops) they need replication (logsumexp: softmax.cc).
// Kept dims are pass-through; keepdim leaves a size-1 dim with no factor.
#include <cmath>
#include <limits>

#include "core/shape.h"
#include "partition/local_builder.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

enum class Combine { kSum, kMax, kMin, kMean, kNone };

// The reduced dims of a reduction node: its `dim` argument, or every dim when it is absent or
// empty ("reduce all"), as ATen does.
std::vector<bool> ReducedDims(const ir::Node& node, int64_t rank) {
  std::vector<bool> reduced(rank, false);
  int dim_arg = ArgIndex(node, "dim");
  std::vector<int64_t> dims = IntListArg(node, dim_arg);
  bool all = dim_arg < 0 || node.arg(dim_arg).is_none() || dims.empty();
  for (int64_t d = 0; d < rank; ++d) reduced[d] = all;
  for (int64_t d : dims) reduced[WrapDim(d, rank)] = true;
  return reduced;
}

std::optional<ShardingRule> Reduction(const ir::Node& node, Combine combine) {
  const TensorType& in = node.input(0).type();
  if (in.rank() == 0) return std::nullopt;
  std::vector<bool> reduced = ReducedDims(node, in.rank());
  bool keepdim = BoolArg(node, ArgIndex(node, "keepdim"), false);
  ShardingRule rule;
  rule.executor.reads_extents = false;  // kept dims are independent
  TensorFactors operand, result;
  for (int64_t d = 0; d < in.rank(); ++d) {
    if (!reduced[d]) {
      int f = rule.AddFactor(in.shape[d]);
      operand.push_back({f});
      result.push_back({f});
      continue;
    }
    Factor factor;
    factor.size = in.shape[d];
    factor.kind = FactorKind::kReduction;
    switch (combine) {
      case Combine::kSum: factor.sums = true; break;
      case Combine::kMean: break;
      case Combine::kMax:
        factor.reduce = ReduceOp::kMax;
        factor.pad_value = -std::numeric_limits<double>::infinity();
        break;
      case Combine::kMin:
        factor.reduce = ReduceOp::kMin;
        factor.pad_value = std::numeric_limits<double>::infinity();
        break;
      case Combine::kNone: factor.kind = FactorKind::kNeedReplication; break;
    }
    rule.factors.push_back(factor);
    operand.push_back({static_cast<int>(rule.factors.size()) - 1});
    if (keepdim) result.push_back({});
  }
  rule.operands.push_back(operand);
  for (int o = 0; o < node.num_outputs(); ++o) rule.results.push_back(result);
  if (combine == Combine::kMean) {
    // The local mean divides by the local (padded) extent: rescale by local/global extent so
    // that summing the partial means over the devices gives the global mean.
    rule.lowering.lower = [reduced](LocalBuilder& b, const std::vector<LocalValue>& operands) {
      std::vector<LocalValue> r = b.EmitNodeOp(operands);
      double scale = 1;
      for (size_t d = 0; d < reduced.size(); ++d)
        if (reduced[d])
          scale *= static_cast<double>(operands[0].local_shape()[d]) / operands[0].global.shape[d];
      r[0] = b.Scale(r[0], scale);
      return r;
    };
  }
  return rule;
}

// histc(self, bins, min, max): counts of self's elements per bin, a sum over every element:
// each dim a summed reduction (partial histograms add up), the padding NaN (counted nowhere).
// Only with constant bounds min < max: min == max takes the data's own range, which partial
// histograms would not share.
std::optional<ShardingRule> Histogram(const ir::Node& node) {
  const TensorType& in = node.input(0).type();
  const int lo = ArgIndex(node, "min"), hi = ArgIndex(node, "max");
  if (in.rank() == 0 || lo < 0 || hi < 0) return std::nullopt;
  const ir::Arg &min = node.arg(lo), &max = node.arg(hi);
  auto value = [](const ir::Arg& a) {
    return a.kind == ir::Arg::Kind::kScalarDouble ? a.d : static_cast<double>(a.i);
  };
  const bool constant = !min.dynamic && !max.dynamic && min.is_scalar() && max.is_scalar();
  if (!constant || !(value(min) < value(max))) return std::nullopt;
  ShardingRule rule;
  TensorFactors operand;
  for (int64_t d = 0; d < in.rank(); ++d) {
    const int f = rule.AddFactor(in.shape[d], FactorKind::kReduction);
    rule.factors[f].sums = true;
    rule.factors[f].pad_value = std::numeric_limits<double>::quiet_NaN();
    operand.push_back({f});
  }
  rule.operands = {operand};
  rule.results = {{{}}};
  return rule;
}

RuleBuilder With(Combine c) {
  return [c](const ir::Node& n) { return Reduction(n, c); };
}

}  // namespace

void RegisterReductionRules() {
  RegisterRules({"aten::sum"}, LinearIn(With(Combine::kSum)));
  RegisterRule("aten::histc", Histogram);
  RegisterRules({"aten::nansum"}, With(Combine::kSum));
  RegisterRules({"aten::mean"}, LinearIn(With(Combine::kMean)));
  RegisterRules({"aten::amax", "aten::max"}, With(Combine::kMax));
  RegisterRules({"aten::amin", "aten::min"}, With(Combine::kMin));
  // max.dim/min.dim also return indices, which cannot be combined from partial results.
  RegisterRules({"aten::max.dim", "aten::min.dim", "aten::argmax", "aten::argmin",
                 "aten::var", "aten::std", "aten::var_mean", "aten::std_mean",
                 "aten::prod", "aten::norm", "aten::linalg_vector_norm",
                 "aten::any", "aten::all", "aten::median", "aten::nanmedian"},
                With(Combine::kNone));
}

}  // namespace spmd::partition
