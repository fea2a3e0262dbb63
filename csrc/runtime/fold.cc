#include "runtime/fold.h"

#include <ATen/ATen.h>


namespace spmd::runtime {

namespace {

// The plan folding factor f, or null.
std::shared_ptr<const FoldPlan> PlanFor(
    const ir::Node& node, const partition::TraitFactor& factor,
    const std::function<bool(int, const std::vector<int>&)>& reaches_reduction) {
  std::vector<int> result_dim(node.num_outputs(), -2);
  std::optional<std::vector<int>> axes;  // of the summed results' pending reduction
  for (int o = 0; o < node.num_outputs(); ++o) {
    if (node.output(o).dtype == DType::kUndefined) continue;
    const int d = factor.result_dim[o];
    if (d == -2) return nullptr;
    const Sharding& layout = node.shardings()[o];
    const bool partial = layout.valid() && layout.IsPartial();
    if (d >= 0) {  // kept: side by side along the factor
      if (partial) return nullptr;
      result_dim[o] = d;
      continue;
    }
    if (!partial || layout.partial_op() != ReduceOp::kSum) return nullptr;
    std::vector<int> a(layout.partial_axes().begin(), layout.partial_axes().end());
    if (axes && *axes != a) return nullptr;
    axes = a;
    result_dim[o] = -1;
  }
  if (!axes) return nullptr;  // nothing summed
  for (int o = 0; o < node.num_outputs(); ++o)
    if (result_dim[o] == -1 && !reaches_reduction(o, *axes)) return nullptr;
  std::vector<int> operand_dim(node.inputs().size());
  bool any = false;
  for (size_t i = 0; i < operand_dim.size(); ++i) {
    operand_dim[i] = factor.operand_dim[i];
    if (operand_dim[i] == -2) return nullptr;
    any |= operand_dim[i] >= 0;
  }
  if (!any) return nullptr;
  return std::make_shared<FoldPlan>(
      FoldPlan{MeshGroups(node.shardings()[0].mesh(), *axes), std::move(operand_dim),
               std::move(result_dim)});
}

}  // namespace

std::shared_ptr<const FoldPlan> FoldPlanOf(
    const ir::Node& node, const partition::OpTraits& traits,
    const std::function<bool(int, const std::vector<int>&)>& reaches_reduction) {
  if (node.op()->internal || node.shardings().size() != static_cast<size_t>(node.num_outputs()))
    return nullptr;
  // Any summed factor will do: by its `sums` property each gives the same results.
  for (const partition::TraitFactor& factor : traits.factors) {
    if (factor.use != partition::TraitFactor::Use::kFold) continue;
    if (auto plan = PlanFor(node, factor, reaches_reduction)) return plan;
  }
  return nullptr;
}

std::optional<FoldedOperands> FoldOperands(const FoldPlan& plan,
                                           const std::vector<const Stacked*>& inputs) {
  FoldedOperands out{{}, ByGroup(inputs, plan.groups)};
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = out.grouped.rows[i];  // [U, k, *local]
    const int d = plan.operand_dim[i];
    if (d >= 0) {
      out.rows.push_back(t.movedim(1, d + 1).flatten(d + 1, d + 2));
    } else if (t.size(1) == 1 || t.stride(1) == 0) {
      out.rows.push_back(t.select(1, 0));  // the same for every member: read once
    } else {
      return std::nullopt;
    }
  }
  return out;
}

std::vector<Stacked> UnfoldResults(const FoldPlan& plan, const Grouped& grouped,
                                   const std::vector<Stacked>& per_group) {
  const int64_t k = plan.groups.group_size();
  std::vector<Stacked> results(per_group.size());
  for (size_t o = 0; o < per_group.size(); ++o) {
    if (plan.result_dim[o] == -2 || !per_group[o].defined()) continue;
    at::Tensor rows = per_group[o].rows;  // [U, ...]
    if (rows.size(0) != grouped.group_map->rows) {  // alike in every group
      std::vector<int64_t> shape = rows.sizes().vec();
      shape[0] = grouped.group_map->rows;
      rows = rows.expand(shape);
    }
    if (plan.result_dim[o] == -1) {
      results[o] = Stacked{rows, grouped.group_map};
      results[o].summed = true;
      continue;
    }
    // The members' tiles side by side along the factor's dim: one row per member (a strided
    // view, as SplitRows leaves merged rows).
    const int64_t d = plan.result_dim[o] + 1;
    at::Tensor members = rows.unflatten(d, {k, rows.size(d) / k}).movedim(d, 1).flatten(0, 1);
    results[o] = Stacked{members, grouped.member_map};
  }
  return results;
}

}  // namespace spmd::runtime
