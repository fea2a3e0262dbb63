// Input donation (XLA's input/output aliasing, for this runtime): which parameters of a step
// nothing can read after it, so the program frees them after their last use.
#pragma once
#include <unordered_map>
#include <vector>

#include "aten/lazy_tensor.h"
#include "ir/graph.h"

namespace spmd::aten {

// Per output value of a step, the slots (tensors) that take its result.
using OutputSlots = std::unordered_map<ir::Value, std::vector<const SlotPtr*>, ir::ValueHash>;

// Input donation (XLA's input/output aliasing, for this runtime): a parameter of the graph
// that nothing can read after this run, typically the previous value of something updated in
// place (optimizer state, sharded parameters), gives its device memory back after its last use
// in the program rather than after the run, so the old and the new model state do not both
// peak at the end of a step. Unlike XLA, a failed run takes the memory back and the data is
// intact (see Executable::Run): a failed step leaves every tensor recomputable.
//
// "Nothing can read it" is decided from reference counts. Each graph node is held by
// graph.nodes, by graph.params (data nodes), by every input edge from a graph node, and, for
// the requested values, by `outputs`, graph.outputs, the slots_of keys and the synced slots
// (which get rebound to the results). A node with any other holder (a live tensor that is
// not synced here, a pending node outside the graph) may be evaluated again later, and with
// it every node it depends on: those parameters are kept.
std::vector<bool> DonatableParams(const ir::Graph& graph, const std::vector<ir::Value>& outputs,
                                  const OutputSlots& slots_of);

}  // namespace spmd::aten
