#include "partition/offload.h"

#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "ir/internal_ops.h"

namespace spmd::partition {

namespace {

bool ToHost(const ir::Node& n) { return n.args().size() > 1 && n.args()[1].i != 0; }

ir::NodePtr Move(const ir::OpInfo* op, const ir::Value& x, const ir::Node& like) {
  ir::NodePtr n = ir::MakeNode(op, {x}, {ir::Arg::Tensor(0)}, {x.type()});
  n->set_scope(like.scope());
  n->set_in_backward(like.in_backward());
  return n;
}

}  // namespace

ir::Graph PlaceOffloaded(const ir::Graph& graph) {
  const ir::InternalOps& ops = ir::InternalOps::Get();
  bool any = false;
  for (const ir::NodePtr& n : graph.nodes) any |= n->op() == ops.offload;
  if (!any) return graph;
  using Key = std::pair<const ir::Node*, int>;
  // The value a mark stands for, through marks of marks.
  auto marked = [&](ir::Value v) {
    while (v.node->op() == ops.offload) v = v.node->input(0);
    return v;
  };
  // The values to offload: marked, read in the backward, and not the step's input data (a
  // parameter stays in device memory for the step anyway: a host copy would only add one).
  std::set<Key> offloaded;
  for (const ir::NodePtr& n : graph.nodes)
    for (const ir::Value& in : n->inputs())
      if (n->in_backward() && in.node->op() == ops.offload && ToHost(*in.node)) {
        const ir::Value v = marked(in);
        if (!v.node->is_data()) offloaded.insert({v.node.get(), v.index});
      }

  ir::Graph g;
  g.params = graph.params;
  g.scalars = graph.scalars;
  g.key = graph.key;
  std::unordered_map<const ir::Node*, ir::NodePtr> copies;  // rebuilt nodes
  std::map<Key, ir::Value> on_host, on_device;  // per offloaded value
  auto add = [&](ir::NodePtr n) {
    g.position[n.get()] = static_cast<int>(g.nodes.size());
    g.nodes.push_back(std::move(n));
  };
  auto rebuilt = [&](const ir::Value& v) {
    auto it = copies.find(v.node.get());
    return it == copies.end() ? v : ir::Value{it->second, v.index};
  };
  // What `reader` reads for `v`: through marks, the marked value; a backward reader of an
  // offloaded one reads its copy back from the host, made right before the first such reader.
  auto read = [&](const ir::Value& v, const ir::Node* reader) -> ir::Value {
    const ir::Value x = marked(v);
    const Key key{x.node.get(), x.index};
    if (v.node->op() == ops.offload && reader && reader->in_backward() && offloaded.count(key)) {
      auto it = on_device.find(key);
      if (it == on_device.end()) {
        ir::NodePtr back = Move(ops.place_to_device, on_host.at(key), *reader);
        it = on_device.emplace(key, ir::Value{back, 0}).first;
        add(back);
      }
      return it->second;
    }
    return rebuilt(x);
  };
  for (const ir::NodePtr& n : graph.nodes) {
    if (n->op() == ops.offload) continue;  // read through
    std::vector<ir::Value> inputs;
    bool changed = false;
    for (const ir::Value& in : n->inputs()) {
      inputs.push_back(read(in, n.get()));
      changed |= inputs.back().node != in.node;
    }
    ir::NodePtr out = n;
    if (changed) {
      out = ir::MakeNode(n->op(), std::move(inputs), n->args(), n->outputs());
      out->set_shardings(n->shardings());
      out->set_scope(n->scope());
      out->set_in_backward(n->in_backward());
      copies.emplace(n.get(), out);
    }
    add(out);
    // Offloaded as soon as it is made: the copy runs beside the forward.
    for (int o = 0; o < n->num_outputs(); ++o)
      if (offloaded.count({n.get(), o})) {
        ir::NodePtr host = Move(ops.place_to_host, ir::Value{out, o}, *n);
        on_host.emplace(Key{n.get(), o}, ir::Value{host, 0});
        add(host);
      }
  }
  for (const ir::Value& out : graph.outputs) g.outputs.push_back(read(out, nullptr));
  return g;
}

}  // namespace spmd::partition
