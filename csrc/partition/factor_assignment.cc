#include "partition/factor_assignment.h"

#include <algorithm>
#include <unordered_map>

namespace spmd::partition {

namespace {

bool IsTrivialFactorInCompound(const ShardingRule& rule, const DimFactors& dim, int f) {
  return dim.size() > 1 && rule.factors[f].size == 1;
}

// Walks a dim's factors major to minor and returns how many of them keep their axes: a factor
// after the first not-fully-sharded one cannot be sharded, and in a multi-factor dim every
// sharded factor must be evenly divided by its axes.
size_t UsableFactors(const ShardingRule& rule, const Mesh& mesh, const DimFactors& dim,
                     const FactorAxes& factor_axes) {
  if (dim.size() <= 1) return dim.size();
  size_t k = 0;
  for (; k < dim.size(); ++k) {
    int f = dim[k];
    if (IsTrivialFactorInCompound(rule, dim, f)) continue;
    int64_t size = rule.factors[f].size;
    int64_t tiles = AxesSize(mesh, factor_axes[f]);
    if (size % tiles != 0) return k;  // uneven: this factor cannot be sharded here
    if (tiles < size) return k + 1;   // later factors must stay unsharded
  }
  return k;
}

int64_t TensorBytes(const TensorType& t) { return std::max<int64_t>(t.bytes(), 1); }

// Whether windowed factor `f` may be cut into `tiles` tiles: within its max_tiles, and every
// dim made of it (of every operand and result) divisible by `tiles`.
bool WindowedTilingOk(const ShardingRule& rule, int f, int64_t tiles,
                      const std::vector<TensorType>& operand_types,
                      const std::vector<TensorType>& result_types) {
  const Factor& factor = rule.factors[f];
  if (factor.max_tiles > 0 && tiles > factor.max_tiles) return false;
  auto even = [&](const std::vector<TensorFactors>& tensors, const std::vector<TensorType>& types) {
    for (size_t i = 0; i < tensors.size() && i < types.size(); ++i)
      for (size_t d = 0; d < tensors[i].size() && d < types[i].shape.size(); ++d)
        if (tensors[i][d] == DimFactors{f} && types[i].shape[d] % tiles != 0) return false;
    return true;
  };
  return even(rule.operands, operand_types) && even(rule.results, result_types);
}

}  // namespace

namespace {

// ProjectToFactors into `out`, which holds no axes for the factors of `tensor`: only those
// entries are written, so a caller can reuse one `out` for every tensor of an op (a
// `_foreach_` op has thousands of factors, each tensor a few).
void ProjectInto(const ShardingRule& rule, const TensorFactors& tensor, const Sharding& sharding,
                 FactorAxes& out) {
  if (!sharding.valid() || sharding.rank() != static_cast<int64_t>(tensor.size())) return;
  const Mesh& mesh = sharding.mesh();
  for (size_t d = 0; d < tensor.size(); ++d) {
    const DimFactors& dim = tensor[d];
    const AxisList& axes = sharding.axes(d);
    if (dim.empty() || axes.empty()) continue;
    if (dim.size() == 1) {
      out[dim[0]] = axes;
      continue;
    }
    size_t pos = 0;
    for (int f : dim) {
      if (IsTrivialFactorInCompound(rule, dim, f)) continue;
      int64_t size = rule.factors[f].size, prod = 1;
      while (pos < axes.size()) {
        int64_t next = prod * mesh.axis_size(axes[pos]);
        if (next > size || size % next != 0) break;
        out[f].push_back(axes[pos++]);
        prod = next;
      }
      if (prod < size || pos >= axes.size()) break;
    }
  }
}

// Axes a tensor proposes for one factor, and how big that tensor is.
struct Candidate {
  AxisList axes;
  int64_t bytes;
  int tensor;  // operands 0.., then results
};

bool SharesAxis(const AxisList& a, const AxisList& b) {
  for (int x : a)
    if (std::find(b.begin(), b.end(), x) != b.end()) return true;
  return false;
}

// Per factor of `factors` (each with candidates, largest first): the bytes that giving it its
// largest proposer's axes moves when another factor of its iteration space wants one of those
// axes too (0 without such a competitor): the tensors proposing them for the other factor
// must be resharded, and a reduction factor leaves the results without it partial, to be
// reduced (a result already counted as a proposer moves once). XLA's dot partitioner and
// Shardy's propagation take the cheaper side of such a conflict; the larger tensor alone does
// not tell it: an activation tiled on its hidden dim feeding a column-parallel weight whose
// result is as large as it is cheaper gathered than contracted tiled (which moves the weight
// and reduce-scatters the result).
std::vector<int64_t> ConflictBytes(const ShardingRule& rule,
                                   const std::vector<std::vector<Candidate>>& candidates,
                                   const std::vector<int>& factors, int first_result,
                                   const std::vector<TensorType>& result_types) {
  std::vector<int64_t> moved(rule.factors.size(), 0);
  std::unordered_map<int, std::vector<int>> by_group;
  for (int f : factors) by_group[rule.factors[f].group].push_back(f);
  for (const auto& [group, members] : by_group) {
    if (members.size() < 2) continue;
    for (int f : members) {
      const AxisList& want = candidates[f][0].axes;
      std::vector<int> counted;
      int64_t bytes = 0;
      for (int g : members) {
        if (g == f) continue;
        for (const Candidate& c : candidates[g]) {
          if (!SharesAxis(c.axes, want) ||
              std::find(counted.begin(), counted.end(), c.tensor) != counted.end())
            continue;
          counted.push_back(c.tensor);
          bytes += c.bytes;
        }
      }
      if (counted.empty()) continue;
      if (rule.factors[f].kind == FactorKind::kReduction)
        for (size_t r = 0; r < rule.results.size() && r < result_types.size(); ++r) {
          bool has_f = false;
          for (const DimFactors& dim : rule.results[r])
            has_f |= std::find(dim.begin(), dim.end(), f) != dim.end();
          const int id = first_result + static_cast<int>(r);
          if (!has_f && std::find(counted.begin(), counted.end(), id) == counted.end())
            bytes += TensorBytes(result_types[r]);
        }
      moved[f] = bytes;
    }
  }
  return moved;
}

}  // namespace

FactorAxes ProjectToFactors(const ShardingRule& rule, const TensorFactors& tensor,
                            const Sharding& sharding) {
  FactorAxes out(rule.factors.size());
  ProjectInto(rule, tensor, sharding, out);
  return out;
}

std::vector<AxisList> DimAxesFromFactors(const ShardingRule& rule, const Mesh& mesh,
                                         const TensorFactors& tensor,
                                         const FactorAxes& factor_axes) {
  std::vector<AxisList> dims(tensor.size());
  for (size_t d = 0; d < tensor.size(); ++d) {
    const DimFactors& dim = tensor[d];
    size_t usable = UsableFactors(rule, mesh, dim, factor_axes);
    for (size_t k = 0; k < usable; ++k) {
      const AxisList& a = factor_axes[dim[k]];
      dims[d].insert(dims[d].end(), a.begin(), a.end());
    }
  }
  return dims;
}

namespace {

// Per factor, the axes each annotated tensor proposes for it (projected from its sharding),
// with the tensor's bytes and its index (operands first, then results from `*first_result`).
std::vector<std::vector<Candidate>> CollectCandidates(
    const ShardingRule& rule, const std::vector<const Sharding*>& operands,
    const std::vector<TensorType>& operand_types, const std::vector<const Sharding*>& results,
    const std::vector<TensorType>& result_types, int* first_result) {
  std::vector<std::vector<Candidate>> candidates(rule.factors.size());
  FactorAxes projected(rule.factors.size());  // (scratch: only a tensor's own factors are touched)
  int tensor_id = 0;
  auto collect = [&](const TensorFactors& tf, const Sharding* s, const TensorType& type) {
    const int id = tensor_id++;
    if (!s || !s->valid()) return;
    ProjectInto(rule, tf, *s, projected);
    for (const DimFactors& dim : tf)
      for (int f : dim) {
        if (projected[f].empty()) continue;
        candidates[f].push_back({std::move(projected[f]), TensorBytes(type), id});
        projected[f].clear();
      }
  };
  for (size_t i = 0; i < rule.operands.size(); ++i)
    collect(rule.operands[i], i < operands.size() ? operands[i] : nullptr,
            i < operand_types.size() ? operand_types[i] : TensorType{});
  *first_result = tensor_id;
  for (size_t i = 0; i < results.size() && i < rule.results.size(); ++i)
    collect(rule.results[i], results[i], result_types[i]);
  // Larger tensors' proposals first (then longer axis lists): they keep their layout, smaller
  // ones move.
  for (auto& c : candidates)
    std::stable_sort(c.begin(), c.end(), [](const Candidate& a, const Candidate& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.axes.size() > b.axes.size();
    });
  return candidates;
}

// The factors to assign, in the order they choose: higher priority first, then those whose
// proposal moves fewer bytes elsewhere, then larger tensors'. (Only factors some tensor
// proposes axes for: in a `_foreach_` op that is a few of thousands.)
std::vector<int> AssignmentOrder(const ShardingRule& rule,
                                 const std::vector<std::vector<Candidate>>& candidates,
                                 int first_result, const std::vector<TensorType>& result_types) {
  std::vector<int> order;
  for (size_t f = 0; f < rule.factors.size(); ++f)
    if (!candidates[f].empty() && rule.factors[f].kind != FactorKind::kNeedReplication)
      order.push_back(static_cast<int>(f));
  const std::vector<int64_t> moved = ConflictBytes(rule, candidates, order, first_result,
                                                   result_types);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const int pa = rule.factors[a].priority, pb = rule.factors[b].priority;
    if (pa != pb) return pa > pb;
    if (moved[a] != moved[b]) return moved[a] < moved[b];
    return candidates[a][0].bytes > candidates[b][0].bytes;
  });
  return order;
}

// Drops factor axes that some tensor of the op cannot carry (multi-factor dims), until none.
void DropUncarriedAxes(const ShardingRule& rule, const Mesh& mesh, FactorAxes& assigned) {
  bool changed = true;
  while (changed) {
    changed = false;
    auto check = [&](const TensorFactors& tf) {
      for (const DimFactors& dim : tf) {
        size_t usable = UsableFactors(rule, mesh, dim, assigned);
        for (size_t k = usable; k < dim.size(); ++k)
          if (!assigned[dim[k]].empty()) {
            assigned[dim[k]].clear();
            changed = true;
          }
      }
    };
    for (const TensorFactors& tf : rule.operands) check(tf);
    for (const TensorFactors& tf : rule.results) check(tf);
  }
}

}  // namespace

FactorAxes AssignFactors(const ShardingRule& rule, const Mesh& mesh,
                         const std::vector<const Sharding*>& operands,
                         const std::vector<TensorType>& operand_types,
                         const std::vector<const Sharding*>& results,
                         const std::vector<TensorType>& result_types) {
  int first_result = 0;
  const std::vector<std::vector<Candidate>> candidates =
      CollectCandidates(rule, operands, operand_types, results, result_types, &first_result);
  FactorAxes assigned(rule.factors.size());
  int num_groups = 1;
  for (const Factor& factor : rule.factors) num_groups = std::max(num_groups, factor.group + 1);
  // used[group * axes + axis]: a mesh axis shards at most one factor of an iteration space.
  const int num_axes = mesh.num_axes();
  std::vector<char> used(static_cast<size_t>(num_groups) * num_axes, 0);
  for (int f : AssignmentOrder(rule, candidates, first_result, result_types)) {
    char* taken = &used[static_cast<size_t>(rule.factors[f].group) * num_axes];
    for (const Candidate& c : candidates[f]) {
      // Take the longest prefix of the proposal whose axes are still free.
      AxisList take;
      for (int a : c.axes) {
        if (taken[a]) break;
        take.push_back(a);
      }
      // Windowed factors keep the longest prefix that tiles them evenly (see rule.h).
      while (rule.factors[f].windowed && !take.empty() &&
             !WindowedTilingOk(rule, f, AxesSize(mesh, take), operand_types, result_types))
        take.pop_back();
      if (take.empty()) continue;
      for (int a : take) taken[a] = 1;
      assigned[f] = std::move(take);
      break;
    }
  }
  DropUncarriedAxes(rule, mesh, assigned);
  return assigned;
}

AxisList PartialAxes(const ShardingRule& rule, const FactorAxes& factor_axes, int result,
                     ReduceOp* op) {
  std::vector<int> reduced;
  if (result < static_cast<int>(rule.reduced_in_result.size()) &&
      !rule.reduced_in_result[result].empty()) {
    reduced = rule.reduced_in_result[result];
  } else {
    std::vector<bool> present(rule.factors.size(), false);
    if (result < static_cast<int>(rule.results.size()))
      for (const DimFactors& dim : rule.results[result])
        for (int f : dim) present[f] = true;
    for (size_t f = 0; f < rule.factors.size(); ++f)
      if (rule.factors[f].kind == FactorKind::kReduction && !present[f]) reduced.push_back(f);
  }
  AxisList axes;
  for (int f : reduced) {
    if (factor_axes[f].empty()) continue;
    axes.insert(axes.end(), factor_axes[f].begin(), factor_axes[f].end());
    if (op) *op = rule.factors[f].reduce;
  }
  std::sort(axes.begin(), axes.end());
  return axes;
}

}  // namespace spmd::partition
