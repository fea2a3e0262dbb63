#include "partition/op_traits.h"

#include "partition/rules/rule.h"

namespace spmd::partition {

OpTraits TraitsOf(const ir::Node& node) {
  OpTraits traits;
  RulePtr rule = GetRule(node);
  if (!rule) return traits;
  traits.elementwise = rule->executor.elementwise;
  traits.mergeable = !rule->lowering.local_args && !rule->executor.reads_extents;
  traits.additive = rule->algebra.additive;
  traits.view = rule->executor.view;
  traits.reads_strides = rule->executor.reads_strides;
  if (rule->operands.size() != node.inputs().size() ||
      rule->results.size() != static_cast<size_t>(node.num_outputs()))
    return traits;
  for (size_t f = 0; f < rule->factors.size(); ++f) {
    const Factor& factor = rule->factors[f];
    TraitFactor t;
    if (factor.kind == FactorKind::kPassThrough && !factor.windowed && !factor.couples_tiles)
      t.use = TraitFactor::Use::kMerge;
    else if (factor.kind == FactorKind::kReduction && factor.sums)
      t.use = TraitFactor::Use::kFold;
    if (t.use != TraitFactor::Use::kNone) {
      for (const TensorFactors& operand : rule->operands)
        t.operand_dim.push_back(DimOfFactor(operand, static_cast<int>(f)));
      for (const TensorFactors& result : rule->results)
        t.result_dim.push_back(DimOfFactor(result, static_cast<int>(f)));
    }
    traits.factors.push_back(std::move(t));
  }
  return traits;
}

}  // namespace spmd::partition
