// The coefficients of the auto-sharding ILP (torch_spmd/plan/auto_shard_ilp.py), in the
// formulation of Alpa and XLA's auto-sharding pass: a strategy per op, costs on the ops, and
// memory rows at the step's points of most live bytes, here over the search's decisions (the
// dim classes of plan/dim_classes.h, and how each parameter group is stored).
//
// An op's strategy is fixed by the options its factors' decisions take, so the ops whose
// factors belong to the same decisions share one set of strategy variables: a DecisionTuple,
// with one entry per valid combination of those decisions' options (no mesh axis sharding two
// factors of the op, as in Shardy's factor propagation). Its seconds are the sum over those ops
// of what the step-time model (plan/cost_model.h) charges each op at the local shapes the
// combination gives, plus the all-reduce of each result left partial (a reduction factor
// sharded: the data-parallel weight gradient, the row-parallel matmul), priced by
// plan/collective_model.h. Parameters stored beyond their classes' axes (FSDP) add the
// all-gather of each use but one (the reduce-scatter of their gradient costs an all-reduce's
// half, about one all-gather less). What it leaves out, and the re-ranking that corrects it
// (every solution is planned for real): overlap of communication with compute, the resharding
// where propagation resolves a conflict, and fusion across ops.
#pragma once
#include <optional>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "partition/rules/rule.h"
#include "plan/dim_classes.h"
#include "plan/hardware.h"
#include "sharding/mesh.h"
#include "sharding/sharding.h"

namespace spmd::plan {

using partition::ShardingRule;
using partition::RulePtr;
// One way to lay out a decision. A class decision: the mesh axes each of its dims is sharded
// over (dim -1). A storage decision: its parameters' dim `dim` stored over `axes` besides the
// axes of their classes (FSDP); dim -1 with no axes: stored as its classes lay it out.
struct LayoutOption {
  int dim = -1;
  AxisList axes;
};

struct LayoutProblem {
  std::vector<int> decision_of_class;  // per DimClasses class: its decision, or -1 (fixed)
  std::vector<std::vector<LayoutOption>> options;  // per decision
  std::vector<int> storage_of_param;  // per graph param: its storage decision, or -1
  int memory_points = 6;              // memory rows: points of the step, most live bytes first
};

struct DecisionTuple {
  std::vector<int> decisions;              // ascending
  std::vector<std::vector<int>> combos;    // per combination: an option index per decision
  std::vector<double> seconds;             // per combination
  std::vector<std::vector<double>> bytes;  // per memory row, per combination: bytes per device
};

struct LayoutCosts {
  std::vector<DecisionTuple> tuples;
  double fixed_seconds = 0;             // ops no decision changes
  std::vector<double> fixed_bytes;      // per memory row: values no decision changes
  std::vector<int64_t> row_positions;   // per memory row: its node's index in graph.nodes
};

// The rules of a graph's nodes, looked up once (GetRule hashes the node's types each call):
// one of these serves every mesh shape's costs of the graph.
class NodeRules {
 public:
  explicit NodeRules(const ir::Graph& graph);
  const ShardingRule* Of(const ir::Node& node) const;  // nullptr: none (data, or no rule)

 private:
  std::unordered_map<const ir::Node*, RulePtr> rules_;
};

// Throws std::invalid_argument when `problem` does not match the graph or the mesh.
LayoutCosts ComputeLayoutCosts(const ir::Graph& graph, const DimClasses& classes,
                               const NodeRules& rules, const Mesh& mesh, const Hardware& hw,
                               const LayoutProblem& problem);

}  // namespace spmd::plan
