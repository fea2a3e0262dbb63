#include "plan/layout_costs.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "ir/internal_ops.h"
#include "partition/cost.h"
#include "partition/factor_assignment.h"
#include "partition/rules/rule.h"
#include "plan/collective_model.h"
#include "plan/cost_model.h"

namespace spmd::plan {

using partition::DimFactors;
using partition::Factor;
using partition::FactorKind;
using partition::ViewKind;
using partition::DimAxesFromFactors;
using partition::DimOfFactor;
using partition::ElementFlops;
using partition::FactorAxes;
using partition::GetRule;
using partition::PartialAxes;
using partition::ShardingRule;
using partition::TensorFactors;
namespace {

// An op's decisions beyond this many are left unsharded in its strategies: the combinations
// grow as options^decisions (a matmul has three: batch, contraction, output).
constexpr size_t kMaxTupleDecisions = 4;

bool Overlap(const AxisList& a, const AxisList& b) {
  for (int x : a)
    if (std::find(b.begin(), b.end(), x) != b.end()) return true;
  return false;
}

class Builder {
 public:
  Builder(const ir::Graph& graph, const DimClasses& classes, const NodeRules& rules,
          const Mesh& mesh, const Hardware& hw, const LayoutProblem& problem, LayoutCosts& out)
      : graph_(graph), classes_(classes), rules_(rules), mesh_(mesh), hw_(hw), problem_(problem),
        out_(out) {}

  void Run() {
    for (const ir::NodePtr& n : graph_.nodes)
      if (!n->is_data() && n->op() != ir::InternalOps::Get().sharding_constraint) AddOp(n);
    AddMemoryRows();
    AddParams();
  }

 private:
  int DecisionOfClass(int c) const {
    return c >= 0 && c < static_cast<int>(problem_.decision_of_class.size())
               ? problem_.decision_of_class[c]
               : -1;
  }
  int DecisionOfDim(const ir::Value& v, int64_t d) const {
    return v.type().shape[d] > 1 ? DecisionOfClass(classes_.ClassOf(v, d)) : -1;
  }
  // The decisions of the minor factors of dim `d` of `v` where a view made it of several
  // ([b*s] from [b, s]): the dim is tiled over their axes after its major factor's, so an op
  // reading it depends on them too (a linear layer's matmul on flattened tokens: sharding the
  // sequence shards its rows).
  std::vector<int> MinorDecisions(const ir::Value& v, int64_t d) const {
    std::vector<int> out;
    const ShardingRule* rule = rules_.Of(*v.node);
    if (!rule || rule->executor.view == ViewKind::kNone || v.index >= static_cast<int>(rule->results.size()))
      return out;
    const TensorFactors& dims = rule->results[v.index];
    if (d >= static_cast<int64_t>(dims.size())) return out;
    for (size_t k = 1; k < dims[d].size(); ++k)
      for (size_t i = 0; i < rule->operands.size() && i < v.node->inputs().size(); ++i) {
        const int at = DimOfFactor(rule->operands[i], dims[d][k]);
        if (at < 0) continue;
        const int j = DecisionOfDim(v.node->input(i), at);
        if (j >= 0) out.push_back(j);
        break;
      }
    return out;
  }

  const LayoutOption& Option(int decision, int index) const {
    return problem_.options.at(decision).at(index);
  }

  // The tuple of `decisions` (ascending, unique), its combinations enumerated when first seen.
  int Tuple(const std::vector<int>& decisions) {
    auto [it, added] = tuple_index_.emplace(decisions, static_cast<int>(out_.tuples.size()));
    if (!added) return it->second;
    DecisionTuple t;
    t.decisions = decisions;
    std::vector<int> combo;
    Enumerate(decisions, 0, combo, t.combos);
    t.seconds.assign(t.combos.size(), 0.0);
    t.bytes.assign(problem_.memory_points, std::vector<double>(t.combos.size(), 0.0));
    std::vector<double>& tiles = tiles_.emplace_back();
    for (const std::vector<int>& combo : t.combos) tiles.push_back(Tiles(t, combo));
    out_.tuples.push_back(std::move(t));
    return it->second;
  }

  void Enumerate(const std::vector<int>& decisions, size_t i, std::vector<int>& combo,
                 std::vector<std::vector<int>>& out) const {
    if (i == decisions.size()) {
      out.push_back(combo);
      return;
    }
    for (size_t o = 0; o < problem_.options.at(decisions[i]).size(); ++o) {
      const AxisList& axes = Option(decisions[i], static_cast<int>(o)).axes;
      bool clash = false;
      for (size_t j = 0; j < i && !clash; ++j) clash = Overlap(axes, Option(decisions[j], combo[j]).axes);
      if (clash) continue;  // a mesh axis shards at most one factor of an op, one dim of a tensor
      combo.push_back(static_cast<int>(o));
      Enumerate(decisions, i + 1, combo, out);
      combo.pop_back();
    }
  }

  // Product of the sizes of the axes `combo` gives `decisions` (class decisions' axes, and a
  // storage decision's axes where its option names a dim).
  double Tiles(const DecisionTuple& t, const std::vector<int>& combo) const {
    double tiles = 1;
    for (size_t i = 0; i < t.decisions.size(); ++i)
      tiles *= static_cast<double>(AxesSize(mesh_, Option(t.decisions[i], combo[i]).axes));
    return tiles;
  }

  TensorType LocalType(const ShardingRule& rule, const TensorFactors& dims, const TensorType& t,
                       const FactorAxes& fa) const {
    if (t.dtype == DType::kUndefined || static_cast<int64_t>(dims.size()) != t.rank()) return t;
    std::vector<AxisList> axes = DimAxesFromFactors(rule, mesh_, dims, fa);
    TensorType local = t;
    for (size_t d = 0; d < axes.size(); ++d) local.shape[d] = CeilDiv(t.shape[d], AxesSize(mesh_, axes[d]));
    return local;
  }

  // Whether tensor `dims` belongs to factor group `group` (-1: every tensor does).
  static bool InGroup(const ShardingRule& rule, const TensorFactors& dims, int group) {
    if (group < 0) return true;
    for (const DimFactors& d : dims)
      for (int f : d)
        if (rule.factors[f].group == group) return true;
    return false;
  }

  // What the step-time model charges `n` run with factor axes `fa`: its op, and the all-reduce
  // of each result left partial. With `group` >= 0, only that factor group's tensors (one
  // element of a list op, its own op as far as cost goes).
  double OpSecondsUnder(const ir::Node& n, const ShardingRule& rule, const FactorAxes& fa,
                        int group = -1) const {
    OpCost c;
    std::vector<TensorType> local;
    std::vector<int> local_result;  // per result: its entry in `local`, or -1
    for (size_t i = 0; i < rule.operands.size() && i < n.inputs().size(); ++i)
      if (InGroup(rule, rule.operands[i], group))
        c.bytes += LocalType(rule, rule.operands[i], n.input(i).type(), fa).bytes();
    for (int o = 0; o < n.num_outputs(); ++o) {
      const TensorType& t = n.output(o);
      const bool ruled = o < static_cast<int>(rule.results.size());
      if (ruled && !InGroup(rule, rule.results[o], group)) {
        local_result.push_back(-1);
        continue;
      }
      local_result.push_back(static_cast<int>(local.size()));
      local.push_back(ruled ? LocalType(rule, rule.results[o], t, fa) : t);
      if (t.dtype != DType::kUndefined) c.bytes += local.back().bytes();
    }
    if (n.num_outputs() > 0) c.dtype = ComputeDType(n, &rule);
    if (group < 0) {
      SetRuleCost(c, rule, mesh_, fa, local);
    } else {  // (a list op's element: pointwise)
      c.flops = ElementFlops(local);
      c.view = rule.executor.view != ViewKind::kNone;
    }
    double seconds = OpSeconds(c, hw_).seconds();
    for (int o = 0; o < n.num_outputs() && o < static_cast<int>(rule.results.size()); ++o) {
      if (local_result[o] < 0) continue;
      const TensorType& lt = local[local_result[o]];
      ReduceOp op = ReduceOp::kSum;
      AxisList partial = PartialAxes(rule, fa, o, &op);
      if (partial.empty() || lt.dtype == DType::kUndefined) continue;
      seconds += Collective("all-reduce", partial, lt.bytes());
    }
    return seconds;
  }

  double Collective(const char* kind, const AxisList& axes, int64_t bytes) const {
    CollectiveStat s;
    s.kind = kind;
    s.group_size = AxesSize(mesh_, axes);
    s.bytes = bytes;
    s.first_group = FirstDeviceGroup(mesh_, axes);
    return CollectiveSeconds(s, hw_).seconds;
  }

  void AddOp(const ir::NodePtr& node) {
    const ir::Node& n = *node;
    const ShardingRule* rule = rules_.Of(n);
    if (!rule) {
      out_.fixed_seconds += OpSecondsUnder(n, ShardingRule{}, {});
      return;
    }
    // Each factor's decision, from the first dim it is the major factor of; a decision two
    // factors share shards only the first (the partitioner gives an axis to one factor). Per
    // factor group: a list op's elements (an optimizer's _foreach_ ops over every parameter)
    // are independent iteration spaces, each a strategy of its own, priced on its tensors.
    std::vector<std::vector<int>> decision(rule->factors.size());  // major first
    std::vector<bool> seen(rule->factors.size(), false);
    std::map<int, std::vector<int>> decisions_of_group;
    auto look = [&](const TensorFactors& dims, const ir::Value& v) {
      for (size_t d = 0; d < dims.size() && static_cast<int64_t>(d) < v.type().rank(); ++d) {
        if (dims[d].empty() || seen[dims[d].front()]) continue;
        const int f = dims[d].front();
        seen[f] = true;
        const Factor& factor = rule->factors[f];
        if (factor.size <= 1 || factor.kind == FactorKind::kNeedReplication) continue;
        std::vector<int> of_dim = MinorDecisions(v, static_cast<int64_t>(d));
        of_dim.insert(of_dim.begin(), DecisionOfDim(v, static_cast<int64_t>(d)));
        std::vector<int>& decisions = decisions_of_group[factor.group];
        for (int j : of_dim) {
          if (j < 0 || std::count(decisions.begin(), decisions.end(), j) ||
              decisions.size() >= kMaxTupleDecisions)
            break;  // (a minor factor only after its major one)
          decision[f].push_back(j);
          decisions.push_back(j);
        }
      }
    };
    for (size_t i = 0; i < rule->operands.size() && i < n.inputs().size(); ++i)
      look(rule->operands[i], n.input(i));
    for (size_t o = 0; o < rule->results.size() && static_cast<int>(o) < n.num_outputs(); ++o)
      look(rule->results[o], ir::Value{node, static_cast<int>(o)});
    std::erase_if(decisions_of_group, [](const auto& g) { return g.second.empty(); });
    if (decisions_of_group.empty()) {
      out_.fixed_seconds += OpSecondsUnder(n, *rule, FactorAxes(rule->factors.size()));
      return;
    }
    const bool groups = decisions_of_group.size() > 1;
    const std::string signature = Signature(n, *rule, decision);
    for (auto& [group, decisions] : decisions_of_group) {
      std::sort(decisions.begin(), decisions.end());
      const int t = Tuple(decisions);
      // Ops alike (a repeated block's) cost alike: priced once per signature.
      auto [it, added] = op_seconds_.emplace(signature + "/" + std::to_string(group),
                                             std::vector<double>());
      if (added) {
        for (const std::vector<int>& combo : out_.tuples[t].combos) {
          FactorAxes fa(rule->factors.size());
          for (size_t f = 0; f < decision.size(); ++f) {
            if (rule->factors[f].group != group) continue;
            for (int j : decision[f]) {
              const size_t i = std::find(decisions.begin(), decisions.end(), j) - decisions.begin();
              const AxisList& axes = Option(j, combo[i]).axes;
              fa[f].insert(fa[f].end(), axes.begin(), axes.end());
            }
          }
          it->second.push_back(OpSecondsUnder(n, *rule, fa, groups ? group : -1));
        }
      }
      std::vector<double>& seconds = out_.tuples[t].seconds;
      for (size_t s = 0; s < seconds.size(); ++s) seconds[s] += it->second[s];
    }
  }

  static std::string Signature(const ir::Node& n, const ShardingRule& rule,
                               const std::vector<std::vector<int>>& decision) {
    std::ostringstream k;
    k << n.op()->qualified;
    auto tensor = [&](const TensorType& t, const TensorFactors& dims) {
      k << '|' << t.ToString();
      for (const DimFactors& d : dims) {
        k << ':';
        for (int f : d) k << f << ',';
      }
    };
    for (size_t i = 0; i < n.inputs().size(); ++i)
      tensor(n.input(i).type(), i < rule.operands.size() ? rule.operands[i] : TensorFactors{});
    for (int o = 0; o < n.num_outputs(); ++o)
      tensor(n.output(o), o < static_cast<int>(rule.results.size()) ? rule.results[o] : TensorFactors{});
    for (size_t f = 0; f < rule.factors.size(); ++f) {
      k << '#' << rule.factors[f].size << '/' << static_cast<int>(rule.factors[f].kind) << '/';
      for (int j : decision[f]) k << j << ',';
    }
    k << '@' << rule.cost.flops_per_point.value_or(-1) << static_cast<int>(rule.executor.view);
    return k.str();
  }

  // The decisions of a value's dims (each once), and its bytes.
  std::vector<int> ValueDecisions(const ir::Value& v) const {
    std::vector<int> out;
    for (int64_t d = 0; d < v.type().rank(); ++d) {
      std::vector<int> of_dim = MinorDecisions(v, d);
      of_dim.insert(of_dim.begin(), DecisionOfDim(v, d));
      for (int j : of_dim)
        if (j >= 0 && !std::count(out.begin(), out.end(), j) && out.size() < kMaxTupleDecisions)
          out.push_back(j);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // Adds `bytes` (unsharded) of a value over `decisions` to memory row `row`.
  void AddBytes(int row, const std::vector<int>& decisions, double bytes) {
    if (decisions.empty()) {
      out_.fixed_bytes[row] += bytes;
      return;
    }
    const int index = Tuple(decisions);
    DecisionTuple& t = out_.tuples[index];
    for (size_t s = 0; s < t.combos.size(); ++s) t.bytes[row][s] += bytes / tiles_[index][s];
  }

  // Rows at the points of the step that hold the most bytes (parameters aside), before
  // partitioning: a view holds none and keeps the value it views live while it is read.
  void AddMemoryRows() {
    const int64_t n = static_cast<int64_t>(graph_.nodes.size());
    struct Life {
      ir::Value value;
      int64_t defined = 0, last = 0;
    };
    std::vector<Life> lives;
    std::unordered_map<const ir::Node*, std::vector<int>> source;   // per output: its life
    for (int64_t i = 0; i < n; ++i) {
      const ir::NodePtr& node = graph_.nodes[i];
      std::vector<int>& src = source[node.get()];
      const ShardingRule* rule = rules_.Of(*node);
      const bool view = rule && rule->executor.view != ViewKind::kNone && !node->inputs().empty();
      for (int o = 0; o < node->num_outputs(); ++o) {
        int life = -1;
        if (view) {
          const ir::Value& in = node->input(0);
          life = source.at(in.node.get())[in.index];
        } else if (!node->is_data() && node->output(o).dtype != DType::kUndefined) {
          life = static_cast<int>(lives.size());
          lives.push_back({ir::Value{node, o}, i, i});
        }
        src.push_back(life);
      }
      for (const ir::Value& in : node->inputs()) {
        const int life = source.at(in.node.get())[in.index];
        if (life >= 0) lives[life].last = std::max(lives[life].last, i);
      }
    }
    for (const ir::Value& v : graph_.outputs) {
      const int life = source.at(v.node.get())[v.index];
      if (life >= 0) lives[life].last = n;
    }
    std::vector<double> live(n + 1, 0.0);
    for (const Life& l : lives) {
      const double b = static_cast<double>(l.value.type().bytes());
      live[l.defined] += b;
      if (l.last + 1 <= n) live[l.last + 1] -= b;
    }
    for (int64_t i = 1; i <= n; ++i) live[i] += live[i - 1];
    std::vector<int64_t> order(n);
    for (int64_t i = 0; i < n; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return live[a] > live[b]; });
    const int64_t apart = std::max<int64_t>(1, n / (4 * std::max(1, problem_.memory_points)));
    for (int64_t i : order) {
      if (static_cast<int>(out_.row_positions.size()) >= problem_.memory_points) break;
      bool near = false;
      for (int64_t r : out_.row_positions) near = near || std::abs(r - i) < apart;
      if (!near) out_.row_positions.push_back(i);
    }
    out_.fixed_bytes.assign(problem_.memory_points, 0.0);
    for (const Life& l : lives) {
      std::vector<int> decisions;  // (looked up once a value is live in some row)
      for (size_t r = 0; r < out_.row_positions.size(); ++r) {
        if (l.defined > out_.row_positions[r] || out_.row_positions[r] > l.last) continue;
        if (decisions.empty()) decisions = ValueDecisions(l.value);
        AddBytes(static_cast<int>(r), decisions, static_cast<double>(l.value.type().bytes()));
      }
    }
  }

  // Parameters are live in every row, stored over their classes' axes and their storage
  // decision's; a stored-sharded one is all-gathered for each contraction that reads it
  // (through views) but one.
  void AddParams() {
    std::unordered_map<const ir::Node*, int> reads;  // contractions reading a param
    std::unordered_map<const ir::Node*, const ir::Node*> param_of;  // views of params
    for (const ir::NodePtr& p : graph_.params) param_of[p.get()] = p.get();
    for (const ir::NodePtr& node : graph_.nodes) {
      const ShardingRule* rule = rules_.Of(*node);
      if (!rule) continue;
      if (rule->executor.view != ViewKind::kNone && !node->inputs().empty()) {
        auto it = param_of.find(node->input(0).node.get());
        if (it != param_of.end()) param_of[node.get()] = it->second;
        continue;
      }
      if (!(rule->cost.flops_per_point && *rule->cost.flops_per_point > 0)) continue;
      for (const ir::Value& in : node->inputs()) {
        auto it = param_of.find(in.node.get());
        if (it != param_of.end()) ++reads[it->second];
      }
    }
    for (size_t i = 0; i < graph_.params.size(); ++i) {
      const ir::Value v{graph_.params[i], 0};
      std::vector<int> decisions = ValueDecisions(v);
      const int storage = i < problem_.storage_of_param.size() ? problem_.storage_of_param[i] : -1;
      if (storage >= 0) {
        decisions.push_back(storage);
        std::sort(decisions.begin(), decisions.end());
      }
      const double bytes = static_cast<double>(v.type().bytes());
      for (size_t r = 0; r < out_.row_positions.size(); ++r) AddBytes(static_cast<int>(r), decisions, bytes);
      auto it = reads.find(graph_.params[i].get());
      if (storage < 0 || it == reads.end() || it->second < 2) continue;
      const int index = Tuple(decisions);
      DecisionTuple& t = out_.tuples[index];
      const size_t at = std::find(t.decisions.begin(), t.decisions.end(), storage) - t.decisions.begin();
      for (size_t s = 0; s < t.combos.size(); ++s) {
        const AxisList& axes = Option(storage, t.combos[s][at]).axes;
        if (axes.empty()) continue;
        const int64_t stored = static_cast<int64_t>(bytes / tiles_[index][s]);
        t.seconds[s] += (it->second - 1) * Collective("all-gather", axes, stored);
      }
    }
  }

  const ir::Graph& graph_;
  const DimClasses& classes_;
  const NodeRules& rules_;
  const Mesh& mesh_;
  const Hardware& hw_;
  const LayoutProblem& problem_;
  LayoutCosts& out_;
  std::map<std::vector<int>, int> tuple_index_;
  std::vector<std::vector<double>> tiles_;  // per tuple, per combination: Tiles
  std::unordered_map<std::string, std::vector<double>> op_seconds_;
};

}  // namespace

NodeRules::NodeRules(const ir::Graph& graph) {
  for (const ir::NodePtr& n : graph.nodes)
    if (!n->is_data()) rules_.emplace(n.get(), GetRule(*n));
}

const ShardingRule* NodeRules::Of(const ir::Node& node) const {
  auto it = rules_.find(&node);
  return it == rules_.end() ? nullptr : it->second.get();
}

LayoutCosts ComputeLayoutCosts(const ir::Graph& graph, const DimClasses& classes,
                               const NodeRules& rules, const Mesh& mesh, const Hardware& hw,
                               const LayoutProblem& problem) {
  for (const auto& options : problem.options) {
    if (options.empty()) throw std::invalid_argument("layout costs: a decision has no option");
    for (const LayoutOption& o : options)
      for (int a : o.axes)
        if (a < 0 || a >= mesh.num_axes())
          throw std::invalid_argument("layout costs: mesh axis " + std::to_string(a) +
                                      " out of range for " + mesh.ToString());
  }
  for (int j : problem.decision_of_class)
    if (j >= static_cast<int>(problem.options.size()))
      throw std::invalid_argument("layout costs: decision " + std::to_string(j) + " has no options");
  for (int j : problem.storage_of_param)
    if (j >= static_cast<int>(problem.options.size()))
      throw std::invalid_argument("layout costs: storage decision " + std::to_string(j) +
                                  " has no options");
  if (problem.memory_points < 1) throw std::invalid_argument("layout costs: memory_points < 1");
  LayoutCosts out;
  Builder(graph, classes, rules, mesh, hw, problem, out).Run();
  return out;
}

}  // namespace spmd::plan
