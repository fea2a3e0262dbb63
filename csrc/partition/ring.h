// Operands read a tile at a time around a ring (ShardingRule::Lowering::Ring): where the plan
// would all-gather a rule's ring operands over mesh axes G, the partitioner keeps them tiled
// over G and the rule's lowering passes the tiles around G's ring by collective-permutes, one
// step per tile, each transfer overlapping the step before it (ring attention: Liu et al.,
// torchtitan's and MaxText's context parallelism). Or it moves G from the paired factor onto
// the exchange factor (all-to-alls before and after the op: DeepSpeed's Ulysses), where that
// factor splits evenly over G too. Either way the values equal the gathered op's up to the
// order of its sums.
#pragma once
#include <optional>
#include <vector>

#include "partition/factor_assignment.h"
#include "partition/local_builder.h"

namespace spmd::partition {

// How the partitioner runs an op whose ring operands it would gather (PartitionOptions).
enum class ContextParallel : uint8_t {
  kAuto,      // all-to-all where the exchange factor splits evenly and it moves fewer bytes
  kRing,      // the ring wherever it applies
  kAllToAll,  // all-to-all wherever it applies, the ring elsewhere
  kGather,    // neither: gather the operands whole
};

struct RingPlan {
  AxisList axes;          // G
  bool exchange = false;  // move G onto the exchange factor instead of the ring
};

// Whether node `n` (rule `rule`, factor assignment `fa`) reads its ring operands around a
// ring or by an all-to-all: `have` are its operands' current layouts.
std::optional<RingPlan> PlanRing(const ir::Node& n, const ShardingRule& rule, const MeshPtr& mesh,
                                 const FactorAxes& fa, const std::vector<Sharding>& have,
                                 ContextParallel method);

// `fa` with the plan's axes moved from the paired factor onto the exchange factor.
FactorAxes ExchangedFactors(const ShardingRule& rule, FactorAxes fa, const RingPlan& plan);

// The layout ring operand `i` is handed to the lowering in: what the assignment asks (`want`)
// with its dim of the ring factor still tiled over the plan's axes.
Sharding RingOperandLayout(const ShardingRule& rule, int i, const Sharding& want,
                           const RingPlan& plan);

// Member m's buffer sent to member m + 1 (`to_next`, over channel 2) or m - 1 (channel 1) of
// the group over `axes`, around its ring: one collective-permute.
LocalValue RingPermute(LocalBuilder& b, const LocalValue& v, const AxisList& axes, bool to_next);

}  // namespace spmd::partition
