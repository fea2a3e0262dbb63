#include "partition/partitioner.h"

namespace spmd::partition {

// Until propagation and rules land, every value is replicated: the program is the graph
// itself and parameters are gathered before it runs.
Program PartitionGraph(const ir::Graph& graph) {
  Program p;
  p.nodes = graph.nodes;
  p.params = graph.params;
  p.param_shardings.resize(graph.params.size());
  p.outputs = graph.outputs;
  p.output_shardings.resize(graph.outputs.size());
  for (const ir::Value& v : graph.outputs) p.output_global_types.push_back(v.type());
  return p;
}

}  // namespace spmd::partition
