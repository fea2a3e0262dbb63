// Dims tied by the ops' rules (MaxText's "logical axes", found instead of named): two tensor
// dims are in one class when some op's rule makes both of them of one factor, directly or
// through a chain of ops. Sharding every dim of a class over the same mesh axes lets each op
// that ties them run without moving data (a reduction factor leaves a partial sum), so the
// auto-sharding search (torch_spmd/plan/auto_shard.py) decides per class, not per tensor dim.
#pragma once
#include <unordered_map>
#include <vector>

#include "ir/graph.h"

namespace spmd::plan {

struct DimClasses {
  // Per graph parameter (graph.params order), the class of each dim; -1 for a dim no rule
  // ties to a shardable factor (a size-1 dim, a need-replication dim).
  std::vector<std::vector<int>> param_dims;
  int num_classes = 0;

  // The class of dim `d` of any value of the graph: one a parameter's dim is in, or -1 (a dim
  // tied to no parameter's: an intermediate's own, as attention's key positions can be).
  int ClassOf(const ir::Value& v, int64_t d) const {
    return element_class.at(first_element.at(v.node.get())[v.index] + static_cast<int>(d));
  }

  // (ClassOf's tables: per node its outputs' first element; per element its class.)
  std::unordered_map<const ir::Node*, std::vector<int>> first_element;
  std::vector<int> element_class;
};

// Union-find over (value, dim): for every node with a rule, the dims whose major factor is the
// same pass-through, reduction or windowed factor (of size > 1) are joined. A sharding
// constraint joins its operand's dims to its result's; nodes without a rule join nothing.
DimClasses ComputeDimClasses(const ir::Graph& graph);

}  // namespace spmd::plan
