#include "aten/donation.h"

namespace spmd::aten {

std::vector<bool> DonatableParams(const ir::Graph& graph, const std::vector<ir::Value>& outputs,
                                  const OutputSlots& slots_of) {
  std::unordered_map<const ir::Node*, long> internal;
  for (const ir::NodePtr& n : graph.nodes) {
    internal[n.get()] += n->is_data() ? 2 : 1;
    for (const ir::Value& in : n->inputs()) ++internal[in.node.get()];
  }
  for (const ir::Value& v : outputs) {
    // outputs, graph.outputs, the slots_of key, and each synced slot's value (which may be
    // the input of v, see MergeAnnotatedCopies).
    internal[v.node.get()] += 3;
    for (const SlotPtr* s : slots_of.at(v)) ++internal[(*s)->value.node.get()];
  }
  std::vector<const ir::Node*> stack;
  std::unordered_map<const ir::Node*, bool> reachable;
  for (const ir::NodePtr& n : graph.nodes)
    if (n.use_count() > internal[n.get()]) stack.push_back(n.get());
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (!reachable.emplace(n, true).second) continue;
    for (const ir::Value& in : n->inputs()) stack.push_back(in.node.get());
  }
  std::vector<bool> donated(graph.params.size(), false);
  for (size_t i = 0; i < graph.params.size(); ++i) {
    const ir::NodePtr& p = graph.params[i];
    donated[i] = !reachable.count(p.get()) && p->data().use_count() == 1;
  }
  return donated;
}

}  // namespace spmd::aten
