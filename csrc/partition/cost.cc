#include "partition/cost.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "ir/internal_ops.h"

namespace spmd::partition {

std::vector<LiveValue> ValueLifetimes(const Program& program, const std::vector<bool>* donated) {
  // Per value (node output), as the runtime frees each output slot after its own last reader:
  // a multi-output op's big result may die long before its small sibling (grad_input vs
  // grad_weight of convolution_backward).
  using Key = std::pair<const ir::Node*, int>;
  const int end = static_cast<int>(program.nodes.size());
  std::map<Key, int> last_use;
  // Where each node is computed: a node fused into its reader (Program::fused_away) is
  // computed where that reader is, so what it reads lives until then.
  std::vector<int> computed_at(program.nodes.size());
  std::unordered_map<const ir::Node*, int> index;
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    index.emplace(program.nodes[i].get(), static_cast<int>(i));
    computed_at[i] = static_cast<int>(i);
  }
  if (!program.fused_away.empty())
    for (int i = end - 1; i >= 0; --i)
      for (const ir::Value& in : program.nodes[i]->inputs())
        if (program.fused_away.count(in.node.get()))
          computed_at[index.at(in.node.get())] = computed_at[i];
  for (size_t i = 0; i < program.nodes.size(); ++i)
    for (const ir::Value& in : program.nodes[i]->inputs()) {
      int& last = last_use[{in.node.get(), in.index}];
      last = std::max(last, computed_at[i]);
    }
  for (const ir::Value& out : program.outputs) last_use[{out.node.get(), out.index}] = end;
  for (size_t i = 0; i < program.params.size(); ++i)
    if (!donated || i >= donated->size() || !(*donated)[i])
      last_use[{program.params[i].get(), 0}] = end;  // kept: the caller still holds it
  // A result written over an operand that dies at its op takes that operand's memory: the
  // operand is counted up to the op before (Program::in_place).
  for (const auto& [node, operands] : program.in_place) {
    const int at = index.at(node);
    for (int k : operands) {
      if (k < 0 || k >= static_cast<int>(node->inputs().size())) continue;
      const ir::Value& in = node->input(k);
      auto it = last_use.find({in.node.get(), in.index});
      if (it != last_use.end() && it->second == at && index.count(in.node.get()) &&
          index.at(in.node.get()) < at)
        it->second = at - 1;
    }
  }
  // A view (ShardingRule::view, OpCost::view) is a strided view of its operand's storage in
  // the program the user wrote: it holds no bytes of its own and keeps that storage alive as
  // long as it is read. Later views first, so that a view of a view reaches the storage.
  std::vector<bool> aliases(program.nodes.size(), false);
  for (const OpCost& c : program.stats.op_costs)
    if (c.view)
      for (int64_t k = c.position; k < c.end_position && k < end; ++k)
        aliases[k] = !program.nodes[k]->inputs().empty() && program.nodes[k]->num_outputs() == 1;
  for (size_t k = 0; k < program.nodes.size(); ++k)
    if (program.views.count(program.nodes[k].get())) aliases[k] = true;
  for (int i = end - 1; i >= 0; --i) {
    const ir::Node& n = *program.nodes[i];
    if (!aliases[i]) continue;
    auto it = last_use.find({&n, 0});
    if (it == last_use.end()) continue;
    int& storage = last_use[{n.inputs()[0].node.get(), n.inputs()[0].index}];
    storage = std::max(storage, it->second);
  }
  const ir::OpInfo* to_host = ir::InternalOps::Get().place_to_host;
  std::vector<LiveValue> values;
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    const ir::Node& n = *program.nodes[i];
    for (int o = 0; o < n.num_outputs(); ++o) {
      const TensorType& t = n.output(o);
      if (t.dtype == DType::kUndefined) continue;
      auto it = last_use.find({&n, o});
      int until = it == last_use.end() ? static_cast<int>(i) : it->second;
      const int64_t bytes = aliases[i] || program.fused_away.count(&n) ? 0 : t.bytes();
      const bool host = n.op() == to_host;  // offloaded: in the host's memory
      values.push_back(LiveValue{&n, o, static_cast<int>(i), until, host ? 0 : bytes,
                                 host ? bytes : 0});
    }
  }
  return values;
}

int64_t PeakHostBytesPerDevice(const Program& program) {
  std::vector<int64_t> delta(program.nodes.size() + 2, 0);
  for (const LiveValue& v : ValueLifetimes(program)) {
    delta[v.defined_at] += v.host_bytes;
    delta[v.last_use + 1] -= v.host_bytes;
  }
  int64_t running = 0, peak = 0;
  for (int64_t d : delta) peak = std::max(peak, running += d);
  return peak;
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
  if (!rule.cost.flops_per_point) return ElementFlops(results);
  double points = *rule.cost.flops_per_point;
  for (size_t f = 0; f < rule.factors.size(); ++f) {
    const int64_t tiles = f < fa.size() && !fa[f].empty() ? AxesSize(mesh, fa[f]) : 1;
    points *= static_cast<double>((rule.factors[f].size + tiles - 1) / tiles);  // padded tile
  }
  return points;
}

DType ComputeDType(const ir::Node& n, const ShardingRule* rule) {
  const int operand = rule ? rule->cost.compute_dtype_operand : -1;
  if (operand >= 0 && operand < static_cast<int>(n.inputs().size()))
    return n.input(operand).type().dtype;
  return n.num_outputs() > 0 ? n.output(0).dtype : DType::kUndefined;
}

bool IsPointwise(const ShardingRule& rule) {
  return rule.executor.elementwise && !rule.cost.flops_per_point;
}

GemmShape ContractionShape(const ShardingRule& rule, const Mesh& mesh, const FactorAxes& fa) {
  if (rule.results.size() != 1) return {};
  const size_t num_factors = rule.factors.size();
  std::vector<bool> in_result(num_factors, false);
  for (const DimFactors& dim : rule.results[0])
    for (int f : dim) in_result[f] = true;
  // The operands holding contracted factors, and which factors each holds.
  std::vector<std::vector<bool>> matrices;
  for (const TensorFactors& operand : rule.operands) {
    std::vector<bool> has(num_factors, false);
    bool contracts = false;
    for (const DimFactors& dim : operand)
      for (int f : dim) {
        has[f] = true;
        contracts |= !in_result[f];
      }
    if (contracts) matrices.push_back(std::move(has));
  }
  if (matrices.size() != 2) return {};
  GemmShape g{1, 1, 1};
  for (size_t f = 0; f < num_factors; ++f) {
    const int64_t tiles = f < fa.size() && !fa[f].empty() ? AxesSize(mesh, fa[f]) : 1;
    const int64_t local = (rule.factors[f].size + tiles - 1) / tiles;
    const bool lhs = matrices[0][f], rhs = matrices[1][f];
    if (!in_result[f] && (lhs || rhs)) g.k *= local;
    else if (in_result[f] && lhs && !rhs) g.m *= local;
    else if (in_result[f] && rhs && !lhs) g.n *= local;
    else if (in_result[f] && lhs && rhs) g.batch *= local;
  }
  return g;
}

void SetRuleCost(OpCost& c, const ShardingRule& rule, const Mesh& mesh, const FactorAxes& fa,
                 const std::vector<TensorType>& local) {
  c.flops = RuleFlops(rule, mesh, fa, local);
  c.contraction = rule.cost.flops_per_point && *rule.cost.flops_per_point > 0;
  c.view = rule.executor.view != ViewKind::kNone;
  if (!c.contraction) return;
  const GemmShape g = ContractionShape(rule, mesh, fa);
  c.gemm_m = g.m;
  c.gemm_n = g.n;
  c.gemm_k = g.k;
  c.gemm_batch = g.batch;
}

void LinkCommunication(const std::vector<ir::NodePtr>& nodes,
                       std::vector<CollectiveStat>& collectives, std::vector<OpCost>& ops) {
  std::unordered_map<const ir::Node*, int64_t> index, first_reader;
  for (const CollectiveStat& c : collectives) first_reader.emplace(c.node, -1);
  // Nodes that read, directly or not, a collective's result (collectives included).
  std::unordered_set<const ir::Node*> after;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node* n = nodes[i].get();
    index.emplace(n, static_cast<int64_t>(i));
    bool reads = first_reader.count(n) > 0;
    for (const ir::Value& in : n->inputs()) {
      reads |= after.count(in.node.get()) > 0;
      auto it = first_reader.find(in.node.get());
      if (it != first_reader.end() && it->second < 0) it->second = static_cast<int64_t>(i);
    }
    if (reads) after.insert(n);
  }
  const int64_t end = static_cast<int64_t>(nodes.size());
  const ir::OpInfo* param = ir::InternalOps::Get().device_data;
  for (CollectiveStat& c : collectives) {
    const ir::Node* input = c.node->input(0).node.get();
    // A parameter's data is on the device before the step starts, wherever its placeholder
    // stands in the program (next to its first reader).
    c.input_position = input->op() == param ? -1 : index.at(input);
    const int64_t reader = first_reader.at(c.node);
    c.first_use_position = reader < 0 ? end : reader;
  }
  // The op whose lowering holds program position p (ops are in program order); none before the
  // first op's or at the end.
  auto op_at = [&](int64_t p) -> const OpCost* {
    auto it = std::upper_bound(ops.begin(), ops.end(), p,
                               [](int64_t q, const OpCost& op) { return q < op.position; });
    if (it == ops.begin()) return nullptr;
    const OpCost& op = *std::prev(it);
    return p < op.end_position ? &op : nullptr;
  };
  int64_t backward_end = 0;  // one past the backward's last node
  for (const OpCost& op : ops)
    if (op.in_backward) backward_end = std::max(backward_end, op.end_position);
  for (CollectiveStat& c : collectives) {
    const OpCost* maker = op_at(c.input_position);
    c.after_backward = maker && maker->in_backward && c.first_use_position >= backward_end;
  }
  for (OpCost& op : ops) {
    op.independent_of_collectives = true;
    for (int64_t i = op.position; i < op.end_position; ++i)
      if (after.count(nodes[i].get())) op.independent_of_collectives = false;
  }
}

}  // namespace spmd::partition
