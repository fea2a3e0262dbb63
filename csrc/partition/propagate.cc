#include "partition/propagate.h"

#include "core/metrics.h"
#include "ir/internal_ops.h"
#include "partition/factor_assignment.h"

namespace spmd::partition {

namespace {
constexpr int kMaxIterations = 16;

bool HasAnyAxis(const Sharding& s) {
  for (const AxisList& a : s.dim_axes())
    if (!a.empty()) return true;
  return false;
}
}  // namespace

Sharding OnMesh(const Sharding& s, const MeshPtr& mesh, int64_t rank) {
  if (s.valid() && (s.mesh() == *mesh || !s.IsReplicated())) return s;
  return Sharding::Replicated(mesh, rank);
}

bool IsRefinement(const Sharding& current, const Sharding& next) {
  if (!current.valid()) return true;
  if (current.rank() != next.rank() || current.mesh() != next.mesh()) return false;
  for (int64_t d = 0; d < current.rank(); ++d) {
    const AxisList& a = current.axes(d);
    const AxisList& b = next.axes(d);
    if (b.size() < a.size() || !std::equal(a.begin(), a.end(), b.begin())) return false;
  }
  return true;
}

const Sharding& LayoutOfData(const ir::Node& data_node, const ParamLayouts* overrides) {
  if (overrides) {
    auto it = overrides->find(data_node.data().get());
    if (it != overrides->end()) return it->second;
  }
  return data_node.data()->sharding();
}

namespace {

// Every dim of the operand is the result's.
RulePtr IdentityRule(const ir::Node& n) {
  auto identity = std::make_shared<ShardingRule>();
  TensorFactors tf = PassThroughFactors(*identity, n.output(0));
  identity->operands = {tf};
  identity->results = {tf};
  return identity;
}

}  // namespace

Propagation::Propagation(const ir::Graph& graph, MeshPtr mesh, const ParamLayouts* overrides)
    : graph_(graph), mesh_(std::move(mesh)) {
  const auto& ops = ir::InternalOps::Get();
  int total = 0;
  for (const ir::NodePtr& n : graph.nodes) {
    first_value_.push_back(total);
    total += n->num_outputs();
  }
  shardings_.resize(total);
  frozen_.assign(total, false);
  changed_at_.assign(total, 0);
  visited_at_.assign(graph.nodes.size(), -1);
  rules_.resize(graph.nodes.size());
  for (size_t p = 0; p < graph.nodes.size(); ++p) {
    const ir::Node& n = *graph.nodes[p];
    int v = first_value_[p];
    if (n.is_data()) {
      const Sharding& s = LayoutOfData(n, overrides);
      shardings_[v] = s.valid() && s.mesh() == *mesh_ ? s : Sharding::Replicated(mesh_, n.output(0).rank());
      frozen_[v] = true;
    } else if (n.op() == ops.shard_to_full) {
      // leaves a manual region in this layout
      shardings_[v] = OnMesh(n.shardings().at(0), mesh_, n.output(0).rank());
      frozen_[v] = true;
    } else if (n.op() == ops.full_to_shard) {
      shardings_[v] = Sharding::Manual(n.shardings().at(0).mesh_ptr(), n.output(0).rank());
      frozen_[v] = true;
    } else if (n.op() == ops.sharding_constraint) {
      shardings_[v] = OnMesh(n.shardings().at(0), mesh_, n.output(0).rank());
      frozen_[v] = true;
      if (shardings_[v].is_manual()) continue;  // nothing to propagate out of a manual region
      rules_[p] = IdentityRule(n);  // an identity: its operand may take its layout
    } else if (n.op() == ops.place_to_host || n.op() == ops.place_to_device) {
      rules_[p] = IdentityRule(n);  // the same value in another memory
    } else {
      rules_[p] = GetRule(n);
    }
  }
  first_input_.reserve(graph.nodes.size());
  for (const ir::NodePtr& n : graph.nodes) {
    first_input_.push_back(static_cast<int>(input_values_.size()));
    for (const ir::Value& in : n->inputs()) input_values_.push_back(Index(in));
  }
  // Forward then backward sweeps until a fixed point.
  bool changed = true;
  while (changed && iterations_ < kMaxIterations) {
    changed = false;
    ++iterations_;
    for (size_t p = 0; p < graph.nodes.size(); ++p) changed |= Visit(p);
    for (size_t p = graph.nodes.size(); p-- > 0;) changed |= Visit(p);
  }
  // Stopped before a fixed point: some values keep a layout short of what propagation would
  // give them (correct, but maybe more communication). Counted, so that it does not go unseen.
  if (changed) Count("PropagationIterationCap");
}

int Propagation::Index(const ir::Value& v) const {
  return first_value_[graph_.PositionOf(v.node.get())] + v.index;
}

bool Propagation::Visit(size_t p) {
  const ir::Node& node = *graph_.nodes[p];
  const ShardingRule* rule = rules_[p].get();
  if (!rule) return false;
  const int* input_values = &input_values_[first_input_[p]];  // (value index per input)
  const size_t num_inputs = node.inputs().size();
  if (visited_at_[p] >= 0) {
    bool stale = false;
    for (size_t i = 0; i < num_inputs; ++i)
      stale = stale || changed_at_[input_values[i]] > visited_at_[p];
    for (int o = 0; o < node.num_outputs(); ++o)
      stale = stale || changed_at_[first_value_[p] + o] > visited_at_[p];
    if (!stale) return false;
  }
  visited_at_[p] = clock_;
  std::vector<const Sharding*> operands, results;
  std::vector<TensorType> operand_types, result_types;
  operands.reserve(node.inputs().size());
  operand_types.reserve(node.inputs().size());
  results.reserve(node.num_outputs());
  result_types.reserve(node.num_outputs());
  for (size_t i = 0; i < num_inputs; ++i) {
    operands.push_back(&shardings_[input_values[i]]);
    operand_types.push_back(node.input(i).type());
  }
  for (int o = 0; o < node.num_outputs(); ++o) {
    results.push_back(&shardings_[first_value_[p] + o]);
    result_types.push_back(node.output(o));
  }
  FactorAxes fa = AssignFactors(*rule, *mesh_, operands, operand_types, results, result_types);
  bool changed = false;
  auto update = [&](int index, const TensorFactors& tf, const TensorType& type) {
    if (frozen_[index] || type.dtype == DType::kUndefined) return;
    Sharding next = Sharding::Tiled(mesh_, DimAxesFromFactors(*rule, *mesh_, tf, fa));
    Sharding& cur = shardings_[index];
    if (!cur.valid() && !HasAnyAxis(next)) return;
    if (cur.valid() && (cur == next || !IsRefinement(cur, next))) return;
    cur = std::move(next);
    changed_at_[index] = ++clock_;
    changed = true;
  };
  for (size_t i = 0; i < num_inputs && i < rule->operands.size(); ++i)
    update(input_values[i], rule->operands[i], node.input(i).type());
  for (int o = 0; o < node.num_outputs() && o < static_cast<int>(rule->results.size()); ++o)
    update(first_value_[p] + o, rule->results[o], node.output(o));
  return changed;
}

const Sharding& Propagation::Get(const ir::Value& v) const { return shardings_[Index(v)]; }

const ShardingRule* Propagation::RuleOf(const ir::Node* node) const {
  return rules_[graph_.PositionOf(node)].get();
}

}  // namespace spmd::partition
