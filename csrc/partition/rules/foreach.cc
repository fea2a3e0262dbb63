// Ops pointwise over lists of tensors: torch 2.x optimizers' `_foreach_*` kernels (the default
// on accelerators) and the `_fused_*` optimizer steps. Element i of every list argument and of
// every result list is one pointwise op of its own: result i's dims are pass-through factors,
// list elements i broadcast onto them, and a lone tensor argument (a learning rate or step
// held as a tensor, a grad scale) is read whole by every element, so it stays replicated.
// Sharded parameters, gradients and optimizer state therefore update locally, as with the
// per-tensor ops a for-loop optimizer records.
//
// Ops of the family that are not elementwise per list element (`_foreach_norm`, `_foreach_max`,
// `_foreach_powsum`: a 0-dim result per tensor; `_foreach_mm`) get no rule, and the recorder
// lets them decompose into per-tensor ops, which have rules of their own.
#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

std::optional<ShardingRule> ListPointwise(const ir::Node& node) {
  // The list length N: the longest tensor-list argument.
  size_t n = 0;
  for (const ir::Arg& a : node.args())
    if (a.kind == ir::Arg::Kind::kTensorList) n = std::max(n, a.ints.size());
  if (n == 0 || node.num_outputs() % n != 0) return std::nullopt;

  // Result lists come one after another: result r is element r % n of its list. Element i's
  // factors come from the first result list; a 0-dim result element mirrors a 0-dim list
  // argument (the fused optimizers return their step counts) and is replicated like it.
  ShardingRule rule;
  rule.executor.reads_extents = false;  // each element from the elements at its index
  rule.executor.elementwise = true;
  std::vector<TensorFactors> element(n);
  for (size_t i = 0; i < n; ++i) {
    element[i] = PassThroughFactors(rule, node.output(i));
    for (const DimFactors& dim : element[i]) rule.factors[dim[0]].group = static_cast<int>(i);
  }
  auto has_scalar_element = [&](size_t i) {
    for (const ir::Arg& a : node.args())
      if (a.kind == ir::Arg::Kind::kTensorList && a.ints.size() == n &&
          node.inputs()[a.ints[i]].type().rank() == 0)
        return true;
    return false;
  };
  for (int r = 0; r < node.num_outputs(); ++r) {
    size_t i = r % n;
    const TensorType& out = node.output(r);
    if (out.shape == node.output(i).shape) rule.results.push_back(element[i]);
    else if (out.rank() == 0 && has_scalar_element(i)) rule.results.push_back({});
    else return std::nullopt;
  }
  rule.operands.assign(node.inputs().size(), {});
  for (int in = 0; in < static_cast<int>(node.inputs().size()); ++in)
    rule.operands[in] = TensorFactors(node.inputs()[in].type().rank());  // replicated
  for (const ir::Arg& a : node.args()) {
    if (a.kind != ir::Arg::Kind::kTensorList || a.ints.size() != n) continue;
    for (size_t i = 0; i < n; ++i) {
      const TensorType& t = node.inputs()[a.ints[i]].type();
      // An element larger than its result would be a reduction: not a pointwise list op.
      if (t.rank() > node.output(i).rank()) return std::nullopt;
      rule.operands[a.ints[i]] = BroadcastFactors(t, node.output(i), element[i]);
    }
  }
  return rule;
}

// The fused optimizer steps update their lists in place (the functional `_fused_adam` exists
// only as functionalization's form of `_fused_adam_`, `_foreach_copy` of `_foreach_copy_`):
// result list j is tensor-list argument j, element by element.
std::optional<ShardingRule> InPlaceListPointwise(const ir::Node& node) {
  std::optional<ShardingRule> rule = ListPointwise(node);
  if (!rule) return rule;
  std::vector<const ir::Arg*> lists;
  for (const ir::Arg& a : node.args())
    if (a.kind == ir::Arg::Kind::kTensorList) lists.push_back(&a);
  const size_t n = lists.empty() ? 0 : lists[0]->ints.size();
  rule->cost.updates_operand.assign(node.num_outputs(), -1);
  for (int r = 0; r < node.num_outputs() && n > 0; ++r) {
    const size_t j = r / n, i = r % n;
    if (j < lists.size() && lists[j]->ints.size() == n &&
        node.input(lists[j]->ints[i]).type() == node.output(r))
      rule->cost.updates_operand[r] = static_cast<int>(lists[j]->ints[i]);
  }
  return rule;
}

}  // namespace

void RegisterForeachRules() {
  RegisterRulePrefix("aten::_foreach_", ListPointwise,
                     {"aten::_foreach_norm", "aten::_foreach_max", "aten::_foreach_powsum",
                      "aten::_foreach_mm", "aten::_foreach_copy"});
  // (Like the fused steps, the functional _foreach_copy is only functionalization's form of
  // _foreach_copy_: the copies land in the destinations' memory.)
  RegisterRule("aten::_foreach_copy", InPlaceListPointwise);
  RegisterRules({"aten::_fused_adam", "aten::_fused_adamw", "aten::_fused_sgd",
                 "aten::_fused_adagrad", "aten::_fused_adam_", "aten::_fused_adamw_",
                 "aten::_fused_sgd_", "aten::_fused_adagrad_"},
                InPlaceListPointwise);
}

}  // namespace spmd::partition
