// The layout ILP's coefficients (plan/layout_costs.h): strategies per tuple of decisions,
// their op and collective seconds, memory rows and parameter storage.
#include "plan/layout_costs.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "graph_test_util.h"
#include "plan/collective_model.h"

namespace spmd::plan {
using namespace spmd::partition;  // the compiler's types the model reads
namespace {

using testing::F32;
using testing::MakeMesh;
using testing::Mm;
using testing::Param;
using testing::Relu;
using testing::Spec;

Hardware Fast(double ring_bandwidth) {
  Hardware hw;
  hw.name = "test";
  hw.peak_flops_bf16 = hw.peak_flops_fp32 = 1e12;
  hw.hbm_bytes = 80e9;
  hw.hbm_bandwidth = 1e15;  // (the matmuls below are compute-bound)
  hw.ring_bandwidth = hw.cross_domain_bandwidth = ring_bandwidth;
  return hw;
}

// x[B=64, D=32] @ w1[D, H=128] -> relu -> @ w2[H, 32]: classes batch, model dim, hidden and
// w2's columns.
struct Mlp {
  MeshPtr mesh = MakeMesh({2, 2}, {"data", "model"});
  ir::Value x = Param(F32({64, 32}), Spec(mesh, {{}, {}}));
  ir::Value w1 = Param(F32({32, 128}), Spec(mesh, {{}, {}}));
  ir::Value w2 = Param(F32({128, 32}), Spec(mesh, {{}, {}}));
  ir::Graph graph = ir::BuildGraph({Mm(Relu(Mm(x, w1)), w2)});
  DimClasses classes = ComputeDimClasses(graph);

  int ClassOf(const ir::Value& p, int d) const {
    for (size_t i = 0; i < graph.params.size(); ++i)
      if (graph.params[i] == p.node) return classes.param_dims[i][d];
    return -1;
  }
  // Each class its own decision, over {none, data, model}.
  LayoutProblem Problem(int memory_points = 2) const {
    LayoutProblem p;
    p.decision_of_class.resize(classes.num_classes);
    for (int c = 0; c < classes.num_classes; ++c) p.decision_of_class[c] = c;
    p.options.assign(classes.num_classes, {{-1, {}}, {-1, {0}}, {-1, {1}}});
    p.memory_points = memory_points;
    return p;
  }
};

const DecisionTuple& TupleOf(const LayoutCosts& c, std::vector<int> decisions) {
  std::sort(decisions.begin(), decisions.end());
  for (const DecisionTuple& t : c.tuples)
    if (t.decisions == decisions) return t;
  throw std::logic_error("no such tuple");
}

double SecondsOf(const DecisionTuple& t, const std::vector<int>& options_in_decision_order) {
  for (size_t s = 0; s < t.combos.size(); ++s)
    if (t.combos[s] == options_in_decision_order) return t.seconds[s];
  throw std::logic_error("no such combination");
}

// The first matmul reads the batch, model and hidden classes: one tuple, whose combinations
// never give one mesh axis to two of its factors (1 all-unsharded + 3 x 2 one-sharded + 3 x 2
// two-sharded = 13).
TEST(LayoutCostsTest, CombinationsNeverUseAnAxisTwice) {
  Mlp m;
  LayoutCosts c = ComputeLayoutCosts(m.graph, m.classes, NodeRules(m.graph), *m.mesh, Fast(1e12), m.Problem());
  const DecisionTuple& t = TupleOf(c, {m.ClassOf(m.x, 0), m.ClassOf(m.x, 1), m.ClassOf(m.w1, 1)});
  EXPECT_EQ(t.combos.size(), 13u);
  for (const std::vector<int>& combo : t.combos) {
    std::vector<int> used;
    for (int o : combo)
      if (o > 0) used.push_back(o);
    std::sort(used.begin(), used.end());
    EXPECT_EQ(std::adjacent_find(used.begin(), used.end()), used.end());
  }
}

// Sharding the batch splits the second matmul's work and leaves no partial sum; sharding the
// hidden dim splits it too, but its contraction leaves a partial result: one all-reduce of
// B x D floats over its axis (Megatron's one all-reduce per MLP). (The second matmul's
// decisions are the batch, the hidden dim and w2's columns, a class of their own.)
TEST(LayoutCostsTest, ShardedContractionsPayTheirAllReduce) {
  Mlp m;
  const int batch = m.ClassOf(m.x, 0), hidden = m.ClassOf(m.w1, 1), out = m.ClassOf(m.w2, 1);
  ASSERT_EQ(m.ClassOf(m.w2, 0), hidden);
  auto seconds = [&](const Hardware& hw, int sharded) {
    LayoutCosts c = ComputeLayoutCosts(m.graph, m.classes, NodeRules(m.graph), *m.mesh, hw, m.Problem());
    const DecisionTuple& t = TupleOf(c, {batch, hidden, out});
    std::vector<int> combo(3, 0);
    if (sharded >= 0)  // over 'model' (2 devices)
      combo[std::find(t.decisions.begin(), t.decisions.end(), sharded) - t.decisions.begin()] = 2;
    return SecondsOf(t, combo);
  };
  const Hardware free_links = Fast(1e18), slow_links = Fast(1e6);
  const double whole = seconds(free_links, -1);
  EXPECT_NEAR(seconds(free_links, batch), whole / 2, whole * 1e-6);
  EXPECT_NEAR(seconds(free_links, hidden), whole / 2, whole * 1e-6);
  EXPECT_NEAR(seconds(slow_links, batch), whole / 2, whole * 1e-6);  // nothing to reduce
  CollectiveStat all_reduce = testing::Stat("all-reduce", 64 * 32 * 4, {0, 1});
  EXPECT_NEAR(seconds(slow_links, hidden) - whole / 2,
              CollectiveSeconds(all_reduce, slow_links).seconds, whole * 1e-6);
}

// Memory rows hold the step's live values at its fullest points; a class sharded over an axis
// divides the bytes of every value it tiles, and a parameter's storage decision divides its
// bytes further and charges an all-gather per contraction reading it beyond the first.
TEST(LayoutCostsTest, MemoryRowsAndStorage) {
  Mlp m;
  LayoutProblem p = m.Problem(1);
  const int storage = static_cast<int>(p.options.size());
  p.options.push_back({{-1, {}}, {0, {0}}});  // w1 stored over 'data' on its dim 0
  p.storage_of_param.assign(m.graph.params.size(), -1);
  for (size_t i = 0; i < m.graph.params.size(); ++i)
    if (m.graph.params[i] == m.w1.node) p.storage_of_param[i] = storage;
  LayoutCosts c = ComputeLayoutCosts(m.graph, m.classes, NodeRules(m.graph), *m.mesh, Fast(1e9), p);
  ASSERT_EQ(c.row_positions.size(), 1u);
  const int d = m.ClassOf(m.w1, 0), h = m.ClassOf(m.w1, 1);
  const DecisionTuple& w1 = TupleOf(c, {d, h, storage});
  // (decisions ascending: d, h, storage) unsharded, then stored over 'data'
  const int at_storage = static_cast<int>(std::find(w1.decisions.begin(), w1.decisions.end(),
                                                    storage) - w1.decisions.begin());
  std::vector<int> plain(3, 0), stored(3, 0);
  stored[at_storage] = 1;
  auto bytes = [&](const std::vector<int>& combo) {
    for (size_t s = 0; s < w1.combos.size(); ++s)
      if (w1.combos[s] == combo) return w1.bytes[0][s];
    throw std::logic_error("no such combination");
  };
  EXPECT_DOUBLE_EQ(bytes(plain), 32 * 128 * 4);
  EXPECT_DOUBLE_EQ(bytes(stored), 32 * 128 * 4 / 2);
  // one contraction reads w1 (its first use is free: the gradient's reduce-scatter saves it)
  EXPECT_EQ(SecondsOf(w1, stored), 0.0);
  // a combination storing w1 over 'data' while its model dim is already over 'data' is invalid
  std::vector<int> clash(3, 0);
  clash[at_storage] = 1;
  clash[std::find(w1.decisions.begin(), w1.decisions.end(), d) - w1.decisions.begin()] = 1;
  EXPECT_EQ(std::count(w1.combos.begin(), w1.combos.end(), clash), 0);
}

TEST(LayoutCostsTest, BadProblemsThrow) {
  Mlp m;
  LayoutProblem p = m.Problem();
  p.options[0].push_back({-1, {2}});  // the mesh has axes 0 and 1
  EXPECT_THROW(ComputeLayoutCosts(m.graph, m.classes, NodeRules(m.graph), *m.mesh, Fast(1e9), p),
               std::invalid_argument);
  p = m.Problem();
  p.decision_of_class[0] = 7;
  EXPECT_THROW(ComputeLayoutCosts(m.graph, m.classes, NodeRules(m.graph), *m.mesh, Fast(1e9), p),
               std::invalid_argument);
}

}  // namespace
}  // namespace spmd::plan
