// Whole-graph simplifications of a recorded graph, applied before partitioning (once per
// compile: the partitioned program is cached). They remove work that eager autograd cannot see
// is unnecessary because it never holds the whole backward at once.
#pragma once
#include "ir/graph.h"

namespace spmd::partition {

// `graph` with its simplifications applied. Parameters, run-time scalars, outputs and the key
// stay the same; a replaced node takes its original's post-order position and its users are
// re-created on the new value; nodes left unused are dropped. Returns a copy of `graph` when
// nothing applies.
//
// The rewrites: a sum (add, alpha 1) of gradients that each fill one part of the
// same zeros tensor (ops whose rule sets ShardingRule::into_zeros: select_backward,
// slice_backward with step 1, what autograd emits for q, k, v taken by index or by slice out
// of one fused projection) that together cover the whole dim becomes one stack (select) or
// cat (slice) of the gradients: no zero fills, no adds.
//
// And torch.cat([x[a:], x[:a]], d), a shift written with slices (ShardingRule::rows_of),
// becomes torch.roll(x, -a, d), whose rule keeps a sharded dim sharded.
ir::Graph SimplifyGraph(const ir::Graph& graph);

}  // namespace spmd::partition
