// Folded contractions: computing a partial sum already summed.
//
// An op summing over a factor that is sharded over mesh axes A leaves each device a partial
// sum, which an all-reduce or reduce-scatter over A then adds up. With the devices' shards
// stacked (stacked.h), the executor can instead run the op once per group of A with the
// members' tiles of that factor concatenated: by the factor's `sums` property (rules/rule.h)
// that gives the group's sum directly (a data-parallel weight gradient is one `mm` over all
// tokens, not eight `mm`s over an eighth of the contraction each, at a third of the speed),
// and the results that keep the factor (a layer norm backward's input gradient) come out
// side by side along it. The collective then only splits (reduce-scatter) and is counted.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ir/node.h"
#include "partition/op_traits.h"
#include "runtime/stacked.h"

namespace spmd::runtime {

struct FoldPlan {
  MeshGroups groups;              // the pending reduction's (over axes A)
  std::vector<int> operand_dim;   // per node input: its dim made of the factor, -1 if it lacks it
  std::vector<int> result_dim;    // per node output: its dim of the factor, -1 summed, -2 none
};

// The plan for `node` (a summing factor of its traits), or null. `reaches_reduction(output, axes)`: whether that output reaches
// an all-reduce or reduce-scatter (sum) over exactly `axes` through views only, read nowhere
// else. Every result without the factor must be partial over one set of axes A and reach such
// a reduction; every result with it must be a plain dim of it.
std::shared_ptr<const FoldPlan> FoldPlanOf(
    const ir::Node& node, const partition::OpTraits& traits,
    const std::function<bool(int, const std::vector<int>&)>& reaches_reduction);

// The operands folded: per node input, [U, ...] over the U distinct groups (an operand that
// lacks the factor: its one value per group), and the grouping. nullopt when an operand lacking
// the factor differs between the members of a group (it cannot be read once for all of them).
struct FoldedOperands {
  std::vector<at::Tensor> rows;
  Grouped grouped;
};
std::optional<FoldedOperands> FoldOperands(const FoldPlan& plan,
                                           const std::vector<const Stacked*>& inputs);

// The op's results over the groups ([U, ...] each) as values: summed results one row per group
// (Stacked::summed), results keeping the factor split back into their members' tiles.
std::vector<Stacked> UnfoldResults(const FoldPlan& plan, const Grouped& grouped,
                                   const std::vector<Stacked>& per_group);

}  // namespace spmd::runtime
