// The bridge between tensor shardings and a rule's factors, used by propagation (to move
// shardings across an op) and by the partitioner (to decide how an op runs locally).
#pragma once
#include <vector>

#include "partition/rules/rule.h"

namespace spmd::partition {

// Per factor: the mesh axes that shard it (empty = not sharded).
using FactorAxes = std::vector<AxisList>;

// The axes each factor gets from one tensor's sharding. In a dim made of several factors the
// axes fill the factors major to minor, each factor taking axes while they divide it evenly;
// axes that cannot be represented that way are ignored.
FactorAxes ProjectToFactors(const ShardingRule& rule, const TensorFactors& tensor,
                            const Sharding& sharding);

// The tiling (axes per dim) a tensor gets from the factor axes. A factor of a multi-factor dim
// may only be sharded when every more major factor of that dim is fully sharded and it is
// itself evenly sharded; otherwise the dim keeps the axes of the factors before it.
std::vector<AxisList> DimAxesFromFactors(const ShardingRule& rule, const Mesh& mesh,
                                         const TensorFactors& tensor,
                                         const FactorAxes& factor_axes);

// Chooses axes for every factor from what the operands and results currently have (an invalid
// Sharding = unknown). Each factor takes the axes proposed by the largest tensor that has an
// opinion on it (resharding the smaller tensors moves fewer bytes); a mesh axis shards at most
// one factor; need-replication factors stay unsharded; windowed factors take only tilings that
// are even on every dim made of them (rule.h); axes no tensor could carry are dropped.
FactorAxes AssignFactors(const ShardingRule& rule, const Mesh& mesh,
                         const std::vector<const Sharding*>& operands,
                         const std::vector<TensorType>& operand_types,
                         const std::vector<const Sharding*>& results,
                         const std::vector<TensorType>& result_types);

// The axes of the sharded factors that result `result` sums over: it is partial over them.
AxisList PartialAxes(const ShardingRule& rule, const FactorAxes& factor_axes, int result,
                     ReduceOp* op);

}  // namespace spmd::partition
