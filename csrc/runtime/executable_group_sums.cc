// Ops on values that are sums over groups of devices: an additive op on the group sums of its
// operands, an op run once per group, and contractions folded over a factor's tiles.
#include "runtime/executable.h"

#include <ATen/ATen.h>

#include "core/metrics.h"
#include "runtime/batched_run.h"
#include "runtime/kernel_call.h"

namespace spmd::runtime {

std::vector<Stacked> Executable::RunOnGroupSums(const Instruction& ins,
                                                const std::vector<const Stacked*>& inputs,
                                                const std::vector<ir::ScalarValue>& scalars) const {
  const FoldPlan& plan = *ins.sums_over;
  Grouped g = ByGroup(inputs, plan.groups);
  const int64_t k = plan.groups.group_size();
  std::vector<at::Tensor> sums(inputs.size());  // per operand, [U, ...]
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = g.rows[i];  // [U, k, ...]
    if (inputs[i]->summed) sums[i] = t.select(1, 0);  // each member holds the group's sum
    else if (t.size(1) == 1 || t.stride(1) == 0) sums[i] = t.select(1, 0) * k;
    else sums[i] = t.sum(1);
  }
  std::vector<Stacked> per_group = RunPerGroup(ins, std::move(sums), g.group_map, scalars);
  Count("GroupSumOps");
  return UnfoldResults(plan, g, per_group);
}

std::vector<Stacked> Executable::RunPerGroup(const Instruction& ins, std::vector<at::Tensor> rows,
                                             const RowMapPtr& map,
                                             const std::vector<ir::ScalarValue>& scalars) const {
  const int64_t n = map->num_devices();
  if (ins.contiguous_inputs)
    for (at::Tensor& r : rows) r = r.contiguous();
  std::vector<Stacked> per_group;
  if (map->rows == 1) {
    std::vector<at::Tensor> args(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) args[i] = rows[i].select(0, 0);
    for (at::Tensor& out : CallKernel(ins, std::move(args), scalars, 0))
      per_group.push_back(out.defined() ? StackReplicated(out, n) : Stacked{});
    return per_group;
  }
  // One row per group: run stacked like any op (an operand alike in every group, a weight
  // read by each group, passes as it is).
  std::vector<Stacked> stacks(rows.size());
  std::vector<const Stacked*> per_operand(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    stacks[i] = rows[i].stride(0) == 0 ? StackReplicated(rows[i].select(0, 0), n)
                                        : Stacked{rows[i], map};
    per_operand[i] = &stacks[i];
  }
  std::optional<std::vector<Stacked>> out = RunBatched(ins, per_operand, scalars);
  return out ? std::move(*out) : RunPerRow(ins, Align(per_operand, nullptr), scalars, nullptr);
}

std::optional<std::vector<Stacked>> Executable::RunFolded(
    const Instruction& ins, const std::vector<const Stacked*>& inputs,
    const std::vector<ir::ScalarValue>& scalars) const {
  std::optional<FoldedOperands> folded = FoldOperands(*ins.fold, inputs);
  if (!folded) return std::nullopt;
  std::vector<Stacked> per_group =
      RunPerGroup(ins, std::move(folded->rows), folded->grouped.group_map, scalars);
  Count("FoldedContractions");
  return UnfoldResults(*ins.fold, folded->grouped, per_group);
}

}  // namespace spmd::runtime
