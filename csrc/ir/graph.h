// A graph cut out of the lazy IR for one execution: the nodes that the requested outputs need,
// in a topological order (graph.cc: as recorded, or post-order where that holds fewer bytes
// live), with the parameters (data nodes) and the run-time scalars pulled out, and a
// structural key for the compile cache.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "core/hash.h"
#include "ir/node.h"

namespace spmd::ir {

struct ScalarValue {
  Arg::Kind kind = Arg::Kind::kScalarDouble;
  int64_t i = 0;
  double d = 0;
};

struct Graph {
  std::vector<NodePtr> nodes;     // every input before its users
  std::vector<NodePtr> params;    // the data nodes, in that order
  std::vector<Value> outputs;     // the requested values, in request order
  std::vector<ScalarValue> scalars;  // dynamic scalar args, in node then arg order
  // Hash of the wiring (each node's hash and the positions of its inputs), the
  // outputs, and the parameters' types and layouts. Equal keys mean the same program.
  Hash key = 0;
  std::unordered_map<const Node*, int> position;  // node -> index in `nodes`

  int PositionOf(const Node* n) const { return position.at(n); }
};

Graph BuildGraph(const std::vector<Value>& outputs);

// Readable text: one line per node, "%3 = aten::mm(%1, %2) : f32[4,4]".
std::string GraphToText(const Graph& graph);

}  // namespace spmd::ir
