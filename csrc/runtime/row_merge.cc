#include "runtime/row_merge.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_set>

namespace spmd::runtime {

MergeFactors MergeFactorsOf(const ir::Node& node, const partition::OpTraits& traits) {
  MergeFactors out;
  // Shape-valued args (view sizes) would name the unmerged extent.
  if (!traits.mergeable) return out;
  for (const ir::Arg& a : node.args())  // channels-last has no meaning for a merged tensor
    if (a.kind == ir::Arg::Kind::kMemoryFormat &&
        a.i >= static_cast<int64_t>(c10::MemoryFormat::ChannelsLast))
      return out;
  for (const partition::TraitFactor& factor : traits.factors) {
    if (factor.use != partition::TraitFactor::Use::kMerge) continue;
    std::vector<int> outputs(node.num_outputs(), -1);
    bool in_every_result = true;
    for (int o = 0; o < node.num_outputs() && in_every_result; ++o) {
      if (node.output(o).dtype == DType::kUndefined) continue;
      outputs[o] = factor.result_dim[o];
      in_every_result = outputs[o] >= 0;
    }
    if (!in_every_result) continue;
    out.input_dim.push_back(factor.operand_dim);
    out.output_dim.push_back(std::move(outputs));
  }
  return out;
}

namespace {

// A plan over several groups of rows: the results hold every combination of their rows, which
// must be exactly the combinations the devices hold (else nullopt). Among the orders of the
// groups (the split puts their row dims in any order at no cost), prefer one numbering the
// devices' rows 0..N-1 as the devices (a row-major mesh), so that other values holding one
// row per device align.
std::optional<MergePlan> OrderGroups(MergePlan plan, const std::vector<RowMapPtr>& maps) {
  const int64_t n = maps[0]->num_devices();
  std::vector<size_t> order(maps.size());
  for (size_t g = 0; g < order.size(); ++g) order[g] = g;
  std::optional<std::vector<size_t>> best;
  std::shared_ptr<RowMap> best_map;
  do {
    auto joint = std::make_shared<RowMap>();
    joint->row_of.resize(n);
    joint->rows = 1;
    for (const RowMapPtr& m : maps) joint->rows *= m->rows;
    std::unordered_set<int32_t> seen;
    bool identity = true;
    for (int64_t d = 0; d < n; ++d) {
      int64_t row = 0;
      for (size_t g : order) row = row * maps[g]->rows + maps[g]->row_of[d];
      joint->row_of[d] = static_cast<int32_t>(row);
      seen.insert(static_cast<int32_t>(row));
      identity &= row == d;
    }
    if (static_cast<int64_t>(seen.size()) != joint->rows) return std::nullopt;
    if (!best || identity) {
      best = order;
      best_map = std::move(joint);
    }
    if (identity) break;
  } while (std::next_permutation(order.begin(), order.end()));
  // Reorder the groups' split dims and rows to the chosen order.
  MergePlan ordered = plan;
  for (size_t k = 0; k < best->size(); ++k) {
    ordered.group_rows[k] = plan.group_rows[(*best)[k]];
    for (size_t o = 0; o < plan.output_dim.size(); ++o)
      ordered.output_dim[o][k] = plan.output_dim[o][(*best)[k]];
  }
  ordered.map = best_map->rows == n && *best_map == *IdentityMap(n) ? IdentityMap(n) : best_map;
  return ordered;
}

}  // namespace

std::optional<MergePlan> PlanMerge(const MergeFactors& factors,
                                   const std::vector<const Stacked*>& inputs) {
  // Inputs that vary over devices, grouped by how they vary.
  std::vector<RowMapPtr> maps;
  std::vector<int> group(inputs.size(), -1);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i]->replicated()) continue;
    auto it = std::find_if(maps.begin(), maps.end(),
                           [&](const RowMapPtr& m) { return SameMap(m, inputs[i]->map); });
    group[i] = static_cast<int>(it - maps.begin());
    if (it == maps.end()) maps.push_back(inputs[i]->map);
  }
  if (maps.empty()) return std::nullopt;
  // Each group takes a factor all of its inputs have and no other input has.
  MergePlan plan;
  plan.input_dim.assign(inputs.size(), -1);
  plan.output_dim.assign(factors.output_dim.empty() ? 0 : factors.output_dim[0].size(), {});
  std::vector<bool> used(factors.input_dim.size(), false);
  for (size_t g = 0; g < maps.size(); ++g) {
    int chosen = -1;
    for (size_t c = 0; c < factors.input_dim.size() && chosen < 0; ++c) {
      if (used[c]) continue;
      bool fits = true;
      for (size_t i = 0; i < inputs.size() && fits; ++i) {
        const int dim = factors.input_dim[c][i];
        fits = group[i] == static_cast<int>(g) ? dim >= 0 : dim == -1;
      }
      if (fits) chosen = static_cast<int>(c);
    }
    if (chosen < 0) return std::nullopt;
    used[chosen] = true;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (group[i] == static_cast<int>(g)) plan.input_dim[i] = factors.input_dim[chosen][i];
    for (size_t o = 0; o < plan.output_dim.size(); ++o)
      plan.output_dim[o].push_back(factors.output_dim[chosen][o]);
    plan.group_rows.push_back(maps[g]->rows);
  }
  if (maps.size() == 1) {
    plan.map = maps[0];
    return plan;
  }
  return OrderGroups(std::move(plan), maps);
}

at::Tensor MergeRows(const at::Tensor& rows, int dim) {
  return (dim == 0 ? rows : rows.movedim(0, dim)).flatten(dim, dim + 1);
}

at::Tensor SplitRows(const at::Tensor& result, const std::vector<int>& dims,
                     const std::vector<int64_t>& group_rows) {
  // Split the dims from the last to the first, so that each split leaves the others' places.
  std::vector<size_t> order(dims.size());
  for (size_t g = 0; g < order.size(); ++g) order[g] = g;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return dims[a] > dims[b]; });
  std::vector<int64_t> at(dims.size());
  at::Tensor t = result;
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t g = order[k];
    t = t.unflatten(dims[g], {group_rows[g], -1});
    for (size_t j = 0; j < k; ++j) at[order[j]] += 1;  // the later dims moved right by one
    at[g] = dims[g];
  }
  std::vector<int64_t> front(dims.size());
  for (size_t g = 0; g < front.size(); ++g) front[g] = static_cast<int64_t>(g);
  t = t.movedim(at, front);
  // One group: the rows as the merged call laid them out, a strided view. Pointwise readers
  // follow that layout, a reshape keeps viewing it, and the next merged or folded call reads
  // it back as the dense tensor it is: a column-parallel layer's output feeds the
  // row-parallel one with no copy in between (copying here, and again for the next merge,
  // cost Megatron over 64 devices 15% of its step). Kernels that read raw memory get
  // contiguous inputs (Instruction::contiguous_inputs).
  return dims.size() == 1 ? t : t.flatten(0, static_cast<int64_t>(dims.size()) - 1);
}

}  // namespace spmd::runtime
