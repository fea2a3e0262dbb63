#include "partition/cost.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <utility>

namespace spmd::partition {

std::vector<LiveValue> ValueLifetimes(const Program& program, const std::vector<bool>* donated) {
  // Per value (node output), as the runtime frees each output slot after its own last reader:
  // a multi-output op's big result may die long before its small sibling (grad_input vs
  // grad_weight of convolution_backward).
  using Key = std::pair<const ir::Node*, int>;
  const int end = static_cast<int>(program.nodes.size());
  std::map<Key, int> last_use;
  for (size_t i = 0; i < program.nodes.size(); ++i)
    for (const ir::Value& in : program.nodes[i]->inputs())
      last_use[{in.node.get(), in.index}] = static_cast<int>(i);
  for (const ir::Value& out : program.outputs) last_use[{out.node.get(), out.index}] = end;
  for (size_t i = 0; i < program.params.size(); ++i)
    if (!donated || i >= donated->size() || !(*donated)[i])
      last_use[{program.params[i].get(), 0}] = end;  // kept: the caller still holds it
  std::vector<LiveValue> values;
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const ir::Node& n = *program.nodes[i];
    for (int o = 0; o < n.num_outputs(); ++o) {
      const TensorType& t = n.output(o);
      if (t.dtype == DType::kUndefined) continue;
      auto it = last_use.find({&n, o});
      int until = it == last_use.end() ? static_cast<int>(i) : it->second;
      values.push_back(LiveValue{&n, o, static_cast<int>(i), until, t.bytes()});
    }
  }
  return values;
}

std::vector<int64_t> LiveBytesTimeline(const Program& program, const std::vector<bool>* donated) {
  // Sweep: a value's bytes count from its definition to its last use.
  std::vector<int64_t> delta(program.nodes.size() + 2, 0);
  for (const LiveValue& v : ValueLifetimes(program, donated)) {
    delta[v.defined_at] += v.bytes;
    delta[v.last_use + 1] -= v.bytes;
  }
  std::vector<int64_t> live(program.nodes.size(), 0);
  int64_t running = 0;
  for (size_t i = 0; i < live.size(); ++i) live[i] = running += delta[i];
  return live;
}

int64_t PeakBytesPerDevice(const Program& program, int64_t* at_node,
                           const std::vector<bool>* donated) {
  std::vector<int64_t> live = LiveBytesTimeline(program, donated);
  int64_t peak = 0, peak_at = 0;
  for (size_t i = 0; i < live.size(); ++i)
    if (live[i] > peak) {
      peak = live[i];
      peak_at = static_cast<int64_t>(i);
    }
  if (at_node) *at_node = peak_at;
  return peak;
}

double ElementFlops(const std::vector<TensorType>& results) {
  double flops = 0;
  for (const TensorType& t : results)
    if (t.dtype != DType::kUndefined) flops += static_cast<double>(NumElements(t.shape));
  return flops;
}

double RuleFlops(const ShardingRule& rule, const Mesh& mesh, const FactorAxes& fa,
                 const std::vector<TensorType>& results) {
  if (!rule.flops_per_point) return ElementFlops(results);
  double points = *rule.flops_per_point;
  for (size_t f = 0; f < rule.factors.size(); ++f) {
    const int64_t tiles = f < fa.size() && !fa[f].empty() ? AxesSize(mesh, fa[f]) : 1;
    points *= static_cast<double>((rule.factors[f].size + tiles - 1) / tiles);  // padded tile
  }
  return points;
}

}  // namespace spmd::partition
