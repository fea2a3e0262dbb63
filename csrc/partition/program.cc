#include "partition/program.h"

#include <sstream>

namespace spmd::partition {

std::string Program::ToText() const {
  ir::Graph g;
  g.nodes = nodes;
  for (size_t i = 0; i < nodes.size(); ++i) g.position[nodes[i].get()] = static_cast<int>(i);
  g.outputs = outputs;
  std::ostringstream os;
  os << ir::GraphToText(g);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Sharding& s = output_shardings[i];
    os << "output " << i << ": " << output_global_types[i].ToString() << " "
       << (s.valid() ? s.ToString() : std::string("{replicated}")) << "\n";
  }
  return os.str();
}

}  // namespace spmd::partition
