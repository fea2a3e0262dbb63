// The static cost analysis (partition/cost.h) and the step-time model (plan/cost_model.h)
// on hand-built rules, programs and statistics, against numbers worked out by hand.
#include "partition/cost.h"

#include <gtest/gtest.h>

#include <cmath>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "graph_test_util.h"
#include "ir/internal_ops.h"
#include "ir/recompute.h"
#include "partition/partitioner.h"
#include "plan/cost_model.h"

namespace spmd::partition {
namespace {

using plan::CollectiveTime;
using plan::EstimateStep;
using plan::Hardware;
using plan::HostDeviceSeconds;
using plan::OpTime;
using plan::StepEstimate;
using plan::TileEfficiency;
using plan::WaveEfficiency;
using testing::Close;
using testing::Stat;
using testing::Constrain;
using testing::F32;
using testing::MakeMesh;
using testing::Mm;
using testing::Param;
using testing::Relu;
using testing::Spec;
using testing::Tanh;

// The rule of the node that produced `v`.
ShardingRule RuleOf(const ir::Value& v) {
  RulePtr rule = GetRule(*v.node);
  if (!rule) throw std::logic_error("no rule for " + v.node->op()->qualified);
  return *rule;
}

// ---------------------------------------------------------------------------------------------
// RuleFlops

struct MmFactors {
  int i, k, j;
};
MmFactors FactorsOfMm(const ShardingRule& rule) {
  // mm: [i,k],[k,j] -> [i,j]
  return {rule.results[0][0][0], rule.operands[0][1][0], rule.results[0][1][0]};
}

TEST(RuleFlopsTest, MmCountsTwoFlopsPerPointOfItsIterationSpace) {
  ir::Value y = Mm(Param(F32({8, 16})), Param(F32({16, 32})));
  ShardingRule rule = RuleOf(y);
  MmFactors f = FactorsOfMm(rule);
  ASSERT_EQ(rule.factors.size(), 3u);
  EXPECT_EQ(rule.factors[f.i].size, 8);
  EXPECT_EQ(rule.factors[f.k].size, 16);
  EXPECT_EQ(rule.factors[f.k].kind, FactorKind::kReduction);
  EXPECT_EQ(rule.factors[f.j].size, 32);
  ASSERT_TRUE(rule.cost.flops_per_point.has_value());
  EXPECT_EQ(*rule.cost.flops_per_point, 2.0);

  MeshPtr mesh = MakeMesh({4}, {"data"});
  // Whole op: 2 * i * k * j = 2 * 8 * 16 * 32 = 8192.
  EXPECT_EQ(RuleFlops(rule, *mesh, FactorAxes(rule.factors.size()), {y.type()}), 8192.0);

  // i split over 'data' (4): each device does 2 * (8/4) * 16 * 32 = 2048, a quarter.
  FactorAxes split_i(rule.factors.size());
  split_i[f.i] = {0};
  EXPECT_EQ(RuleFlops(rule, *mesh, split_i, {F32({2, 32})}), 2048.0);
  EXPECT_EQ(RuleFlops(rule, *mesh, split_i, {F32({2, 32})}), 8192.0 / 4);

  // The contraction split instead: 2 * 8 * (16/4) * 32 = 2048 too (partial sums cost the same).
  FactorAxes split_k(rule.factors.size());
  split_k[f.k] = {0};
  EXPECT_EQ(RuleFlops(rule, *mesh, split_k, {F32({8, 32})}), 2048.0);
}

TEST(RuleFlopsTest, MmOnTwoAxesAndUnevenFactors) {
  MeshPtr mesh = MakeMesh({2, 2}, {"data", "model"});
  ir::Value y = Mm(Param(F32({8, 16})), Param(F32({16, 32})));
  ShardingRule rule = RuleOf(y);
  MmFactors f = FactorsOfMm(rule);
  // i over 'data' (2), j over 'model' (2): 2 * 4 * 16 * 16 = 2048.
  FactorAxes fa(rule.factors.size());
  fa[f.i] = {0};
  fa[f.j] = {1};
  EXPECT_EQ(RuleFlops(rule, *mesh, fa, {F32({4, 16})}), 2048.0);
  // i over both axes (4 tiles): 2 * 2 * 16 * 32 = 2048.
  FactorAxes both(rule.factors.size());
  both[f.i] = {0, 1};
  EXPECT_EQ(RuleFlops(rule, *mesh, both, {F32({2, 32})}), 2048.0);

  // 10 rows over 4 devices: every device runs the padded tile of ceil(10/4) = 3 rows,
  // 2 * 3 * 16 * 32 = 3072; the whole op is 2 * 10 * 16 * 32 = 10240.
  MeshPtr mesh4 = MakeMesh({4}, {"data"});
  ir::Value z = Mm(Param(F32({10, 16})), Param(F32({16, 32})));
  ShardingRule zr = RuleOf(z);
  MmFactors zf = FactorsOfMm(zr);
  FactorAxes zi(zr.factors.size());
  zi[zf.i] = {0};
  EXPECT_EQ(RuleFlops(zr, *mesh4, FactorAxes(zr.factors.size()), {z.type()}), 10240.0);
  EXPECT_EQ(RuleFlops(zr, *mesh4, zi, {F32({3, 32})}), 3072.0);
}

TEST(RuleFlopsTest, PointwiseCountsOneFlopPerResultElement) {
  ir::Value a = Relu(Param(F32({8, 16})));
  ShardingRule rule = RuleOf(a);
  EXPECT_FALSE(rule.cost.flops_per_point.has_value());
  MeshPtr mesh = MakeMesh({4}, {"data"});
  FactorAxes fa(rule.factors.size());
  fa[rule.results[0][0][0]] = {0};
  // The local result f32[2,16]: 32 elements.
  EXPECT_EQ(RuleFlops(rule, *mesh, fa, {F32({2, 16})}), 32.0);
  // ElementFlops: 8 * 16 = 128, plus 3 * 5 = 15; undefined results count nothing.
  EXPECT_EQ(ElementFlops({F32({8, 16}), F32({3, 5}), TensorType{}}), 143.0);
}

// ---------------------------------------------------------------------------------------------
// ContractionShape

TEST(ContractionShapeTest, MmIsMTimesKTimesNOfTheLocalTile) {
  ir::Value y = Mm(Param(F32({8, 16})), Param(F32({16, 32})));
  ShardingRule rule = RuleOf(y);
  MmFactors f = FactorsOfMm(rule);
  MeshPtr mesh = MakeMesh({4}, {"data"});
  GemmShape whole = ContractionShape(rule, *mesh, FactorAxes(rule.factors.size()));
  EXPECT_EQ(whole.m, 8);
  EXPECT_EQ(whole.k, 16);
  EXPECT_EQ(whole.n, 32);
  // Rows over 'data' (4): each device multiplies a 2 x 16 tile by 16 x 32.
  FactorAxes split_i(rule.factors.size());
  split_i[f.i] = {0};
  GemmShape local = ContractionShape(rule, *mesh, split_i);
  EXPECT_EQ(local.m, 2);
  EXPECT_EQ(local.k, 16);
  EXPECT_EQ(local.n, 32);
}

TEST(ContractionShapeTest, BatchDimsAreNeitherMNorN) {
  // torch.matmul of [4,8,16,32] x [4,8,32,16]: 32 GEMMs of 16 x 32 x 16.
  const ir::OpInfo* matmul = ir::InternOp(
      "aten::matmul", {{"self", ir::ArgType::kTensor}, {"other", ir::ArgType::kTensor}}, 1);
  ir::NodePtr n = ir::MakeNode(matmul, {Param(F32({4, 8, 16, 32})), Param(F32({4, 8, 32, 16}))},
                               {ir::Arg::Tensor(0), ir::Arg::Tensor(1)}, {F32({4, 8, 16, 16})});
  ShardingRule rule = RuleOf(ir::Value{n, 0});
  MeshPtr mesh = MakeMesh({4}, {"data"});
  GemmShape g = ContractionShape(rule, *mesh, FactorAxes(rule.factors.size()));
  EXPECT_EQ(g.m, 16);
  EXPECT_EQ(g.k, 32);
  EXPECT_EQ(g.n, 16);
  EXPECT_EQ(g.batch, 32);  // the batch dims: 4 x 8 GEMMs
}

TEST(ContractionShapeTest, OtherRulesHaveNone) {
  ShardingRule relu = RuleOf(Relu(Param(F32({8, 16}))));
  MeshPtr mesh = MakeMesh({4}, {"data"});
  GemmShape g = ContractionShape(relu, *mesh, FactorAxes(relu.factors.size()));
  EXPECT_EQ(g.m, 0);
  EXPECT_EQ(g.n, 0);
  EXPECT_EQ(g.k, 0);
  EXPECT_TRUE(IsPointwise(relu));
  EXPECT_FALSE(IsPointwise(RuleOf(Mm(Param(F32({8, 16})), Param(F32({16, 32}))))));
}

// ---------------------------------------------------------------------------------------------
// FLOPs and memory of partitioned programs

TEST(ProgramCostTest, ShardedContractionMm) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{}, {"model"}}));
  ir::Value w = Param(F32({16, 32}), Spec(mesh, {{"model"}, {}}));
  Program p = PartitionGraph(ir::BuildGraph({Mm(x, w)}), 4);

  // Per device: 2 * 8 * (16/4) * 32 = 2048; the model: 2 * 8 * 16 * 32 = 8192.
  EXPECT_EQ(p.stats.flops_per_device, 2048.0);
  EXPECT_EQ(p.stats.model_flops, 8192.0);
  ASSERT_EQ(p.stats.op_costs.size(), 1u);  // parameters and collectives are not ops
  const OpCost& c = p.stats.op_costs[0];
  EXPECT_EQ(c.op, "aten::mm");
  EXPECT_EQ(c.flops, 2048.0);
  EXPECT_EQ(c.model_flops, 8192.0);
  // Local operands f32[8,4] (128 B) and f32[4,32] (512 B), local result f32[8,32] (1024 B).
  EXPECT_EQ(c.bytes, 128 + 512 + 1024);
  EXPECT_EQ(c.dtype, DType::kFloat32);

  // Program: x (128 B), w (512 B), mm (1024 B, last read by the all-reduce), all-reduce
  // (1024 B, an output). After the all-reduce: 128 + 512 + 1024 + 1024 = 2688.
  ASSERT_EQ(p.nodes.size(), 4u) << p.ToText();
  EXPECT_EQ(p.stats.peak_bytes_per_device, 2688);
  EXPECT_EQ(p.stats.peak_op, "spmd::all_reduce");
  int64_t at = -1;
  EXPECT_EQ(PeakBytesPerDevice(p, &at), 2688);
  EXPECT_EQ(at, 3);
}

TEST(ProgramCostTest, MegatronMlpFlops) {
  MeshPtr mesh = MakeMesh({2, 2}, {"data", "model"});
  ir::Value x = Param(F32({8, 16}), Sharding::Replicated(mesh, 2));
  ir::Value w1 = Param(F32({16, 32}), Spec(mesh, {{}, {"model"}}));
  ir::Value w2 = Param(F32({32, 16}), Spec(mesh, {{"model"}, {}}));
  Program p = PartitionGraph(ir::BuildGraph({Mm(Relu(Mm(x, w1)), w2)}), 4);

  // mm1: j = 32 over 'model' (2):   2 * 8 * 16 * 16 = 4096 per device, 2 * 8 * 16 * 32 = 8192.
  // relu on f32[8,16] locally:      128 per device, 8 * 32 = 256.
  // mm2: k = 32 over 'model' (2):   2 * 8 * 16 * 16 = 4096 per device, 2 * 8 * 32 * 16 = 8192.
  ASSERT_EQ(p.stats.op_costs.size(), 3u);
  EXPECT_EQ(p.stats.op_costs[0].op, "aten::mm");
  EXPECT_EQ(p.stats.op_costs[0].flops, 4096.0);
  EXPECT_EQ(p.stats.op_costs[0].model_flops, 8192.0);
  EXPECT_EQ(p.stats.op_costs[1].op, "aten::relu");
  EXPECT_EQ(p.stats.op_costs[1].flops, 128.0);
  EXPECT_EQ(p.stats.op_costs[1].model_flops, 256.0);
  EXPECT_EQ(p.stats.op_costs[2].op, "aten::mm");
  EXPECT_EQ(p.stats.op_costs[2].flops, 4096.0);
  EXPECT_EQ(p.stats.op_costs[2].model_flops, 8192.0);
  EXPECT_EQ(p.stats.flops_per_device, 4096.0 + 128 + 4096);   // 8320
  EXPECT_EQ(p.stats.model_flops, 8192.0 + 256 + 8192);        // 16640
  // relu reads f32[8,16] and writes f32[8,16]: 512 + 512 bytes.
  EXPECT_EQ(p.stats.op_costs[1].bytes, 1024);
}

TEST(ProgramCostTest, PointwiseChainsFuse) {
  MeshPtr mesh = MakeMesh({4}, {"data"});
  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{"data"}, {}}));
  ir::Value w = Param(F32({16, 32}), Sharding::Replicated(mesh, 2));
  // tanh(relu(x)) @ w: relu's result is read by tanh alone, so relu's write and tanh's read of
  // that f32[2,16] tile (128 B each) stay on chip; tanh's result feeds the matmul, which does
  // not fuse (the rule is not pointwise), so it goes through HBM.
  Program p = PartitionGraph(ir::BuildGraph({Mm(Tanh(Relu(x)), w)}), 4);
  ASSERT_EQ(p.stats.op_costs.size(), 3u);
  const OpCost& relu = p.stats.op_costs[0];
  const OpCost& tanh = p.stats.op_costs[1];
  const OpCost& mm = p.stats.op_costs[2];
  EXPECT_EQ(relu.op, "aten::relu");
  EXPECT_EQ(relu.bytes, 256);
  EXPECT_EQ(relu.fused_bytes, 128);  // its write
  EXPECT_EQ(tanh.bytes, 256);
  EXPECT_EQ(tanh.fused_bytes, 128);  // its read
  EXPECT_EQ(mm.fused_bytes, 0);
  EXPECT_TRUE(mm.contraction);
  EXPECT_FALSE(relu.contraction);
  EXPECT_EQ(mm.gemm_m, 2);
  EXPECT_EQ(mm.gemm_k, 16);
  EXPECT_EQ(mm.gemm_n, 32);

  // A value with two readers is written once and read twice: nothing fuses.
  ir::Value r = Relu(x);
  Program q = PartitionGraph(ir::BuildGraph({Tanh(r), Relu(r)}), 4);
  for (const OpCost& c : q.stats.op_costs) EXPECT_EQ(c.fused_bytes, 0) << c.op;
}

TEST(ProgramCostTest, CollectivesKnowWhereTheirInputIsMadeAndTheirResultRead) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{}, {"model"}}));
  ir::Value w = Param(F32({16, 32}), Spec(mesh, {{"model"}, {}}));
  Program p = PartitionGraph(ir::BuildGraph({Relu(Mm(x, w))}), 4);
  // x, w, mm (partial sums), all-reduce, relu.
  ASSERT_EQ(p.nodes.size(), 5u) << p.ToText();
  ASSERT_EQ(p.stats.collectives.size(), 1u);
  const CollectiveStat& ar = p.stats.collectives[0];
  EXPECT_EQ(ar.kind, "all-reduce");
  EXPECT_EQ(ar.position, 3);
  EXPECT_EQ(ar.input_position, 2);      // the mm
  EXPECT_EQ(ar.first_use_position, 4);  // the relu
  // The mm needs no communication; the relu reads the all-reduce.
  ASSERT_EQ(p.stats.op_costs.size(), 2u);
  EXPECT_TRUE(p.stats.op_costs[0].independent_of_collectives);
  EXPECT_EQ(p.stats.op_costs[0].end_position, 3);
  EXPECT_FALSE(p.stats.op_costs[1].independent_of_collectives);

  // An all-gather of a parameter: its input is there from the start.
  ir::Value ws = Param(F32({16, 32}), Spec(mesh, {{"model"}, {}}));
  ir::Value xr = Param(F32({8, 16}), Sharding::Replicated(mesh, 2));
  Program g = PartitionGraph(
      ir::BuildGraph({Mm(xr, Constrain(ws, Sharding::Replicated(mesh, 2)))}), 4);
  ASSERT_EQ(g.stats.collectives.size(), 1u) << g.ToText();
  const CollectiveStat& ag = g.stats.collectives[0];
  EXPECT_EQ(ag.kind, "all-gather");
  EXPECT_EQ(ag.input_position, -1);
  EXPECT_EQ(ag.first_use_position, g.stats.op_costs.back().position);  // the mm
  // A result read only as an output is first read at the end of the program.
  Program o = PartitionGraph(ir::BuildGraph({Mm(x, w)}), 4);
  ASSERT_EQ(o.stats.collectives.size(), 1u);
  EXPECT_EQ(o.stats.collectives[0].first_use_position, static_cast<int64_t>(o.nodes.size()));
}

// A program built by hand (op names do not matter to liveness).
struct HandProgram {
  Program program;
  ir::NodePtr p0, p1, a, b, c, d;
};

HandProgram MakeHandProgram() {
  const ir::OpInfo* data = ir::InternalOps::Get().device_data;
  const ir::OpInfo* unary = testing::OpUnary("test::unary");
  const ir::OpInfo* binary = ir::InternOp(
      "test::binary", {{"self", ir::ArgType::kTensor}, {"other", ir::ArgType::kTensor}}, 1);
  HandProgram h;
  h.p0 = ir::MakeNode(data, {}, {}, {F32({100})});  // 400 B
  h.p1 = ir::MakeNode(data, {}, {}, {F32({25})});   // 100 B
  h.a = ir::MakeNode(unary, {{h.p0, 0}}, {ir::Arg::Tensor(0)}, {F32({50})});  // 200 B
  h.b = ir::MakeNode(unary, {{h.a, 0}}, {ir::Arg::Tensor(0)}, {F32({20})});   // 80 B
  h.c = ir::MakeNode(binary, {{h.b, 0}, {h.p1, 0}}, {ir::Arg::Tensor(0), ir::Arg::Tensor(1)},
                     {F32({75})});  // 300 B
  h.d = ir::MakeNode(unary, {{h.c, 0}}, {ir::Arg::Tensor(0)}, {F32({10})});  // 40 B
  h.program.nodes = {h.p0, h.p1, h.a, h.b, h.c, h.d};
  h.program.params = {h.p0, h.p1};
  h.program.outputs = {{h.d, 0}};
  return h;
}

TEST(PeakBytesTest, ParametersLiveThroughoutIntermediatesFreedAfterLastUse) {
  HandProgram h = MakeHandProgram();
  // Live bytes after each node (a value counts from its definition through its last reader):
  //   0 p0:            400
  //   1 p1:            400 + 100                    = 500
  //   2 a:             500 + 200                    = 700
  //   3 b (reads a):   700 + 80                     = 780
  //   4 c (reads b):   a is gone: 500 + 80 + 300    = 880   <- peak
  //   5 d (reads c):   b is gone: 500 + 300 + 40    = 840   (p1 stays, though last read at 4)
  // Keeping everything would reach 400+100+200+80+300+40 = 1120.
  int64_t at = -1;
  EXPECT_EQ(PeakBytesPerDevice(h.program, &at), 880);
  EXPECT_EQ(at, 4);
  EXPECT_EQ(PeakBytesPerDevice(h.program), 880);  // at_node is optional
}

TEST(PeakBytesTest, OutputsLiveToTheEnd) {
  HandProgram h = MakeHandProgram();
  h.program.outputs.push_back({h.a, 0});  // a is now also handed back
  //   4 c: 500 + 200 (a) + 80 + 300 = 1080   <- peak
  //   5 d: 500 + 200 + 300 + 40     = 1040
  int64_t at = -1;
  EXPECT_EQ(PeakBytesPerDevice(h.program, &at), 1080);
  EXPECT_EQ(at, 4);
}

TEST(PeakBytesTest, UnreadParameterIsLiveThroughout) {
  HandProgram h = MakeHandProgram();
  // A third parameter, f32[8] = 32 B, that no op reads, placed first: every index shifts by
  // one and its 32 B are live everywhere:
  //   0 p2: 32;  1 p0: 432;  2 p1: 532;  3 a: 732;  4 b: 812;  5 c: 880 + 32 = 912 <- peak;
  //   6 d: 840 + 32 = 872.
  ir::NodePtr p2 = ir::MakeNode(ir::InternalOps::Get().device_data, {}, {}, {F32({8})});
  h.program.nodes.insert(h.program.nodes.begin(), p2);
  h.program.params.push_back(p2);
  int64_t at = -1;
  EXPECT_EQ(PeakBytesPerDevice(h.program, &at), 912);
  EXPECT_EQ(at, 5);
}

// ---------------------------------------------------------------------------------------------
// Step-time model

Hardware TestHardware() {
  Hardware hw;
  hw.name = "test";
  hw.peak_flops_bf16 = 1e15;
  hw.peak_flops_fp32 = 2.5e14;
  hw.hbm_bytes = 80e9;
  hw.hbm_bandwidth = 2e12;
  hw.ring_bandwidth = 100e9;
  hw.cross_domain_bandwidth = 25e9;
  hw.link_latency = 1e-6;
  hw.devices_per_domain = 8;
  return hw;
}

TEST(CostModelTest, RingFormulasInsideOneHost) {
  const Hardware hw = TestHardware();
  const std::vector<int64_t> g4 = {0, 1, 2, 3};
  // n = 4, s = 1e6 B, B = 100e9 B/s, one link step = 1 us.
  // all-gather: (n-1) s / B + (n-1) lat = 3e6/1e11 + 3e-6 = 3e-5 + 3e-6 = 3.3e-5.
  CollectiveTime ag = CollectiveSeconds(Stat("all-gather", 1000000, g4), hw);
  EXPECT_EQ(ag.kind, "all-gather");
  EXPECT_FALSE(ag.crosses_hosts);
  EXPECT_TRUE(Close(ag.seconds, 3.3e-5)) << ag.seconds;
  // all-reduce: 2 (n-1)/n s / B + 2 (n-1) lat = 1.5e6/1e11 + 6e-6 = 1.5e-5 + 6e-6 = 2.1e-5.
  CollectiveTime ar = CollectiveSeconds(Stat("all-reduce", 1000000, g4), hw);
  EXPECT_TRUE(Close(ar.seconds, 2.1e-5)) << ar.seconds;
  // reduce-scatter: (n-1)/n s / B + (n-1) lat = 7.5e5/1e11 + 3e-6 = 7.5e-6 + 3e-6 = 1.05e-5.
  CollectiveTime rs = CollectiveSeconds(Stat("reduce-scatter", 1000000, g4), hw);
  EXPECT_TRUE(Close(rs.seconds, 1.05e-5)) << rs.seconds;
  // all-to-all moves (n-1)/n of its buffer too: 1.05e-5.
  CollectiveTime a2a = CollectiveSeconds(Stat("all-to-all", 1000000, g4), hw);
  EXPECT_TRUE(Close(a2a.seconds, 1.05e-5)) << a2a.seconds;
  // collective-permute: one exchange: s / B + lat = 1e-5 + 1e-6 = 1.1e-5.
  CollectiveTime cp = CollectiveSeconds(Stat("collective-permute", 1000000, g4), hw);
  EXPECT_TRUE(Close(cp.seconds, 1.1e-5)) << cp.seconds;
  // all-reduce over n = 2: 2 * 1/2 * 1e6 / 1e11 + 2 * 1e-6 = 1e-5 + 2e-6 = 1.2e-5.
  CollectiveTime ar2 = CollectiveSeconds(Stat("all-reduce", 1000000, {4, 5}), hw);
  EXPECT_TRUE(Close(ar2.seconds, 1.2e-5)) << ar2.seconds;
  // A group of one moves nothing.
  EXPECT_EQ(CollectiveSeconds(Stat("all-reduce", 1000000, {3}), hw).seconds, 0.0);
}

TEST(CostModelTest, GroupsAcrossHostsRideTheSlowerLinks) {
  Hardware hw = TestHardware();  // 8 devices per host
  // {0, 8, 16, 24}: one device on each of hosts 0..3. all-gather of 1e6 B at 25e9 B/s:
  // 3e6 / 25e9 + 3e-6 = 1.2e-4 + 3e-6 = 1.23e-4.
  CollectiveTime across = CollectiveSeconds(Stat("all-gather", 1000000, {0, 8, 16, 24}), hw);
  EXPECT_TRUE(across.crosses_hosts);
  EXPECT_TRUE(Close(across.seconds, 1.23e-4)) << across.seconds;
  // {8, 9, 10, 11}: all on host 1 (8/8 = 11/8 = 1): ring bandwidth, 3.3e-5.
  CollectiveTime inside = CollectiveSeconds(Stat("all-gather", 1000000, {8, 9, 10, 11}), hw);
  EXPECT_FALSE(inside.crosses_hosts);
  EXPECT_TRUE(Close(inside.seconds, 3.3e-5)) << inside.seconds;
  // {6, 7, 8, 9} straddles hosts 0 and 1, two members on each, and each member has a NIC of
  // its own. all-reduce: NCCL's ring through all four, its crossing traffic over both NICs of
  // a host, min(100e9, 2 x 25e9) = 50e9 B/s: 1.5e6 / 50e9 + 6e-6 = 3.6e-5 (a tree: 4.8e-5;
  // until the model knew of the second NIC it charged the whole ring one NIC: 6.6e-5). NCCL
  // runs no hierarchical all-reduce: that is XLA's over TPU slices (collective_model_test.cc),
  // which would take reduce-scatter on each pair, the halves across, all-gather: 3.4e-5.
  CollectiveTime straddle = CollectiveSeconds(Stat("all-reduce", 1000000, {6, 7, 8, 9}), hw);
  EXPECT_TRUE(straddle.crosses_hosts);
  EXPECT_EQ(straddle.algorithm, "ring");
  EXPECT_TRUE(Close(straddle.seconds, 3.6e-5)) << straddle.seconds;
  // devices_per_domain = 0: one interconnect (a TPU slice), nothing crosses.
  hw.devices_per_domain = 0;
  CollectiveTime slice = CollectiveSeconds(Stat("all-gather", 1000000, {0, 8, 16, 24}), hw);
  EXPECT_FALSE(slice.crosses_hosts);
  EXPECT_TRUE(Close(slice.seconds, 3.3e-5)) << slice.seconds;
}

TEST(CostModelTest, OpSecondsIsARoofline) {
  const Hardware hw = TestHardware();
  EXPECT_EQ(hw.PeakFlops(DType::kBFloat16), 1e15);
  EXPECT_EQ(hw.PeakFlops(DType::kFloat16), 1e15);
  EXPECT_EQ(hw.PeakFlops(DType::kFloat32), 2.5e14);

  OpCost big;
  big.flops = 2e12;
  big.bytes = 1000000000;  // 1e9
  big.dtype = DType::kBFloat16;
  // Compute-bound: 2e12 / 1e15 = 2e-3 s against 1e9 / 2e12 = 5e-4 s of memory traffic.
  EXPECT_TRUE(Close(OpSeconds(big, hw).seconds(), 2e-3)) << OpSeconds(big, hw).seconds();
  EXPECT_TRUE(OpSeconds(big, hw).compute_bound());
  EXPECT_TRUE(Close(OpSeconds(big, hw).memory, 5e-4));
  // The same op in fp32 runs at the fp32 peak: 2e12 / 2.5e14 = 8e-3 s.
  big.dtype = DType::kFloat32;
  EXPECT_TRUE(Close(OpSeconds(big, hw).seconds(), 8e-3)) << OpSeconds(big, hw).seconds();

  OpCost stream;
  stream.flops = 1e9;
  stream.bytes = 4000000000;  // 4e9
  stream.dtype = DType::kFloat32;
  // Memory-bound: 4e9 / 2e12 = 2e-3 s against 1e9 / 2.5e14 = 4e-6 s of compute.
  EXPECT_TRUE(Close(OpSeconds(stream, hw).seconds(), 2e-3)) << OpSeconds(stream, hw).seconds();
  EXPECT_FALSE(OpSeconds(stream, hw).compute_bound());

  EXPECT_EQ(OpSeconds(OpCost{}, hw).seconds(), 0.0);  // nothing to do
}

TEST(CostModelTest, MatmulEfficiencyTilesAndHbmEfficiency) {
  EXPECT_EQ(TileEfficiency(128, 256, 512, 128), 1.0);
  EXPECT_EQ(TileEfficiency(64, 128, 128, 128), 0.5);          // M padded from 64 to 128
  EXPECT_EQ(TileEfficiency(200, 128, 128, 128), 200.0 / 256);
  EXPECT_EQ(TileEfficiency(1, 4096, 4096, 128), 1.0 / 128);   // a matrix-vector product
  EXPECT_EQ(TileEfficiency(64, 128, 128, 0), 1.0);            // no tile: no shape term
  EXPECT_EQ(TileEfficiency(0, 0, 0, 128), 1.0);               // shape unknown

  Hardware hw = TestHardware();
  OpCost mm;
  mm.flops = 2.0 * 64 * 128 * 128;  // 2,097,152
  mm.dtype = DType::kBFloat16;
  mm.contraction = true;
  mm.gemm_m = 64;
  mm.gemm_n = 128;
  mm.gemm_k = 128;
  // At the peak: 2,097,152 / 1e15.
  EXPECT_TRUE(Close(OpSeconds(mm, hw).compute, 2097152 / 1e15));
  // Half the peak on large matmuls, and half of the 128-tile wasted on M: a quarter of it.
  hw.matmul_efficiency = 0.5;
  hw.matmul_tile = 128;
  EXPECT_TRUE(Close(OpSeconds(mm, hw).compute, 2097152 / 0.25e15));
  // Pointwise FLOPs are not matmul work: neither term applies.
  OpCost add;
  add.flops = 1e9;
  add.dtype = DType::kBFloat16;
  EXPECT_TRUE(Close(OpSeconds(add, hw).compute, 1e-6));
  // Memory: bytes not kept on chip by fusion, at the achieved bandwidth.
  add.bytes = 3000000;
  add.fused_bytes = 1000000;
  hw.hbm_efficiency = 0.8;
  EXPECT_TRUE(Close(OpSeconds(add, hw).memory, 2e6 / (2e12 * 0.8)));
}

TEST(CostModelTest, WaveQuantizationOnGpus) {
  EXPECT_EQ(WaveEfficiency(108, 108), 1.0);
  EXPECT_EQ(WaveEfficiency(109, 108), 109.0 / 216);  // a second wave of one tile
  EXPECT_EQ(WaveEfficiency(24, 108), 24.0 / 108);
  EXPECT_EQ(WaveEfficiency(24, 0), 1.0);              // not modelled

  Hardware hw = TestHardware();
  hw.matmul_tile = 128;
  OpCost mm;
  mm.contraction = true;
  mm.gemm_m = 1024;  // a tensor-parallel q/k/v projection of 1024 tokens: 384 columns
  mm.gemm_n = 384;
  mm.gemm_k = 1024;
  EXPECT_EQ(GemmEfficiency(mm, hw), 1.0);  // a TPU: no padding here, no waves
  hw.matrix_units = 108;
  // 128 x 128 tiles: 8 x 3 = 24 tiles on 108 SMs; 64 x 64 tiles: 16 x 6 = 96, the better.
  EXPECT_EQ(GemmEfficiency(mm, hw), 96.0 / 108);
  mm.gemm_batch = 32;  // 32 such GEMMs: 768 tiles of 128, 7.1 waves; 3072 of 64, 28.4 waves
  EXPECT_EQ(GemmEfficiency(mm, hw), std::max(768.0 / (8 * 108), 3072.0 / (29 * 108)));
}

TEST(CostModelTest, ViewsTakeNoTime) {
  MeshPtr mesh = MakeMesh({4}, {"data"});
  ir::Value x = Param(F32({16, 16}), Spec(mesh, {{"data"}, {}}));
  ir::Value w = Param(F32({16, 32}), Sharding::Replicated(mesh, 2));
  // x.t() @ w, and a detached x: in eager PyTorch both are views of x's storage.
  Program p = PartitionGraph(
      ir::BuildGraph({Mm(testing::Unary("aten::t_copy", x), w),
                      testing::Unary("aten::detach_copy", x)}), 4);
  const Hardware hw = TestHardware();
  int views = 0;
  for (const OpCost& c : p.stats.op_costs) {
    const bool view = c.op == "aten::t_copy" || c.op == "aten::detach_copy";
    EXPECT_EQ(c.view, view) << c.op;
    EXPECT_GT(c.bytes, 0) << c.op;  // the stats still count what the functional IR copies
    const OpTime t = OpSeconds(c, hw);
    EXPECT_EQ(t.seconds() == 0 && !t.launches, view) << c.op;
    views += view;
  }
  EXPECT_EQ(views, 2);
  // Nor memory: r.t() @ w peaks like r @ w (same shapes, both replicated), the transpose
  // aliasing r.
  ir::Value r = Param(F32({16, 16}), Sharding::Replicated(mesh, 2));
  Program plain = PartitionGraph(ir::BuildGraph({Mm(r, w)}), 4);
  Program transposed =
      PartitionGraph(ir::BuildGraph({Mm(testing::Unary("aten::t_copy", r), w)}), 4);
  EXPECT_EQ(PeakBytesPerDevice(transposed), PeakBytesPerDevice(plain));
  EXPECT_GT(PeakBytesPerDevice(plain), 0);
}

TEST(GraphOrderTest, RunsInTheOrderThatHoldsFewerBytes) {
  ir::Value x = Param(F32({64, 64}));
  ir::Value w = Param(F32({64, 1}));
  // Recorded: two 16 KiB values, then each reduced to a column. In that order both are live
  // at once; in the post-order from the outputs (a, c, b, d) one at a time: it wins.
  ir::Value a = Relu(x), b = Tanh(x);
  ir::Value c = Mm(a, w), d = Mm(b, w);
  ir::Graph g = ir::BuildGraph({c, d});
  EXPECT_LT(g.PositionOf(c.node.get()), g.PositionOf(b.node.get()));
  // Recorded as a, c, b, d: the orders agree, recorded wins the tie.
  ir::Value a2 = Relu(x);
  ir::Value c2 = Mm(a2, w);
  ir::Value b2 = Tanh(x);
  ir::Value d2 = Mm(b2, w);
  ir::Graph g2 = ir::BuildGraph({d2, c2});  // post-order would run b2 first
  EXPECT_LT(g2.PositionOf(a2.node.get()), g2.PositionOf(b2.node.get()));
  EXPECT_LT(g2.PositionOf(c2.node.get()), g2.PositionOf(b2.node.get()));
}

// Collectives whose positions are unknown (hand-built statistics) are read before the first
// op: nothing overlaps.
TEST(CostModelTest, EstimateStepWithoutPositionsSumsOpsAndCollectives) {
  const Hardware hw = TestHardware();
  ProgramStats stats;
  OpCost mm;  // compute-bound bf16: 2e-3 s (above)
  mm.op = "aten::mm";
  mm.flops = 2e12;
  mm.bytes = 1000000000;
  mm.dtype = DType::kBFloat16;
  OpCost add;  // memory-bound fp32: 2e-3 s (above)
  add.op = "aten::add.Tensor";
  add.flops = 1e9;
  add.bytes = 4000000000;
  add.dtype = DType::kFloat32;
  stats.op_costs = {mm, add};
  stats.collectives = {Stat("all-gather", 1000000, {0, 1, 2, 3}),   // 3.3e-5 s
                       Stat("all-reduce", 1000000, {0, 8, 16, 24})}; // 1.5e6/25e9 + 6e-6 = 6.6e-5
  StepEstimate e = EstimateStep(stats, hw);
  ASSERT_EQ(e.op_times.size(), 2u);
  ASSERT_EQ(e.collective_seconds.size(), 2u);
  EXPECT_TRUE(Close(e.op_times[0].seconds(), 2e-3));
  EXPECT_TRUE(Close(e.op_times[1].seconds(), 2e-3));
  EXPECT_TRUE(Close(e.compute_bound_seconds, 2e-3));  // the mm
  EXPECT_TRUE(Close(e.memory_bound_seconds, 2e-3));   // the add
  EXPECT_EQ(e.collective_seconds[0].kind, "all-gather");
  EXPECT_FALSE(e.collective_seconds[0].crosses_hosts);
  EXPECT_TRUE(e.collective_seconds[1].crosses_hosts);
  EXPECT_TRUE(Close(e.collective_seconds[1].seconds, 6.6e-5));
  EXPECT_TRUE(Close(e.compute_seconds, 4e-3)) << e.compute_seconds;
  EXPECT_TRUE(Close(e.communication_seconds, 3.3e-5 + 6.6e-5)) << e.communication_seconds;
  // No overlap: 4e-3 + 9.9e-5 = 4.099e-3; full overlap: max(4e-3, 9.9e-5) = 4e-3.
  EXPECT_TRUE(Close(e.step_seconds, 4.099e-3)) << e.step_seconds;
  EXPECT_TRUE(Close(e.no_overlap_step_seconds, 4.099e-3)) << e.no_overlap_step_seconds;
  EXPECT_TRUE(Close(e.exposed_communication_seconds, 9.9e-5));
  EXPECT_TRUE(Close(e.overlapped_step_seconds, 4e-3)) << e.overlapped_step_seconds;
}

// An eager runtime's host and device: the larger when one dominates, more near balance.
TEST(CostModelTest, HostAndDeviceNearBalanceCostMoreThanTheirMaximum) {
  EXPECT_EQ(HostDeviceSeconds(0, 2), 2.0);
  EXPECT_EQ(HostDeviceSeconds(3, 0), 3.0);
  EXPECT_TRUE(Close(HostDeviceSeconds(1, 1), std::cbrt(2.0)));     // 1.26x at balance
  EXPECT_TRUE(Close(HostDeviceSeconds(1, 4), std::cbrt(65.0)));    // 4.02: 0.5% over
  EXPECT_LT(HostDeviceSeconds(1, 1), 2.0);                         // never the sum
  // Four memory-bound adds of 2e-3 s each, each a kernel the host issues in 2e-3 s: the
  // schedule says 8e-3 + 2e-3 (the first waits for its issue), the smooth maximum of 8e-3 of
  // host and 8e-3 of device 1.26 x 8e-3; the difference is the device waiting for the host.
  Hardware hw = TestHardware();
  hw.kernel_overhead = 2e-3;
  ProgramStats stats;
  OpCost add;
  add.op = "aten::add.Tensor";
  add.flops = 1e9;
  add.bytes = 4000000000;
  add.dtype = DType::kFloat32;
  for (int64_t i = 0; i < 4; ++i) {
    add.position = 10 * (i + 1);
    stats.op_costs.push_back(add);
  }
  StepEstimate e = EstimateStep(stats, hw);
  EXPECT_TRUE(Close(e.compute_seconds, 8e-3)) << e.compute_seconds;
  EXPECT_TRUE(Close(e.step_seconds, std::cbrt(2.0) * 8e-3)) << e.step_seconds;
  EXPECT_TRUE(Close(e.host_bound_seconds, (std::cbrt(2.0) - 1) * 8e-3)) << e.host_bound_seconds;
  EXPECT_TRUE(Close(e.exposed_communication_seconds, 0));
  EXPECT_TRUE(Close(e.no_overlap_step_seconds, e.step_seconds));
  // A host 10x faster than the device: the schedule's 8.2e-3 s stands (the smooth maximum,
  // 8.003e-3 s, is below it).
  hw.kernel_overhead = 2e-4;
  e = EstimateStep(stats, hw);
  EXPECT_TRUE(Close(e.step_seconds, 8.2e-3)) << e.step_seconds;
}

// The model applied to a partitioned program's own statistics.
TEST(CostModelTest, EstimateStepOfAPartitionedMm) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{}, {"model"}}));
  ir::Value w = Param(F32({16, 32}), Spec(mesh, {{"model"}, {}}));
  Program p = PartitionGraph(ir::BuildGraph({Mm(x, w)}), 4);
  Hardware hw;
  hw.peak_flops_bf16 = 4e12;
  hw.peak_flops_fp32 = 1e12;
  hw.hbm_bandwidth = 1e11;
  hw.ring_bandwidth = 1e10;
  hw.link_latency = 1e-6;
  StepEstimate e = EstimateStep(p.stats, hw);
  // mm: 2048 FLOPs / 1e12 = 2.048e-9 s; 1664 B / 1e11 = 1.664e-8 s: memory-bound, 1.664e-8.
  // all-reduce of 1024 B over 4, by a tree: 2 * 1024 B / (0.92 * 1e10) = 2.226e-7 s, + 2
  // log2(4) = 4 steps of 1e-6 s (a ring: 2 * 3/4 * 1024 B / 1e10 + 6 steps = 6.1536e-6 s,
  // what the model charged before it knew trees).
  const double tree = 2048 / (0.92 * 1e10) + 4e-6;
  EXPECT_TRUE(Close(e.compute_seconds, 1.664e-8)) << e.compute_seconds;
  EXPECT_TRUE(Close(e.communication_seconds, tree)) << e.communication_seconds;
  EXPECT_EQ(e.collective_seconds[0].algorithm, "tree");
  // The all-reduce reads the mm's result and nothing follows it: they cannot overlap.
  EXPECT_TRUE(Close(e.step_seconds, 1.664e-8 + tree)) << e.step_seconds;
  EXPECT_TRUE(Close(e.collective_seconds[0].start, 1.664e-8));
  EXPECT_TRUE(Close(e.exposed_communication_seconds, tree));
  EXPECT_TRUE(Close(e.overlapped_step_seconds, tree)) << e.overlapped_step_seconds;
}

// Activation checkpointing's recomputation: a chain computed again from the same inputs is
// found node by node (its inputs the same values or recomputations of them); a computation
// that only looks alike (other inputs) is not.
TEST(RecomputeTest, FindsChainsComputedAgainFromTheSameInputs) {
  ir::Value x = Param(F32({8, 8}));
  ir::Value w = Param(F32({8, 8}));
  ir::Value h = Relu(Mm(x, w));                  // the forward
  ir::Value h2 = Relu(Mm(x, w));                 // its recomputation
  ir::Value other = Relu(Mm(h, w));              // alike in form, other input
  ir::Value out = Mm(Tanh(h2), other);
  ir::Graph g = ir::BuildGraph({out, h});
  std::unordered_set<const ir::Node*> again = ir::RecomputedNodes(g);
  // Whichever of the two runs second (the graph's order) is the recomputation.
  const bool h_first = g.PositionOf(h.node.get()) < g.PositionOf(h2.node.get());
  const ir::Value& second = h_first ? h2 : h;
  EXPECT_EQ(again.size(), 2u);
  EXPECT_TRUE(again.count(second.node.get()));
  EXPECT_TRUE(again.count(second.node->input(0).node.get()));
  EXPECT_FALSE(again.count(other.node.get()));
}

}  // namespace
}  // namespace spmd::partition
