// Running one op over the stacked shards of all devices (stacked.h) as one plain call, by
// merging each input's device rows into one of its own dims.
//
// If a pass-through factor f of the op's rule (a loop index every element of the result keeps)
// is a plain dim of every result and of the inputs that vary over devices one way, and of no
// other input, then the op on those inputs with their rows concatenated along f's dim is the
// op on each row, side by side along f in the results. E.g. `addmm(bias, x, w)` with x stacked
// [G, n, k] and w, bias replicated is `addmm(bias, x as [G*n, k], w)` = [G*n, m] -> [G, n, m]:
// exactly the call CPU eager makes for the global batch. Inputs varying in different ways
// (a 2-D mesh: activations over 'data' [4 rows], weights over 'model' [2 rows]) each merge
// into a factor of their own, and the result holds every combination: `mm(x, w)` with x
// [4, n, k] and w [2, k, m] is one mm of [4n, k] by [k, 2m], split to [4, 2, n, m] = 8 rows,
// when the devices hold exactly those 8 combinations.
#pragma once
#include <ATen/Tensor.h>

#include <optional>
#include <vector>

#include "ir/node.h"
#include "partition/op_traits.h"
#include "runtime/stacked.h"

namespace spmd::runtime {

// What the op's traits offer (the compiler's, from its rule), computed once per instruction.
struct MergeFactors {
  // Per candidate factor (a pass-through factor that is a plain dim of every result): for each
  // input the dim it is (-1: absent, -2: part of a compound dim), and for each result its dim.
  std::vector<std::vector<int>> input_dim;
  std::vector<std::vector<int>> output_dim;
  bool any() const { return !input_dim.empty(); }
};
MergeFactors MergeFactorsOf(const ir::Node& node, const partition::OpTraits& traits);

struct MergePlan {
  RowMapPtr map;              // the results' rows: every combination of the groups' rows
  std::vector<int> input_dim;  // per input: the dim its rows merge into, -1: passed as it is
  // Per group of inputs that vary alike (in order): its rows and each result's dim.
  std::vector<int64_t> group_rows;
  std::vector<std::vector<int>> output_dim;  // [result][group]
};

// A plan for these inputs, or nullopt when no factor assignment works (or the devices do not
// hold exactly every combination of the groups' rows).
std::optional<MergePlan> PlanMerge(const MergeFactors& factors,
                                   const std::vector<const Stacked*>& inputs);

// `rows` [M, *local] with the row dim merged into local dim `dim` (rows major).
at::Tensor MergeRows(const at::Tensor& rows, int dim);
// A result with each group's rows split out of its dim and moved to the front, flattened to
// one row dim in group order: [prod(group_rows), *local].
at::Tensor SplitRows(const at::Tensor& result, const std::vector<int>& dims,
                     const std::vector<int64_t>& group_rows);

}  // namespace spmd::runtime
