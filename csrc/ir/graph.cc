#include "ir/graph.h"

#include <algorithm>
#include <atomic>
#include <sstream>

namespace spmd::ir {

namespace {

// The graph's wiring by node index: each node's input nodes, its bytes (0 for parameters, which
// live through any order) and whether it is an output.
struct Wiring {
  std::vector<std::vector<int>> inputs;
  std::vector<int64_t> bytes;
  std::vector<bool> output;
};

// The most bytes the values hold at once when node `order[t]` runs at step t and each value
// lives from its node to its last reader (the outputs to the end).
int64_t PeakLiveBytes(const Wiring& w, const std::vector<int>& order) {
  const size_t n = order.size();
  std::vector<size_t> step_of(n), last_use(n);
  for (size_t t = 0; t < n; ++t) step_of[order[t]] = t;
  for (size_t t = 0; t < n; ++t) {
    last_use[order[t]] = w.output[order[t]] ? n : std::max(last_use[order[t]], t);
    for (int in : w.inputs[order[t]])
      if (last_use[in] < n) last_use[in] = std::max(last_use[in], t);
  }
  std::vector<int64_t> delta(n + 2, 0);
  for (size_t i = 0; i < n; ++i) {
    delta[step_of[i]] += w.bytes[i];
    delta[last_use[i] + 1] -= w.bytes[i];
  }
  int64_t live = 0, peak = 0;
  for (int64_t d : delta) peak = std::max(peak, live += d);
  return peak;
}

}  // namespace

Graph BuildGraph(const std::vector<Value>& outputs) {
  Graph g;
  g.outputs = outputs;
  // Iterative DFS: training graphs have many thousands of nodes, too deep for recursion.
  std::vector<std::pair<NodePtr, size_t>> stack;
  // `position` doubles as the visited set (-1 until the node is placed). Sized for the last
  // graph cut: a training step cuts one of about the same size every time.
  static std::atomic<size_t> last_size{0};
  g.position.reserve(last_size.load(std::memory_order_relaxed));
  g.nodes.reserve(last_size.load(std::memory_order_relaxed));
  auto& visited = g.position;
  for (const Value& root : outputs) {
    if (!visited.emplace(root.node.get(), -1).second) continue;
    stack.emplace_back(root.node, 0);
    while (!stack.empty()) {
      Node* node = stack.back().first.get();
      size_t next = stack.back().second;
      if (next < node->inputs().size()) {
        stack.back().second++;
        const NodePtr& in = node->inputs()[next].node;
        if (visited.emplace(in.get(), -1).second) stack.emplace_back(in, 0);
        continue;
      }
      g.position[node] = static_cast<int>(g.nodes.size());
      g.nodes.push_back(std::move(stack.back().first));
      stack.pop_back();
    }
  }

  // Two orders to run the program in; the one whose values need fewer bytes at once wins
  // (recorded on a tie), as XLA's scheduler picks among its list schedulers by peak memory.
  // - The order the ops were recorded, which is the order eager PyTorch runs them: autograd's
  //   backward frees as it goes (each block's recomputation, its input and weight gradients,
  //   then the next block). Node ids grow as ops are recorded and a node is recorded after its
  //   inputs, so it is a topological order.
  // - The DFS post-order from the outputs: each value computed just before its first reader.
  //   It runs a backward's input-gradient chain first and the weight gradients, listed later
  //   among the outputs, at the end (every recomputed activation live across the backward
  //   under checkpointing), but it also delays a forward's values not needed yet (a model
  //   whose weights are cast or transposed at use holds fewer of those copies at once).
  // Both are compared as permutations of the DFS positions, the only index built.
  const size_t n = g.nodes.size();
  Wiring w{std::vector<std::vector<int>>(n), std::vector<int64_t>(n, 0),
           std::vector<bool>(n, false)};
  for (size_t i = 0; i < n; ++i) {
    const Node& node = *g.nodes[i];
    for (const Value& in : node.inputs()) w.inputs[i].push_back(g.position.at(in.node.get()));
    if (!node.is_data())
      for (const TensorType& t : node.outputs()) w.bytes[i] += t.bytes();
  }
  for (const Value& out : outputs) w.output[g.position.at(out.node.get())] = true;
  std::vector<int> post_order(n), recorded(n);
  for (size_t i = 0; i < n; ++i) post_order[i] = recorded[i] = static_cast<int>(i);
  std::sort(recorded.begin(), recorded.end(),
            [&](int a, int b) { return g.nodes[a]->id() < g.nodes[b]->id(); });
  if (PeakLiveBytes(w, recorded) <= PeakLiveBytes(w, post_order)) {
    std::vector<NodePtr> nodes(n);
    for (size_t t = 0; t < n; ++t) nodes[t] = std::move(g.nodes[recorded[t]]);
    g.nodes = std::move(nodes);
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) g.position[g.nodes[i].get()] = static_cast<int>(i);

  last_size.store(g.nodes.size(), std::memory_order_relaxed);
  Hash key = HashInt(static_cast<int64_t>(g.nodes.size()));
  for (const NodePtr& n : g.nodes) {
    if (n->is_data()) g.params.push_back(n);
    Hash h = n->hash();
    for (const Value& in : n->inputs()) {
      h = HashCombine(h, HashInt(g.position.at(in.node.get())));
      h = HashCombine(h, HashInt(in.index));
    }
    key = HashCombine(key, h);
    for (const Arg& a : n->args()) {
      if (!a.dynamic) continue;
      if (a.kind == Arg::Kind::kScalarList) {
        for (size_t e = 0; e < a.doubles.size(); ++e)
          g.scalars.push_back(ScalarValue{static_cast<Arg::Kind>(a.ints[e]),
                                          static_cast<int64_t>(a.doubles[e]), a.doubles[e]});
        continue;
      }
      g.scalars.push_back(ScalarValue{a.kind, a.i, a.d});
    }
  }
  for (const Value& out : outputs) {
    key = HashCombine(key, HashInt(g.position.at(out.node.get())));
    key = HashCombine(key, HashInt(out.index));
  }
  g.key = key;
  return g;
}

std::string GraphToText(const Graph& g) {
  std::ostringstream os;
  auto name = [&](const Value& v) {
    std::string s = "%" + std::to_string(g.position.at(v.node.get()));
    if (v.node->num_outputs() > 1) s += "." + std::to_string(v.index);
    return s;
  };
  for (size_t k = 0; k < g.nodes.size(); ++k) {
    const Node& n = *g.nodes[k];
    os << "%" << k << " = " << n.op()->qualified << "(";
    bool first = true;
    size_t next_input = 0;
    for (size_t a = 0; a < n.args().size(); ++a) {
      const Arg& arg = n.args()[a];
      if (!first) os << ", ";
      first = false;
      if (a < n.op()->args.size()) os << n.op()->args[a].name << "=";
      if (arg.kind == Arg::Kind::kTensor) {
        os << name(n.input(arg.i));
        next_input = std::max<size_t>(next_input, arg.i + 1);
      } else if (arg.kind == Arg::Kind::kTensorList || arg.kind == Arg::Kind::kOptTensorList) {
        os << "[";
        for (size_t j = 0; j < arg.ints.size(); ++j) {
          if (j) os << ", ";
          os << (arg.ints[j] < 0 ? std::string("None") : name(n.input(arg.ints[j])));
          next_input = std::max<size_t>(next_input, arg.ints[j] + 1);
        }
        os << "]";
      } else {
        os << arg.ToString();
      }
    }
    // Internal ops without schema args list their inputs positionally.
    for (size_t i = next_input; i < n.inputs().size(); ++i) {
      if (!first) os << ", ";
      first = false;
      os << name(n.input(i));
    }
    os << ") : ";
    for (int o = 0; o < n.num_outputs(); ++o) os << (o ? ", " : "") << n.output(o).ToString();
    if (n.is_data() && n.data()->sharding().valid())
      os << " " << n.data()->sharding().ToString();
    for (const Sharding& s : n.shardings())
      if (s.valid()) os << " " << s.ToString();
    os << "\n";
  }
  os << "outputs: ";
  for (size_t i = 0; i < g.outputs.size(); ++i) os << (i ? ", " : "") << name(g.outputs[i]);
  os << "\n";
  return os.str();
}

}  // namespace spmd::ir
