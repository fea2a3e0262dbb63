// Recomputation in a graph: nodes that compute again a value the graph computes earlier. With
// activation checkpointing the backward runs each checkpointed block's forward a second time;
// those FLOPs are work the hardware does but the model does not need, which is what tells
// hardware FLOPs utilisation (HFU, every op) from model FLOPs utilisation (MFU, without them).
#pragma once
#include <unordered_set>

#include "ir/graph.h"

namespace spmd::ir {

// The nodes of `graph` that recompute an earlier node: the same op with the same arguments and
// output types, whose inputs are the earlier node's inputs or recomputations of them
// (common-subexpression equivalence, ignoring the phase a node was recorded in). Ops that draw
// random numbers are never counted (their seeds are run-time values).
std::unordered_set<const Node*> RecomputedNodes(const Graph& graph);

}  // namespace spmd::ir
