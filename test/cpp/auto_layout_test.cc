// Auto layouts (use_spmd(auto=True)'s search): the layouts a graph's parameters get from the
// cost model, and the partitioner taking layouts without data (PartitionOptions::param_layouts).
#include "plan/auto_layout.h"

#include <gtest/gtest.h>

#include "graph_test_util.h"
#include "partition/partitioner.h"
#include "plan/cost_model.h"

namespace spmd::plan {
using namespace spmd::partition;  // the compiler's types the model reads
namespace {

using testing::F32;
using testing::MakeMesh;
using testing::Mm;
using testing::Param;
using testing::Relu;

Hardware Chip() {
  Hardware hw;
  hw.name = "test";
  hw.peak_flops_bf16 = hw.peak_flops_fp32 = 1e14;
  hw.hbm_bytes = 16e9;
  hw.hbm_bandwidth = 1e12;
  hw.ring_bandwidth = 1e11;
  hw.link_latency = 1e-6;
  return hw;
}

struct Mlp {
  ir::Value x, w1, w2;
  ir::Graph graph;
};

// x[rows,1024] @ w1[1024,4096] -> relu -> @ w2[4096,1024], nothing laid out.
Mlp MakeMlp(int64_t rows) {
  Mlp m;
  m.x = Param(F32({rows, 1024}));
  m.w1 = Param(F32({1024, 4096}));
  m.w2 = Param(F32({4096, 1024}));
  m.graph = ir::BuildGraph({Mm(Relu(Mm(m.x, m.w1)), m.w2)});
  return m;
}

AutoLayoutRequest Request(const ir::Graph& g, MeshPtr mesh) {
  AutoLayoutRequest r;
  r.mesh = mesh;
  r.hardware = Chip();
  r.decide.assign(g.params.size(), true);
  return r;
}

double StepOf(const ir::Graph& g, const ParamLayouts* layouts, int64_t devices) {
  PartitionOptions options;
  options.param_layouts = layouts;
  return EstimateStep(PartitionGraph(g, devices, options).stats, Chip()).step_seconds;
}

const Sharding* LayoutOf(const AutoLayout& a, const ir::Value& p) {
  auto it = a.layouts.find(p.node->data().get());
  return it == a.layouts.end() ? nullptr : &it->second;
}

// The partitioner takes the assumed layouts: as parameters of the program, and propagated.
TEST(AutoLayoutTest, PartitionerTakesAssumedParameterLayouts) {
  MeshPtr mesh = MakeMesh({8}, {"d"});
  Mlp m = MakeMlp(64);
  ParamLayouts layouts{{m.x.node->data().get(), testing::Spec(mesh, {{"d"}, {}})}};
  PartitionOptions options;
  options.param_layouts = &layouts;
  Program p = PartitionGraph(m.graph, 8, options);
  ASSERT_EQ(p.param_shardings.size(), 3u);
  int tiled = 0;
  for (const Sharding& s : p.param_shardings) tiled += s.IsTiled() ? 1 : 0;
  EXPECT_EQ(tiled, 1);
  EXPECT_FALSE(p.output_shardings.at(0).IsReplicated());  // the rows stay split
  // and without them, nothing is tiled
  Program plain = PartitionGraph(m.graph, 8, PartitionOptions{});
  for (const Sharding& s : plain.param_shardings) EXPECT_FALSE(s.IsTiled());
}

// 8 rows against 32 MiB of weights: reading the weights is the step; sharding them over the
// devices (the hidden dim, or the model dim) cuts it, and the search finds a layout that is
// faster than replicated by the same estimate.
TEST(AutoLayoutTest, WeightsDominatingGetSharded) {
  MeshPtr mesh = MakeMesh({8}, {"d"});
  Mlp m = MakeMlp(8);
  AutoLayout a = ChooseParamLayouts(m.graph, Request(m.graph, mesh));
  ASSERT_NE(LayoutOf(a, m.w1), nullptr);
  EXPECT_TRUE(LayoutOf(a, m.w1)->IsTiled());
  EXPECT_TRUE(LayoutOf(a, m.w2)->IsTiled());
  EXPECT_GT(a.evaluations, 1);
  EXPECT_LT(a.step_seconds, StepOf(m.graph, nullptr, 8));
  EXPECT_DOUBLE_EQ(a.step_seconds, StepOf(m.graph, &a.layouts, 8));
}

// 2^16 rows: the matmuls dominate; the batch is split.
TEST(AutoLayoutTest, RowsDominatingSplitTheBatch) {
  MeshPtr mesh = MakeMesh({8}, {"d"});
  Mlp m = MakeMlp(1 << 16);
  AutoLayout a = ChooseParamLayouts(m.graph, Request(m.graph, mesh));
  ASSERT_NE(LayoutOf(a, m.x), nullptr);
  EXPECT_EQ(LayoutOf(a, m.x)->axes(0), AxisList{0});
  EXPECT_LT(a.step_seconds, StepOf(m.graph, nullptr, 8) / 4);
}

// A parameter not to decide keeps its layout (it is not in the result); a budget below the
// replicated peak is met.
TEST(AutoLayoutTest, KeepsUndecidedParametersAndMeetsTheBudget) {
  MeshPtr mesh = MakeMesh({8}, {"d"});
  Mlp m = MakeMlp(8);
  AutoLayoutRequest r = Request(m.graph, mesh);
  for (size_t i = 0; i < m.graph.params.size(); ++i)
    if (m.graph.params[i] == m.x.node) r.decide[i] = false;
  const int64_t replicated_peak = PartitionGraph(m.graph, 8, {}).stats.peak_bytes_per_device;
  r.memory_budget = replicated_peak / 2;
  AutoLayout a = ChooseParamLayouts(m.graph, r);
  EXPECT_EQ(LayoutOf(a, m.x), nullptr);
  EXPECT_TRUE(a.fits);
  EXPECT_LE(a.peak_bytes, r.memory_budget);
}

// Two mesh axes: a class may take either, both, or none.
TEST(AutoLayoutTest, TwoAxisMeshUsesBoth) {
  MeshPtr mesh = MakeMesh({2, 4}, {"a", "b"});
  Mlp m = MakeMlp(8);
  AutoLayout a = ChooseParamLayouts(m.graph, Request(m.graph, mesh));
  int64_t tiles = 1;
  for (int64_t d = 0; d < 2; ++d)
    for (int axis : LayoutOf(a, m.w1)->axes(d)) tiles *= mesh->axis_size(axis);
  EXPECT_EQ(tiles, 8);  // the weight over all 8 devices
}

}  // namespace
}  // namespace spmd::plan
