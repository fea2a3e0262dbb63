#include "ir/recompute.h"

#include <unordered_map>
#include <vector>

namespace spmd::ir {

namespace {

// What a node computes, its phase left out: op, arguments, output types, shardings.
Hash ComputationHash(const Node& n) {
  Hash h = HashString(n.op()->qualified);
  for (const Arg& a : n.args()) h = HashCombine(h, a.hash());
  for (const TensorType& t : n.outputs())
    h = HashCombine(HashCombine(h, HashInt(static_cast<int64_t>(t.dtype))), HashInts(t.shape));
  for (const Sharding& s : n.shardings()) h = HashCombine(h, s.valid() ? s.hash() : 1);
  return h;
}

}  // namespace

std::unordered_set<const Node*> RecomputedNodes(const Graph& graph) {
  std::unordered_map<const Node*, const Node*> original;  // a node -> the first to compute it
  std::unordered_map<Hash, std::vector<const Node*>> by_key;
  std::unordered_set<const Node*> recomputed;
  auto first_of = [&](const Node* n) {
    auto it = original.find(n);
    return it == original.end() ? n : it->second;
  };
  for (const NodePtr& node : graph.nodes) {
    const Node* n = node.get();
    if (n->is_data() || n->draws_random_numbers()) continue;
    Hash key = ComputationHash(*n);
    for (const Value& in : n->inputs())
      key = HashCombine(HashCombine(key, HashInt(reinterpret_cast<intptr_t>(first_of(in.node.get())))),
                        HashInt(in.index));
    std::vector<const Node*>& same = by_key[key];
    const Node* twin = nullptr;
    for (const Node* m : same) {
      if (m->op() != n->op() || m->inputs().size() != n->inputs().size() ||
          m->outputs() != n->outputs())
        continue;
      bool inputs_alike = true;
      for (size_t i = 0; i < n->inputs().size() && inputs_alike; ++i)
        inputs_alike = first_of(m->input(i).node.get()) == first_of(n->input(i).node.get()) &&
                       m->input(i).index == n->input(i).index;
      if (inputs_alike) {
        twin = m;
        break;
      }
    }
    if (twin) {
      original[n] = twin;
      recomputed.insert(n);
    } else {
      same.push_back(n);
    }
  }
  return recomputed;
}

}  // namespace spmd::ir
